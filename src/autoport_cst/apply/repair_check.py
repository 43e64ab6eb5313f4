"""A repair step leaves none of the findings it was chosen for.

``apply`` runs the fix of a lint rule marked ``REPAIR`` when the reference
breaks that rule (``composer.repairs``). A fix that changes nothing where
the rule still fires (config-written-names once looked the config class up
under a name transformers does not have, and the port kept the field's
default without a word) would write a port with the reference's latent bug
in it. So after each repair step, the files it ran on are linted with the
rules it is the fix of; a finding left is the step's error, positioned in
the reference file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autoport_cst.errors import Position, PreconditionError


def findings_left(step_id: str, files: Iterable[tuple[str, str, Any]]) -> PreconditionError | None:
    """The first finding of the rules ``step_id`` repairs in ``files`` ((label,
    code, parsed module) of each Python file it ran on), as the step's error;
    None when none is left."""
    from autoport_cst.lint import lint_source
    from autoport_cst.lint.rules import registry

    codes = [code for code, rule in registry().items() if rule.REPAIR and rule.FIX == step_id]
    if not codes:
        return None
    for label, code, module in files:
        for finding in lint_source(code, label, select=codes, module=module):
            return PreconditionError(
                f"repair step {step_id} left {finding.code} ({finding.name}) unrepaired: {finding.message}",
                Position(label, finding.line, finding.column),
            )
    return None
