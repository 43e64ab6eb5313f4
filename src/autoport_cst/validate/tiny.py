"""Tiny random checkpoints built with transformers, deterministic per seed.

``build_tiny_checkpoint(source, outdir, seed=0)`` takes an HF architecture
name (``LlamaForCausalLM``), a ``model_type`` (``llama``) or a path to a
``config.json`` (or a directory holding one), shrinks the configuration to a
few thousand parameters and writes ``config.json`` and ``model.safetensors``.
Nothing is downloaded.

The shrinking is generic: a fixed set of small dimensions is applied to every
attribute the config class has (``hidden_size``, ``num_attention_heads``,
``num_experts``...), per-layer lists such as ``layer_types`` are cut to the
new layer count, and a sliding window shrinks below the validation prompts so
that it takes effect. The layer count is 2, or as many as it takes for every
kind of layer the config expresses (sliding and full attention, RoPE and
NoPE, dense and MoE...) to be built at least once (``layer_variants``). A
config that interleaves MoE layers by a step (``interleave_moe_layer_step``)
set to 1 (every layer MoE) gets a step of 2, so that its dense layers are
built too, their width (``intermediate_size_mlp``) shrunk like
``intermediate_size``; one that makes every ``decoder_sparse_step``-th layer
MoE with a step of 1 and no ``mlp_only_layers`` gets a step of 2 for the same
reason. No table is keyed by model name.

Random initialisation uses ``initializer_range`` (see ``TINY_INIT_STD``): the
transformers default of 0.02 gives near-uniform next-token distributions on a
64-wide model, where greedy and top-1 metrics only measure ties. The larger
standard deviation gives peaked distributions, as a trained model has.

Tensors that transformers initialises to a constant (biases to 0, norm weights
to 1) get noise of the same standard deviation added: a port that drops a
bias or forgets a norm weight must change the outputs.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoport_cst.atomic import atomic_output, write_atomic
from autoport_cst.config_json import config_object, decode_floats, load_config_values
from autoport_cst.errors import InputError, did_you_mean

from .layer_variants import layer_count_for_variants
from .tiny_fit import (
    derived_defaults,
    derived_sizes,
    fit_kv_head_fields,
    fit_layer_counts,
    rederive_placeholders,
    rederive_sizes,
    restore_per_layer_overrides,
    shrink_text_sub_config,
    take_per_layer_overrides,
    text_sub_config,
    untouched,
)
from .tiny_tokenizer import write_tiny_tokenizer
from .tiny_unset import fill_unset_counts

# Small dimensions applied to every config attribute of that name that exists.
TINY_DIMENSIONS: dict[str, int] = {
    "hidden_size": 64,
    # token embeddings as wide as the layers, as in the default config (OPT's
    # 768 = hidden_size); a narrower hidden size alone would add project_in/out
    "word_embed_proj_dim": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    # odd, so that no TP size divides it: the default TP=2 runs shard a padded
    # vocabulary (the embedding's and the LM head's last shard end in padding)
    "vocab_size": 511,
    "max_position_embeddings": 512,
    # mixture of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}
# Multi-latent attention (configs with kv_lora_rank): its compressed and per-head sizes.
LATENT_DIMENSIONS: dict[str, int] = {
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
}
TINY_INIT_STD = 0.2
# A shrunk model larger than this (per two layers: more layers are kept when
# the config's layers differ) keeps dimensions the shrinker does not know.
MAX_TINY_PARAMETERS = 5_000_000
# Sliding windows shrink below the validation prompts (8 to 20 tokens plus the
# decode steps), so a port that ignores the window shows it.
TINY_WINDOW = 6
# the config fields that hold an attention window in tokens: sliding_window, and GPT-Neo's window_size
# (its local layers' window)
WINDOW_FIELDS = ("sliding_window", "window_size")
# Attention chunks (Llama 4's attention_chunk_size) shrink below the prompts
# too: the 20-token prompt crosses a chunk in its prefill, every prompt in
# its decode steps, and the segmented calls (from position 0 and 32) span
# chunks; a port that attends across chunks shows it.
TINY_CHUNK = 12
# Attention-temperature steps (Llama 4's floor_scale, Ministral 3's
# rope_parameters original_max_position_embeddings when it sets
# llama_4_scaling_beta) shrink below the prompts too, so that the factor
# changes within them and a port that ignores it shows it.
TINY_TEMPERATURE_FLOOR = 5  # no tiny size equals it (a field equal to it would make it ambiguous)

# Steps that choose the MoE layers among dense ones; a step of 1 (every layer
# MoE) becomes 2 unless given (_interleave_dense_layers, _sparse_step_dense_layers).
LAYER_KIND_STEPS = ("interleave_moe_layer_step", "decoder_sparse_step")

# Sizes whose variants (``<size>_<what>``) shrink with them (_fit_dense_widths).
_VARIED_SIZES = ("intermediate_size", "hidden_size", "vocab_size")

# Attributes that name token ids: kept inside the tiny vocabulary.
_TOKEN_ID_ATTRIBUTES = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class TinyCheckpoint:
    """Where a tiny checkpoint was written and what it is."""

    directory: Path
    architecture: str
    model_type: str
    seed: int
    num_parameters: int


def _import_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the install
        raise InputError(
            "building a tiny checkpoint needs torch and transformers: pip install 'autoport-cst[validate]'"
        ) from error
    return transformers


def source_is_path(source: str | os.PathLike[str]) -> bool:
    """How ``tiny`` and :func:`resolve_config` read their source: a path
    object, or text with a path separator or ending in ``.json``, is a
    config.json or a directory holding one (``./llama``, ``llama/``,
    ``config.json``); any other word is an architecture or a model_type,
    even where a file or directory of that name exists (``llama``)."""
    if not isinstance(source, str):
        return True
    return source.endswith(".json") or "/" in source or os.sep in source


def resolve_config(source: str | os.PathLike[str]) -> tuple[Any, str]:
    """Return ``(config, architecture)`` for an architecture name, a model_type
    or a config.json path (a directory holding one is accepted; which one a
    source is: :func:`source_is_path`)."""
    transformers = _import_transformers()
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if source_is_path(source):
        return _config_file(Path(source))
    text = os.fspath(source)
    if text in CONFIG_MAPPING:
        architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(text)
        if architecture is None:
            raise InputError(f"model_type {text!r} has no causal-LM class in transformers")
        return AutoConfig.for_model(text), architecture

    model_class = getattr(transformers, text, None)
    config_class = getattr(model_class, "config_class", None)
    if config_class is None or not hasattr(config_class, "model_type"):
        mapping = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        raise _unknown_source(text, [name for name in (*mapping, *mapping.values()) if isinstance(name, str)])
    return config_class(), text


def _config_file(path: Path) -> tuple[Any, str]:
    """``(config, architecture)`` of a config.json (or a directory holding one)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(f"{path}: no such config file")
    try:
        values = load_config_values(path)  # tagged floats decoded, as transformers reads it
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from None
    if not isinstance(values, dict):
        raise InputError(f"{path}: a config.json holds a JSON object")
    model_type = values.get("model_type")
    if model_type not in CONFIG_MAPPING:
        hint = did_you_mean(model_type, CONFIG_MAPPING) if isinstance(model_type, str) else ""
        raise InputError(f"{path}: unknown or missing model_type {model_type!r}{hint}")
    try:
        config = config_object(values)
    except Exception as error:  # noqa: BLE001 - the config class's own validators
        raise InputError(f"{path}: transformers cannot build a {model_type} configuration: {error}") from None
    architectures = values.get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture is None:
        architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(model_type))
    if architecture is None:
        raise InputError(f"{path}: no 'architectures' and no causal-LM class for {model_type!r}")
    return config, architecture


_ARCHITECTURE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_architecture_name(text: str) -> None:
    """Refuse a class name transformers does not export before torch is
    imported (``tiny LlamaForCausalLm`` imported torch, 5-10 s, to say so):
    transformers' top-level module lists its names lazily, without torch.
    Only a name that starts with a capital is judged: model types are lower
    case (the one that is not, EvollaModel, is a class name too)."""
    if not text[:1].isupper():
        return
    names = dir(_import_transformers())
    if text not in names:
        raise _unknown_source(text, [name for name in names if name.endswith(_ARCHITECTURE_SUFFIXES)])


def known_model_types() -> frozenset[str] | None:
    """transformers' model types, read without importing torch:
    ``configuration_auto`` imports it (2.6 s CPU under ``-X importtime``) but
    takes its names from ``auto_mappings`` (generated, imports nothing) and
    adds a few in its own source (``gpt-sw3``, ``mimi_decoder``...), read
    here as the string keys of its dict literals. None when this
    transformers lays them out otherwise (the names are then judged after
    torch, by :func:`resolve_config`)."""
    try:
        from transformers.models.auto import auto_mappings

        spec = importlib.util.find_spec("transformers.models.auto.configuration_auto")
        source = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else None
        names = set(auto_mappings.CONFIG_MAPPING_NAMES)
    except (ImportError, AttributeError, OSError):
        return None
    if source is None:
        return None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            names.update(
                k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    return frozenset(names)


def check_model_type_name(text: str) -> None:
    """Refuse a lower-case word that is no transformers model type before
    torch is imported (``tiny lama`` imported torch to say so); a directory
    of that name is named as the way to build from its config.json."""
    if not text[:1].islower() or source_is_path(text):
        return
    known = known_model_types()
    if known is None or text in known:
        return
    error = _unknown_source(text, sorted(known))
    if Path(text).exists():
        error = InputError(f"{error.message}; to build from the config.json in ./{text}, give ./{text}")
    raise error


def _unknown_source(text: str, known: list[str]) -> InputError:
    return InputError(
        f"{text!r} is neither a transformers architecture (e.g. LlamaForCausalLM), "
        f"a model_type (e.g. llama) nor a config.json path{did_you_mean(text, known)}"
    )


def shrink_config(config: Any, architecture: str, dimensions: dict[str, int] | None = None) -> Any:
    """Apply the tiny dimensions (``TINY_DIMENSIONS``, updated with
    ``dimensions``) to the attributes this config class has, and to its
    nested text config (``shrink_text_sub_config``)."""
    text = text_sub_config(config)
    if text is not None:  # the given sizes are the text model's (--set num_key_value_heads=1)
        shrink_text_sub_config(config, lambda sub: shrink_config(sub, architecture, dimensions))
        dimensions = {
            k: v for k, v in (dimensions or {}).items() if not hasattr(text, k) or hasattr(config, k)
        }
    per_layer = take_per_layer_overrides(config)  # put back on the kept layers at the end
    original_layers = getattr(config, "num_hidden_layers", None)
    original_head = _head_size(config)
    original_heads = getattr(config, "num_attention_heads", None)
    sizes = {**TINY_DIMENSIONS, **(dimensions or {})}
    derived = [n for n in derived_sizes(config, list(sizes)) if n not in (dimensions or {})]
    defaults = derived_defaults(config, config_values(config))
    for name in dimensions or {}:
        if not hasattr(config, name):
            raise InputError(f"{architecture}: its config has no {name!r} to set")
    for name, value in sizes.items():
        current = getattr(config, name, None)
        if isinstance(current, (list, tuple)) and all(isinstance(v, int) for v in current):
            setattr(config, name, type(current)(value for _ in current))  # one per layer (Gemma 3n's widths)
        elif current is not None:
            setattr(config, name, value)
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    if hasattr(config, "num_key_value_heads") and config.num_key_value_heads is None and heads:
        config.num_key_value_heads = heads  # None means one KV head per query head
    fit_kv_head_fields(config, sizes["num_key_value_heads"], original_heads, set(dimensions or {}))
    if _settable(config, "head_dim") and hidden and heads and "head_dim" not in (dimensions or {}):
        config.head_dim = hidden // heads  # a head_dim given with --set is taken as given
    _fit_rotary_dim(config, original_head, set(dimensions or {}))
    _fit_latent_attention(config, set(dimensions or {}))
    _fit_expert_groups(config, set(dimensions or {}))
    _fit_dense_widths(config, sizes, set(dimensions or {}))
    _interleave_dense_layers(config, original_layers, set(dimensions or {}))
    _sparse_step_dense_layers(config, set(dimensions or {}))
    fit_layer_counts(config, original_layers, set(dimensions or {}))
    layers = getattr(config, "num_hidden_layers", None)
    for name, value in list(vars(config).items()):
        # per-layer lists (layer_types, mlp_only_layers patterns...) follow the layer count
        if name == "layer_types" and isinstance(value, list) and layers:
            pattern = value or ["full_attention"]
            setattr(config, name, [pattern[i % len(pattern)] for i in range(layers)])
        elif (
            isinstance(value, (list, tuple))
            and layers
            and isinstance(original_layers, int)
            and original_layers > layers
            and len(value) == original_layers
        ):
            # any other list with one entry per layer (mlp_layer_types,
            # attention_layers, ...) keeps its first entries
            setattr(config, name, type(value)(value[:layers]))
    for name in WINDOW_FIELDS:
        window = getattr(config, name, None)
        given = name in (dimensions or {})  # a window given with --set is taken as given
        if isinstance(window, int) and not isinstance(window, bool) and window > TINY_WINDOW and not given:
            setattr(config, name, TINY_WINDOW)
    chunk = getattr(config, "attention_chunk_size", None)
    if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > TINY_CHUNK:
        config.attention_chunk_size = TINY_CHUNK
    _shrink_temperature_floor(config)
    vocab = getattr(config, "vocab_size", None)
    for name in _TOKEN_ID_ATTRIBUTES:
        token = getattr(config, name, None)
        if isinstance(token, int) and vocab and token >= vocab:
            setattr(config, name, vocab - 1)
    if hasattr(config, "initializer_range"):
        config.initializer_range = TINY_INIT_STD
    config.architectures = [architecture]
    restore_per_layer_overrides(config, per_layer)
    rederive_placeholders(config, set(dimensions or {}), config_values(config))
    rederive_sizes(config, derived + untouched(config, defaults, dimensions), config_values(config))
    return config


def _shrink_temperature_floor(config: Any) -> None:
    floor = getattr(config, "floor_scale", None)
    if isinstance(floor, (int, float)) and not isinstance(floor, bool) and floor > TINY_TEMPERATURE_FLOOR:
        config.floor_scale = TINY_TEMPERATURE_FLOOR
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") is not None:
        original = rope.get("original_max_position_embeddings")
        if isinstance(original, int) and original > TINY_TEMPERATURE_FLOOR:
            rope["original_max_position_embeddings"] = TINY_TEMPERATURE_FLOOR


def _settable(config: Any, name: str) -> bool:
    """Whether ``config`` has an attribute ``name`` it lets be set (FalconConfig
    derives ``head_dim`` from the hidden size and heads, read-only)."""
    found = getattr(type(config), name, None)
    return hasattr(config, name) and not (isinstance(found, property) and found.fset is None)


def _head_size(config: Any) -> int | None:
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    if isinstance(head_dim, int):
        return head_dim
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def _fit_rotary_dim(config: Any, original_head: int | None, given: set[str]) -> None:
    """A rotary dimension given in channels (GPT-J, CodeGen's ``rotary_dim``)
    keeps its fraction of the head: 64 of 256 channels rotate in GPT-J-6B,
    so 4 of the tiny head's 16 (left as given, it would exceed the head)."""
    rotary, head = getattr(config, "rotary_dim", None), _head_size(config)
    if "rotary_dim" in given or not isinstance(rotary, int) or not original_head or not head:
        return
    config.rotary_dim = max(2, min(head, rotary * head // original_head) // 2 * 2)


def _fit_latent_attention(config: Any, given: set[str]) -> None:
    """Multi-latent attention (a config with ``kv_lora_rank``): the latent and
    per-head dimensions shrink (``LATENT_DIMENSIONS``), ``head_dim`` stays the
    rotated part of a head (``qk_rope_head_dim``), and every query head keeps
    its own key and value (no grouping), as in the full-size configs."""
    if getattr(config, "kv_lora_rank", None) is None:
        return
    for name, value in LATENT_DIMENSIONS.items():
        if name not in given and getattr(config, name, None) is not None:
            setattr(config, name, value)
    rope = getattr(config, "qk_rope_head_dim", None)
    if hasattr(config, "head_dim") and rope and "head_dim" not in given:
        config.head_dim = rope
    heads = getattr(config, "num_attention_heads", None)
    if hasattr(config, "num_key_value_heads") and heads and "num_key_value_heads" not in given:
        config.num_key_value_heads = heads


def _fit_expert_groups(config: Any, given: set[str]) -> None:
    """Group-limited routing (``n_group`` groups of routed experts, the best
    ``topk_group`` kept): the groups must divide the tiny expert count, and
    fewer groups than there are are kept, so the limit still acts."""
    groups, experts = getattr(config, "n_group", None), getattr(config, "n_routed_experts", None)
    if isinstance(experts, int) and getattr(config, "num_experts_per_tok", 0) is None:
        # a default config with routed experts but no top-k (DeepseekV2Config) cannot run
        config.num_experts_per_tok = TINY_DIMENSIONS["num_experts_per_tok"]
    if not isinstance(groups, int) or not isinstance(experts, int) or groups <= 1 or "n_group" in given:
        return
    if experts % groups == 0:
        return
    config.n_group = 2 if experts % 2 == 0 else 1
    topk = getattr(config, "topk_group", None)
    if isinstance(topk, int) and "topk_group" not in given:
        config.topk_group = max(1, min(topk, config.n_group - 1))


def _fit_dense_widths(config: Any, sizes: dict[str, int], given: set[str]) -> None:
    """Sizes the config class declares as variants of ``intermediate_size``
    (Llama 4's ``intermediate_size_mlp``, its dense layers' MLP beside the
    experts' ``intermediate_size``), of ``hidden_size`` or ``vocab_size``
    (Gemma 3n's and Gemma 4's per-layer input embedding,
    ``hidden_size_per_layer_input`` wide over ``vocab_size_per_layer_input``
    tokens) shrink to the tiny size they vary."""
    for name, value in list(vars(config).items()):
        base = next((b for b in _VARIED_SIZES if name.startswith(b + "_")), None)
        if (
            base is not None
            and name not in given
            and isinstance(value, int)
            and not isinstance(value, bool)
            and value > sizes[base]
        ):
            setattr(config, name, sizes[base])


def _interleave_dense_layers(config: Any, original_layers: Any, given: set[str]) -> None:
    """A config that chooses its MoE layers by a list of their indices
    (``moe_layers``) derived from an interleave step
    (``interleave_moe_layer_step``, Llama 4) can express dense layers; with a
    step of 1 every layer is MoE and the tiny model would build no dense
    layer. The step becomes 2 (dense and MoE layers alternate, as in Llama 4
    Maverick) unless given, and a list derived from the step is derived again
    for the new step and layer count; an explicit list is kept."""
    step, chosen = getattr(config, "interleave_moe_layer_step", None), getattr(config, "moe_layers", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1 or not isinstance(layers, int):
        return
    if not isinstance(chosen, list) or not isinstance(original_layers, int):
        return
    if chosen != list(range(step - 1, original_layers, step)):
        return
    if step == 1 and "interleave_moe_layer_step" not in given:
        step = config.interleave_moe_layer_step = 2
    config.moe_layers = list(range(step - 1, layers, step))


def _sparse_step_dense_layers(config: Any, given: set[str]) -> None:
    """A config that makes every ``decoder_sparse_step``-th layer MoE, the
    others and those listed in ``mlp_only_layers`` dense (Qwen2-MoE,
    Qwen3-MoE), can express dense layers; with a step of 1 and no layer
    listed every layer is MoE and the tiny model would build no dense layer.
    The step becomes 2 (layer 0 dense, layer 1 MoE) unless given or a layer
    is listed (those are kept)."""
    step, listed = getattr(config, "decoder_sparse_step", None), getattr(config, "mlp_only_layers", None)
    if not isinstance(step, int) or isinstance(step, bool) or "decoder_sparse_step" in given:
        return
    if step == 1 and isinstance(listed, list) and not listed:
        config.decoder_sparse_step = 2


def tiny_dimensions(
    model_class: Any, config: Any, architecture: str, dimensions: dict[str, int] | None = None
) -> dict[str, int]:
    """The overrides of ``TINY_DIMENSIONS`` for ``config``: ``dimensions``,
    and unless they set it, a layer count large enough that every per-layer
    variant the config expresses (sliding and full attention, RoPE and NoPE
    layers, dense and MoE layers...) is instantiated at least once
    (``layer_variants``)."""
    sizes = dict(dimensions or {})
    layered = text_sub_config(config) or config  # a nested text config holds the layers
    if "num_hidden_layers" in sizes or not isinstance(getattr(layered, "num_hidden_layers", None), int):
        return sizes
    minimum = TINY_DIMENSIONS["num_hidden_layers"]

    def shrink_to(layers: int) -> Any:
        return shrink_config(copy.deepcopy(config), architecture, {**sizes, "num_hidden_layers": layers})

    layers, _variants = layer_count_for_variants(model_class, layered, shrink_to, minimum)
    sizes["num_hidden_layers"] = layers
    return sizes


def parameter_limit(config: Any) -> int:
    """``MAX_TINY_PARAMETERS`` for the default two layers, in proportion for more."""
    layers = getattr(config, "num_hidden_layers", None)
    minimum = TINY_DIMENSIONS["num_hidden_layers"]
    if not isinstance(layers, int) or layers <= minimum:
        return MAX_TINY_PARAMETERS
    return MAX_TINY_PARAMETERS * layers // minimum


def config_values(config: Any) -> dict:
    """``config.to_dict()`` with the non-finite floats transformers encodes as
    ``{"__float__": "Infinity"}`` (e.g. Mamba's ``time_step_limit``) turned
    back into floats, so that the config's own validators accept the values
    and ``json.dumps`` writes them as ``Infinity``, which ``json.loads``
    (and so ``from_pretrained``) reads back."""
    return decode_floats(config.to_dict())


def write_config_json(config: Any, path: str | os.PathLike[str]) -> None:
    """Write ``config`` as the ``config.json`` transformers reads back (its
    values from :func:`config_values`, without the writer's version)."""
    values = config_values(config)
    values.pop("transformers_version", None)
    write_atomic(path, json.dumps(values, indent=2, sort_keys=True) + "\n")


def build_tiny_checkpoint(
    source: str | os.PathLike[str],
    outdir: str | os.PathLike[str],
    seed: int = 0,
    dimensions: dict[str, int] | None = None,
    key_format: str = "model",
    keep_layer_kinds: bool = False,
) -> TinyCheckpoint:
    """Build a tiny random model and save ``config.json`` + ``model.safetensors``.

    ``key_format`` names the tensors as the model's state dict does
    (``"model"``) or as ``save_pretrained`` writes them (``"saved"``: the hub
    layout, transformers' load-time renames and fusions reverted, e.g.
    GPT-NeoX's ``embed_out``, GraniteMoE's ``router.layer``, per-expert
    tensors).

    ``dimensions`` overrides tiny dimensions or sets other integer config
    attributes (``{"num_key_value_heads": 1}``: a layout that needs one KV
    head). The same ``source``, ``seed`` and ``dimensions`` give
    byte-identical tensors.

    ``keep_layer_kinds`` keeps the source's dense / MoE layer steps
    (``LAYER_KIND_STEPS``) as given instead of making a config whose every
    layer is MoE build a dense layer too: the checkpoint of a port planned on
    that config, whose config guard refuses another step.
    """
    if keep_layer_kinds:
        dimensions = {**_layer_kind_steps(source), **(dimensions or {})}
    config, architecture, model_class = _tiny_config(source, dimensions)
    _check_parameter_count(model_class, copy.deepcopy(config), architecture)  # the model may set fields
    directory = Path(outdir)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    _seed_process(seed)
    state = save_seeded_checkpoint(directory, model_class, config, seed, key_format)
    # text in and out of a served tiny model without a hub (tiny_tokenizer)
    write_tiny_tokenizer(directory, config_values(config))
    return TinyCheckpoint(
        directory=directory,
        architecture=architecture,
        model_type=config.model_type,
        seed=seed,
        num_parameters=sum(t.numel() for t in state.values()),
    )


def _layer_kind_steps(source: str | os.PathLike[str]) -> dict[str, int]:
    """The source config's own ``LAYER_KIND_STEPS`` values."""
    config, _architecture = resolve_config(source)
    found = {name: getattr(config, name, None) for name in LAYER_KIND_STEPS}
    return {name: v for name, v in found.items() if isinstance(v, int) and not isinstance(v, bool)}


def _tiny_config(source: str | os.PathLike[str], dimensions: dict[str, int] | None) -> tuple[Any, str, Any]:
    """(shrunk config, architecture, model class); the config must load back
    from the values written to config.json."""
    transformers = _import_transformers()
    config, architecture = resolve_config(source)
    model_class = getattr(transformers, architecture, None)
    if model_class is None:
        raise InputError(f"transformers has no class {architecture!r}")
    config = shrink_config(
        config, architecture, tiny_dimensions(model_class, config, architecture, dimensions)
    )
    fill_unset_counts(model_class, config, {**TINY_DIMENSIONS, **(dimensions or {})})
    try:  # the saved config.json must load back
        type(config).from_dict(config_values(config))
    except Exception as error:  # noqa: BLE001 - transformers' own validators
        first = str(error).strip().splitlines()
        raise InputError(
            f"{architecture}: the shrunk config does not validate in transformers "
            f"({' '.join(line.strip() for line in first[:2])}); give a small config.json instead"
        ) from error
    return config, architecture, model_class


def _check_parameter_count(model_class: Any, config: Any, architecture: str) -> None:
    """The model builds (on the meta device) and is small enough (``parameter_limit``)."""
    import torch

    try:
        with torch.device("meta"):  # count before allocating anything
            parameters = sum(p.numel() for p in model_class(config).parameters())
    except Exception as error:  # noqa: BLE001 - transformers' own model code
        raise InputError(
            f"{architecture}: transformers cannot build the model from its shrunk config "
            f"({type(error).__name__}: {error}); give a small config.json instead"
        ) from error
    limit = parameter_limit(config)
    if parameters > limit:
        raise InputError(
            f"{architecture}: {parameters:,} parameters after shrinking (limit "
            f"{limit:,}); its config has size fields the shrinker does not know "
            "(nested sub-configs?): give a small config.json instead"
        )


def save_seeded_checkpoint(
    directory: str | os.PathLike[str],
    model_class: Any,
    config: Any,
    seed: int,
    key_format: str = "model",
) -> dict:
    """Build ``model_class(config)`` seeded with ``seed`` and save its tensors
    (``seeded_state``) as ``model.safetensors`` beside ``config.json`` (both or
    neither new) in ``directory``; the tensors saved. ``config.json`` holds
    the config as given, not as the model's ``__init__`` left it (Falcon's
    decoder layer sets ``num_ln_in_parallel_attn`` to 2 where it is None: a
    port planned on a config without the field guards None)."""
    import torch

    from .checkpoint_file import save_state

    written = copy.deepcopy(config)
    state = seeded_state(model_class, config, seed, key_format)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = written
    config.dtype = torch.float32
    with atomic_output(directory / "model.safetensors") as tmp:
        save_state(state, tmp, {"format": "pt", KEY_FORMAT: key_format})
        # replaced right before the weights: Ctrl-C leaves both files or neither new
        write_config_json(config, directory / "config.json")
    return state


def _seed_process(seed: int) -> None:
    """Leave the process's random generator seeded with ``seed``, as building
    a tiny checkpoint always has (the build itself draws from a fork)."""
    import torch

    torch.manual_seed(seed)


def seeded_state(model_class: Any, config: Any, seed: int, key_format: str) -> dict:
    """The model's tensors, built on a generator seeded with ``seed`` (the
    process's generator is left as it was), in float32, sorted by name, tied
    tensors stored once (under their first name: the input embedding's),
    constant ones perturbed, named as ``key_format`` says (``in_key_format``)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32).eval()
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().contiguous().clone()
    state = dict(sorted(state.items()))
    _perturb_constant_tensors(state, seed)
    return in_key_format(model, state, key_format)


KEY_FORMAT = "key_format"  # safetensors metadata: how a tiny checkpoint names its tensors


def in_key_format(model: Any, state: dict, key_format: str) -> dict:
    """``state`` (the model's state dict) with its tensors named as
    ``key_format`` says: ``"model"`` as it is, ``"saved"`` as
    ``save_pretrained`` writes them (transformers' load-time renames and
    fusions reverted)."""
    if key_format == "model":
        return state
    if key_format != "saved":
        raise InputError(f"key_format must be 'model' or 'saved', got {key_format!r}")
    from transformers.core_model_loading import revert_weight_conversion

    return {
        name: tensor.contiguous() for name, tensor in sorted(revert_weight_conversion(model, state).items())
    }


def key_format_of(directory: str | os.PathLike[str]) -> str:
    """The key format a tiny checkpoint was written in (``"model"`` when it
    does not say: any other checkpoint)."""
    from autoport_cst.research.checkpoint import read_checkpoint

    header = read_checkpoint(directory)
    value = header.metadata.get(KEY_FORMAT) if header is not None else None
    return value if value in ("model", "saved") else "model"


def _perturb_constant_tensors(state: dict, seed: int) -> None:
    """Add ``TINY_INIT_STD`` noise to every floating tensor whose elements are
    all equal (zero biases, unit norm weights), deterministically per seed."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    for name, tensor in state.items():
        if not tensor.is_floating_point() or tensor.numel() < 2:
            continue
        flat = tensor.reshape(-1)
        if bool((flat == flat[0]).all()):
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            state[name] = (tensor.to(torch.float32) + TINY_INIT_STD * noise).to(tensor.dtype)
