"""``nn.Parameter`` attributes added beside existing weights, and the module
names new code imports from."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.anatomy.classes import param_ctor
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    keyword_arg,
    positional_args,
    self_assignment,
)

WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"


ACT_TYPES = "nkilib.core.utils.common_types"


def bias_parameter(
    weight_stmt: cst.SimpleStatementLine, bias_attr: str, module: cst.Module
) -> cst.BaseStatement:
    """``self.<bias> = nn.Parameter(torch.zeros(<last weight dim>, dtype=<same>))``."""
    ctor = param_ctor(weight_stmt)
    if ctor is None:
        raise ValueError("weight is not nn.Parameter(torch.<ctor>(...))")
    dims = positional_args(ctor)
    dtype = keyword_arg(ctor, "dtype")
    dtype_code = f", dtype={code_of(dtype.value)}" if dtype is not None else ""
    pair = self_assignment(weight_stmt)
    assert pair is not None and isinstance(pair[1], cst.Call)  # as param_ctor found it
    param = dotted(pair[1].func)
    return parse_statement(
        f"self.{bias_attr} = {param}(torch.zeros({code_of(dims[-1].value)}{dtype_code}))", module
    )


def kwarg_code(call: cst.Call | None, name: str) -> str | None:
    if call is None:
        return None
    arg = keyword_arg(call, name)
    return None if arg is None else code_of(arg.value)
