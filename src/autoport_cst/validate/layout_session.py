"""One rank of a run with data or context parallelism, laid out the way the
vLLM Neuron runner serves it (``autoport_cst.validate.layout``).

Attention DP, the component DP degrees and decode context parallelism shape
the decode graph only: vllm_neuron serves them disaggregated, a prefill
graph (plain TP, or context-parallel with ``apply_prefill_dcp``) handing its
KV cache to the decode graph. Each rank therefore builds and loads the
package twice, under the layout of each graph (``parallel_state.activate``,
the matching vLLM config and a ``NeuronConfig`` carrying the graph's
options; on-device sampling off, so both return logits):

- **prefill graph**: ``NeuronConfig(apply_prefill_dcp=...)``; replica ``d``
  prefills its own sequences (``Scenario.replicas``) over its TP group;
- **decode graph**: ``NeuronConfig(attention_dp_size, mlp_dp_size,
  embedding_dp_size, lm_head_dp_size)``; every replica decodes its own batch
  (padded to the largest replica's with the runner's padding rows: token 0,
  position 0, slot -1, block table of the null block) in lockstep.

The KV cache passes from one graph to the other as a disaggregated
deployment passes it: the same tensors when both graphs lay the cache out
alike (DP; DCP with a context-parallel prefill), or re-laid from the plain
prefill cache into each DCP rank's interleaved share (a plain prefill
feeding a DCP decode: the rank keeps the positions it owns, at the slots
``PagedLayout.cp_slot`` gives them). Under DCP the runner's slot mapping is
``cp_slot``'s (-1 for positions another rank holds); a context-parallel
prefill call gets only this rank's share of it (``S / dcp`` entries, the
rows the model keeps), and is padded to a multiple of ``dcp * interleave``
(and of TP) rows. Decode metadata under DCP carries each sequence's
``cached_seq_len``.

Whether the run takes the cache paths (``prefill="auto"``) is decided once
for the world: every replica's first prefill is a whole prompt, after which
the ranks agree (all-reduce) on whether any port instance read
``kv_segment_size``.

``run`` returns this rank's ``PortOutput`` for its replica: prefill records
and logits of its calls (sequence-parallel slices, merged by the parent), and
decode rows of its own sequences only (a component whose output holds the
gathered batches of several replicas is cut to this replica's).
"""

from __future__ import annotations

import time
from dataclasses import replace
from math import lcm
from typing import Any

import torch

from .components import ComponentRecorder, find_components
from .driver import PortFailure, PortOutput, PortSession, _real_rows, _spans
from .layout import ParallelLayout, replica_of, tp_rank_of
from .runner_metadata import PAD_SLOT, StepInputs, build_metadata
from .scenario import PrefillCall, Scenario


def _interleaved_share(values: list[int], width: int, interleave: int, index: int) -> list[int]:
    """The entries context-parallel rank ``index`` keeps: runs of
    ``interleave`` dealt to the ranks in turn."""
    return [v for i, v in enumerate(values) if (i // interleave) % width == index]


class _Graph:
    """One graph (prefill or decode) of the package on this rank."""

    def __init__(self, name: str, session: PortSession, neuron_config: Any, vllm_config: Any) -> None:
        self.name, self.session = name, session
        self.neuron_config, self.vllm_config = neuron_config, vllm_config

    @property
    def model(self):
        return self.session.model


class LayoutSession:
    """Both graphs of one rank, loaded and bound to their KV caches."""

    def __init__(
        self,
        factory: Any,
        checkpoint_dir: str,
        hf_config: Any,
        scenario: Scenario,
        layout: ParallelLayout,
        rank: int,
        prefill: str = "auto",
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        from .standin import parallel_state

        self.scenario, self.layout, self.rank, self.prefill = scenario, layout, rank, prefill
        self.replica, self.tp_rank = replica_of(layout, rank), tp_rank_of(layout, rank)
        self.kv_cache_dtype = kv_cache_dtype
        self.state = parallel_state
        self.prefill_graph = self._graph("prefill", factory, checkpoint_dir, hf_config)
        self.decode_graph = self._graph("decode", factory, checkpoint_dir, hf_config)
        self._connect_caches()

    # -- building ---------------------------------------------------------------------

    def _graph(self, name: str, factory: Any, checkpoint_dir: str, hf_config: Any) -> _Graph:
        from .standin import neuron_config as nc
        from .standin import vllm_config

        sizes = self.layout.prefill_layout() if name == "prefill" else self.layout.decode_layout()
        config = nc.NeuronConfig(
            attention_dp_size=sizes.attention_dp,
            mlp_dp_size=sizes.mlp_dp,
            embedding_dp_size=sizes.embedding_dp,
            lm_head_dp_size=sizes.lm_head_dp,
            apply_prefill_dcp=sizes.prefill_dcp,
            on_device_sampling_config=None,
        )
        if self.scenario.on_device_sampling:  # the runner's sampling (deterministic), with logprobs
            from .sampled_output import LOGPROBS, sampling_config

            config = replace(config, on_device_sampling_config=sampling_config(), max_logprobs=LOGPROBS)
        current = vllm_config.get_current_vllm_config()
        graph_config = replace(
            current,
            parallel_config=replace(
                current.parallel_config,
                decode_context_parallel_size=sizes.dcp,
                cp_kv_cache_interleave_size=sizes.dcp_interleave,
                data_parallel_size=sizes.dp if name == "decode" else 1,
            ),
        )
        self._enter(name, graph_config)
        try:
            session = PortSession(
                _WithNeuronConfig(factory, config),
                checkpoint_dir,
                hf_config,
                self.scenario,
                self.tp_rank,
                self.layout.tp,
                prefill=self.prefill,
                kv_cache_dtype=self.kv_cache_dtype,
            )
        except PortFailure as failure:
            raise PortFailure(
                failure.stage, f"{name} graph: {failure.message}", failure.refusal, failure.raised_in
            ) from failure
        return _Graph(name, session, config, graph_config)

    def _enter(self, name: str, config: Any) -> None:
        from .standin import vllm_config

        self.state.activate(name)
        vllm_config.use(config)

    def _connect_caches(self) -> None:
        """Hand the prefill graph's cache to the decode graph (module docstring)."""
        prefill, decode = self.prefill_graph.session, self.decode_graph.session
        specs = [
            [(layer.name, layer.num_kv_heads, layer.head_size) for layer in s.kv_spec.layers]
            for s in (prefill, decode)
        ]
        if specs[0] != specs[1]:
            raise PortFailure(
                "kv_cache",
                "the prefill and decode graphs ask for different KV caches (layer, KV heads per rank, head "
                f"size): prefill {specs[0]}, decode {specs[1]}; the decode graph must hold the cache the "
                "prefill graph hands it",
            )
        self.relayout = self.layout.dcp > 1 and not self.layout.prefill_dcp
        if not self.relayout:
            decode.caches = prefill.caches
            self._enter("decode", self.decode_graph.vllm_config)
            decode.model.bind_kv_cache(prefill.caches)

    # -- metadata -----------------------------------------------------------------------

    @property
    def _cp(self) -> tuple[int, int, int]:
        """(width, interleave, this rank's place) of the decode cache."""
        layout = self.layout
        return layout.dcp, layout.dcp_interleave, self.tp_rank % layout.dcp

    def _prefill_call(self, call: PrefillCall) -> PrefillCall:
        """The call padded as a context-parallel prefill needs."""
        if not self.layout.prefill_dcp:
            return call
        multiple = lcm(self.layout.dcp * self.layout.dcp_interleave, self.layout.tp)
        rows = -(-call.rows // multiple) * multiple
        return replace(call, padded_rows=rows) if rows != call.rows else call

    def _prefill_inputs(self, call: PrefillCall) -> StepInputs:
        scenario = self.scenario
        width, interleave, place = self._cp if self.layout.prefill_dcp else (1, 1, 0)
        table = scenario.block_table(call.sequence, width)
        padding = call.rows - call.tokens
        positions = list(range(call.start, call.end))
        slots = [scenario.layout.cp_slot(table, p, width, interleave, place) for p in positions]
        slots += [PAD_SLOT] * padding
        if width > 1:
            slots = _interleaved_share(slots, width, interleave, place)
        prompt = scenario.prompts[call.sequence]
        return StepInputs(
            input_ids=torch.tensor(list(prompt[call.start : call.end]) + [0] * padding, dtype=torch.int64),
            positions=torch.tensor(positions + [0] * padding, dtype=torch.int64),
            sampling_positions=torch.tensor(call.sampled, dtype=torch.int64),
            metadata=build_metadata(
                self.prefill_graph.session.layer_names,
                self.prefill_graph.session.reads,
                max_query_len=call.rows,
                slots=slots,
                tables=[table],
                block_size=scenario.layout.block_size,
                cached=[call.start],
                kv_segment_size=call.segment,
            ),
        )

    def _decode_inputs(self, step: int, tokens: list[int], batch: list[int | None]) -> StepInputs:
        """This replica's batch (None: a padding row)."""
        scenario = self.scenario
        width, interleave, place = self._cp
        null_table = (0,) * scenario.layout.blocks_per_seq
        ids, positions, tables, slots = [], [], [], []
        for sequence, token in zip(batch, tokens, strict=False):
            if sequence is None:
                ids.append(0)
                positions.append(0)
                tables.append(null_table)
                slots.append(PAD_SLOT)
                continue
            position = len(scenario.prompts[sequence]) + step
            table = scenario.block_table(sequence, width)
            ids.append(token)
            positions.append(position)
            tables.append(table)
            slots.append(scenario.layout.cp_slot(table, position, width, interleave, place))
        session = self.decode_graph.session
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            sampling_positions=torch.arange(len(batch), dtype=torch.int64),
            metadata=build_metadata(
                session.layer_names,
                session.reads,
                max_query_len=1,
                slots=slots,
                tables=tables,
                block_size=scenario.layout.block_size,
                cached=positions,
                kv_segment_size=0,
                cached_per_sequence=width > 1,
            ),
        )

    # -- the run ------------------------------------------------------------------------

    def run(self, teacher: list[list[int]]) -> PortOutput:
        graphs = (self.prefill_graph, self.decode_graph)
        components = [find_components(g.model) for g in graphs]
        recorders = [ComponentRecorder(g.model, c) for g, c in zip(graphs, components, strict=False)]
        try:
            with torch.no_grad():
                calls, sequences, prefill_logits = self._run_prefill(recorders[0])
                self._hand_over_cache(calls)
                decode_logits = self._run_decode(teacher, recorders[1], sequences)
        finally:
            for recorder in recorders:
                recorder.remove()
        session = self.prefill_graph.session
        output = PortOutput(
            prefill_logits=prefill_logits,
            decode_logits=decode_logits,
            components=components[0],
            prefill_records={c.name: [] for c in components[0]},
            decode_records={c.name: [] for c in components[0]},
            unexpected_keys=session.unexpected_keys,
            timings={
                **session.timings,
                **{f"decode_graph_{k}": v for k, v in self.decode_graph.session.timings.items()},
            },
            prefill_calls=calls,
            prefill_spans=_spans(calls, sequences),
            sequences=list(sequences),
            segmented=any(call.segment for call in calls),
            guarded_attributes=sorted(set(session.guarded) | set(self.decode_graph.session.guarded)),
        )
        self._keep_records(recorders, calls, len(sequences), output)
        return output

    def _forward(self, graph: _Graph, stage: str, step: StepInputs, with_rank: bool = True) -> torch.Tensor:
        self._enter(graph.name, graph.vllm_config)
        return graph.session._forward(stage, step, with_rank=with_rank)

    def decode_again(
        self, step: int, tokens: list[int], batch: list[int | None], with_rank: bool = True
    ) -> torch.Tensor:
        """After ``run``: the decode call of ``step`` made again on the
        decode graph with ``tokens`` for the rows of ``batch``, ``rank``
        omitted without ``with_rank`` (``rankless_check``); its logits."""
        return self._forward(self.decode_graph, "decode", self._decode_inputs(step, tokens, batch), with_rank)

    def _run_prefill(self, recorder: ComponentRecorder):
        start = time.perf_counter()
        scenario = self.scenario
        every = scenario.sequences(scenario.chunked is not None)
        mine = scenario.replicas(every, self.layout.dp)[self.replica]
        first = self._prefill_call(PrefillCall(mine[0], 0, len(scenario.prompts[mine[0]])))
        calls, logits = [first], []
        recorder.set_tag(("prefill", 0))
        logits.append(self._forward(self.prefill_graph, "prefill", self._prefill_inputs(first)))
        cache_paths = self._agree_on_cache_paths()
        sequences = scenario.replicas(scenario.sequences(cache_paths), self.layout.dp)[self.replica]
        plan = [call for call in scenario.prefill_plan(cache_paths) if call.sequence in sequences]
        for call in plan[1:]:
            call = self._prefill_call(call)
            recorder.set_tag(("prefill", len(calls)))
            logits.append(self._forward(self.prefill_graph, "prefill", self._prefill_inputs(call)))
            calls.append(call)
        self.prefill_graph.session.timings["prefill"] = time.perf_counter() - start
        return calls, sequences, logits

    def _agree_on_cache_paths(self) -> bool:
        """The cache paths for every rank or none (``PortSession._cache_paths``
        on this rank's prefill graph, then the world's maximum)."""
        import torch.distributed as dist

        mine = self.prefill_graph.session._cache_paths()
        flag = torch.tensor([int(mine)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _hand_over_cache(self, calls: list[PrefillCall]) -> None:
        """A plain prefill's cache, re-laid into this DCP rank's share."""
        if not self.relayout:
            return
        scenario = self.scenario
        width, interleave, place = self._cp
        source_slots, target_slots = [], []
        for sequence in sorted({call.sequence for call in calls}):
            plain = scenario.block_table(sequence)
            shared = scenario.block_table(sequence, width)
            for position in range(len(scenario.prompts[sequence])):
                slot = scenario.layout.cp_slot(shared, position, width, interleave, place)
                if slot >= 0:
                    source_slots.append(scenario.layout.slot(plain, position))
                    target_slots.append(slot)
        block = scenario.layout.block_size
        source = torch.tensor(source_slots, dtype=torch.int64)
        target = torch.tensor(target_slots, dtype=torch.int64)
        for name, caches in self.prefill_graph.session.caches.items():
            for plain_cache, cp_cache in zip(caches, self.decode_graph.session.caches[name], strict=False):
                view_in = plain_cache if plain_cache.dim() == 4 else plain_cache.unsqueeze(1)
                view_out = cp_cache if cp_cache.dim() == 4 else cp_cache.unsqueeze(1)
                rows = view_in[source // block, :, source % block]
                view_out[target // block, :, target % block] = rows

    def _run_decode(self, teacher, recorder: ComponentRecorder, sequences: tuple[int, ...]):
        import torch.distributed as dist

        start = time.perf_counter()
        size = torch.tensor([len(sequences)], dtype=torch.int64)
        dist.all_reduce(size, op=dist.ReduceOp.MAX)
        batch: list[int | None] = list(sequences) + [None] * (int(size.item()) - len(sequences))
        logits = []
        for step in range(self.scenario.steps):
            recorder.set_tag(("decode", step))
            tokens = [0 if b is None else teacher[b][step] for b in batch]
            output = self._forward(self.decode_graph, "decode", self._decode_inputs(step, tokens, batch))
            logits.append(output[: len(sequences)])
        self.decode_graph.session.timings["decode"] = time.perf_counter() - start
        self.batch, self.decode_batch = len(batch), batch
        return logits

    def _keep_records(self, recorders, calls, real: int, output: PortOutput) -> None:
        prefill, decode = recorders
        for name, entries in prefill.records.items():
            for (_phase, index), tensor in entries:
                rows = tensor.reshape(-1, tensor.shape[-1])
                output.prefill_records[name].append(
                    _real_rows(rows, calls[index], self.tp_rank, self.layout.tp)
                )
        for name, entries in decode.records.items():
            if name not in output.decode_records:
                continue
            for _tag, tensor in entries:
                rows = tensor.reshape(-1, tensor.shape[-1])
                output.decode_records[name].append(self._own_rows(rows)[:real])

    def _own_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """This replica's rows of a decode output that holds the batches of
        ``k`` replicas (a DP group's gathered state: replica ``d`` is member
        ``d % k``)."""
        if rows.shape[0] == self.batch or rows.shape[0] % self.batch != 0:
            return rows
        k = rows.shape[0] // self.batch
        own = self.replica % k
        return rows[own * self.batch : (own + 1) * self.batch]


class _WithNeuronConfig:
    """The factory as the runner calls it, with this graph's neuron config."""

    def __init__(self, factory: Any, neuron_config: Any) -> None:
        self.factory, self.neuron_config = factory, neuron_config

    def from_configs(self, hf_config: Any, _neuron_config: Any = None) -> Any:
        return self.factory.from_configs(hf_config, self.neuron_config)
