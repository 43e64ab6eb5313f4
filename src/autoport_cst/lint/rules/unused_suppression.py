"""NRN901 unused-suppression."""

from __future__ import annotations

from autoport_cst.lint.rule import Invalid, Rule, Valid


class UnusedSuppression(Rule):
    """A suppression comment whose code reported nothing where it applies.

    Why: suppressions outlive the code they were written for. Once the line is
    fixed or moved, a stale ``# autoport: ignore[NRN002]`` would silently hide
    the next real violation there. Only codes of rules that ran are checked,
    so a suppression is not reported as unused because of ``--select``.

    A suppression applies to a finding on its own line, on the first line of
    the statement that contains the finding, or, as a comment-only line, in
    the block of comments directly above that statement.

    Example::

        return x.to(torch.float32)  # autoport: ignore[NRN002] ...   <- NRN901: a dtype cast
    """

    CODE = "NRN901"
    NAME = "unused-suppression"
    MESSAGE = "unused suppression"
    PSEUDO = True

    VALID = (
        Valid(
            """
            class M(nn.Module):
                def forward(self, x):
                    # autoport: ignore[NRN002] the cache lives on the host by design
                    return x.to(
                        self.device
                    )
            """,
            title="a comment above the statement",
        ),
        Valid(
            """
            class M(nn.Module):
                def forward(self, x):
                    return x.to(  # autoport: ignore[no-device-move-in-forward] host cache
                        self.device
                    )
            """,
            title="a rule name on the statement's first line",
        ),
    )
    INVALID = (
        Invalid(
            """
            class M(nn.Module):
                def forward(self, x):
                    return x.to(torch.float32)  # autoport: ignore[NRN002] cast
            """,
            at=((3, 37),),
            message="unused suppression: NRN002",
        ),
        Invalid(
            """
            class M(nn.Module):
                # autoport: ignore[NRN003] not on the next line
                def forward(self, x):
                    return x
            """,
            at=((2, 5),),
        ),
    )
