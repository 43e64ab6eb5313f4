"""Sites: every place in a model file where one family of computation happens.

A *family* is what a codemod changes: the attention kernels, the Q/K/V
projection, the output projection, RoPE application, each sublayer call of a
decoder layer, the dense MLP kernel, the norms, the embedding lookup, the LM
head, the MoE router and experts. The real vllm_neuron code has several
sites per family (flash and segmented prefill, segmented with context
parallelism, fused and bounded-gather decode, a decode ``forward`` and a
``_forward_prefill``, FP8 branches), and a codemod that changes a family
must account for each of them (see ``census.py``).

A site is found structurally (by what is called, in which class role), and
is described by its *footprint*: the code the call's computation depends
on along one path through its method (``flow.py``), plus the attributes,
methods and module functions that code reads. A site whose footprint did not
change was not edited.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import libcst as cst

from autoport_cst.transform.cst_helpers import (
    call_name,
    dotted,
    self_assignment,
    self_attr,
    walk,
)
from autoport_cst.transform.anatomy import flow
from autoport_cst.transform.roles import class_role

Branch = flow.Branch


@dataclass(frozen=True)
class Site:
    """One variant (path) of one site of a family."""

    family: str
    cls: str  # enclosing class ("" at module level)
    function: str  # enclosing method
    kind: str  # what is called: ``NF.flash_attention``, ``self.self_attn``, ...
    ordinal: int  # rank among the calls of that kind in the method
    path: tuple[Branch, ...]  # the branches this variant takes (relevant ones only)
    footprint: str  # digest of the code the site depends on on that path
    node: cst.CSTNode = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.family, self.cls, self.function, self.kind, self.ordinal)

    def describe(self) -> str:
        where = f"{self.cls}.{self.function}" if self.cls else self.function
        text = f"{where}: {self.kind}"
        if self.ordinal:
            text += f" (#{self.ordinal + 1})"
        if self.path:
            text += " on the path " + ", ".join(
                f"{key}" if taken else f"not ({key})" for key, taken in self.path
            )
        return text


# -- what belongs to each family -----------------------------------------------------------


def _callee(call: cst.Call) -> str | None:
    """Dotted name of a call that can be a kernel: a function, not a module
    called through ``self``, a class, or a getter of groups and classes."""
    name = call_name(call)
    if name is None or name.startswith("self."):
        return None
    last = _last(name)
    if last[:1].isupper() or last.startswith(("get_", "resolve_")):
        return None
    return name


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def is_decode_kernel(name: str) -> bool:
    last = _last(name)
    return "attention_decode" in last and "mask" not in last


def is_attention_kernel(name: str) -> bool:
    last = _last(name).lower()
    return "attention" in last and "mask" not in last and "merge" not in last


def _kernel_kind(predicate: Callable[[cst.Call], bool]):
    def kind(call: cst.Call, _owner: "Owner") -> str | None:
        name = _callee(call)
        return name if name is not None and predicate(call) else None

    return kind


def _attention_kernel(call: cst.Call) -> bool:
    return is_attention_kernel(_callee(call) or "")


def _output(call: cst.Call) -> bool:
    name = _callee(call) or ""
    return _last(name) == "o_proj" or is_decode_kernel(name)


def _mlp_kernel(call: cst.Call) -> bool:
    name = _callee(call) or ""
    return "mlp" in _last(name).lower()


@dataclass
class Owner:
    """A class and what its ``__init__`` (and other methods) assign to ``self``."""

    cls: cst.ClassDef
    role: str | None
    attr_classes: dict[str, str]  # self attribute -> class it is built from (a call)


SUBLAYER_NAMES = ("self_attn", "attn", "attention", "mlp", "feed_forward", "block_sparse_moe", "moe")


def _module_call_kind(roles: tuple[str, ...], names: tuple[str, ...] = ()):
    """``self.<attr>(...)`` where ``attr`` is built from a class of one of
    ``roles`` (or, when built dynamically, is named one of ``names``)."""

    def kind(call: cst.Call, owner: Owner) -> str | None:
        attr = self_attr(call.func)
        if attr is None:
            return None
        built = owner.attr_classes.get(attr)
        if built is not None and class_role(built) in roles:
            return f"self.{attr}"
        if (built is None or class_role(built) is None) and attr in names:
            return f"self.{attr}"
        return None

    return kind


def _norm_kind(call: cst.Call, owner: Owner) -> str | None:
    """A norm module called, or a norm's weight handed to a fused kernel."""
    direct = _module_call_kind(("norm",))(call, owner)
    if direct is not None:
        return direct
    for arg in call.args:
        for node in walk(arg.value):
            if isinstance(node, cst.Attribute) and node.attr.value in ("weight", "bias"):
                attr = self_attr(node.value)
                if attr is not None and class_role(owner.attr_classes.get(attr, "")) == "norm":
                    return f"{dotted(call.func) or 'call'}({dotted(node)})"
    return None


def _named_attr_kind(names: tuple[str, ...], ctors: tuple[str, ...]):
    def kind(call: cst.Call, owner: Owner) -> str | None:
        attr = self_attr(call.func)
        if attr is None:
            return None
        built = owner.attr_classes.get(attr, "")
        if attr in names or _last(built) in ctors:
            return f"self.{attr}"
        return None

    return kind


@dataclass(frozen=True)
class Family:
    name: str
    doc: str
    kind: Callable[[cst.Call, Owner], str | None]
    roles: tuple[str, ...] | None = None  # class roles searched (None: every class)
    # kinds whose footprint is the call alone: a fused kernel that is handed a
    # module's weight computes with it itself, so a change to the module
    # (its class, its forward) does not reach the kernel
    narrow: Callable[[str], bool] = lambda kind: False


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "attention.kernel",
            "attention kernels: flash, segmented (and with context parallelism), "
            "fused decode and their op-by-op substitutes",
            _kernel_kind(_attention_kernel),
        ),
        Family(
            "attention.qkv",
            "the queries, keys and values each attention kernel consumes (projection, "
            "q/k norms, RoPE, biases: all in the kernel call's footprint)",
            _kernel_kind(_attention_kernel),
        ),
        Family("attention.output", "output projection: NF.o_proj and the decode kernel", _kernel_kind(_output)),
        Family(
            "rope.application",
            "where rotated queries and keys are consumed: each attention kernel",
            _kernel_kind(_attention_kernel),
        ),
        Family(
            "decoder.sublayer",
            "each call of the attention or MLP/MoE module in a decoder layer's forwards",
            _module_call_kind(("attention", "mlp", "moe", "experts"), SUBLAYER_NAMES),
            roles=("decoder_layer",),
        ),
        Family("mlp.kernel", "dense MLP kernels (NF.mlp and substitutes)", _kernel_kind(_mlp_kernel)),
        Family(
            "norm.application",
            "norm modules called, and norm weights fused into kernels",
            _norm_kind,
            narrow=lambda kind: "(" in kind,
        ),
        Family(
            "embedding.lookup",
            "token embedding lookups",
            _named_attr_kind(("embed_tokens",), ("VocabDimShardedEmbedding",)),
        ),
        Family(
            "lm_head.logits",
            "LM-head projections",
            _named_attr_kind(("lm_head",), ("ColumnParallelLinear",)),
            roles=("causal_lm",),
        ),
        Family("rope.frequencies", "rotary-embedding modules called", _module_call_kind(("rotary",))),
    )
}


# -- footprints -----------------------------------------------------------------------------


class ModuleIndex:
    """Classes, module functions and generated code of one module, cached."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
        self.functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        self._code: dict[int, str] = {}
        self._flat: dict[int, flow.FlatFunction] = {}
        self._owners: dict[int, Owner] = {}

    def code(self, node: cst.CSTNode) -> str:
        key = id(node)
        if key not in self._code:
            self._code[key] = self.module.code_for_node(node)
        return self._code[key]

    def flat(self, func: cst.FunctionDef) -> flow.FlatFunction:
        if id(func) not in self._flat:
            self._flat[id(func)] = flow.flatten(func)
        return self._flat[id(func)]

    def owner(self, cls: cst.ClassDef) -> Owner:
        if id(cls) not in self._owners:
            attrs: dict[str, str] = {}
            for node in walk(cls):
                pair = self_assignment(node) if isinstance(node, cst.SimpleStatementLine) else None
                if pair is not None and isinstance(pair[1], cst.Call) and pair[0] not in attrs:
                    attrs[pair[0]] = dotted(pair[1].func) or ""
            self._owners[id(cls)] = Owner(cls, class_role(cls.name.value), attrs)
        return self._owners[id(cls)]


def methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return [s for s in body if isinstance(s, cst.FunctionDef)]


class _Footprint:
    """Collects the code a site depends on: its slice on one path, the
    ``self`` attributes that code reads (where they are set), the methods
    and module functions it calls, and the ``forward`` of package classes
    held in attributes it calls."""

    def __init__(self, index: ModuleIndex, cls: cst.ClassDef | None) -> None:
        self.index = index
        self.cls = cls
        self.parts: set[str] = set()
        self.seen: set[int] = set()
        self.attrs: set[tuple[str, str]] = set()

    def add_items(self, flat: flow.FlatFunction, items: list[flow.Item]) -> None:
        for item in items:
            self.add_code(flow.header_code(item, self.index.code))
            for key, _ in item.conditions:
                self.add_code(f"if {self.index.code(flat.if_tests[key])}")
            self.follow(_own_nodes(item))
        used = {name for item in items for name in item.uses}
        self.callers(flat.func, used)

    def callers(self, func: cst.FunctionDef, used: set[str]) -> None:
        """For the parameters of ``func`` the slice reads: what the other
        methods of the class pass to them (``self.<func>(...)`` calls), with
        the slice of those arguments in the caller."""
        if self.cls is None:
            return
        params = [p.name.value for p in func.params.params]
        wanted = [i for i, name in enumerate(params) if name in used and name != "self"]
        if not wanted or ("callers", func.name.value) in self.attrs:
            return
        self.attrs.add(("callers", func.name.value))
        for other in methods(self.cls):
            if other is func:
                continue
            flat = self.index.flat(other)
            for item in flat.items:
                for call in _calls_in(_own_nodes(item)):
                    if self_attr(call.func) != func.name.value:
                        continue
                    names = _argument_names(call, params, wanted)
                    self.add_items(flat, [item, *flow.backward(flat.items, item, names)])

    def add_code(self, text: str) -> None:
        self.parts.add(text)

    def follow(self, nodes: list[cst.CSTNode]) -> None:
        for node in nodes:
            for n in walk(node):
                attr = self_attr(n)
                if attr is not None:
                    self.attribute(attr)
                if isinstance(n, cst.Call):
                    self.callee(n)

    def attribute(self, attr: str) -> None:
        """Where ``self.<attr>`` gets its value: its assignments, and the
        weight loader attached to it (a parameter's value is what its loader
        makes of the checkpoint)."""
        if self.cls is None or ("attr", attr) in self.attrs:
            return
        self.attrs.add(("attr", attr))
        for func in methods(self.cls):
            flat = self.index.flat(func)
            for item in flat.items:
                node = item.node
                if not isinstance(node, cst.SimpleStatementLine) or id(node) in self.seen:
                    continue
                pair = self_assignment(node)
                if (pair is None or pair[0] != attr) and _loaded_attr(node) != attr:
                    continue
                self.seen.add(id(node))
                names = {n for n in item.uses if n != "self"}
                self.add_items(flat, [item, *flow.backward(flat.items, item, names)])

    def callee(self, call: cst.Call) -> None:
        name = dotted(call.func)
        attr = self_attr(call.func)
        if attr is not None and self.cls is not None:
            own = next((m for m in methods(self.cls) if m.name.value == attr), None)
            if own is not None:
                self.include(own, follow=True)
                return
            # a module held in an attribute: its class, as a whole
            built = self.index.owner(self.cls).attr_classes.get(attr)
            held = self.index.classes.get(built or "")
            if held is not None:
                self.include(held, follow=False)
        elif name in self.index.functions:
            self.include(self.index.functions[name], follow=True)

    def include(self, target: cst.FunctionDef | cst.ClassDef, follow: bool) -> None:
        if id(target) in self.seen:
            return
        self.seen.add(id(target))
        self.add_code(self.index.code(target))
        if follow:
            self.follow([target])

    def digest(self) -> str:
        text = "\n\0".join(sorted(self.parts))
        return hashlib.sha1(text.encode()).hexdigest()


def _loaded_attr(stmt: cst.SimpleStatementLine) -> str | None:
    """``x`` for ``set_weight_loader(self.x, ...)`` (or ``self.x.weight``)."""
    if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr):
        return None
    call = stmt.body[0].value
    if not isinstance(call, cst.Call) or _last(call_name(call) or "") != "set_weight_loader" or not call.args:
        return None
    target = call.args[0].value
    attr = self_attr(target)
    if attr is None and isinstance(target, cst.Attribute):
        attr = self_attr(target.value)
    return attr


def _calls_in(nodes: list[cst.CSTNode]) -> Iterator[cst.Call]:
    for node in nodes:
        yield from _calls(node)


def _argument_names(call: cst.Call, params: list[str], wanted: list[int]) -> set[str]:
    """Names read by the arguments of a ``self.method(...)`` call that bind
    the parameters at ``wanted`` (indices into ``params``, ``self`` first)."""
    from autoport_cst.transform.cst_helpers import free_names

    names: set[str] = set()
    positional = [a for a in call.args if a.keyword is None]
    for index in wanted:
        name = params[index]
        arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)
        if arg is None and 0 < index <= len(positional):
            arg = positional[index - 1]
        if arg is not None:
            names |= free_names(arg.value)
    if any(a.star for a in call.args):
        names |= {n for a in call.args if a.star for n in free_names(a.value)}
    return names - {"self"}


def _own_nodes(item: flow.Item) -> list[cst.CSTNode]:
    node = item.node
    if item.header == "for":
        return [node.target, node.iter]  # type: ignore[attr-defined]
    if item.header == "with":
        return list(node.items)  # type: ignore[attr-defined]
    return [node]


# -- finding sites -------------------------------------------------------------------------


def _calls(node: cst.CSTNode) -> Iterator[cst.Call]:
    for n in walk(node):
        if isinstance(n, cst.Call):
            yield n


def _variants(index: ModuleIndex, cls: cst.ClassDef | None, func: cst.FunctionDef,
              call: cst.Call) -> list[tuple[tuple[Branch, ...], str]]:
    """(path, footprint) of each distinct path to ``call`` in ``func``."""
    flat = index.flat(func)
    start = flat.item_of(call)
    if start is None:  # pragma: no cover - every call sits in some item
        return [((), index.code(call))]
    names = {n for n in start.uses if n != "self"}
    found: dict[frozenset[int], tuple[tuple[Branch, ...], str]] = {}
    for path in flow.paths(flat, start, names):
        line = flow.on_path(flat, path)
        items = [start, *flow.backward(line, start, names, path), *flow.consumers(line, start, path)]
        chosen = frozenset(item.index for item in items)
        if chosen in found:
            continue
        footprint = _Footprint(index, cls)
        footprint.seen.add(id(func))  # the site's own method is read by its slice, not whole
        footprint.add_items(flat, items)
        fixed = {key for key, _ in start.conditions}
        signature = tuple((key, taken) for key, taken in path.items() if key not in fixed)
        found[chosen] = (signature, footprint.digest())
    return list(found.values())


# Methods that build, load or describe the model: no computation of a family runs there.
NOT_FORWARD = ("__init__", "from_configs", "get_kv_spec", "bind_kv_cache")
NOT_FORWARD_PREFIXES = ("load_weights", "_load", "_setup")


def is_forward_method(func: cst.FunctionDef) -> bool:
    name = func.name.value
    return name not in NOT_FORWARD and not name.startswith(NOT_FORWARD_PREFIXES)


def find_sites(module: cst.Module, family: str, index: ModuleIndex | None = None) -> list[Site]:
    """Every site of ``family`` in the methods of ``module``'s classes, one
    entry per distinct path."""
    spec = FAMILIES[family]
    index = index or ModuleIndex(module)
    sites: list[Site] = []
    for cls in index.classes.values():
        owner = index.owner(cls)
        if spec.roles is not None and owner.role not in spec.roles:
            continue
        for func in filter(is_forward_method, methods(cls)):
            ordinals: dict[str, int] = {}
            for call in _calls(func):
                kind = spec.kind(call, owner)
                if kind is None:
                    continue
                ordinal = ordinals.get(kind, 0)
                ordinals[kind] = ordinal + 1
                if spec.narrow(kind):
                    digest = hashlib.sha1(index.code(call).encode()).hexdigest()
                    sites.append(Site(family, cls.name.value, func.name.value, kind, ordinal, (), digest, call))
                    continue
                for path, footprint in _variants(index, cls, func, call):
                    sites.append(
                        Site(family, cls.name.value, func.name.value, kind, ordinal, path, footprint, call)
                    )
    return sites
