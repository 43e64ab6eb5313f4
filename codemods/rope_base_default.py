"""rope-base-default: the port's default RoPE base is the one the modeling code writes."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.config import config_class, dataclass_fields
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, dotted
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, not_to


@dataclass(frozen=True)
class RopeBaseDefaultParams:
    theta: float = field(
        default=10000.0,
        metadata={"doc": "The RoPE base the modeling code writes.", "examples": (10000.0, 50000.0)},
    )


class RopeBaseDefault(Codemod):
    """Make the RoPE base the modeling code writes the config's default base.

    GPT-J and CodeGen compute their rotary frequencies from ``10000 **
    (arange(0, dim, 2) / dim)``: the base is a constant of the code, and
    their configs have no ``rope_theta``. A port reads the base from the
    config and, for a config without one, takes its config dataclass's
    default: that default becomes the code's base. In the config file, the
    default of a ``rope_theta`` field, or, for a ``rope_parameters`` field
    whose default comes from a module function (``field(default_factory=
    _default_rope_parameters)``), the ``"rope_theta"`` entry of the dict
    that function returns. A config that gives a base still reads it.

    Precondition: one config dataclass with a ``rope_theta`` default, or a
    ``rope_parameters`` field made by a module function returning a dict
    literal with a ``"rope_theta"`` entry.
    """

    ID = "rope-base-default"
    REALIZES = Realizes({"rope.theta_in_code": not_to(None)})
    Params = RopeBaseDefaultParams
    FILES = ("config",)
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="a default made by a function (llama3)",
            role="config",
            path="config.py",
            before="""
                def _default_rope_parameters() -> dict[str, Any]:
                    return {"rope_type": "default", "rope_theta": 500000.0}


                @dataclass
                class LlamaConfig:
                    rope_parameters: dict[str, Any] = field(default_factory=_default_rope_parameters)
            """,
            after="""
                def _default_rope_parameters() -> dict[str, Any]:
                    return {"rope_type": "default", "rope_theta": 10000.0}


                @dataclass
                class LlamaConfig:
                    rope_parameters: dict[str, Any] = field(default_factory=_default_rope_parameters)
            """,
        ),
        Example(
            title="a rope_theta field (qwen3)",
            role="config",
            path="config.py",
            params={"theta": 50000.0},
            before="""
                @dataclass
                class Qwen3Config:
                    rope_theta: float = 1000000.0
            """,
            after="""
                @dataclass
                class Qwen3Config:
                    rope_theta: float = 50000.0
            """,
        ),
        Example(
            title="no default base",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
            """,
            raises="no default RoPE base in LlamaConfig",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> RopeBaseDefaultParams:
        return RopeBaseDefaultParams(theta=float(target.rope.theta_in_code))

    @classmethod
    def check_params(cls, params: RopeBaseDefaultParams) -> list[str]:
        return [] if params.theta > 1 else [f"theta: a RoPE base is > 1, not {params.theta!r}"]

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        cls = config_class(module, ctx)
        default = _default_base(module, cls)
        if default is None:
            raise ctx.refuse(
                f"no default RoPE base in {cls.name.value}: expected a rope_theta field with a default, or "
                'a rope_parameters field whose default_factory returns a dict with a "rope_theta" entry',
                cls,
                module,
            )
        literal = repr(float(self.params.theta))
        if code_of(default) == literal:
            return module
        return rewrite(module, {id(default): lambda _: parse_expr(literal, module)})


def _default_base(module: cst.Module, cls: cst.ClassDef) -> cst.BaseExpression | None:
    """The expression of the config's default RoPE base."""
    fields = dataclass_fields(cls)
    theta = fields.get("rope_theta")
    if theta is not None and theta.default is not None and not theta.default_is_none:
        return theta.default
    rope = fields.get("rope_parameters")
    factory = _default_factory(rope.default) if rope is not None else None
    functions = {
        s.name.value: s
        for s in module.body
        if isinstance(s, cst.FunctionDef) and isinstance(s.body, cst.IndentedBlock)
    }
    if factory not in functions:
        return None
    for stmt in functions[factory].body.body:
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Return):
            value = stmt.body[0].value
            if isinstance(value, cst.Dict):
                for element in value.elements:
                    if (
                        isinstance(element, cst.DictElement)
                        and isinstance(element.key, cst.SimpleString)
                        and element.key.evaluated_value == "rope_theta"
                    ):
                        return element.value
    return None


def _default_factory(default: cst.BaseExpression | None) -> str | None:
    """``NAME`` of ``field(default_factory=NAME)``."""
    if not isinstance(default, cst.Call) or dotted(default.func) not in ("field", "dataclasses.field"):
        return None
    for arg in default.args:
        if (
            arg.keyword is not None
            and arg.keyword.value == "default_factory"
            and isinstance(arg.value, cst.Name)
        ):
            return arg.value.value
    return None
