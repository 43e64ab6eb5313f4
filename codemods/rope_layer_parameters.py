"""rope-layer-parameters: RoPE base, type and scaling per attention layer type (Gemma 3)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.attention import kernel_sites
from autoport_cst.transform.anatomy.classes import one_class, require_method
from autoport_cst.transform.anatomy.config import config_class, config_fields
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    find_self_assignment,
    method,
    self_assignment,
    self_attr,
    statements,
    string_text,
    walk,
)
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions, parse_method
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.tree import add_edit, followed_by, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "rope-layer-parameters"

CONFIG_FIELDS = [
    (
        "rope_layer_parameters: dict[str, dict[str, Any]] | None = None",
        "RoPE base, type and scaling parameters per attention layer type, when they differ",
    ),
    ("layer_types: list[str] | None = None", ""),
]

# config dataclass: the view one layer type's rotary embedding is built from
ROPE_CONFIG_METHOD = '''
def rope_config(self, layer_type: str | None) -> "{cls}":
    """This config as the rotary embedding of one attention layer type reads
    it: ``rope_theta`` and ``rope_scaling`` (RoPE type and scaling parameters)
    from ``rope_layer_parameters[layer_type]``. Itself when one RoPE serves
    every layer."""
    if layer_type is None or not self.rope_layer_parameters:
        return self
    parameters = dict(self.rope_layer_parameters[layer_type])
    rope_theta = parameters.pop("rope_theta", self.rope_theta)
    return replace(self, rope_theta=rope_theta, rope_scaling=parameters, rope_layer_parameters=None)
'''

# a config keeping the checkpoint's rope_parameters: the split, and each type's view
SPLIT_PARAMETERS = """
if self.rope_parameters and all(isinstance(value, dict) for value in self.rope_parameters.values()):
    self.rope_layer_parameters = {key: dict(value) for key, value in self.rope_parameters.items()}
    self.rope_parameters = dict(next(iter(self.rope_layer_parameters.values())))
"""

PARAMETERS_CONFIG_METHOD = '''
def rope_config(self, layer_type: str | None) -> "{cls}":
    """This config as the rotary embedding of one attention layer type reads
    it: ``rope_parameters`` (RoPE base, type and scaling parameters) from
    ``rope_layer_parameters[layer_type]``. Itself when one RoPE serves every
    layer."""
    if layer_type is None or not self.rope_layer_parameters:
        return self
    return replace(self, rope_parameters=dict(self.rope_layer_parameters[layer_type]), rope_layer_parameters=None)
'''

LAYER_TYPES_FUNCTION = '''
def _rope_layer_types(config) -> list[str | None]:
    """Each layer's attention type (``config.layer_types``), the key of its RoPE
    parameters in ``config.rope_layer_parameters``; None for every layer when
    one RoPE serves them all."""
    if not config.rope_layer_parameters:
        return [None] * config.num_hidden_layers
    if config.layer_types is None:
        raise ValueError("RoPE parameters per layer type (rope_layer_parameters) need layer_types")
    missing = sorted(set(config.layer_types) - set(config.rope_layer_parameters))
    if missing:
        raise ValueError(f"no RoPE parameters for layer type(s) {missing}")
    return list(config.layer_types)
'''

INIT = """
self.rope_layer_types = _rope_layer_types({config})
self.layer_rotary_embs = nn.ModuleDict(
    {{
        layer_type: {rotary}({config}.rope_config(layer_type))
        for layer_type in sorted(set(self.rope_layer_types) - {{None}})
    }}
)
"""

BY_TYPE = "rope_by_layer_type"
PER_LAYER = "layer_position_embeddings"
INDEX = "layer_idx"

FORWARD = """
{by_type} = {{
    layer_type: rotary({arguments})
    for layer_type, rotary in self.layer_rotary_embs.items()
}}
{per_layer} = [
    {by_type}.get(layer_type, {embeddings}) for layer_type in self.rope_layer_types
]
"""


class RopeLayerParameters(Codemod):
    """RoPE that differs per attention layer type: each layer rotates with its own type's base, type and scaling (Gemma 3).

    Gemma 3 keys ``rope_parameters`` by attention layer type: sliding layers
    use one RoPE base (and type), full-attention layers another.

    Config file: the dataclass gains ``rope_layer_parameters`` (layer type ->
    that type's ``rope_theta``, ``rope_type`` and scaling keys) and
    ``layer_types``; ``from_configs`` keeps the per-type parameters instead of
    raising when they differ (``rope_theta`` / ``rope_scaling`` still hold one
    type's, the fallback for a layer without a type); a ``rope_config(layer_type)``
    method returns the config as that type's rotary embedding reads it (a
    ``dataclasses.replace`` copy with the type's ``rope_theta`` and
    ``rope_scaling``), so the rotary class itself is unchanged and every RoPE
    variant it implements works per type.

    Model file, backbone (``<Prefix>Model``): ``__init__`` keeps each layer's
    type (``_rope_layer_types(config)``, added to the module: ``config.layer_types``,
    checked against the per-type parameters; all None with one RoPE) and builds
    one rotary embedding per type in use (``self.layer_rotary_embs``, from
    ``config.rope_config(type)``) next to ``self.rotary_emb``; ``forward``
    computes each type's ``(cos, sin)`` with the same arguments as the
    model-wide one and passes every layer the pair of its own type (the loop
    over the layers is enumerated). Both attention paths take the layer's pair
    as before, so prefill and decode rotate alike.

    Preconditions: a config ``from_configs`` that splits per-type RoPE
    parameters (``sets = list(rope.values())``) and raises ``ValueError`` when
    they differ; a backbone whose ``__init__`` builds the rotary embedding
    (``self.rotary_emb = <Prefix>RotaryEmbedding(config)``) and whose
    ``forward`` computes the step's embeddings from it and passes them to each
    layer in a loop over the layers.
    """

    ID = ID
    REALIZES = Realizes({"rope.layer_parameters": not_to(None)})
    Params = NoParams
    NEEDS_REAL_MODEL = True
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="one (cos, sin) per layer type, each layer gets its own type's",
            before="""
                class Gemma3Model(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.norm = Gemma3RMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.rotary_emb = Gemma3RotaryEmbedding(config)

                    def forward(self, input_ids, positions, attn_metadata=None):
                        hidden_states = self.embed_tokens(input_ids)
                        position_embeddings = self.rotary_emb(
                            positions, device=hidden_states.device, dtype=hidden_states.dtype
                        )
                        for layer in self.layers:
                            hidden_states = layer(hidden_states, positions, position_embeddings, attn_metadata)
                        return self.norm(hidden_states)
            """,
            after='''
                def _rope_layer_types(config) -> list[str | None]:
                    """Each layer's attention type (``config.layer_types``), the key of its RoPE
                    parameters in ``config.rope_layer_parameters``; None for every layer when
                    one RoPE serves them all."""
                    if not config.rope_layer_parameters:
                        return [None] * config.num_hidden_layers
                    if config.layer_types is None:
                        raise ValueError("RoPE parameters per layer type (rope_layer_parameters) need layer_types")
                    missing = sorted(set(config.layer_types) - set(config.rope_layer_parameters))
                    if missing:
                        raise ValueError(f"no RoPE parameters for layer type(s) {missing}")
                    return list(config.layer_types)


                class Gemma3Model(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.norm = Gemma3RMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.rotary_emb = Gemma3RotaryEmbedding(config)
                        # <-- MODEL-SPECIFIC: RoPE per attention layer type: each layer's type, one rotary embedding per type
                        self.rope_layer_types = _rope_layer_types(config)
                        self.layer_rotary_embs = nn.ModuleDict(
                            {
                                layer_type: Gemma3RotaryEmbedding(config.rope_config(layer_type))
                                for layer_type in sorted(set(self.rope_layer_types) - {None})
                            }
                        )

                    def forward(self, input_ids, positions, attn_metadata=None):
                        hidden_states = self.embed_tokens(input_ids)
                        position_embeddings = self.rotary_emb(
                            positions, device=hidden_states.device, dtype=hidden_states.dtype
                        )
                        # <-- MODEL-SPECIFIC: each layer type's (cos, sin); every layer gets the pair of its own type
                        rope_by_layer_type = {
                            layer_type: rotary(positions, device=hidden_states.device, dtype=hidden_states.dtype)
                            for layer_type, rotary in self.layer_rotary_embs.items()
                        }
                        layer_position_embeddings = [
                            rope_by_layer_type.get(layer_type, position_embeddings) for layer_type in self.rope_layer_types
                        ]
                        for layer_idx, layer in enumerate(self.layers):
                            hidden_states = layer(hidden_states, positions, layer_position_embeddings[layer_idx], attn_metadata)
                        return self.norm(hidden_states)
            ''',
        ),
        Example(
            title="the config keeps the per-type parameters and gives each type its view",
            role="config",
            path="config.py",
            before="""
                from dataclasses import dataclass, fields


                @dataclass
                class Gemma3Config:
                    rope_theta: float = 10000.0
                    rope_scaling: dict[str, Any] | None = None
                    torch_dtype: torch.dtype = torch.bfloat16

                    def __post_init__(self) -> None:
                        pass

                    @classmethod
                    def from_configs(cls, hf_config):
                        values = dict(hf_config)
                        rope = values.get("rope_parameters") or values.get("rope_scaling")
                        if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
                            sets = list(rope.values())
                            if any(s != sets[0] for s in sets):
                                raise ValueError(f"RoPE parameters differ per layer type ({sorted(rope)}): not supported")
                            rope = sets[0]
                        if isinstance(rope, dict):
                            values["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
                        return cls(**values)
            """,
            after='''
                from dataclasses import dataclass, fields, replace


                @dataclass
                class Gemma3Config:
                    rope_theta: float = 10000.0
                    rope_scaling: dict[str, Any] | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    layer_types: list[str] | None = None
                    # RoPE base, type and scaling parameters per attention layer type, when they differ
                    rope_layer_parameters: dict[str, dict[str, Any]] | None = None
                    torch_dtype: torch.dtype = torch.bfloat16

                    def __post_init__(self) -> None:
                        pass

                    # <-- MODEL-SPECIFIC: RoPE per attention layer type
                    def rope_config(self, layer_type: str | None) -> "Gemma3Config":
                        """This config as the rotary embedding of one attention layer type reads
                        it: ``rope_theta`` and ``rope_scaling`` (RoPE type and scaling parameters)
                        from ``rope_layer_parameters[layer_type]``. Itself when one RoPE serves
                        every layer."""
                        if layer_type is None or not self.rope_layer_parameters:
                            return self
                        parameters = dict(self.rope_layer_parameters[layer_type])
                        rope_theta = parameters.pop("rope_theta", self.rope_theta)
                        return replace(self, rope_theta=rope_theta, rope_scaling=parameters, rope_layer_parameters=None)

                    @classmethod
                    def from_configs(cls, hf_config):
                        values = dict(hf_config)
                        rope = values.get("rope_parameters") or values.get("rope_scaling")
                        if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
                            sets = list(rope.values())
                            if any(s != sets[0] for s in sets):
                                # <-- MODEL-SPECIFIC: RoPE per attention layer type: every type's parameters are kept
                                values["rope_layer_parameters"] = {key: dict(value) for key, value in rope.items()}
                            rope = sets[0]
                        if isinstance(rope, dict):
                            values["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
                        return cls(**values)
            ''',
        ),
        Example(
            title="a config keeping the checkpoint's rope_parameters (real vllm_neuron llama3 shape)",
            role="config",
            path="config.py",
            before="""
                from dataclasses import dataclass, field


                @dataclass
                class LlamaConfig:
                    head_dim: int = 64
                    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 500000.0})
                    torch_dtype: torch.dtype = torch.bfloat16

                    def __post_init__(self):
                        if self.head_dim is None:
                            self.head_dim = self.hidden_size // self.num_attention_heads

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        config_dict = hf_config.to_dict()
                        field_names = {f.name for f in cls.__dataclass_fields__.values()}
                        return cls(**{k: v for k, v in config_dict.items() if k in field_names})
            """,
            after='''
                from dataclasses import dataclass, field, replace
                from typing import Any


                @dataclass
                class LlamaConfig:
                    head_dim: int = 64
                    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 500000.0})
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    layer_types: list[str] | None = None
                    # RoPE base, type and scaling parameters per attention layer type, when they differ
                    rope_layer_parameters: dict[str, dict[str, Any]] | None = None
                    torch_dtype: torch.dtype = torch.bfloat16

                    def __post_init__(self):
                        # <-- MODEL-SPECIFIC: RoPE per attention layer type: parameters keyed by type are kept per type
                        if self.rope_parameters and all(isinstance(value, dict) for value in self.rope_parameters.values()):
                            self.rope_layer_parameters = {key: dict(value) for key, value in self.rope_parameters.items()}
                            self.rope_parameters = dict(next(iter(self.rope_layer_parameters.values())))
                        if self.head_dim is None:
                            self.head_dim = self.hidden_size // self.num_attention_heads

                    # <-- MODEL-SPECIFIC: RoPE per attention layer type
                    def rope_config(self, layer_type: str | None) -> "LlamaConfig":
                        """This config as the rotary embedding of one attention layer type reads
                        it: ``rope_parameters`` (RoPE base, type and scaling parameters) from
                        ``rope_layer_parameters[layer_type]``. Itself when one RoPE serves every
                        layer."""
                        if layer_type is None or not self.rope_layer_parameters:
                            return self
                        return replace(self, rope_parameters=dict(self.rope_layer_parameters[layer_type]), rope_layer_parameters=None)

                    @classmethod
                    def from_configs(cls, hf_config, neuron_config=None):
                        config_dict = hf_config.to_dict()
                        field_names = {f.name for f in cls.__dataclass_fields__.values()}
                        return cls(**{k: v for k, v in config_dict.items() if k in field_names})
            ''',
        ),
        Example(
            title="the layers must take the step's embeddings in a loop",
            before="""
                class Gemma3Model(nn.Module):
                    def __init__(self, config):
                        self.rotary_emb = Gemma3RotaryEmbedding(config)

                    def forward(self, input_ids, positions):
                        position_embeddings = self.rotary_emb(positions)
                        return self.layers[0](input_ids, positions, position_embeddings)
            """,
            raises="rope-layer-parameters: Gemma3Model.forward passes position_embeddings to no layer in a loop over the layers",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            return self._config(module, ctx)
        return self._model(module, ctx)

    # -- config ------------------------------------------------------------------------

    def _config(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        module = add_config_fields(module, ctx, CONFIG_FIELDS)
        cls = config_class(module, ctx)
        if (
            "rope_parameters" in config_fields(cls)
            and _per_type_refusal(method(cls, "from_configs") or cls)[0] is None
        ):
            return self._parameters_config(cls, module, ctx)
        name = cls.name.value
        edits: dict = {}
        from_configs = require_method(module, ctx, cls, "from_configs")
        if not any(_subscript_target(n) == "rope_layer_parameters" for n in walk(from_configs)):
            per_type, raise_stmt = _per_type_refusal(from_configs)
            values = next(
                (key_owner for n in walk(from_configs) if (key_owner := _subscript_owner(n, "rope_scaling"))),
                None,
            )
            if per_type is None or raise_stmt is None or values is None:
                raise ctx.precondition(
                    f"{ID}: {name}.from_configs does not split RoPE parameters keyed by layer type "
                    "(sets = list(rope.values()), then raise ValueError when they differ)",
                    from_configs,
                    module,
                )
            keep = with_comment(
                parse_statement(
                    f'{values}["rope_layer_parameters"] = {{key: dict(value) for key, value in {per_type}.items()}}',
                    module,
                ),
                "<-- MODEL-SPECIFIC: RoPE per attention layer type: every type's parameters are kept",
            )
            edits[id(raise_stmt)] = lambda updated, keep=keep: keep
        if method(cls, "rope_config") is None:
            new = parse_method(ROPE_CONFIG_METHOD.format(cls=name), module)
            new = with_comment(new, "<-- MODEL-SPECIFIC: RoPE per attention layer type")
            new = new.with_changes(leading_lines=[cst.EmptyLine(indent=False), *new.leading_lines])
            anchor = method(cls, "__post_init__")
            if anchor is not None:
                edits[id(anchor)] = lambda updated, new=new: cst.FlattenSentinel([updated, new])
            else:
                edits[id(from_configs)] = lambda updated, new=new: cst.FlattenSentinel(
                    [new, updated.with_changes(leading_lines=[cst.EmptyLine(indent=False)])]
                )
        module = rewrite(module, edits)
        return ensure_import_from(module, "dataclasses", "replace")

    def _parameters_config(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext) -> cst.Module:
        """A config that keeps the checkpoint's ``rope_parameters`` as they
        come (transformers v5; the real vllm_neuron llama3): parameters keyed
        by layer type are split first thing in ``__post_init__`` (``rope_layer_parameters``;
        ``rope_parameters`` keeps the first type's for the model-wide rotary
        embedding) and ``rope_config`` gives each type's view."""
        edits: dict = {}
        post_init = method(cls, "__post_init__")
        if post_init is None or not any(self_attr(n) == "rope_layer_parameters" for n in walk(post_init)):
            split = parse_statements(SPLIT_PARAMETERS.strip("\n"), module)
            split[0] = with_comment(
                split[0],
                "<-- MODEL-SPECIFIC: RoPE per attention layer type: parameters keyed by type are kept per type",
            )
            if post_init is None:
                new = parse_method("def __post_init__(self) -> None:\n    pass\n", module)
                new = new.with_changes(
                    body=new.body.with_changes(body=split), leading_lines=[cst.EmptyLine(indent=False)]
                )
                last_field = list(config_fields(cls).values())[-1]
                edits[id(last_field)] = lambda updated, new=new: cst.FlattenSentinel([updated, new])
            else:
                # first: whatever else __post_init__ does reads one type's parameters
                first = list(statements(post_init))[0]
                edits[id(first)] = lambda updated, split=split: cst.FlattenSentinel([*split, updated])
        if method(cls, "rope_config") is None:
            new = parse_method(PARAMETERS_CONFIG_METHOD.format(cls=cls.name.value), module)
            new = with_comment(new, "<-- MODEL-SPECIFIC: RoPE per attention layer type")
            new = new.with_changes(leading_lines=[cst.EmptyLine(indent=False), *new.leading_lines])
            anchor = post_init or method(cls, "from_configs")
            if anchor is None:
                raise ctx.precondition(
                    f"{ID}: {cls.name.value} has no __post_init__ or from_configs", cls, module
                )
            if anchor is post_init:
                add_edit(edits, id(anchor), lambda updated, new=new: cst.FlattenSentinel([updated, new]))
            else:
                edits[id(anchor)] = lambda updated, new=new: cst.FlattenSentinel(
                    [new, updated.with_changes(leading_lines=[cst.EmptyLine(indent=False)])]
                )
        module = rewrite(module, edits)
        module = ensure_import_from(module, "typing", "Any")  # the new fields' annotation
        return ensure_import_from(module, "dataclasses", "replace")

    # -- model -------------------------------------------------------------------------

    def _model(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if not classes_with_role(module, "backbone") and any(
            class_role(name) == "backbone" for name in ctx.port.package_classes
        ):
            return module  # the backbone is defined in another file of the package
        backbone = one_class(module, ctx, "backbone", "<Prefix>Model backbone")
        name = backbone.name.value
        init = require_method(module, ctx, backbone, "__init__")
        forward = require_method(module, ctx, backbone, "forward")
        config, built_stmt, rotary_attr, rotary_call = _rotary_built(name, init, module, ctx)
        step_stmt, embeddings = _embeddings_step(name, forward, rotary_attr, module, ctx)
        forward_done = any(isinstance(n, cst.Name) and n.value == PER_LAYER for n in walk(forward))
        loop = next(
            (s for s in statements(forward) if isinstance(s, cst.For) and _layer_calls(s, embeddings)),
            None,
        )
        if loop is None and not forward_done:
            raise ctx.precondition(
                f"{ID}: {name}.forward passes {embeddings} to no layer in a loop over the layers",
                forward,
                module,
            )
        edits: dict = {}
        if find_self_assignment(init, "layer_rotary_embs") is None:
            new_init = parse_statements(
                INIT.format(config=config, rotary=dotted(rotary_call.func)).strip("\n"), module
            )
            new_init[0] = with_comment(
                new_init[0],
                "<-- MODEL-SPECIFIC: RoPE per attention layer type: each layer's type, one rotary embedding per type",
            )
            edits[id(built_stmt)] = followed_by(*new_init)
        if not forward_done:
            edits[id(step_stmt)] = followed_by(*_per_type_embeddings(step_stmt, embeddings, module))
            self._loop_edits(loop, embeddings, module, edits)
        self._declare_kernels(module, ctx)
        module = rewrite(module, edits)
        return add_functions(module, [LAYER_TYPES_FUNCTION])

    def _declare_kernels(self, module: cst.Module, ctx: FileContext) -> None:
        """The attention kernels rotate with the ``(cos, sin)`` their layer is
        passed (``position_embeddings`` of the attention's ``forward``), which
        the backbone now chooses per layer type: a change the census cannot
        see from the attention class, declared on each kernel site. An
        attention class that computes its own RoPE tables (calls a rotary
        module) is not declared, so the census names its sites."""
        for cls in classes_with_role(module, "attention"):
            forward = method(cls, "forward")
            params = [p.name.value for p in forward.params.params] if forward is not None else []
            rotary_attrs = {
                pair[0]
                for node in walk(cls)
                if isinstance(node, cst.SimpleStatementLine)
                and (pair := self_assignment(node)) is not None
                and isinstance(pair[1], cst.Call)
                and class_role(dotted(pair[1].func) or "") == "rotary"
            }
            own_rope = any(isinstance(n, cst.Call) and self_attr(n.func) in rotary_attrs for n in walk(cls))
            if "position_embeddings" not in params or own_rope:
                continue
            for site in kernel_sites(cls):
                ctx.unaffected(
                    site.call,
                    "rotates with the (cos, sin) its layer is passed, chosen per layer type by the backbone",
                )

    def _loop_edits(self, loop: cst.For, embeddings: str, module: cst.Module, edits: dict) -> None:
        index = INDEX
        if isinstance(loop.target, cst.Tuple) and _is_enumerate(loop.iter):
            index = loop.target.elements[0].value.value
        else:
            target, iterable = loop.target, loop.iter

            def enumerate_loop(updated: cst.For, target=target, iterable=iterable) -> cst.For:
                return updated.with_changes(
                    target=cst.Tuple(
                        [
                            cst.Element(
                                cst.Name(index), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                            ),
                            cst.Element(updated.target),
                        ],
                        lpar=[],
                        rpar=[],
                    ),
                    iter=cst.Call(cst.Name("enumerate"), [cst.Arg(updated.iter)]),
                )

            edits[id(loop)] = enumerate_loop
        chosen = parse_expr(f"{PER_LAYER}[{index}]", module)
        for call in _layer_calls(loop, embeddings):
            for arg in call.args:
                if isinstance(arg.value, cst.Name) and arg.value.value == embeddings:
                    edits[id(arg.value)] = lambda updated, chosen=chosen: chosen


def _rotary_built(name: str, init: cst.FunctionDef, module: cst.Module, ctx: FileContext):
    """The backbone's ``self.<attr> = <Prefix>RotaryEmbedding(config)``:
    the config parameter's name, the statement, the attribute and the call."""
    config = init.params.params[1].name.value if len(init.params.params) > 1 else None
    built = next(
        (
            (s, pair[0], pair[1])
            for s in statements(init)
            if (pair := self_assignment(s)) is not None
            and isinstance(pair[1], cst.Call)
            and class_role(dotted(pair[1].func) or "") == "rotary"
        ),
        None,
    )
    if built is None or config is None:
        raise ctx.precondition(
            f"{ID}: {name}.__init__(self, config) builds no rotary embedding "
            "(self.rotary_emb = <Prefix>RotaryEmbedding(config))",
            init,
            module,
        )
    return (config, *built)


def _embeddings_step(
    name: str, forward: cst.FunctionDef, rotary_attr: str, module: cst.Module, ctx: FileContext
) -> tuple[cst.SimpleStatementLine, str]:
    """``<embeddings> = self.<rotary_attr>(...)`` in the backbone's forward:
    the statement and the name it binds."""
    step = next(
        (
            (s, target)
            for s in statements(forward)
            if isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.Assign)
            and len(s.body[0].targets) == 1
            and isinstance(target := s.body[0].targets[0].target, cst.Name)
            and isinstance(s.body[0].value, cst.Call)
            and self_attr(s.body[0].value.func) == rotary_attr
        ),
        None,
    )
    if step is None:
        raise ctx.precondition(
            f"{ID}: {name}.forward computes no position embeddings with self.{rotary_attr}(...)",
            forward,
            module,
        )
    return step[0], step[1].value


def _per_type_embeddings(
    step_stmt: cst.SimpleStatementLine, embeddings: str, module: cst.Module
) -> list[cst.BaseStatement]:
    """Each layer type's (cos, sin), computed after the model-wide step with its arguments."""
    call = step_stmt.body[0].value  # type: ignore[union-attr]
    arguments = ", ".join(
        module.code_for_node(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip() for a in call.args
    )
    new_forward = parse_statements(
        FORWARD.format(
            by_type=BY_TYPE, per_layer=PER_LAYER, embeddings=embeddings, arguments=arguments
        ).strip("\n"),
        module,
    )
    new_forward[0] = with_comment(
        new_forward[0],
        "<-- MODEL-SPECIFIC: each layer type's (cos, sin); every layer gets the pair of its own type",
    )
    return new_forward


def _layer_calls(loop: cst.For, embeddings: str) -> list[cst.Call]:
    """Calls of the loop's layer (``layer(...)``) that pass ``embeddings``."""
    target = loop.target
    if isinstance(target, cst.Tuple) and _is_enumerate(loop.iter) and len(target.elements) == 2:
        target = target.elements[1].value
    if not isinstance(target, cst.Name):
        return []
    return [
        n
        for n in walk(loop.body)
        if isinstance(n, cst.Call)
        and isinstance(n.func, cst.Name)
        and n.func.value == target.value
        and any(isinstance(a.value, cst.Name) and a.value.value == embeddings for a in n.args)
    ]


def _is_enumerate(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and dotted(node.func) == "enumerate"


def _subscript_target(node: cst.CSTNode) -> str | None:
    """The string key of ``x["key"] = ...``."""
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        target = node.targets[0].target
        if isinstance(target, cst.Subscript) and len(target.slice) == 1:
            element = target.slice[0].slice
            if isinstance(element, cst.Index):
                return string_text(element.value)
    return None


def _subscript_owner(node: cst.CSTNode, key: str) -> str | None:
    """``values`` for ``values["key"] = ...``."""
    if _subscript_target(node) == key:
        value = node.targets[0].target.value
        if isinstance(value, cst.Name):
            return value.value
    return None


def _per_type_refusal(func: cst.FunctionDef) -> tuple[str | None, cst.BaseStatement | None]:
    """The per-type dict (``rope`` in ``sets = list(rope.values())``) and the
    ``raise ValueError(...)`` statement in the ``if`` that follows it."""
    per_type = None
    for node in walk(func):
        if (
            isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Call)
            and dotted(node.value.func) == "list"
            and len(node.value.args) == 1
            and isinstance(call := node.value.args[0].value, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "values"
            and isinstance(call.func.value, cst.Name)
        ):
            per_type = call.func.value.value
            break
    if per_type is None:
        return None, None
    for node in walk(func):
        if isinstance(node, cst.If) and any(
            isinstance(n, cst.Call) and dotted(n.func) == "any" for n in walk(node.test)
        ):
            body = list(node.body.body)
            if (
                len(body) == 1
                and isinstance(body[0], cst.SimpleStatementLine)
                and isinstance(body[0].body[0], cst.Raise)
                and isinstance(body[0].body[0].exc, cst.Call)
                and dotted(body[0].body[0].exc.func) == "ValueError"
            ):
                return per_type, body[0]
    return per_type, None
