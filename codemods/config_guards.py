"""config-guards: the port refuses a config that breaks an assumption its code was written on."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.config import config_class, method_of
from autoport_cst.transform.anatomy.config_values import CONVENTIONAL, config_values
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import walk
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.tree import insert_after, with_comment

ID = "config-guards"
CHECK = "check_assumed_config"
COMMENT = "<-- MODEL-SPECIFIC: refuse a config this port's code was not written for"
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


@dataclass(frozen=True)
class AssumedField:
    field: str = dataclasses.field(
        metadata={"doc": "Config field, dotted into a dict field (rope_parameters.factor)."}
    )
    value: Any = dataclasses.field(metadata={"doc": "The value the port was made for."})
    default: Any = dataclasses.field(
        default=None, metadata={"doc": "The value transformers takes when a config lacks the field."}
    )
    fixes: str = dataclasses.field(
        default="", metadata={"doc": "What the port's code fixes for that value (spec fields)."}
    )
    allowed: tuple[Any, ...] | None = dataclasses.field(
        default=None,
        metadata={
            "doc": "For a list of per-layer types: the entries the port handles (value is then an example)."
        },
    )
    same_as: str | None = dataclasses.field(
        default=None,
        metadata={
            "doc": "For a list of per-layer values the model uses in place of a field's (GraniteSWA's "
            "layer_rope_theta for rope_parameters.rope_theta): that field, which the port reads for every "
            "layer; each entry must equal it (value is then an example). For a single value (Falcon "
            "without multi-query: num_kv_heads same_as num_attention_heads): the field it must equal, "
            "both read by the port."
        },
    )
    also: tuple[Any, ...] = dataclasses.field(
        default=(),
        metadata={
            "doc": "For a top-level field made for None: the values the model's own code sets in its place "
            "(Falcon-40B's layers write num_ln_in_parallel_attn = 2, and a saved config states it): the same "
            "model, accepted as the value."
        },
    )


@dataclass(frozen=True)
class ConfigGuardsParams:
    assumed: tuple[AssumedField, ...] = dataclasses.field(
        default=(), metadata={"doc": "The config values the port's code was written for."}
    )


class ConfigGuards(Codemod):
    """Make the port refuse a model config that differs, in a field its code
    does not read, from the config it was planned on.

    A port is registered for an architecture, but a codemod realizes a
    feature once, for the value the planned config has: a port planned on
    ``attention_bias = false`` has no bias parameters, whatever a later
    config says. The research varies every config field the transformers
    code reads and lists those whose change the port cannot follow at run
    time (``autoport_cst.plan.assumptions``); ``plan`` and ``port`` add this
    step with them. Config file: a module function ``check_assumed_config``
    holds the fields, the value the port was made for, the value
    transformers takes when a config lacks the field, and what the port's
    code fixes; ``from_configs`` calls it on the model config's values right
    after reading them, so a config that breaks an assumption raises
    ``ValueError`` naming the field and both values instead of building a
    wrong model. A field made for None that the model's own code sets on its
    config (Falcon-40B's decoder layers write ``num_ln_in_parallel_attn = 2``,
    which any ``save_pretrained`` of the loaded model then states) lists that
    value under ``also``: a config holding it is the model the port was made
    for, not another.

    Preconditions: one config dataclass whose ``from_configs`` binds the
    model config's values to a local on every path before the dataclass is
    built: ``values``, or a name assigned ``<config>.to_dict()`` or
    ``dict(<config>)`` in some branch, as the production packages'
    ``config_dict`` (``autoport_cst.transform.anatomy.config_values``);
    every field is a dotted identifier and every value a JSON scalar.
    """

    ID = ID
    PURPOSE = "every port planned by research"
    Params = ConfigGuardsParams
    FILES = ("config",)
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="a port made on a config without attention biases",
            role="config",
            path="config.py",
            params={
                "assumed": [
                    {
                        "field": "attention_bias",
                        "value": False,
                        "default": False,
                        "fixes": "attention.qkv_bias, attention.o_bias",
                    }
                ]
            },
            before="""
                @dataclass
                class Gemma2Config:
                    hidden_size: int = 2048

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        if hasattr(hf_config, "to_dict"):
                            values = hf_config.to_dict()
                        else:
                            values = dict(hf_config)
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
            after="""
                def check_assumed_config(values: dict) -> None:
                    \"\"\"Refuse a model config that differs from the one this port was made for
                    in a field its code does not read (written by autoport-cst config-guards).

                    Each entry: the field (dotted into a dict field), the value the port was
                    made for, the value transformers takes when a config lacks the field, the
                    entries it handles when the field is a list of per-layer types, and what
                    the port's code fixes for that value.\"\"\"
                    assumed = (
                        ("attention_bias", False, False, None, "attention.qkv_bias, attention.o_bias"),
                    )
                    for name, expected, default, allowed, fixes in assumed:
                        value = values
                        for key in name.split("."):
                            value = value.get(key, default) if isinstance(value, dict) else default
                        if allowed is not None:
                            wrong = [entry for entry in value or () if entry not in allowed]
                            if wrong:
                                raise ValueError(
                                    f"config field {name} holds {wrong[0]!r}, but this port was made for {name} entries in "
                                    f"{list(allowed)!r} ({fixes} fixed in its code): port this checkpoint again"
                                )
                        elif value != expected:
                            raise ValueError(
                                f"config field {name} is {value!r}, but this port was made for {name} = {expected!r} "
                                f"({fixes} fixed in its code): port this checkpoint again"
                            )


                @dataclass
                class Gemma2Config:
                    hidden_size: int = 2048

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        if hasattr(hf_config, "to_dict"):
                            values = hf_config.to_dict()
                        else:
                            values = dict(hf_config)
                        # <-- MODEL-SPECIFIC: refuse a config this port's code was not written for
                        check_assumed_config(values)
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
        ),
        Example(
            title="a port made on full attention only, run again: the guards are replaced, called once",
            role="config",
            path="config.py",
            params={
                "assumed": [
                    {
                        "field": "attention_bias",
                        "value": False,
                        "default": False,
                        "fixes": "attention.qkv_bias, attention.o_bias",
                    },
                    {
                        "field": "layer_types",
                        "value": ["full_attention", "full_attention"],
                        "allowed": ["full_attention"],
                        "fixes": "attention.sliding_window",
                    },
                ]
            },
            before="""
                def check_assumed_config(values: dict) -> None:
                    \"\"\"Refuse a model config that differs from the one this port was made for
                    in a field its code does not read (written by autoport-cst config-guards).

                    Each entry: the field (dotted into a dict field), the value the port was
                    made for, the value transformers takes when a config lacks the field, the
                    entries it handles when the field is a list of per-layer types, and what
                    the port's code fixes for that value.\"\"\"
                    assumed = (
                        ("attention_bias", False, False, None, "attention.qkv_bias, attention.o_bias"),
                    )
                    for name, expected, default, allowed, fixes in assumed:
                        value = values
                        for key in name.split("."):
                            value = value.get(key, default) if isinstance(value, dict) else default
                        if allowed is not None:
                            wrong = [entry for entry in value or () if entry not in allowed]
                            if wrong:
                                raise ValueError(
                                    f"config field {name} holds {wrong[0]!r}, but this port was made for {name} entries in "
                                    f"{list(allowed)!r} ({fixes} fixed in its code): port this checkpoint again"
                                )
                        elif value != expected:
                            raise ValueError(
                                f"config field {name} is {value!r}, but this port was made for {name} = {expected!r} "
                                f"({fixes} fixed in its code): port this checkpoint again"
                            )


                @dataclass
                class Gemma2Config:
                    hidden_size: int = 2048

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        if hasattr(hf_config, "to_dict"):
                            values = hf_config.to_dict()
                        else:
                            values = dict(hf_config)
                        # <-- MODEL-SPECIFIC: refuse a config this port's code was not written for
                        check_assumed_config(values)
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
            after="""
                def check_assumed_config(values: dict) -> None:
                    \"\"\"Refuse a model config that differs from the one this port was made for
                    in a field its code does not read (written by autoport-cst config-guards).

                    Each entry: the field (dotted into a dict field), the value the port was
                    made for, the value transformers takes when a config lacks the field, the
                    entries it handles when the field is a list of per-layer types, and what
                    the port's code fixes for that value.\"\"\"
                    assumed = (
                        ("attention_bias", False, False, None, "attention.qkv_bias, attention.o_bias"),
                        ("layer_types", ['full_attention', 'full_attention'], None, ("full_attention",), "attention.sliding_window"),
                    )
                    for name, expected, default, allowed, fixes in assumed:
                        value = values
                        for key in name.split("."):
                            value = value.get(key, default) if isinstance(value, dict) else default
                        if allowed is not None:
                            wrong = [entry for entry in value or () if entry not in allowed]
                            if wrong:
                                raise ValueError(
                                    f"config field {name} holds {wrong[0]!r}, but this port was made for {name} entries in "
                                    f"{list(allowed)!r} ({fixes} fixed in its code): port this checkpoint again"
                                )
                        elif value != expected:
                            raise ValueError(
                                f"config field {name} is {value!r}, but this port was made for {name} = {expected!r} "
                                f"({fixes} fixed in its code): port this checkpoint again"
                            )


                @dataclass
                class Gemma2Config:
                    hidden_size: int = 2048

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        if hasattr(hf_config, "to_dict"):
                            values = hf_config.to_dict()
                        else:
                            values = dict(hf_config)
                        # <-- MODEL-SPECIFIC: refuse a config this port's code was not written for
                        check_assumed_config(values)
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
        ),
        Example(
            title="a model that rotates each layer by its entry of a per-layer list (GraniteSWA), ported to one base",
            role="config",
            path="config.py",
            params={
                "assumed": [
                    {
                        "field": "layer_rope_theta",
                        "value": [10000.0, 10000.0],
                        "same_as": "rope_parameters.rope_theta",
                        "fixes": "rope.theta",
                    }
                ]
            },
            before="""
                @dataclass
                class GraniteSwaConfig:
                    hidden_size: int = 2048

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        values = hf_config.to_dict()
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
            after="""
                def check_assumed_config(values: dict) -> None:
                    \"\"\"Refuse a model config that differs from the one this port was made for
                    in a field its code does not read (written by autoport-cst config-guards).

                    Each entry: the field (dotted into a dict field), the value the port was
                    made for, the value transformers takes when a config lacks the field, the
                    entries it handles when the field is a list of per-layer types, and what
                    the port's code fixes for that value.\"\"\"
                    assumed = (
                    )
                    for name, expected, default, allowed, fixes in assumed:
                        value = values
                        for key in name.split("."):
                            value = value.get(key, default) if isinstance(value, dict) else default
                        if allowed is not None:
                            wrong = [entry for entry in value or () if entry not in allowed]
                            if wrong:
                                raise ValueError(
                                    f"config field {name} holds {wrong[0]!r}, but this port was made for {name} entries in "
                                    f"{list(allowed)!r} ({fixes} fixed in its code): port this checkpoint again"
                                )
                        elif value != expected:
                            raise ValueError(
                                f"config field {name} is {value!r}, but this port was made for {name} = {expected!r} "
                                f"({fixes} fixed in its code): port this checkpoint again"
                            )
                    # per-layer values the model uses in place of a field this port reads for every layer
                    per_layer = (
                        ("layer_rope_theta", "rope_parameters.rope_theta", "rope.theta"),
                    )
                    for name, field_name, fixes in per_layer:
                        target = values
                        for key in field_name.split("."):
                            target = target.get(key) if isinstance(target, dict) else None
                        wrong = [entry for entry in values.get(name) or () if entry != target]
                        if wrong:
                            raise ValueError(
                                f"config field {name} holds {wrong[0]!r}, but this port computes every layer with "
                                f"{field_name} = {target!r} ({fixes} read from it): a per-layer value that differs "
                                "is not supported"
                            )


                @dataclass
                class GraniteSwaConfig:
                    hidden_size: int = 2048

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        values = hf_config.to_dict()
                        # <-- MODEL-SPECIFIC: refuse a config this port's code was not written for
                        check_assumed_config(values)
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
        ),
        Example(
            title="the production packages' from_configs: the config's dict bound in each branch of its type",
            role="config",
            path="config.py",
            params={
                "assumed": [
                    {"field": "use_qk_norm", "value": True, "default": True, "fixes": "attention.qk_norm"}
                ]
            },
            before="""
                @dataclass
                class MixtralConfig:
                    hidden_size: int = 4096

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config):
                        if isinstance(hf_config, str):
                            with open(hf_config) as handle:
                                config_dict = json.load(handle)
                        elif isinstance(hf_config, PretrainedConfig):
                            if getattr(hf_config, "quantization_config", 0) is None:
                                del hf_config.quantization_config
                                config_dict = hf_config.to_dict()
                                hf_config.quantization_config = None
                            else:
                                config_dict = hf_config.to_dict()
                        else:
                            config_dict = hf_config

                        kept = {key: value for key, value in config_dict.items() if key in cls.__dataclass_fields__}
                        kept["neuron_config"] = neuron_config
                        return cls(**kept)
            """,
            after="""
                def check_assumed_config(values: dict) -> None:
                    \"\"\"Refuse a model config that differs from the one this port was made for
                    in a field its code does not read (written by autoport-cst config-guards).

                    Each entry: the field (dotted into a dict field), the value the port was
                    made for, the value transformers takes when a config lacks the field, the
                    entries it handles when the field is a list of per-layer types, and what
                    the port's code fixes for that value.\"\"\"
                    assumed = (
                        ("use_qk_norm", True, True, None, "attention.qk_norm"),
                    )
                    for name, expected, default, allowed, fixes in assumed:
                        value = values
                        for key in name.split("."):
                            value = value.get(key, default) if isinstance(value, dict) else default
                        if allowed is not None:
                            wrong = [entry for entry in value or () if entry not in allowed]
                            if wrong:
                                raise ValueError(
                                    f"config field {name} holds {wrong[0]!r}, but this port was made for {name} entries in "
                                    f"{list(allowed)!r} ({fixes} fixed in its code): port this checkpoint again"
                                )
                        elif value != expected:
                            raise ValueError(
                                f"config field {name} is {value!r}, but this port was made for {name} = {expected!r} "
                                f"({fixes} fixed in its code): port this checkpoint again"
                            )


                @dataclass
                class MixtralConfig:
                    hidden_size: int = 4096

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config):
                        if isinstance(hf_config, str):
                            with open(hf_config) as handle:
                                config_dict = json.load(handle)
                        elif isinstance(hf_config, PretrainedConfig):
                            if getattr(hf_config, "quantization_config", 0) is None:
                                del hf_config.quantization_config
                                config_dict = hf_config.to_dict()
                                hf_config.quantization_config = None
                            else:
                                config_dict = hf_config.to_dict()
                        else:
                            config_dict = hf_config
                        # <-- MODEL-SPECIFIC: refuse a config this port's code was not written for
                        check_assumed_config(config_dict)

                        kept = {key: value for key, value in config_dict.items() if key in cls.__dataclass_fields__}
                        kept["neuron_config"] = neuron_config
                        return cls(**kept)
            """,
        ),
        Example(
            title="a port made on Falcon-40B's config, which leaves a field None that the model's layers set to 2",
            role="config",
            path="config.py",
            params={
                "assumed": [
                    {
                        "field": "new_decoder_architecture",
                        "value": True,
                        "default": False,
                        "fixes": "residual.parallel",
                    },
                    {
                        "field": "num_ln_in_parallel_attn",
                        "value": None,
                        "default": None,
                        "fixes": "norm.placement",
                        "also": [2],
                    },
                ]
            },
            before="""
                @dataclass
                class FalconConfig:
                    hidden_size: int = 8192

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        values = hf_config.to_dict()
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
            after="""
                def check_assumed_config(values: dict) -> None:
                    \"\"\"Refuse a model config that differs from the one this port was made for
                    in a field its code does not read (written by autoport-cst config-guards).

                    Each entry: the field (dotted into a dict field), the value the port was
                    made for, the value transformers takes when a config lacks the field, the
                    entries it handles when the field is a list of per-layer types, and what
                    the port's code fixes for that value.\"\"\"
                    # values the model's own code sets on its config where a field made for None holds None
                    written = (
                        ("num_ln_in_parallel_attn", (2,)),
                    )
                    values = dict(values)
                    for name, also in written:
                        if values.get(name) in also:
                            values[name] = None
                    assumed = (
                        ("new_decoder_architecture", True, False, None, "residual.parallel"),
                        ("num_ln_in_parallel_attn", None, None, None, "norm.placement"),
                    )
                    for name, expected, default, allowed, fixes in assumed:
                        value = values
                        for key in name.split("."):
                            value = value.get(key, default) if isinstance(value, dict) else default
                        if allowed is not None:
                            wrong = [entry for entry in value or () if entry not in allowed]
                            if wrong:
                                raise ValueError(
                                    f"config field {name} holds {wrong[0]!r}, but this port was made for {name} entries in "
                                    f"{list(allowed)!r} ({fixes} fixed in its code): port this checkpoint again"
                                )
                        elif value != expected:
                            raise ValueError(
                                f"config field {name} is {value!r}, but this port was made for {name} = {expected!r} "
                                f"({fixes} fixed in its code): port this checkpoint again"
                            )


                @dataclass
                class FalconConfig:
                    hidden_size: int = 8192

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        values = hf_config.to_dict()
                        # <-- MODEL-SPECIFIC: refuse a config this port's code was not written for
                        check_assumed_config(values)
                        names = {f.name for f in fields(cls)}
                        return cls(**{k: v for k, v in values.items() if k in names})
            """,
        ),
        Example(
            title="a config dict some branch leaves unbound",
            role="config",
            path="config.py",
            params={"assumed": [{"field": "use_qk_norm", "value": True}]},
            before="""
                @dataclass
                class MixtralConfig:
                    hidden_size: int = 4096

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config):
                        if isinstance(hf_config, dict):
                            config_dict = hf_config
                        elif hasattr(hf_config, "to_dict"):
                            config_dict = hf_config.to_dict()
                        return cls(**config_dict)
            """,
            raises="config-guards: MixtralConfig.from_configs binds 'config_dict' on some paths only",
        ),
        Example(
            title="from_configs without a values dict",
            role="config",
            path="config.py",
            params={"assumed": [{"field": "hidden_activation", "value": "gelu_pytorch_tanh"}]},
            before="""
                @dataclass
                class Gemma2Config:
                    hidden_size: int = 2048

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        return cls(hidden_size=hf_config.hidden_size)
            """,
            raises="config-guards: Gemma2Config.from_configs binds no local to the model config's values",
        ),
    )

    @classmethod
    def check_params(cls, params: ConfigGuardsParams) -> list[str]:
        problems = []
        for index, entry in enumerate(params.assumed):
            if not _FIELD.fullmatch(entry.field):
                problems.append(f"assumed[{index}].field {entry.field!r} is not a dotted identifier")
            if entry.same_as is not None and not _FIELD.fullmatch(entry.same_as):
                problems.append(f"assumed[{index}].same_as {entry.same_as!r} is not a dotted identifier")
            # a list of per-layer types and the entries it may hold, or of values equal to another field
            listed = entry.allowed is not None or (
                entry.same_as is not None and isinstance(entry.value, list)
            )
            values = [entry.default, *(entry.allowed or ())]
            values += list(entry.value) if listed and isinstance(entry.value, list) else [entry.value]
            if not all(_scalar(v) for v in values) or (listed and not isinstance(entry.value, list)):
                problems.append(
                    f"assumed[{index}]: value and default must be JSON scalars (with allowed: value a list of them)"
                )
            if entry.also and (entry.value is not None or "." in entry.field or listed or entry.same_as):
                problems.append(f"assumed[{index}].also: only for a top-level field made for None")
            if not all(_scalar(v) and v is not None for v in entry.also):
                problems.append(f"assumed[{index}].also: JSON scalars other than null")
        return problems

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if not self.params.assumed:
            return module
        cls = config_class(module, ctx)
        method = method_of(cls, "from_configs")
        if method is None:
            raise ctx.precondition(f"{ID}: {cls.name.value} has no from_configs", cls, module)
        if not _calls_check(method):
            found = config_values(method)
            if found is None:
                raise ctx.precondition(
                    f"{ID}: {cls.name.value}.from_configs binds no local to the model config's values "
                    f"({CONVENTIONAL!r}, or a name assigned <config>.to_dict() or dict(<config>))",
                    method,
                    module,
                )
            if found.statement is None:
                raise ctx.precondition(
                    f"{ID}: {cls.name.value}.from_configs binds {found.name!r} on some paths only: "
                    "the guard would read it unbound",
                    found.partial or method,
                    module,
                )
            call = with_comment(parse_statement(f"{CHECK}({found.name})", module), COMMENT)
            module = insert_after(module, found.statement, [call])  # type: ignore[assignment]
        return add_functions(module, [self._function()], replace=True)

    def _function(self) -> str:
        entries = "".join(
            f"        ({_literal(e.field)}, {_literal(e.value)}, {_literal(e.default)}, {_allowed(e.allowed)}, "
            f"{_literal(e.fixes)}),\n"
            for e in self.params.assumed
            if e.same_as is None
        )
        per_layer = "".join(
            f"        ({_literal(e.field)}, {_literal(e.same_as)}, {_literal(e.fixes)}),\n"
            for e in self.params.assumed
            if e.same_as is not None and isinstance(e.value, list)
        )
        related = "".join(
            f"        ({_literal(e.field)}, {_literal(e.same_as)}, {_literal(e.fixes)}),\n"
            for e in self.params.assumed
            if e.same_as is not None and not isinstance(e.value, list)
        )
        written = "".join(
            f"        ({_literal(e.field)}, {_allowed(tuple(e.also))}),\n"
            for e in self.params.assumed
            if e.also
        )
        function = FUNCTION.replace("{entries}", entries)
        if written:
            function = function.replace(
                "    assumed = (\n", WRITTEN.replace("{entries}", written) + "    assumed = (\n", 1
            )
        function += PER_LAYER.replace("{entries}", per_layer) if per_layer else ""
        return function + RELATED.replace("{entries}", related) if related else function


FUNCTION = '''
def check_assumed_config(values: dict) -> None:
    """Refuse a model config that differs from the one this port was made for
    in a field its code does not read (written by autoport-cst config-guards).

    Each entry: the field (dotted into a dict field), the value the port was
    made for, the value transformers takes when a config lacks the field, the
    entries it handles when the field is a list of per-layer types, and what
    the port's code fixes for that value."""
    assumed = (
{entries}    )
    for name, expected, default, allowed, fixes in assumed:
        value = values
        for key in name.split("."):
            value = value.get(key, default) if isinstance(value, dict) else default
        if allowed is not None:
            wrong = [entry for entry in value or () if entry not in allowed]
            if wrong:
                raise ValueError(
                    f"config field {name} holds {wrong[0]!r}, but this port was made for {name} entries in "
                    f"{list(allowed)!r} ({fixes} fixed in its code): port this checkpoint again"
                )
        elif value != expected:
            raise ValueError(
                f"config field {name} is {value!r}, but this port was made for {name} = {expected!r} "
                f"({fixes} fixed in its code): port this checkpoint again"
            )
'''

# put before FUNCTION's checks for fields made for None that the model's own code sets
WRITTEN = """    # values the model's own code sets on its config where a field made for None holds None
    written = (
{entries}    )
    values = dict(values)
    for name, also in written:
        if values.get(name) in also:
            values[name] = None
"""

# appended to FUNCTION's body for lists whose entries must equal a field the port reads
PER_LAYER = """    # per-layer values the model uses in place of a field this port reads for every layer
    per_layer = (
{entries}    )
    for name, field_name, fixes in per_layer:
        target = values
        for key in field_name.split("."):
            target = target.get(key) if isinstance(target, dict) else None
        wrong = [entry for entry in values.get(name) or () if entry != target]
        if wrong:
            raise ValueError(
                f"config field {name} holds {wrong[0]!r}, but this port computes every layer with "
                f"{field_name} = {target!r} ({fixes} read from it): a per-layer value that differs "
                "is not supported"
            )
"""

# appended to FUNCTION's body for fields that must equal another (a relation the model needs)
RELATED = """    # fields the model needs equal to another field (each read by the port)
    related = (
{entries}    )
    for name, field_name, fixes in related:
        pair = []
        for dotted in (name, field_name):
            value = values
            for key in dotted.split("."):
                value = value.get(key) if isinstance(value, dict) else None
            pair.append(value)
        if pair[0] != pair[1]:
            raise ValueError(
                f"config field {name} is {pair[0]!r}, but this port needs {name} equal to {field_name} "
                f"(here {pair[1]!r}; {fixes} otherwise): port this checkpoint again"
            )
"""


def _allowed(values: tuple[Any, ...] | None) -> str:
    if values is None:
        return "None"
    return "(" + "".join(f"{_literal(v)}, " for v in values).rstrip(" ") + ")"


def _literal(value: Any) -> str:
    """Python source of a JSON scalar, strings in double quotes."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _calls_check(method: cst.FunctionDef) -> bool:
    return any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == CHECK
        for node in walk(method)
    )
