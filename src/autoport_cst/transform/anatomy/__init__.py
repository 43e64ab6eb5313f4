"""Model-anatomy locators: the classes of each role, every site of a family of
computation with its position (``sites``), and the census that keeps codemods
exhaustive (``census``). A locator returns all sites or raises a positioned
precondition naming the codemod (``FileContext.refuse``)."""
