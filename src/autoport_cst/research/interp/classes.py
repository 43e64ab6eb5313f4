"""Names and classes: a module's globals (the source's classes and
functions, imports resolved into the source or left external, module-level
assignments, builtins), class bases and MROs, methods and class attributes,
and constructing an instance (running the source's ``__init__``)."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.interp.core import CallOptions, Core
from autoport_cst.research.interp.externals import EXTERNAL_MODULES, external_instance
from autoport_cst.research.interp.python_builtins import BUILTINS
from autoport_cst.research.interp.values import UNKNOWN, External, FuncRef, Instance, SourceClass
from autoport_cst.research.sources import SourceModule


class Classes(Core):
    # ---- name resolution -----------------------------------------------------

    def global_value(self, module: SourceModule, name: str) -> Any:
        if name in module.classes:
            return SourceClass(module, module.classes[name])
        if name in module.functions:
            return FuncRef(module, module.functions[name])
        if name in module.imports:
            return self.resolve_dotted(module.imports[name])
        if name in module.assignments:
            key = (id(module), name)
            if key not in self._globals:
                self._globals[key] = UNKNOWN  # against self-reference
                self._globals[key] = self.eval(module.assignments[name], {}, module, None)
            return self._globals[key]
        return BUILTINS.get(name, UNKNOWN)

    def resolve_dotted(self, dotted: str) -> Any:
        # model code lives under transformers.models; the framework around it
        # (PreTrainedModel, GenerationMixin, kernels hub decorators) is external
        found = self.library.resolve(dotted) if dotted.startswith("transformers.models.") else None
        if found is not None:
            module, name = found
            if name in module.classes:
                return SourceClass(module, module.classes[name])
            return FuncRef(module, module.functions[name])
        if dotted == "math":
            return External("math")
        return External(dotted)

    # ---- classes ---------------------------------------------------------------

    def bases(self, cls: SourceClass) -> list[SourceClass | External]:
        result = []
        for base in cls.node.bases:
            value = self.eval(base, {}, cls.module, None)
            if isinstance(value, (SourceClass, External)):
                result.append(value)
        return result

    def mro(self, cls: SourceClass | External) -> list[SourceClass | External]:
        """Depth-first, left-to-right linearisation (enough for these files)."""
        if cls in self._mro:
            return self._mro[cls]
        order: list[SourceClass | External] = []
        stack = [cls]
        while stack:
            current = stack.pop(0)
            if current in order:
                continue
            order.append(current)
            if isinstance(current, SourceClass):
                stack = self.bases(current) + stack
        self._mro[cls] = order
        return order

    def find_method(self, cls: SourceClass | External, name: str, after: SourceClass | None = None):
        """(class, FunctionDef) of the first definition of ``name`` in the MRO."""
        order = self.mro(cls)
        if after is not None and after in order:
            order = order[order.index(after) + 1 :]
        for klass in order:
            if isinstance(klass, SourceClass):
                for stmt in klass.node.body:
                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                        return klass, stmt
        return None

    def external_bases(self, cls: SourceClass | External) -> list[str]:
        return [k.qualname for k in self.mro(cls) if isinstance(k, External)]

    def class_attribute(self, cls: SourceClass, name: str) -> Any:
        for klass in self.mro(cls):
            if isinstance(klass, SourceClass):
                for stmt in klass.node.body:
                    targets: list[ast.expr] = []
                    if isinstance(stmt, ast.Assign):
                        targets, value = stmt.targets, stmt.value
                    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                        targets, value = [stmt.target], stmt.value
                    for target in targets:
                        if isinstance(target, ast.Name) and target.id == name:
                            return self.eval(value, {}, klass.module, None)
        return UNKNOWN

    def _is_data_class(self, cls: SourceClass) -> bool:
        """A @dataclass output container (ModelOutput subclass) defined in the
        modeling file, with no __init__ of its own."""
        if self.find_method(cls, "__init__") is not None:
            return False
        return any(
            qual.rsplit(".", 1)[-1].endswith("ModelOutput")
            or qual.rsplit(".", 1)[-1].endswith("OutputWithPast")
            for qual in self.external_bases(cls)
        )

    # ---- construction --------------------------------------------------------

    def instantiate(self, cls: SourceClass | External, args: list, kwargs: dict, reads: dict) -> Any:
        if isinstance(cls, External):
            return external_instance(cls, args, kwargs, reads)
        instance = Instance(cls)
        found = self.find_method(cls, "__init__")
        if found is None:
            ext = self.external_bases(cls)
            for qual in ext:
                short = qual.rsplit(".", 1)[-1]
                if short in EXTERNAL_MODULES:
                    inner = external_instance(External(qual), args, kwargs, reads)
                    instance.args, instance.reads, instance.attrs = inner.args, inner.reads, inner.attrs
                    break
            return instance
        klass, init = found
        how = CallOptions(owner=klass, record=instance, reads=reads)
        self.call_function(klass.module, init, [instance, *args], kwargs, how)
        return instance

    def constructor_reads(self, cls: SourceClass, reads: dict) -> dict[str, frozenset[str]]:
        """The config keys each argument of a construction read, keyed by the
        names of ``__init__``'s parameters."""
        found = self.find_method(cls, "__init__")
        if found is None:
            return dict(reads)
        params = [a.arg for a in found[1].args.posonlyargs + found[1].args.args][1:]
        out = {}
        for key, value in reads.items():
            if key.isdigit():
                index = int(key)
                if index < len(params):
                    out[params[index]] = value
            else:
                out[key] = value
        return out
