"""NRN900 invalid-suppression."""

from __future__ import annotations

from autoport_cst.lint.rule import Invalid, Rule, Valid


class InvalidSuppression(Rule):
    """A suppression comment that is refused: a blanket ``# autoport: ignore``
    (no codes, ``[]`` or ``[*]``), an unknown code, or no reason.

    Why: a blanket suppression hides every present and future hardware rule on
    that line, including the ones that crash a compile hours later. A
    suppression must name what it silences and say why, so that a reviewer can
    judge it: ``# autoport: ignore[NRN001] inv_freq on device="cpu", follows
    model.to(device)``. Blanket suppressions silence nothing; a suppression
    with an unknown code still honours its known codes; a suppression without
    a reason is honoured and reported.

    Example::

        x = x.to(device)  # autoport: ignore             <- NRN900, and NRN002 stays
        x = x.to(device)  # autoport: ignore[NRN002]     <- NRN900: no reason
    """

    CODE = "NRN900"
    NAME = "invalid-suppression"
    MESSAGE = "invalid suppression comment"
    PSEUDO = True

    VALID = (
        Valid(
            """
            class M(nn.Module):
                def forward(self, x):
                    return x.to(self.device)  # autoport: ignore[NRN002] runs once, eager
            """
        ),
        Valid('x = "# autoport: ignore"  # a string, not a comment\n'),
    )
    INVALID = (
        Invalid(
            """
            class M(nn.Module):
                def forward(self, x):
                    return x.to(self.device)  # autoport: ignore
            """,
            at=((3, 35),),
            message="blanket suppression",
        ),
        Invalid(
            """
            class M(nn.Module):
                def forward(self, x):
                    # autoport: ignore[*] everything
                    return x.cpu()
            """,
            at=((3, 9),),
            message="blanket suppression",
        ),
        Invalid(
            """
            class M(nn.Module):
                def forward(self, x):
                    return x.cpu()  # autoport: ignore[NRN002]
            """,
            at=((3, 25),),
            message="without a reason",
        ),
        Invalid(
            """
            class M(nn.Module):
                def forward(self, x):
                    return x.cpu()  # autoport: ignore[NRN002, XYZ1] debugging aid
            """,
            at=((3, 25),),
            message="unknown code 'XYZ1'",
        ),
    )
