"""logits-divisor: the final logits divided by a constant (Granite logits_scaling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.decoder import logits_site
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import self_attr, walk
from autoport_cst.transform.edit.config_fields import config_scalar_edit, init_reads_config
from autoport_cst.transform.edit.layer_guards import other_model_file
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, not_to


@dataclass(frozen=True)
class LogitsDivisorParams:
    config_key: str = field(
        default="logits_scaling",
        metadata={"doc": "Config field holding the factor.", "examples": ("logit_scale",)},
    )
    default: float = field(default=1.0, metadata={"doc": "Its value when the config has none."})
    form: Literal["divide", "multiply"] = field(
        default="divide",
        metadata={
            "doc": "divide: logits / field (Granite logits_scaling); multiply: logits * field (Cohere logit_scale)."
        },
    )


class LogitsDivisor(Codemod):
    """Divide the LM-head logits by a constant read from the config.

    Granite computes ``logits = lm_head(h) / logits_scaling``. In the causal
    LM class (``<Prefix>ForCausalLM``): ``__init__`` gets ``self.<key> =
    config.<key>``; ``forward`` gets ``logits = logits / self.<key>`` right
    after the LM-head statement (and the logits' own rescaling) (``logits = self.lm_head(...)``), so that
    every use of the logits sees them divided: the gathered logits of
    logprobs, the rows kept after LM-head data parallelism, on-device
    sampling, the returned logits. In the config file, the dataclass gets
    ``<key>: float = <default>``.

    With ``form="multiply"`` the logits are multiplied by the field instead
    (Cohere's ``logits = lm_head(h) * logit_scale``): the spec's
    ``logits_divisor`` is then the field's reciprocal, and the port multiplies
    by the field itself, which is exact.

    Precondition: one ``<Prefix>ForCausalLM`` class taking ``config`` whose
    ``forward`` calls the LM head once, in a top-level ``<logits> =
    self.lm_head(...)`` statement.

    Realizes ``lm_head.logits_divisor`` with ``lm_head.logits_key`` and
    ``lm_head.logits_form`` (``divisor`` -> divide, ``multiplier`` -> multiply).
    """

    ID = "logits-divisor"
    REALIZES = Realizes(
        dict.fromkeys(("lm_head.logits_divisor", "lm_head.logits_key", "lm_head.logits_form"), not_to(None))
    )
    Params = LogitsDivisorParams
    FILES = ("model", "config", "module")
    EXAMPLES = (
        Example(
            title="Granite",
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
                        self.logits_scaling = config.logits_scaling

                    def forward(self, input_ids, positions):
                        hidden_states = self.model(input_ids, positions)
                        logits = self.lm_head(hidden_states)
                        logits = logits / self.logits_scaling
                        return logits
            """,
        ),
        Example(
            title="Cohere multiplies by logit_scale",
            params={"config_key": "logit_scale", "form": "multiply"},
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
                        self.logit_scale = config.logit_scale

                    def forward(self, input_ids, positions):
                        hidden_states = self.model(input_ids, positions)
                        logits = self.lm_head(hidden_states)
                        logits = logits * self.logit_scale
                        return logits
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
    def params_for(cls, diffs, target, port: PortContext) -> LogitsDivisorParams:
        head = target.lm_head
        if head.logits_key is None:
            return LogitsDivisorParams()
        return LogitsDivisorParams(
            config_key=head.logits_key, form="multiply" if head.logits_form == "multiplier" else "divide"
        )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        key = self.params.config_key
        if ctx.role == "config":
            return config_scalar_edit(
                module,
                ctx,
                key,
                "float",
                self.params.default,
                "<-- MODEL-SPECIFIC: logits "
                + ("divided" if self.params.form == "divide" else "multiplied")
                + " by this",
            )
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "the logits scaling")
        site = logits_site(module, ctx)
        if site is None:
            return module
        lm, forward, name, last = site
        edits = init_reads_config(module, ctx, lm, key)
        operator = cst.Divide if self.params.form == "divide" else cst.Multiply
        if not any(
            isinstance(n, cst.BinaryOperation)
            and isinstance(n.operator, operator)
            and self_attr(n.right) == key
            for n in walk(forward)
        ):
            symbol = "/" if self.params.form == "divide" else "*"
            stmt = parse_statement(f"{name} = {name} {symbol} self.{key}", module)
            edits[id(last)] = lambda updated: cst.FlattenSentinel([updated, stmt])
        return rewrite(module, edits)
