"""plan.json: loading, validation and its JSON Schema."""

from autoport_cst.plan.naming import derive_class_prefix
from autoport_cst.plan.plan_file import (
    PLAN_VERSION,
    Plan,
    PlanStep,
    from_research,
    load_plan,
    parse_plan,
    plan_schema,
    plan_to_json,
)

__all__ = [
    "PLAN_VERSION",
    "Plan",
    "PlanStep",
    "derive_class_prefix",
    "from_research",
    "load_plan",
    "parse_plan",
    "plan_schema",
    "plan_to_json",
]
