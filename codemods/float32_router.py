"""float32-router: the MoE router weight is created and loaded as float32."""

from __future__ import annotations

import re

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import classes, code_of, dotted, keyword_arg, self_assignment, walk
from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, to

ROUTER_PARAM = re.compile(r"^(router|gate|routing)(_gate)?_weight$|router.*weight|^router_bias$")
ROUTER_MODULE = ("gate", "router")
LOAD_METHODS = re.compile(r"^(load_weights|_load_\w*|_cast\w*)$")
FLOAT32 = "torch.float32"
DTYPE_KEYWORDS = ("router_mm_dtype", "computation_dtype")


def _float32_like(dtype: str) -> str:
    """``nl.bfloat16`` -> ``nl.float32``; ``torch.float16`` -> ``torch.float32``."""
    namespace = dtype.rsplit(".", 1)[0] if "." in dtype else "torch"
    return f"{namespace}.float32"


class Float32Router(Codemod):
    """Create and load the MoE router weight in float32, and compute every router site in float32.

    Expert selection is a top-k over router scores; in bf16, near-ties between
    experts flip, and the model silently routes tokens to the wrong experts.
    This changes numerics (by design), so lint applies it only with
    ``--unsafe-fixes``.

    What the real packages do, and what this codemod decides: qwen3_moe and
    gpt_oss keep the router weight (and bias) in bf16, compute the prefill
    router in float32 (``NF.router(..., computation_dtype=torch.float32)``
    casts the weight up) but the decode router's matmul in bf16
    (``NF.moe_block_tkg(..., router_mm_dtype=nl.bfloat16)``). Their spec is
    therefore ``router_dtype: bfloat16`` (a bf16 weight, and a bf16 decode
    router). A float32 router here means both the weight and every router
    computation:

    - Creation: ``self.<router>_weight = nn.Parameter(torch.<ctor>(..., dtype=...))``
      (``router_weight``, ``gate_weight``, ...; not an MLP's ``gate_proj_weight``)
      and a router bias (``router_bias``) get ``dtype=torch.float32``; so does an
      ``nn.Linear`` router assigned to ``self.gate`` / ``self.router`` in an
      MoE, experts or router class.
    - Every router site (the ``moe.router`` family): ``NF.router`` and its
      op-by-op substitute get ``computation_dtype=torch.float32``; the decode
      kernel ``NF.moe_block_tkg`` (and its substitute) gets
      ``router_mm_dtype=nl.float32``; other router kernels with a
      ``router_mm_dtype`` / ``computation_dtype`` argument get float32 in the
      same namespace (``torch.float16`` -> ``torch.float32``); a router site
      with no dtype argument (an explicit matmul with the weight, a router
      module) is guarded (its path raises ``NotImplementedError``), since a
      float32 weight against bf16 activations would not run as written.
    - Loading: a blanket cast in a load method (``load_weights``, ``_load_*``,
      ``_cast*``) of the form ``for name, tensor in state.items(): ...
      tensor.to(<dtype>)`` (or the same in a comprehension) keeps router tensors
      in float32: ``tensor.to(torch.float32 if name.endswith(<router keys>)
      else <dtype>)``. Loaders that cast to the parameter's own dtype (the
      pipelined loader of the real packages) need no change.

    Preconditions: a router weight exists in the file; ``nl`` (``nki.language``)
    imported where a decode kernel gets a new ``router_mm_dtype``. Already
    float32: unchanged.
    """

    ID = "float32-router"
    REALIZES = Realizes({"moe.router_dtype": to("float32")})
    SAFE = False
    EXAMPLES = (
        Example(
            title="bf16 router parameter and a blanket cast on load",
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=self.dtype))
                        self.gate_up_proj_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, 2 * self.intermediate, dtype=self.dtype))


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        state = checkpoint.load(path)
                        for name, tensor in state.items():
                            state[name] = tensor.to(self.config.torch_dtype)
                        self.load_state_dict(state, strict=False, assign=True)
            """,
            after="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32))
                        self.gate_up_proj_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, 2 * self.intermediate, dtype=self.dtype))


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        state = checkpoint.load(path)
                        for name, tensor in state.items():
                            state[name] = tensor.to(torch.float32 if name.endswith(".router_weight") else self.config.torch_dtype)
                        self.load_state_dict(state, strict=False, assign=True)
            """,
        ),
        Example(
            title="dense model: no router",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(4, 8, dtype=self.dtype))
            """,
            raises="no MoE router weight",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext):
        return cls.Params()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        routers = _router_parameters(module)
        if not routers:
            raise ctx.precondition(
                "float32-router: no MoE router weight in this file (looked for "
                "self.router_weight / self.gate_weight = nn.Parameter(...), or an nn.Linear "
                "self.gate / self.router in an MoE, experts or router class)"
            )
        module = self._sites(module, ctx)
        routers = _router_parameters(module)
        module = module.visit(_Float32Creation({id(stmt) for stmt in routers.values()}, module))
        suffixes = tuple(f".{attr}" for attr in sorted(routers))
        return module.visit(_KeepRouterOnLoad(suffixes, module))

    def _sites(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        """Every router site computes in float32."""
        edits: dict = {}
        for site in anatomy_experts.moe_sites(module, "moe.router"):
            if site.kind in ("router", "router_sub"):
                key, value = "computation_dtype", FLOAT32
            elif site.kind in ("block", "block_sub"):
                current = anatomy_experts.literal(site.call, "router_mm_dtype")
                if current is None and not moe_edits.module_imports_name(module, "nl"):
                    raise ctx.precondition(
                        f"float32-router: {site.name} computes its router in the kernel's default dtype and "
                        "nki.language is not imported as nl (for router_mm_dtype=nl.float32)",
                        site.call,
                        module,
                    )
                key, value = "router_mm_dtype", _float32_like(current or "nl.bfloat16")
            else:
                key = next(
                    (k for k in DTYPE_KEYWORDS if anatomy_experts.literal(site.call, k) is not None), None
                )
                if key is None:
                    moe_edits.guard_site(
                        module,
                        ctx,
                        site,
                        f"float32 router: {site.name} is not ported to a float32 router weight",
                        "<-- MODEL-SPECIFIC: this router computation does not take a float32 router",
                        edits,
                    )
                    continue
                value = _float32_like(anatomy_experts.literal(site.call, key))
            if anatomy_experts.literal(site.call, key) != value:
                expr = parse_expr(value, module)
                edits[id(site.call)] = lambda updated, key=key, expr=expr: set_keyword(updated, key, expr)
        return rewrite(module, edits)


def _router_parameters(module: cst.Module) -> dict[str, cst.SimpleStatementLine]:
    """Attribute name (as it appears in parameter names) -> creating statement."""
    found: dict[str, cst.SimpleStatementLine] = {}
    for cls in classes(module):
        moe_like = class_role(cls.name.value) in ("moe", "experts", "router")
        for node in walk(cls):
            if not isinstance(node, cst.SimpleStatementLine):
                continue
            assignment = self_assignment(node)
            if assignment is None or not isinstance(assignment[1], cst.Call):
                continue
            attr, value = assignment
            ctor = dotted(value.func) or ""
            if ctor.endswith("Parameter") and ROUTER_PARAM.search(attr) and "proj" not in attr:
                found[attr] = node
            elif moe_like and ctor.endswith("Linear") and attr in ROUTER_MODULE:
                found[f"{attr}.weight"] = node
    return found


def _set_dtype(call: cst.Call, module: cst.Module) -> cst.Call:
    dtype = keyword_arg(call, "dtype")
    value = parse_expr(FLOAT32, module)
    if dtype is not None:
        if code_of(dtype.value) == FLOAT32:
            return call
        return call.with_changes(args=[a.with_changes(value=value) if a is dtype else a for a in call.args])
    new_arg = cst.Arg(
        keyword=cst.Name("dtype"),
        value=value,
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new_arg])


class _Float32Creation(cst.CSTTransformer):
    def __init__(self, statements: set[int], module: cst.Module) -> None:
        self.statements = statements
        self.module = module
        self.inside = 0

    def visit_SimpleStatementLine(self, node) -> None:
        if id(node) in self.statements:
            self.inside += 1

    def leave_SimpleStatementLine(self, original, updated):
        if id(original) in self.statements:
            self.inside -= 1
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.inside:
            return updated
        name = dotted(updated.func) or ""
        if name.endswith("Parameter") and updated.args and isinstance(updated.args[0].value, cst.Call):
            inner = _set_dtype(updated.args[0].value, self.module)
            return updated.with_changes(args=[updated.args[0].with_changes(value=inner), *updated.args[1:]])
        if name.endswith("Linear"):
            return _set_dtype(updated, self.module)
        return updated


class _KeepRouterOnLoad(cst.CSTTransformer):
    """In load methods: ``value.to(D)`` inside a loop or comprehension over
    ``X.items()`` keeps router tensors in float32."""

    def __init__(self, suffixes: tuple[str, ...], module: cst.Module) -> None:
        self.suffixes = suffixes
        self.module = module
        self.in_load = 0
        self.loops: list[tuple[str, str]] = []  # (key var, value var)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if LOAD_METHODS.match(node.name.value):
            self.in_load += 1

    def leave_FunctionDef(self, original, updated):
        if LOAD_METHODS.match(original.name.value):
            self.in_load -= 1
        return updated

    def _push(self, target: cst.BaseExpression, iterable: cst.BaseExpression) -> bool:
        if (
            isinstance(iterable, cst.Call)
            and isinstance(iterable.func, cst.Attribute)
            and iterable.func.attr.value == "items"
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and all(isinstance(e.value, cst.Name) for e in target.elements)
        ):
            self.loops.append((target.elements[0].value.value, target.elements[1].value.value))
            return True
        self.loops.append(("", ""))
        return False

    def visit_For(self, node: cst.For) -> None:
        self._push(node.target, node.iter)

    def leave_For(self, original, updated):
        self.loops.pop()
        return updated

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._push(node.target, node.iter)

    def leave_CompFor(self, original, updated):
        self.loops.pop()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.in_load or not self.loops:
            return updated
        key, value = next(((k, v) for k, v in reversed(self.loops) if k), ("", ""))
        if not key:
            return updated
        func = updated.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "to"
            and isinstance(func.value, cst.Name)
            and func.value.value == value
            and len(updated.args) == 1
        ):
            return updated
        dtype = updated.args[0].value
        dtype_code = code_of(dtype)
        if FLOAT32 in dtype_code and "endswith" in dtype_code:
            return updated  # already exempts routers
        suffixes = self.suffixes[0] if len(self.suffixes) == 1 else self.suffixes
        condition = f"{key}.endswith({suffixes!r})".replace("'", '"')
        new_dtype = parse_expr(f"{FLOAT32} if {condition} else {dtype_code}", self.module)
        return updated.with_changes(args=[updated.args[0].with_changes(value=new_dtype)])
