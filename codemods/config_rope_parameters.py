"""config-rope-parameters: the config reads the RoPE base where transformers 5 keeps it."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.config import dataclass_fields, mentions
from autoport_cst.transform.cst.snippets import parse_statement, parse_statements
from autoport_cst.transform.edit.config_fields import prepend_to_post_init
from autoport_cst.transform.edit.tree import rewrite, with_comment

FIELD = "rope_parameters: dict | None = None"

LIFT = """
if self.rope_parameters:
    rope_parameters = self.rope_parameters
    if "rope_theta" not in rope_parameters and any(
        isinstance(value, dict) for value in rope_parameters.values()
    ):
        per_layer_type = [value for value in rope_parameters.values() if isinstance(value, dict)]
        if any(value != per_layer_type[0] for value in per_layer_type):
            raise ValueError(
                f"rope_parameters differ between layer types ({rope_parameters!r}): "
                "this config reads one set of RoPE parameters for every layer"
            )
        rope_parameters = per_layer_type[0]
    per_layer = getattr(self, "rope_layer_parameters", None) or {}
    rope_types = [value.get("rope_type", "default") for value in (rope_parameters, *per_layer.values())]
    unread = [rope_type for rope_type in rope_types if rope_type != "default"]
    if unread and not getattr(self, "rope_scaling", None):
        raise ValueError(
            f"rope_parameters rope_type {unread[0]!r} is not read by this config, which "
            + (
                "takes a scaled RoPE from rope_scaling alone (unset in this model config)"
                if "rope_scaling" in getattr(self, "__dataclass_fields__", {})
                else "computes the default RoPE from rope_theta alone"
            )
        )
    self.rope_theta = rope_parameters.get("rope_theta", self.rope_theta)
"""


class ConfigRopeParameters(Codemod):
    """Read the RoPE base from ``rope_parameters`` when the model config has
    them, as transformers 5 writes it.

    A config dataclass with a top-level ``rope_theta`` field and no
    ``rope_parameters`` keeps its default under transformers 5 (which no
    longer writes ``rope_theta`` at the top). The config gains a
    ``rope_parameters`` field, and ``__post_init__`` (added if absent) takes
    ``rope_theta`` from it. RoPE parameters given per layer type (a dict of
    dicts without a base of their own, as Olmo 3 writes them) are read as
    one set when every layer type has the same (the reference applies one
    base to every layer), and refused with a ValueError naming them when
    they differ. A RoPE type other than ``default`` there, or in the
    per-layer-type parameters rope-layer-parameters splits off before
    (``rope_layer_parameters``), is refused too, unless the config's own
    ``rope_scaling`` is set: a config class that knew only ``rope_theta``
    (and ``rope_scaling``, transformers 4's place for a scaled RoPE) would
    otherwise compute the default RoPE for a YaRN checkpoint, or for
    Gemma 3's linearly scaled global layers, without a word. A config that sets ``rope_theta`` at the top
    and has no ``rope_parameters`` reads as before. This is the fix of lint rule NRN007,
    run by ``apply`` as a repair step on a reference that needs it.
    """

    ID = "config-rope-parameters"
    PURPOSE = "repair"
    FILES = ("config",)
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="a top-level RoPE base",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class Qwen3Config:
                    rope_theta: float = 1_000_000.0
                    rope_scaling: dict | None = None

                    def __post_init__(self):
                        if self.head_dim is None:
                            self.head_dim = 128
            """,
            after="""
                @dataclass
                class Qwen3Config:
                    rope_theta: float = 1_000_000.0
                    # <-- MODEL-SPECIFIC: transformers 5 keeps the RoPE base in rope_parameters
                    rope_parameters: dict | None = None
                    rope_scaling: dict | None = None

                    def __post_init__(self):
                        if self.rope_parameters:
                            rope_parameters = self.rope_parameters
                            if "rope_theta" not in rope_parameters and any(
                                isinstance(value, dict) for value in rope_parameters.values()
                            ):
                                per_layer_type = [value for value in rope_parameters.values() if isinstance(value, dict)]
                                if any(value != per_layer_type[0] for value in per_layer_type):
                                    raise ValueError(
                                        f"rope_parameters differ between layer types ({rope_parameters!r}): "
                                        "this config reads one set of RoPE parameters for every layer"
                                    )
                                rope_parameters = per_layer_type[0]
                            per_layer = getattr(self, "rope_layer_parameters", None) or {}
                            rope_types = [value.get("rope_type", "default") for value in (rope_parameters, *per_layer.values())]
                            unread = [rope_type for rope_type in rope_types if rope_type != "default"]
                            if unread and not getattr(self, "rope_scaling", None):
                                raise ValueError(
                                    f"rope_parameters rope_type {unread[0]!r} is not read by this config, which "
                                    + (
                                        "takes a scaled RoPE from rope_scaling alone (unset in this model config)"
                                        if "rope_scaling" in getattr(self, "__dataclass_fields__", {})
                                        else "computes the default RoPE from rope_theta alone"
                                    )
                                )
                            self.rope_theta = rope_parameters.get("rope_theta", self.rope_theta)
                        if self.head_dim is None:
                            self.head_dim = 128
            """,
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        for cls in (s for s in module.body if isinstance(s, cst.ClassDef)):
            field = dataclass_fields(cls).get("rope_theta")
            if field is not None and not mentions(module, "rope_parameters"):
                module = rewrite(
                    module, {id(cls): lambda updated, module=module: self._read_parameters(updated, module)}
                )  # type: ignore[assignment]
        return module

    def _read_parameters(self, cls: cst.ClassDef, module: cst.Module) -> cst.ClassDef:
        anchor = dataclass_fields(cls)["rope_theta"].statement
        field = with_comment(
            parse_statement(FIELD, module),
            "<-- MODEL-SPECIFIC: transformers 5 keeps the RoPE base in rope_parameters",
        )
        body = list(cls.body.body)  # type: ignore[union-attr]
        body.insert(body.index(anchor) + 1, field)
        body = prepend_to_post_init(body, parse_statements(LIFT.strip("\n"), module), module)
        return cls.with_changes(body=cls.body.with_changes(body=body))
