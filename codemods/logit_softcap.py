"""logit-softcap: tanh softcapping of the final logits (Gemma 2)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.decoder import logits_site
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import is_call, self_attr, walk
from autoport_cst.transform.edit.config_fields import config_scalar_edit, init_reads_config
from autoport_cst.transform.edit.layer_guards import other_model_file
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, not_to


@dataclass(frozen=True)
class LogitSoftcapParams:
    config_key: str = field(
        default="final_logit_softcapping",
        metadata={"doc": "Config field holding the cap (null: no capping)."},
    )


class LogitSoftcap(Codemod):
    """Softcap the final logits: ``cap * tanh(logits / cap)``.

    Gemma 2 bounds its logits with ``final_logit_softcapping``: ``logits =
    tanh(logits / cap) * cap``, in the logits' dtype. In the causal LM class
    (``<Prefix>ForCausalLM``): ``__init__`` gets ``self.<key> = config.<key>``;
    ``forward``, right after the LM-head statement (``logits =
    self.lm_head(...)``) and the logits' own rescaling, before any other use
    of them (gathered logits, LM-head data-parallel rows, sampling), gets ``if self.<key> is not None: logits = torch.tanh(logits / self.<key>)
    * self.<key>`` (a Python-level test of a config float, resolved when the
    graph is traced). In the config file the dataclass gets ``<key>: float |
    None = None``. Applied per vocabulary shard, the capping is the same with
    or without gathered logits, so on-device sampling sees capped logits too.

    Runs after ``logits-divisor`` (a model with both divides first).
    Precondition: one ``<Prefix>ForCausalLM`` class taking ``config`` whose
    ``forward`` calls the LM head once, in a top-level ``<logits> =
    self.lm_head(...)`` statement.
    """

    ID = "logit-softcap"
    REALIZES = Realizes({"lm_head.softcap": not_to(None)})
    Params = LogitSoftcapParams
    PITFALLS = (
        Pitfall(
            280,
            lambda spec, facts: spec.lm_head.softcap is not None,
            "final logits tanh-softcapped at {spec.lm_head.softcap:g}",
        ),
    )
    FILES = ("model", "config", "module")
    AFTER = ("logits-divisor",)
    EXAMPLES = (
        Example(
            title="Gemma 2",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.lm_head = ColumnParallelLinear(config.hidden_size, config.vocab_size, bias=False)

                    def forward(self, input_ids, positions):
                        hidden_states = self.model(input_ids, positions)
                        logits = self.lm_head(hidden_states)
                        return logits
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.lm_head = ColumnParallelLinear(config.hidden_size, config.vocab_size, bias=False)
                        self.final_logit_softcapping = config.final_logit_softcapping

                    def forward(self, input_ids, positions):
                        hidden_states = self.model(input_ids, positions)
                        logits = self.lm_head(hidden_states)
                        if self.final_logit_softcapping is not None:
                            logits = torch.tanh(logits / self.final_logit_softcapping) * self.final_logit_softcapping
                        return logits
            """,
        ),
        Example(
            title="the config field",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    neuron_config: NeuronConfig | None = None
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    neuron_config: NeuronConfig | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # logits softcapped at this value
                    final_logit_softcapping: float | None = None
            """,
        ),
        Example(
            title="no LM head call",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        pass

                    def forward(self, input_ids):
                        return self.model(input_ids)
            """,
            raises="needs one top-level <logits> = self.lm_head(...) statement",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> LogitSoftcapParams:
        return LogitSoftcapParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        key = self.params.config_key
        if ctx.role == "config":
            return config_scalar_edit(
                module,
                ctx,
                key,
                "float | None",
                None,
                "<-- MODEL-SPECIFIC: logits softcapped at this value",
            )
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "the logit softcap")
        site = logits_site(module, ctx)
        if site is None:
            return module
        lm, forward, name, last = site
        edits = init_reads_config(module, ctx, lm, key)
        if not any(
            is_call(n, "torch.tanh") and any(self_attr(m) == key for m in walk(n)) for n in walk(forward)
        ):
            stmt = parse_statement(
                f"if self.{key} is not None:\n    {name} = torch.tanh({name} / self.{key}) * self.{key}",
                module,
            )
            edits[id(last)] = lambda updated: cst.FlattenSentinel([updated, stmt])
        return rewrite(module, edits)
