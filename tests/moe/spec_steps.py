"""Steps a MoE port takes because of what its spec declares against the
reference's declared spec, for tests that check a port's step set.

``moe.router_dtype``: research reads nothing about it, so a researched spec
has the spec's default (``float32``: the weight and every router computation
in float32); the MoE references keep the router weight in the model dtype
and declare ``bfloat16``. A spec that asks for another router dtype than its
reference's takes ``float32-router``, whatever the architecture.

``config-guards`` is a guard, not a feature: it makes the port refuse a
config that breaks an assumption the plan was made on (no change to what the
port computes), and a plan has it whenever research finds such assumptions.
"""

from __future__ import annotations

# steps that do not change what a port computes: identity steps and guards
IDENTITY = {"rename-classes", "set-constants", "register-model"}
IDENTITY_AND_GUARDS = IDENTITY | {"config-guards"}

# spec fields these tests do not list per architecture -> the codemod realizing them
UNLISTED = {"moe.router_dtype": "float32-router"}


def declared_changes(spec, reference_spec) -> set[str]:
    """The fields of ``UNLISTED`` on which ``spec`` differs from ``reference_spec``."""
    changed = set()
    for path in UNLISTED:
        section, name = path.split(".")
        ours, theirs = getattr(spec, section), getattr(reference_spec, section)
        if ours is not None and theirs is not None and getattr(ours, name) != getattr(theirs, name):
            changed.add(path)
    return changed


def declared_steps(spec, reference_spec) -> set[str]:
    """The codemods that ``spec`` needs against ``reference_spec`` on those fields."""
    return {UNLISTED[path] for path in declared_changes(spec, reference_spec)}
