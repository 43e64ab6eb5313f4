"""multi-query: one key/value head when a config flag says so (gpt_bigcode's multi_query)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.config import config_class
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.edit.config_fields import add_config_fields, prepend_to_post_init
from autoport_cst.transform.edit.tree import with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "multi-query"
COMMENT = "<-- MODEL-SPECIFIC: multi-query attention: one key/value head shared by every query head"


@dataclass(frozen=True)
class MultiQueryParams:
    key: str = field(
        default="multi_query",
        metadata={"doc": "The boolean config field that makes the attention multi-query."},
    )


class MultiQuery(Codemod):
    """One key/value head shared by every query head when a config flag says so (gpt_bigcode's ``multi_query``).

    transformers' GPTBigCode builds its fused ``c_attn`` with one key and one
    value head when ``config.multi_query`` is set, whatever
    ``num_key_value_heads`` the config carries (a config without it means
    one KV head per query head). The port's attention already serves any
    KV head count (GQA; the KV heads replicated over the TP ranks when
    fewer), so the change is in the config file: the dataclass gains the
    flag (``<key>: bool = False``) and ``__post_init__`` first sets
    ``num_key_value_heads = 1`` when it is on. The fused Q/K/V checkpoint
    tensor (q rows, then one head of k, then one of v) is split by
    ``fused-checkpoint``'s loader, each rank taking the shared K/V head.

    Precondition: one config dataclass.
    """

    ID = ID
    REALIZES = Realizes({"attention.multi_query_key": not_to(None)})
    Params = MultiQueryParams
    FILES = ("config",)
    TOUCHES = ()
    PITFALLS = (
        Pitfall(
            175,
            lambda spec, facts: spec.attention.multi_query_key is not None,
            lambda spec, facts: (
                f"multi-query attention (config.{spec.attention.multi_query_key}): one KV head whatever "
                "num_key_value_heads says, replicated over the TP ranks"
            ),
        ),
    )
    EXAMPLES = (
        Example(
            title="gpt_bigcode",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class GPTBigCodeConfig:
                    num_key_value_heads: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16

                    def __post_init__(self) -> None:
                        if self.num_key_value_heads is None:
                            self.num_key_value_heads = self.num_attention_heads
            """,
            after="""
                @dataclass
                class GPTBigCodeConfig:
                    num_key_value_heads: int | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # one key/value head when set (multi-query attention)
                    multi_query: bool = False
                    torch_dtype: torch.dtype = torch.bfloat16

                    def __post_init__(self) -> None:
                        # <-- MODEL-SPECIFIC: multi-query attention: one key/value head shared by every query head
                        if self.multi_query:
                            self.num_key_value_heads = 1
                        if self.num_key_value_heads is None:
                            self.num_key_value_heads = self.num_attention_heads
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> MultiQueryParams:
        return MultiQueryParams(key=target.attention.multi_query_key or "multi_query")

    @classmethod
    def check_params(cls, params: MultiQueryParams) -> list[str]:
        return [] if params.key.isidentifier() else [f"key {params.key!r} is not a config field name"]

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role != "config":
            return module
        key = self.params.key
        module = add_config_fields(
            module, ctx, [(f"{key}: bool = False", "one key/value head when set (multi-query attention)")]
        )
        cls = config_class(module, ctx)
        if COMMENT in module.code_for_node(cls):
            return module
        guard = with_comment(
            parse_statement(f"if self.{key}:\n    self.num_key_value_heads = 1", module), COMMENT
        )
        body = prepend_to_post_init(list(cls.body.body), [guard], module)
        new_cls = cls.with_changes(body=cls.body.with_changes(body=body))
        return module.with_changes(body=[new_cls if s is cls else s for s in module.body])
