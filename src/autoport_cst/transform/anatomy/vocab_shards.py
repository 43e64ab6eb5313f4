"""Where a model file shards the vocabulary without padding it (read only;
the validator and ``port`` use it).

vllm_neuron's ``ColumnParallelLinear`` shards its output features evenly over
its TP group and refuses a size the group does not divide; its
``VocabDimShardedEmbedding`` pads the table to whole shards, but a
``sharding_weight_loader`` without ``pad_shard=True`` hands the last shard
short. Our references pad both (``padded_vocab_size``, ``pad_shard=True``)
and mask the padding; the real vllm_neuron llama3 builds ``self.lm_head =
ColumnParallelLinear(config.hidden_size, config.vocab_size, ...)`` and loads
its embedding with no ``pad_shard`` (the real qwen3: the LM head only), so on
device they need a vocabulary every group they shard it over divides.

Two sites are found:

- ``lm_head``: a ``ColumnParallelLinear`` assigned to ``self.lm_head`` whose
  output size is an attribute ``<...>.vocab_size`` (``config.vocab_size``);
- ``embedding``: a ``sharding_weight_loader`` whose ``shard_size`` reads
  ``vocab_size_per_rank`` (the embedding's shards) and that is given no
  ``pad_shard`` at all, as the real llama3's. An explicit ``pad_shard=False``
  is not that shape: a port that turned its reference's padding off (the
  mutation benchmark's qwen2:993) is wrong, and fails at load as before.

Each is sharded over the TP group in the prefill graph, and over TP x the
component's DP degree in the decode graph when the file takes vllm_neuron's
TP group of that component (``ACCESSORS``).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from autoport_cst.transform.cst.vocabulary import dotted, walk

LINEAR = "ColumnParallelLinear"
LOADER = "sharding_weight_loader"
# vllm_neuron's accessor of each component's TP group (TP x its DP degree in the decode graph)
ACCESSORS = {"lm_head": "get_neuron_lm_head_tp_group", "embedding": "get_neuron_embedding_tp_group"}


@dataclass(frozen=True)
class UnpaddedShards:
    """A site that shards the vocabulary as the config gives it."""

    component: str  # lm_head or embedding (a DP component of the layout)
    line: int
    column: int
    what: str  # the site in words: "ColumnParallelLinear over config.vocab_size"


def unpadded_shards(module: cst.Module) -> list[UnpaddedShards]:
    """Every site of ``module`` that shards the vocabulary unpadded, in
    source order."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    found = []
    for node in walk(module):
        site = None
        if isinstance(node, cst.Assign) and _is_lm_head(node) and isinstance(node.value, cst.Call):
            size = _argument(node.value, "out_features", 1)
            if (
                _callee(node.value) == LINEAR
                and isinstance(size, cst.Attribute)
                and size.attr.value == "vocab_size"
            ):
                site = ("lm_head", f"{LINEAR} over {module.code_for_node(size)}, not padded")
        elif isinstance(node, cst.Call) and _callee(node) == LOADER:
            size = _argument(node, "shard_size", 1)
            pad = _argument(node, "pad_shard", 4)
            shards = module.code_for_node(size) if size is not None else ""
            if "vocab_size_per_rank" in shards and pad is None:
                site = ("embedding", f"{LOADER} of {shards} rows, no pad_shard")
        if site is not None:
            start = positions[node].start
            found.append(UnpaddedShards(site[0], start.line, start.column + 1, site[1]))
    return found


def takes_group(module: cst.Module, component: str) -> bool:
    """Whether ``module`` calls vllm_neuron's TP group accessor of ``component``."""
    accessor = ACCESSORS[component]
    return any(isinstance(n, cst.Call) and _callee(n) == accessor for n in walk(module))


def _callee(call: cst.Call) -> str:
    return (dotted(call.func) or "").rsplit(".", 1)[-1]


def _is_lm_head(node: cst.Assign) -> bool:
    return any(
        isinstance(t.target, cst.Attribute)
        and isinstance(t.target.value, cst.Name)
        and t.target.value.value == "self"
        and t.target.attr.value == "lm_head"
        for t in node.targets
    )


def _argument(call: cst.Call, keyword: str, index: int) -> cst.BaseExpression | None:
    """The argument ``keyword=``, or the positional one at ``index``."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    return positional[index] if len(positional) > index else None
