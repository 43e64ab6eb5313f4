"""Statements and control flow: a block runs over a list of paths (one
:class:`~autoport_cst.research.interp.values.State` each, at most
``MAX_PATHS``); an ``if`` the interpreter cannot decide follows both
branches; loops over concrete sequences are unrolled, loops over tensors run
once, loops over a model's layers run for the first layer (every layer when
``every_layer`` is set); a ``raise`` drops its path. One ``_exec_<node type>``
method per statement kind; any other statement (``pass``, ``assert``,
``import``, ``del``, ``break``...) changes nothing."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.core import MAX_PATHS, MAX_UNROLL
from autoport_cst.research.interp.expressions import Expressions
from autoport_cst.research.interp.operators import binop, truth
from autoport_cst.research.interp.values import (
    MODULE_LIST,
    UNKNOWN,
    FirstOnly,
    FuncRef,
    Instance,
    Node,
    Param,
    Raised,
    State,
)
from autoport_cst.research.sources import SourceModule


class Statements(Expressions):
    def exec_block(self, body: list[ast.stmt], states: list[State], module: SourceModule) -> list[State]:
        for stmt in body:
            live = [s for s in states if not s.returned]
            done = [s for s in states if s.returned]
            if not live:
                return states
            new: list[State] = []
            for state in live:
                try:
                    new.extend(self.exec_stmt(stmt, state, module))
                except Raised:
                    continue
            states = done + new
            if len(states) > MAX_PATHS:
                states = states[:MAX_PATHS]
        return states

    def exec_stmt(self, stmt: ast.stmt, state: State, module: SourceModule) -> list[State]:
        handler = getattr(self, f"_exec_{type(stmt).__name__}", None)
        if handler is None:
            return [state]  # pass, assert, import, global, del, break, continue
        return handler(stmt, state, module)

    # ---- assignments and expression statements -----------------------------------

    def _exec_Assign(self, stmt: ast.Assign, state: State, module: SourceModule) -> list[State]:
        env = state.env
        frame = self.capture()
        try:
            value = self.eval(stmt.value, env, module, state)
        finally:
            self.release(frame)
        for target in stmt.targets:
            base = _attribute_base(target, env)
            if isinstance(base, Instance) and isinstance(target, ast.Attribute):
                _keep_none_reads(base, target.attr)
            self.assign(target, value, env, module, state)
            if isinstance(base, Instance) and isinstance(target, ast.Attribute):
                base.attr_reads[target.attr] = frozenset(frame)
                if _literal(stmt.value):
                    base.literal_attrs.add(target.attr)
                else:
                    base.literal_attrs.discard(target.attr)
        return [state]

    def _exec_AnnAssign(self, stmt: ast.AnnAssign, state: State, module: SourceModule) -> list[State]:
        if stmt.value is not None:
            self.assign(
                stmt.target, self.eval(stmt.value, state.env, module, state), state.env, module, state
            )
        return [state]

    def _exec_AugAssign(self, stmt: ast.AugAssign, state: State, module: SourceModule) -> list[State]:
        env = state.env
        current = self.eval(_load(stmt.target), env, module, state)
        value = binop(stmt.op, current, self.eval(stmt.value, env, module, state))
        self.assign(stmt.target, value, env, module, state)
        return [state]

    def _exec_Expr(self, stmt: ast.Expr, state: State, module: SourceModule) -> list[State]:
        env = state.env
        value = self.eval(stmt.value, env, module, state)
        call = stmt.value
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
            and call.func.attr.endswith("_")
            and not call.func.attr.startswith("_")
            and isinstance(env.get(call.func.value.id), Node)
            and isinstance(value, Node)
        ):
            env[call.func.value.id] = value  # in-place tensor update (index_add_, mul_)
        return [state]

    def _exec_FunctionDef(self, stmt: ast.FunctionDef, state: State, module: SourceModule) -> list[State]:
        state.env[stmt.name] = FuncRef(module, stmt)
        return [state]

    _exec_AsyncFunctionDef = _exec_FunctionDef

    # ---- control flow --------------------------------------------------------------

    def _exec_Return(self, stmt: ast.Return, state: State, module: SourceModule) -> list[State]:
        value = self.eval(stmt.value, state.env, module, state) if stmt.value is not None else None
        return [State(state.env, True, value)]

    def _exec_Raise(self, stmt: ast.Raise, state: State, module: SourceModule) -> list[State]:
        raise Raised()

    def _exec_If(self, stmt: ast.If, state: State, module: SourceModule) -> list[State]:
        env = state.env
        test = truth(self.eval(stmt.test, env, module, state))
        if test is True:
            return self.exec_block(stmt.body, [state], module)
        if test is False:
            return self.exec_block(stmt.orelse, [state], module)
        a = self.exec_block(stmt.body, [State(dict(env))], module)
        b = self.exec_block(stmt.orelse, [State(dict(env))], module)
        return a + b

    def _exec_While(self, stmt: ast.While, state: State, module: SourceModule) -> list[State]:
        states = self.exec_block(stmt.body, [state], module)
        return self.exec_block(stmt.orelse, states, module) if stmt.orelse else states

    def _exec_With(self, stmt: ast.With | ast.AsyncWith, state: State, module: SourceModule) -> list[State]:
        for item in stmt.items:
            value = self.eval(item.context_expr, state.env, module, state)
            if item.optional_vars is not None:
                self.assign(item.optional_vars, value, state.env, module, state)
        return self.exec_block(stmt.body, [state], module)

    _exec_AsyncWith = _exec_With

    def _exec_Try(self, stmt: ast.Try, state: State, module: SourceModule) -> list[State]:
        states = self.exec_block(stmt.body, [state], module)
        states = self.exec_block(stmt.orelse, states, module) if stmt.orelse else states
        return self.exec_block(stmt.finalbody, states, module) if stmt.finalbody else states

    def exec_for(self, stmt: ast.For | ast.AsyncFor, state: State, module: SourceModule) -> list[State]:
        iterable = self.eval(stmt.iter, state.env, module, state)
        items = self.iterate(iterable)
        if items is None or len(items) > MAX_UNROLL:
            item = Node("iter", "", (iterable,))
            if isinstance(iterable, Instance) and iterable.cls == MODULE_LIST and iterable.attrs["items"]:
                item = iterable.attrs["items"][0]
            self.assign(stmt.target, item, state.env, module, state)
            states = self.exec_block(stmt.body, [state], module)
        else:
            states = [state]
            for item in items:
                live = [s for s in states if not s.returned]
                if not live:
                    break
                for s in live:
                    self.assign(stmt.target, item, s.env, module, s)
                states = [s for s in states if s.returned] + self.exec_block(stmt.body, live, module)
        return self.exec_block(stmt.orelse, states, module) if stmt.orelse else states

    _exec_For = exec_for
    _exec_AsyncFor = exec_for

    def iterate(self, value: Any) -> list | None:
        if isinstance(value, (list, tuple, range)):
            return list(value)
        if isinstance(value, dict):
            return list(value)
        if isinstance(value, FirstOnly):
            return [value.value]
        if isinstance(value, Instance) and value.cls == MODULE_LIST:
            items = value.attrs.get("items", [])
            if self.every_layer:
                return list(items)
            return items[:1] if items else None  # a loop over layers: the first one
        return None

    # ---- binding -------------------------------------------------------------------

    def assign(
        self, target: ast.expr, value: Any, env: dict, module: SourceModule, state: State | None
    ) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            self._assign_unpacked(target.elts, value, env, module, state)
        elif isinstance(target, ast.Attribute):
            self._assign_attribute(target, value, env, module, state)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, value, env, module, state)
        # subscript targets: in-place tensor writes, not tracked

    def _assign_unpacked(
        self, elts: list[ast.expr], value: Any, env: dict, module: SourceModule, state: State | None
    ) -> None:
        star = next((i for i, e in enumerate(elts) if isinstance(e, ast.Starred)), None)
        if isinstance(value, (tuple, list)) and star is None and len(value) == len(elts):
            for elt, item in zip(elts, value, strict=False):
                self.assign(elt, item, env, module, state)
            return
        for index, elt in enumerate(elts):
            if isinstance(elt, ast.Starred):
                self.assign(elt.value, UNKNOWN, env, module, state)
                continue
            if isinstance(value, Node):
                item = Node("item", "", (value, index))
            elif isinstance(value, (tuple, list)) and index < len(value) and star is None:
                item = value[index]
            else:
                item = UNKNOWN
            self.assign(elt, item, env, module, state)

    def _assign_attribute(
        self, target: ast.Attribute, value: Any, env: dict, module: SourceModule, state: State | None
    ) -> None:
        """``obj.name = value``: a module's attribute (naming the module or
        parameter assigned), or a field of a configuration copy."""
        base = self.eval(target.value, env, module, state)
        if isinstance(base, ConfigProxy):
            base.write(target.attr, value)
        if isinstance(base, Instance):
            if isinstance(value, (Instance, Param)) and value.name is None:
                value.name = target.attr
            if isinstance(value, Instance) and value.cls == MODULE_LIST:
                for index, item in enumerate(value.attrs.get("items", [])):
                    if isinstance(item, Instance) and item.name is None:
                        item.name = f"{target.attr}.{index}"
            base.attrs[target.attr] = value


def _load(target: ast.expr) -> ast.expr:
    clone: Any = ast.copy_location(type(target)(**{f: getattr(target, f) for f in target._fields}), target)
    clone.ctx = ast.Load()  # a Name, Attribute, Subscript, ... target: each has a ctx
    return clone


def _literal(expr: ast.expr) -> bool:
    """An expression of constants only (``1.0``, ``-1``, ``2 ** -0.5``): no
    name, attribute or call, so its value is the code's, never the config's."""
    allowed = (ast.Constant, ast.UnaryOp, ast.BinOp, ast.unaryop, ast.operator, ast.expr_context)
    return all(isinstance(node, allowed) for node in ast.walk(expr))


def _attribute_base(target: ast.expr, env: dict) -> Any:
    """The object of an assignment to ``name.attr`` (``self.scaling``), or None."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        return env.get(target.value.id)
    return None


def _keep_none_reads(base: Instance, attr: str) -> None:
    """Before ``attr`` is assigned again: the config keys it read while it
    holds None (the field whose None the code is about to replace)."""
    if base.attrs.get(attr, UNKNOWN) is None and base.attr_reads.get(attr):
        base.none_reads[attr] = base.attr_reads[attr]
