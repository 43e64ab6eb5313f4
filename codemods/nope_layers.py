"""nope-layers: layers that use no positional embedding (SmolLM3; by layer type: Cohere 2, EXAONE 4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import attention_classes
from autoport_cst.transform.anatomy.classes import require_method
from autoport_cst.transform.cst.snippets import parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import find_self_assignment, is_docstring, statements
from autoport_cst.transform.edit.attention import place_setting
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import ANY, Realizes, not_to

ID = "nope-layers"

LAYER_FUNCTION = '''
def _layer_uses_rope(config, layer_idx: int) -> bool:
    """Whether a layer rotates its queries and keys (some layers use no
    positional embedding at all).

    ``config.no_rope_layers`` holds 1 for a layer with RoPE and 0 for one
    without; without it, every ``no_rope_layer_interval``-th layer has none.
    """
    if config.no_rope_layers is not None:
        return bool(config.no_rope_layers[layer_idx])
    if config.no_rope_layer_interval:
        return (layer_idx + 1) % config.no_rope_layer_interval != 0
    return True
'''

LAYER_TYPE_FUNCTION = '''
def _layer_uses_rope(config, layer_idx: int) -> bool:
    """Whether a layer rotates its queries and keys: the layers
    ``config.layer_types`` marks "sliding_attention" do, the others use no
    positional embedding; {without}
    """
    if config.sliding_window is None:
        return {no_window}
    if config.layer_types is None:
        raise ValueError("the config sets sliding_window but no layer_types")
    return config.layer_types[layer_idx] == "sliding_attention"
'''

LAYER_TYPE_ONLY_FUNCTION = '''
def _layer_uses_rope(config, layer_idx: int) -> bool:
    """Whether a layer rotates its queries and keys: the layers
    ``config.layer_types`` marks "sliding_attention" do, the others use no
    positional embedding, whether or not a sliding window is set.
    """
    if config.layer_types is None:
        raise ValueError("no RoPE on the full-attention layers: the config needs layer_types")
    return config.layer_types[layer_idx] == "sliding_attention"
'''

# rope.nope_rule -> (the docstring's last line, what a config without a sliding window gives)
LAYER_TYPE_RULES = {
    "sliding": ("a config without sliding window rotates no layer.", "False"),
    "sliding_or_no_window": ("a config without sliding window rotates every layer.", "True"),
}

CONFIG_FIELDS = [
    (
        "no_rope_layer_interval: int | None = None",
        "layers without positional embedding (no_rope_layers: 1 RoPE, 0 none)",
    ),
    ("no_rope_layers: list[int] | None = None", ""),
]
LAYER_TYPE_FIELDS = [
    ("layer_types: list[str] | None = None", "layers without positional embedding: the full-attention ones"),
    ("sliding_window: int | None = None", ""),
]


@dataclass(frozen=True)
class NopeLayersParams:
    rule: Literal["config_fields", "sliding", "sliding_or_no_window", "layer_type"] = field(
        default="config_fields",
        metadata={
            "doc": "config_fields: no_rope_layers / no_rope_layer_interval (SmolLM3); sliding: the sliding "
            "layers rotate, none without a window (Cohere 2, Flint); sliding_or_no_window: the sliding "
            "layers rotate, every layer without a window (EXAONE 4); layer_type: the sliding layers "
            "rotate whether or not a window is set (AfMoE)."
        },
    )


def layer_function(rule: str) -> str:
    """The source of ``_layer_uses_rope`` for ``rule``."""
    if rule == "config_fields":
        return LAYER_FUNCTION
    if rule == "layer_type":
        return LAYER_TYPE_ONLY_FUNCTION
    without, no_window = LAYER_TYPE_RULES[rule]
    return LAYER_TYPE_FUNCTION.format(without=without, no_window=no_window)


IDENTITY = """
if not self.use_rope:
    cos, sin = {embeddings}
    {embeddings} = (torch.ones_like(cos), torch.zeros_like(sin))
"""


class NopeLayers(Codemod):
    """Layers without positional embedding: their queries and keys are not rotated (SmolLM3, Cohere 2).

    Model file, attention class (``<Prefix>Attention``): ``__init__`` sets
    ``self.use_rope`` from ``_layer_uses_rope(config, layer_idx)`` (added to
    the module), which reads ``config.no_rope_layers`` (1: RoPE, 0: none) or,
    without it, leaves every ``no_rope_layer_interval``-th layer without RoPE
    (SmolLM3's rule, ``rule="config_fields"``). With ``rule="sliding"`` or
    ``"sliding_or_no_window"`` it reads ``config.layer_types`` instead: the
    sliding layers rotate, the full-attention ones do not, and a config
    without ``sliding_window`` rotates no layer (Cohere 2, Flint:
    ``if self.sliding_window is not None``) or every layer (EXAONE 4:
    ``if self.sliding_window is None or self.is_sliding``), or, with
    ``rule="layer_type"``, the sliding layers whatever the window (AfMoE:
    ``if self.is_local_attention``); an existing
    ``_layer_uses_rope`` of another rule is replaced. ``forward`` replaces the step's ``(cos, sin)`` by
    ``(1, 0)`` on those layers before dispatching to prefill or decode: a
    rotation by angle zero, which leaves q and k bit for bit unchanged in
    the hand-written prefill RoPE and in the decode kernel alike, so neither
    path changes. Config file: the dataclass gains ``no_rope_layers`` and
    ``no_rope_layer_interval`` (``layer_types`` and ``sliding_window`` for the
    layer-type rules).

    Preconditions: an attention class with ``__init__(self, config,
    layer_idx)`` and a ``forward`` taking ``position_embeddings``.
    """

    ID = ID
    REALIZES = Realizes({"rope.nope_layers": not_to(None), "rope.nope_rule": ANY})
    Params = NopeLayersParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            160,
            lambda spec, facts: spec.rope.nope_layers,
            lambda spec, facts: f"layers without RoPE: {list(spec.rope.nope_layers or ())}",
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="RoPE skipped on the layers the config marks",
            before="""
                class SmolLM3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        \"\"\">>> PARALLELISM: dispatch to the prefill or decode path. <<<\"\"\"
                        if not _is_prefill(attn_metadata):
                            return self.forward_decode(hidden_states, positions, position_embeddings)
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            """,
            after='''
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    """Whether a layer rotates its queries and keys (some layers use no
                    positional embedding at all).

                    ``config.no_rope_layers`` holds 1 for a layer with RoPE and 0 for one
                    without; without it, every ``no_rope_layer_interval``-th layer has none.
                    """
                    if config.no_rope_layers is not None:
                        return bool(config.no_rope_layers[layer_idx])
                    if config.no_rope_layer_interval:
                        return (layer_idx + 1) % config.no_rope_layer_interval != 0
                    return True


                class SmolLM3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: this layer rotates q and k (False: no positional embedding)
                        self.use_rope = _layer_uses_rope(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        """>>> PARALLELISM: dispatch to the prefill or decode path. <<<"""
                        # <-- MODEL-SPECIFIC: no positional embedding: rotate by angle zero
                        if not self.use_rope:
                            cos, sin = position_embeddings
                            position_embeddings = (torch.ones_like(cos), torch.zeros_like(sin))
                        if not _is_prefill(attn_metadata):
                            return self.forward_decode(hidden_states, positions, position_embeddings)
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            ''',
        ),
        Example(
            title="the config fields",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class SmolLM3Config:
                    hidden_size: int = 4096
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class SmolLM3Config:
                    hidden_size: int = 4096
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # layers without positional embedding (no_rope_layers: 1 RoPE, 0 none)
                    no_rope_layer_interval: int | None = None
                    no_rope_layers: list[int] | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="RoPE on the sliding layers only, on every layer without a window (EXAONE 4)",
            params={"rule": "sliding_or_no_window"},
            before="""
                class Exaone4Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            """,
            after='''
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    """Whether a layer rotates its queries and keys: the layers
                    ``config.layer_types`` marks "sliding_attention" do, the others use no
                    positional embedding; a config without sliding window rotates every layer.
                    """
                    if config.sliding_window is None:
                        return True
                    if config.layer_types is None:
                        raise ValueError("the config sets sliding_window but no layer_types")
                    return config.layer_types[layer_idx] == "sliding_attention"


                class Exaone4Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: this layer rotates q and k (False: no positional embedding)
                        self.use_rope = _layer_uses_rope(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        # <-- MODEL-SPECIFIC: no positional embedding: rotate by angle zero
                        if not self.use_rope:
                            cos, sin = position_embeddings
                            position_embeddings = (torch.ones_like(cos), torch.zeros_like(sin))
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            ''',
        ),
        Example(
            title="RoPE on the sliding layers whether or not a window is set (AfMoE)",
            params={"rule": "layer_type"},
            before="""
                class AfmoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            """,
            after='''
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    """Whether a layer rotates its queries and keys: the layers
                    ``config.layer_types`` marks "sliding_attention" do, the others use no
                    positional embedding, whether or not a sliding window is set.
                    """
                    if config.layer_types is None:
                        raise ValueError("no RoPE on the full-attention layers: the config needs layer_types")
                    return config.layer_types[layer_idx] == "sliding_attention"


                class AfmoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: this layer rotates q and k (False: no positional embedding)
                        self.use_rope = _layer_uses_rope(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        # <-- MODEL-SPECIFIC: no positional embedding: rotate by angle zero
                        if not self.use_rope:
                            cos, sin = position_embeddings
                            position_embeddings = (torch.ones_like(cos), torch.zeros_like(sin))
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            ''',
        ),
        Example(
            title="a reference's rule replaced: SmolLM3's config fields by Cohere 2's sliding layers",
            params={"rule": "sliding"},
            before='''
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    """SmolLM3's rule."""
                    return bool(config.no_rope_layers[layer_idx])


                class SmolLM3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.use_rope = _layer_uses_rope(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        if not self.use_rope:
                            cos, sin = position_embeddings
                            position_embeddings = (torch.ones_like(cos), torch.zeros_like(sin))
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            ''',
            after='''
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    """Whether a layer rotates its queries and keys: the layers
                    ``config.layer_types`` marks "sliding_attention" do, the others use no
                    positional embedding; a config without sliding window rotates no layer.
                    """
                    if config.sliding_window is None:
                        return False
                    if config.layer_types is None:
                        raise ValueError("the config sets sliding_window but no layer_types")
                    return config.layer_types[layer_idx] == "sliding_attention"


                class SmolLM3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.use_rope = _layer_uses_rope(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        if not self.use_rope:
                            cos, sin = position_embeddings
                            position_embeddings = (torch.ones_like(cos), torch.zeros_like(sin))
                        return self.forward_prefill(hidden_states, positions, position_embeddings)
            ''',
        ),
        Example(
            title="the config fields of the layer-type rules",
            role="config",
            path="config.py",
            params={"rule": "sliding"},
            before="""
                @dataclass
                class Cohere2Config:
                    hidden_size: int = 4096
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class Cohere2Config:
                    hidden_size: int = 4096
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # layers without positional embedding: the full-attention ones
                    layer_types: list[str] | None = None
                    sliding_window: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="the position embeddings must reach the attention's forward",
            before="""
                class SmolLM3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, cos, sin):
                        return hidden_states
            """,
            raises="nope-layers: SmolLM3Attention.forward takes no position_embeddings",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NopeLayersParams:
        return NopeLayersParams(rule=target.rope.nope_rule or "config_fields")

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        by_type = self.params.rule != "config_fields"
        if ctx.role == "config":
            return add_config_fields(module, ctx, LAYER_TYPE_FIELDS if by_type else CONFIG_FIELDS)
        edits: dict = {}
        for cls in attention_classes(module, ctx):
            self._attention_edits(cls, module, ctx, edits)
        module = rewrite(module, edits)
        return add_functions(module, [layer_function(self.params.rule)], replace=by_type)

    def _attention_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        forward = require_method(module, ctx, cls, "forward")
        params = [p.name.value for p in init.params.params]
        if len(params) < 3:
            raise ctx.precondition(f"{ID}: {name}.__init__ must take (self, config, layer_idx)", init, module)
        forward_params = [p.name.value for p in forward.params.params]
        if "position_embeddings" not in forward_params:
            raise ctx.precondition(
                f"{ID}: {name}.forward takes no position_embeddings (the step's (cos, sin))", forward, module
            )
        if find_self_assignment(init, "use_rope") is None:
            stmt = with_comment(
                parse_statement(f"self.use_rope = _layer_uses_rope({params[1]}, {params[2]})", module),
                "<-- MODEL-SPECIFIC: this layer rotates q and k (False: no positional embedding)",
            )
            if not place_setting(init, "use_rope", stmt, edits):
                body = list(statements(init))
                start = 1 if body and "super()" in module.code_for_node(body[0]) else 0
                edits[id(body[start])] = lambda updated, stmt=stmt: cst.FlattenSentinel([stmt, updated])
        body = list(statements(forward))
        if any("self.use_rope" in module.code_for_node(s) for s in body):
            return
        new = parse_statements(IDENTITY.format(embeddings="position_embeddings").strip("\n"), module)
        new[0] = with_comment(new[0], "<-- MODEL-SPECIFIC: no positional embedding: rotate by angle zero")
        start = 1 if body and is_docstring(body[0]) else 0
        target = body[start]
        edits[id(target)] = lambda updated, new=new: cst.FlattenSentinel([*new, updated])
