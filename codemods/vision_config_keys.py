"""vision-config-keys: the tower's widths read from vision_config keys of other names (Qwen2-VL)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import classes_with_role, dotted, method, statements, walk
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import ANY, Realizes

COMMENT = "<-- MODEL-SPECIFIC: vision_config writes these tower fields under other names"
READER = "from_values"
MARK_FIELD = "out_hidden_size"  # the vision config's field: the merged tokens' width


@dataclass(frozen=True)
class VisionConfigKeysParams:
    keys: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "Port field -> the vision_config key it is read from, or '<key> * <key>' (an integer product).",
            "examples": [{"hidden_size": "embed_dim", "intermediate_size": "embed_dim * mlp_ratio"}],
        },
    )


def expression(source: str) -> str:
    """``embed_dim`` -> ``values["embed_dim"]``; ``a * b`` -> ``int(values["a"] * values["b"])``."""
    parts = [part.strip() for part in source.split("*")]
    read = " * ".join(f'values["{part}"]' for part in parts)
    return read if len(parts) == 1 else f"int({read})"


class VisionConfigKeys(Codemod):
    """Read the tower's widths from the ``vision_config`` keys the checkpoint writes them under.

    The reference reads the tower width, the merged width and the MLP
    intermediate size from ``vision_config``'s ``hidden_size``,
    ``out_hidden_size`` and ``intermediate_size``; Qwen2-VL writes the tower
    width as ``embed_dim``, the merged width as ``hidden_size`` and the
    intermediate size as ``embed_dim * mlp_ratio``. The vision config class's
    ``from_values`` sets the port's fields from those keys first (all read
    before any is written), the rest of the config reading unchanged.

    Precondition: a config class with an ``out_hidden_size`` field and a
    ``from_values`` classmethod starting ``values = dict(values)``.
    """

    ID = "vision-config-keys"
    REALIZES = Realizes({"vision.config_keys": ANY})
    Params = VisionConfigKeysParams
    FILES = ("config",)
    EXAMPLES = (
        Example(
            title="Qwen2-VL",
            role="config",
            path="config.py",
            params={
                "keys": {
                    "hidden_size": "embed_dim",
                    "out_hidden_size": "hidden_size",
                    "intermediate_size": "embed_dim * mlp_ratio",
                }
            },
            before="""
                @dataclass
                class Qwen3VLVisionConfig:
                    hidden_size: int = 1152
                    out_hidden_size: int = 4096

                    @classmethod
                    def from_values(cls, values, dtype, neuron_config):
                        values = dict(values)
                        return cls(**_kept(cls, values), torch_dtype=dtype, neuron_config=neuron_config)
            """,
            after="""
                @dataclass
                class Qwen3VLVisionConfig:
                    hidden_size: int = 1152
                    out_hidden_size: int = 4096

                    @classmethod
                    def from_values(cls, values, dtype, neuron_config):
                        values = dict(values)
                        # <-- MODEL-SPECIFIC: vision_config writes these tower fields under other names
                        values.update(hidden_size=values["embed_dim"], out_hidden_size=values["hidden_size"], intermediate_size=int(values["embed_dim"] * values["mlp_ratio"]))
                        return cls(**_kept(cls, values), torch_dtype=dtype, neuron_config=neuron_config)
            """,
        ),
        Example(
            title="no vision config",
            role="config",
            path="config.py",
            params={"keys": {"hidden_size": "embed_dim"}},
            before="""
                class LlamaConfig:
                    hidden_size: int = 4096
            """,
            raises="no config class with an out_hidden_size field and a from_values method",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionConfigKeysParams:
        diff = next(d for d in diffs if d.path == "vision.config_keys")
        return VisionConfigKeysParams(keys=dict(diff.target or {}))

    @classmethod
    def check_params(cls, params: VisionConfigKeysParams) -> list[str]:
        bad = [k for k, v in params.keys.items() if not all(p.strip().isidentifier() for p in v.split("*"))]
        return [f"keys: {k}: not a key or a product of keys" for k in bad] + (
            [] if params.keys else ["keys: none"]
        )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        reader = _reader(module)
        if reader is None:
            raise ctx.refuse(f"no config class with an {MARK_FIELD} field and a {READER} method")
        body = statements(reader)
        first = body[0] if body else None
        if first is None or "values = dict(values)" not in cst.Module([]).code_for_node(first):
            raise ctx.refuse(f"{READER} does not start with 'values = dict(values)'", reader, module)
        keywords = ", ".join(f"{name}={expression(source)}" for name, source in self.params.keys.items())
        new = with_comment(parse_statement(f"values.update({keywords})", module), COMMENT)
        existing = body[1] if len(body) > 1 and _is_update(body[1]) else None
        if existing is not None:
            if existing.deep_equals(new):
                return module
            return rewrite(module, {id(existing): lambda node: new})
        return rewrite(module, {id(first): lambda node: cst.FlattenSentinel([node, new])})


def _reader(module: cst.Module) -> cst.FunctionDef | None:
    for cls in classes_with_role(module, "config"):
        lines = [s for s in statements(cls) if isinstance(s, cst.SimpleStatementLine)]
        fields = {
            small.target.value
            for line in lines
            for small in line.body
            if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name)
        }
        if MARK_FIELD in fields and method(cls, READER) is not None:
            return method(cls, READER)
    return None


def _is_update(stmt: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Call) and dotted(n.func) == "values.update" for n in walk(stmt))
