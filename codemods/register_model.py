"""register-model: add a port to ``vllm_neuron/model/registry.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import dotted, is_docstring, simple_assign, string_text, walk


@dataclass(frozen=True)
class RegisterModelParams:
    package: str = field(default="", metadata={"doc": "Package name under vllm_neuron/model/ (snake_case)."})
    class_name: str = field(default="", metadata={"doc": "Exported class, <Prefix>ForCausalLM."})
    architecture: str = field(default="", metadata={"doc": "Exact Hugging Face architecture string."})
    replace: bool = field(
        default=False,
        metadata={"doc": "Replace an entry that maps the architecture to another class."},
    )


class RegisterModel(Codemod):
    """Register a model class under its Hugging Face architecture string.

    The registry module imports each package's exported class at the top
    (``from .qwen2 import Qwen2ForCausalLM``) and lists
    ``("<architecture>", <Class>)`` pairs in the list literal that
    ``get_models()`` returns. This codemod adds the import (after the other
    package imports) and appends the pair to that list.

    The architecture string must equal ``config.json``'s ``architectures[0]``
    exactly; it is never derived from the class name. Registering the same
    pair again changes nothing. An entry that maps the architecture to another
    class is a precondition error unless ``replace`` is set. Precondition: a
    ``get_models`` function with a list literal.
    """

    ID = "register-model"
    PURPOSE = "every port"
    Params = RegisterModelParams
    FILES = ("registry",)
    EXAMPLES = (
        Example(
            title="first entry",
            role="registry",
            path="registry.py",
            params={"package": "qwen2", "class_name": "Qwen2ForCausalLM", "architecture": "Qwen2ForCausalLM"},
            before='''
                """Model registry."""

                from .llama3 import LlamaForCausalLM


                def get_models():
                    models = [
                        ("LlamaForCausalLM", LlamaForCausalLM),
                    ]
                    return models
            ''',
            after='''
                """Model registry."""

                from .llama3 import LlamaForCausalLM
                from .qwen2 import Qwen2ForCausalLM


                def get_models():
                    models = [
                        ("LlamaForCausalLM", LlamaForCausalLM),
                        ("Qwen2ForCausalLM", Qwen2ForCausalLM),
                    ]
                    return models
            ''',
        ),
        Example(
            title="architecture already taken by another class",
            role="registry",
            path="registry.py",
            params={"package": "qwen2", "class_name": "Qwen2ForCausalLM", "architecture": "LlamaForCausalLM"},
            before="""
                from .llama3 import LlamaForCausalLM


                def get_models():
                    models = [("LlamaForCausalLM", LlamaForCausalLM)]
                    return models
            """,
            raises="already maps 'LlamaForCausalLM' to LlamaForCausalLM",
        ),
    )

    @classmethod
    def check_params(cls, params: RegisterModelParams) -> list[str]:
        missing = [n for n in ("package", "class_name", "architecture") if not getattr(params, n)]
        return [f"{n} is required" for n in missing]

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> RegisterModelParams:
        return RegisterModelParams(
            package=port.model_name,
            class_name=f"{port.class_prefix}ForCausalLM",
            architecture=port.architecture,
        )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        p = self.params
        models_list = _models_list(module)
        if models_list is None:
            raise ctx.precondition(
                "register-model: no get_models() function returning a list literal "
                "(models = [...]) in the registry"
            )
        replaced = False
        for element in models_list.elements:
            pair = element.value
            if (
                isinstance(pair, cst.Tuple)
                and len(pair.elements) == 2
                and string_text(pair.elements[0].value) == p.architecture
            ):
                current = dotted(pair.elements[1].value)
                if current == p.class_name:
                    return self._ensure_import(module)
                if not p.replace:
                    raise ctx.precondition(
                        f"register-model: the registry already maps {p.architecture!r} to "
                        f"{current}; --force replaces that entry",
                        pair,
                        module,
                    )
                replaced = True
        module = module.visit(_AddEntry(models_list, p, module, replaced))
        return self._ensure_import(module)

    def _ensure_import(self, module: cst.Module) -> cst.Module:
        p = self.params
        body = list(module.body)
        last_import = 0 if body and is_docstring(body[0]) else -1
        for index, stmt in enumerate(body):
            if isinstance(stmt, cst.SimpleStatementLine) and isinstance(
                stmt.body[0], (cst.Import, cst.ImportFrom)
            ):
                last_import = index
                small = stmt.body[0]
                if (
                    isinstance(small, cst.ImportFrom)
                    and len(small.relative) == 1
                    and dotted(small.module) == p.package
                    and not isinstance(small.names, cst.ImportStar)
                    and any(dotted(a.name) == p.class_name for a in small.names)
                ):
                    return module
        new = parse_statement(f"from .{p.package} import {p.class_name}", module)
        if last_import == 0 and is_docstring(body[0]):  # first import after the docstring
            new = new.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        body.insert(last_import + 1, new)
        return module.with_changes(body=body)


def _models_list(module: cst.Module) -> cst.List | None:
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "get_models":
            for node in walk(stmt):
                pair = simple_assign(node) if isinstance(node, cst.SimpleStatementLine) else None
                if pair and isinstance(pair[1], cst.List):
                    return pair[1]
                if isinstance(node, cst.Return) and isinstance(node.value, cst.List):
                    return node.value
    return None


class _AddEntry(cst.CSTTransformer):
    def __init__(
        self, target: cst.List, params: RegisterModelParams, module: cst.Module, replace: bool
    ) -> None:
        self.target = target
        self.params = params
        self.module = module
        self.replace = replace

    def leave_List(self, original: cst.List, updated: cst.List) -> cst.List:
        if original is not self.target:
            return updated
        p = self.params
        entry = parse_expr(f'("{p.architecture}", {p.class_name})', self.module)
        elements = list(updated.elements)
        if self.replace:
            elements = [
                e.with_changes(value=entry)
                if isinstance(e.value, cst.Tuple) and string_text(e.value.elements[0].value) == p.architecture
                else e
                for e in elements
            ]
            return updated.with_changes(elements=elements)
        if not elements:
            return parse_expr(f'[\n    ("{p.architecture}", {p.class_name}),\n]', self.module)
        last = elements[-1]
        opening = updated.lbracket.whitespace_after
        if len(elements) >= 2:
            separator = elements[-2].comma
        elif isinstance(opening, cst.ParenthesizedWhitespace):  # one entry per line
            separator = cst.Comma(whitespace_after=opening)
        else:
            separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        closing = last.comma
        elements[-1] = last.with_changes(comma=separator)
        elements.append(cst.Element(value=entry, comma=closing))
        return updated.with_changes(elements=elements)
