"""The code dense-layers writes into a mixture-of-experts model file: the
rule telling from the config which decoder layers are dense, and the dense
MLP class those layers build instead of the experts (a SiLU-gated MLP behind
the experts' pre-MLP norm), in the layout of the MoE wrapper it stands in
for, chosen by that wrapper's ``forward`` signature."""

from __future__ import annotations

WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"
PARALLEL_STATE = "vllm_neuron.parallel.neuron_parallel_state"
RULE = "_layer_is_dense"

RULE_FUNCTION = '''
def _layer_is_dense(config, layer_idx: int) -> bool:
    """Whether decoder layer ``layer_idx`` has a dense MLP instead of the experts.

    Mixture-of-experts configs say it in one of these forms (the first one the
    config has decides): ``mlp_layer_types`` ("dense" or "sparse" per layer);
    ``first_k_dense_replace`` or ``num_dense_layers`` (the first k layers are
    dense); ``moe_layer_interval`` with ``moe_layer_start_index`` and
    ``moe_layer_end_index`` (experts on every interval-th layer of that range);
    ``moe_layers`` (the layers with experts, listed) or
    ``interleave_moe_layer_step`` (experts on every step-th layer: Llama 4);
    ``mlp_only_layers`` (listed layers are dense) with ``decoder_sparse_step``
    (experts on every step-th layer). A config with none of them has experts
    on every layer.
    """
    if config.mlp_layer_types is not None:
        return config.mlp_layer_types[layer_idx] != "sparse"
    if config.first_k_dense_replace is not None:
        return layer_idx < config.first_k_dense_replace
    if config.num_dense_layers is not None:
        return layer_idx < config.num_dense_layers
    if config.moe_layer_interval is not None:
        start = config.moe_layer_start_index or 0
        end = config.moe_layer_end_index
        if end is None or end < 0:
            end = config.num_hidden_layers - 1
        return not (start <= layer_idx <= end and (layer_idx + 1) % config.moe_layer_interval == 0)
    if config.moe_layers is not None:
        return layer_idx not in config.moe_layers
    if config.interleave_moe_layer_step is not None:
        return (layer_idx + 1) % config.interleave_moe_layer_step != 0
    if layer_idx in (config.mlp_only_layers or ()):
        return True
    return (layer_idx + 1) % (config.decoder_sparse_step or 1) != 0
'''

DENSE_CLASS = '''
class {name}(nn.Module):
    """The dense feed-forward block of the layers without experts: a SiLU-gated
    MLP with the pre-MLP norm in front of it, like the experts (so that the
    decoder layer calls both alike)."""

    def __init__(self, {config}):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size

        # >>> PARALLELISM: intermediate dimension sharded over TP <<<
        # <-- MODEL-SPECIFIC: the dense width (intermediate_size_mlp when the config gives one: Llama 4)
        self.intermediate_size_per_rank = (config.intermediate_size_mlp or config.intermediate_size) // self.world_size

        # <-- MODEL-SPECIFIC: pre-MLP norm (the decoder layer's post-attention norm)
        {norm}
        # <-- MODEL-SPECIFIC: SiLU-gated MLP; gate/up stored [H, I/tp], down [I/tp, H]
        self.gate_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.up_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.down_proj_weight = nn.Parameter(
            torch.empty(self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype)
        )
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: each rank loads its slice of the intermediate dimension. <<<"""
        for weight in (self.gate_proj_weight, self.up_proj_weight):
            set_weight_loader(
                weight,
                sharding_weight_loader(
                    shard_dim=1,
                    shard_size=self.intermediate_size_per_rank,
                    num_shards=self.world_size,
                    is_storage_transposed=True,
                ),
            )
        set_weight_loader(
            self.down_proj_weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.intermediate_size_per_rank,
                num_shards=self.world_size,
                is_storage_transposed=True,
            ),
        )

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_prefill: bool):
        """This rank's SP slice [T / world_size, H] in prefill, [B * S, H] in decode."""
        hidden_states = self.{norm_attr}(hidden_states.to(self.dtype))
        # >>> PARALLELISM: All-gather from SP before the MLP <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        output = NF.mlp(hidden_states, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
        # >>> PARALLELISM: reduce-scatter back to SP (prefill) or sum the partial outputs (decode) <<<
        if self.world_size > 1:
            if is_prefill:
                output = self.tp_group.reduce_scatter(output, dim=0)
            else:
                output = self.tp_group.all_reduce(output)
        return output
'''

# The same block for the real packages' wrapper signature, (hidden_states,
# positions, is_decode, rank): decode rows arrive in the MLP-DP state (the
# batches of every MLP-DP rank), so the intermediate dimension is sharded over
# the MLP TP group (TP * MLP DP) and the decode partial sums are summed over
# it, as the experts and the dense references' MLP do; prefill keeps the SP
# all-gather and reduce-scatter over TP.
DENSE_CLASS_MLP_DP = '''
class {name}(nn.Module):
    """The dense feed-forward block of the layers without experts: a SiLU-gated
    MLP with the pre-MLP norm in front of it, like the experts (so that the
    decoder layer calls both alike); the intermediate dimension is sharded
    over the MLP TP group (TP * MLP DP), like the experts'."""

    def __init__(self, {config}):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size

        # >>> PARALLELISM: MLP data parallelism: the MLP TP group spans TP * MLP DP <<<
        self.mlp_tp_group = get_neuron_mlp_tp_group()
        self.mlp_tp_size = self.mlp_tp_group.world_size
        self.mlp_tp_rank = self.mlp_tp_group.rank_in_group
        # <-- MODEL-SPECIFIC: the dense width (intermediate_size_mlp when the config gives one: Llama 4)
        self.intermediate_size_per_rank = (config.intermediate_size_mlp or config.intermediate_size) // self.mlp_tp_size

        # <-- MODEL-SPECIFIC: pre-MLP norm (the decoder layer's post-attention norm)
        {norm}
        # <-- MODEL-SPECIFIC: SiLU-gated MLP; gate/up stored [H, I/t], down [I/t, H]
        self.gate_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.up_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.down_proj_weight = nn.Parameter(
            torch.empty(self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype)
        )
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: each rank loads the slice of its place in the MLP TP group. <<<"""
        gate_up_loader = sharding_weight_loader(
            shard_dim=1,
            shard_size=self.intermediate_size_per_rank,
            num_shards=self.mlp_tp_size,
            is_storage_transposed=True,
        )
        down_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=self.intermediate_size_per_rank,
            num_shards=self.mlp_tp_size,
            is_storage_transposed=True,
        )
        gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
        down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
        set_weight_loader(self.gate_proj_weight, gate_up_loader)
        set_weight_loader(self.up_proj_weight, gate_up_loader)
        set_weight_loader(self.down_proj_weight, down_loader)

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        is_decode: bool,
        rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """This rank's SP slice [T / world_size, H] in prefill; in decode [B * S, H],
        the batches of every MLP-DP rank."""
        hidden_states = self.{norm_attr}(hidden_states.to(self.dtype))
        # >>> PARALLELISM: All-gather from SP before the MLP (prefill) <<<
        if not is_decode and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        output = NF.mlp(hidden_states, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
        # >>> PARALLELISM: reduce-scatter to SP (prefill) or all-reduce over the MLP TP group (decode) <<<
        if is_decode:
            if self.mlp_tp_size > 1:
                output = self.mlp_tp_group.all_reduce(output)
        elif self.world_size > 1:
            output = self.tp_group.reduce_scatter(output, dim=0)
        return output
'''

# the MoE wrapper's forward parameters -> (the dense class written for them,
# the names it imports as (module, name))
TEMPLATES = {
    ("hidden_states", "positions", "is_prefill"): (
        DENSE_CLASS,
        ((WEIGHT_LOADERS, "sharding_weight_loader"),),
    ),
    ("hidden_states", "positions", "is_decode", "rank"): (
        DENSE_CLASS_MLP_DP,
        (
            (WEIGHT_LOADERS, "sharding_weight_loader"),
            (WEIGHT_LOADERS, "with_rank_override"),
            (PARALLEL_STATE, "get_neuron_mlp_tp_group"),
        ),
    ),
}
