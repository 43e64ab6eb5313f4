"""Edit primitives: rewriting a tree in one pass and parsing snippets
(``tree``), imports, module functions, keyword arguments, parameters, weight
loaders, ``load_weights`` mappings, config fields, guards, and the code the
codemods write per model part. Edits find their targets through
``autoport_cst.transform.anatomy``."""
