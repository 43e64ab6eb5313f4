"""The CST layer: reading LibCST nodes (``vocabulary``), the class and file
roles read from names (``roles``), printing kept code (``printed``,
``statement_code``) and positions in the user's file (``positions``). Nothing
here knows a model; the lint rules share it."""
