"""The codemod library: one LibCST codemod per module.

Each module defines one ``Codemod`` subclass whose docstring documents it and
whose ``EXAMPLES`` are run as tests. ``autoport-cst codemods`` lists them.
"""
