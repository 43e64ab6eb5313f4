"""NRN999 syntax-error."""

from __future__ import annotations

from autoport_cst.lint.rule import Invalid, Rule


class SyntaxErrorRule(Rule):
    """The file does not parse, so no rule could check it.

    Why: a file that LibCST cannot parse cannot be checked against the
    hardware rules, and Python would not import it either. The finding points
    at the parser's error position. It is always reported (it cannot be
    deselected or suppressed) and makes the run fail with exit code 1, like any
    violation; it is not an internal error.

    Example::

        def forward(self, x:   # NRN999: the parameter list is never closed
    """

    CODE = "NRN999"
    NAME = "syntax-error"
    MESSAGE = "syntax error"
    PSEUDO = True

    VALID = ("x = 1\n",)
    INVALID = (
        Invalid("def forward(self, x:\n    return x\n", at=((1, 12),), message="never closed"),
        Invalid("class A:\nreturn 1\n", at=((2, 1),), message="syntax error"),
    )
