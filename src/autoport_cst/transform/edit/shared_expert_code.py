"""The code shared-experts writes into a model file: the shared expert's
parameter names, the functions reading its width from the config and its
checkpoint keys from the checkpoint's tensor names, its parameters and
loaders in an experts class (intermediate sharded like a dense MLP's), and
the method computing it (``NF.mlp``, optionally scaled by a sigmoid gate)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.cst.snippets import parse_statement

WEIGHTS = ("shared_gate_proj_weight", "shared_up_proj_weight", "shared_down_proj_weight")
GATE = "shared_expert_gate_weight"
SIZE = "shared_intermediate_size_per_rank"
METHOD = "_shared_expert"

WIDTH_FUNCTION = '''
def _shared_expert_width(config) -> int:
    """Intermediate size of the always-on shared expert: the config's
    ``shared_expert_intermediate_size`` when it has one (Qwen2-MoE), else the
    expert intermediate size times the number of shared experts
    (``n_shared_experts``; one when the config does not say)."""
    if config.shared_expert_intermediate_size:
        return config.shared_expert_intermediate_size
    return config.moe_intermediate_size * (config.n_shared_experts or 1)
'''

KEY_FUNCTION = '''
def _shared_expert_key(names, block: str, tensor: str) -> str:
    """Checkpoint key of ``tensor`` (``gate_proj.weight``...) of the shared
    expert of MoE block ``block``, which checkpoints name ``shared_expert``,
    ``shared_experts`` or ``shared_mlp``."""
    for name in ("shared_expert", "shared_experts", "shared_mlp"):
        if f"{block}.{name}.{tensor}" in names:
            return f"{block}.{name}.{tensor}"
    raise KeyError(
        f"no shared expert in the checkpoint for {block} (looked for {block}.shared_expert.{tensor}, "
        f"{block}.shared_experts.{tensor}, {block}.shared_mlp.{tensor})"
    )
'''

GATE_PARAMETER = f"self.{GATE} = nn.Parameter(torch.empty(self.hidden_size, 1, dtype=torch.float32))"
GATE_LOADER = (
    "set_weight_loader(\n"
    f"    self.{GATE},\n"
    "    sharding_weight_loader(shard_dim=1, shard_size=1, num_shards=1, is_storage_transposed=True),\n"
    ")\n"
)


def parameters_code(config: str, shards: str, dtype: str) -> str:
    """The shared expert's width per rank and its weights, in the model's dtype."""
    return (
        f"self.{SIZE} = _shared_expert_width({config}) // {shards}\n"
        f"self.{WEIGHTS[0]} = nn.Parameter(\n"
        f"    torch.empty(self.hidden_size, self.{SIZE}, dtype={dtype})\n)\n"
        f"self.{WEIGHTS[1]} = nn.Parameter(\n"
        f"    torch.empty(self.hidden_size, self.{SIZE}, dtype={dtype})\n)\n"
        f"self.{WEIGHTS[2]} = nn.Parameter(\n"
        f"    torch.empty(self.{SIZE}, self.hidden_size, dtype={dtype})\n)\n"
    )


def loaders_code(shards: str, rank: str | None) -> str:
    """Transposed sharding loaders of the shared expert's weights (gate and
    up on their columns, down on its rows) over ``shards`` ranks, with
    ``rank`` overridden when given."""
    return (
        f"for weight in (self.{WEIGHTS[0]}, self.{WEIGHTS[1]}):\n"
        f"    set_weight_loader(\n        weight,\n        {_sharded_loader(1, '        ', shards, rank)},\n    )\n"
        f"set_weight_loader(\n    self.{WEIGHTS[2]},\n    {_sharded_loader(0, '    ', shards, rank)},\n)\n"
    )


def _sharded_loader(dim: int, indent: str, shards: str, rank: str | None) -> str:
    inner = indent + "    " if rank is not None else indent
    loader = (
        f"sharding_weight_loader(\n{inner}    shard_dim={dim},\n{inner}    shard_size=self.{SIZE},\n"
        f"{inner}    num_shards={shards},\n{inner}    is_storage_transposed=True,\n{inner})"
    )
    if rank is None:
        return loader
    return f"with_rank_override(\n{inner}{loader},\n{inner}rank={rank},\n{indent})"


def shared_method(gate: bool, module: cst.Module, cross_dp: bool = False) -> cst.FunctionDef:
    """``_shared_expert(hidden_states)``: ``NF.mlp`` over the shared weights,
    scaled by the sigmoid gate with ``gate``; with ``cross_dp`` it refuses
    cross-DP expert parallelism (its output would be summed once per replica)."""
    lines = [
        f"def {METHOD}(self, hidden_states):",
        '    """The always-on shared expert on normalized hidden states [T, H]; partial sums over TP."""',
    ]
    if cross_dp:
        lines += [
            "    # >>> PARALLELISM: with cross-DP expert parallelism the routed output is summed over every",
            "    # DP replica's ranks, which would count a TP-sharded shared expert once per replica <<<",
            "    if self.cross_dp_ep:",
            "        raise NotImplementedError(",
            '            "shared experts with cross-DP expert parallelism (data_parallel_size > 1 with EP)"',
            "        )",
        ]
    lines += [
        "    output = NF.mlp(",
        "        hidden_states,",
        f"        self.{WEIGHTS[0]},",
        f"        self.{WEIGHTS[1]},",
        f"        self.{WEIGHTS[2]},",
        "    )",
    ]
    if gate:
        lines += [
            f"    gate = torch.sigmoid(hidden_states.to(torch.float32) @ self.{GATE}.to(torch.float32))",
            "    output = (output.to(torch.float32) * gate).to(output.dtype)",
        ]
    lines.append("    return output")
    method = parse_statement("\n".join(lines) + "\n", module)
    assert isinstance(method, cst.FunctionDef)
    return method.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
