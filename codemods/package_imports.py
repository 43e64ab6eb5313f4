"""package-imports: absolute imports of the package's own modules follow the port's name."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext, locate
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import dotted
from autoport_cst.transform.edit.scope_rename import MODEL_ROOT, own_package_module


@dataclass(frozen=True)
class PackageImportsParams:
    old_package: str = field(default="", metadata={"doc": "The reference package's name (llama3)."})
    new_package: str = field(default="", metadata={"doc": "The port's package name (qwen2)."})


class PackageImports(Codemod):
    """Point absolute imports of the package's own modules at the port's package.

    A reference package may import its own modules by their absolute name
    (``from vllm_neuron.model.gpt_oss.weight_loaders_bf16 import ...``). Copied
    into ``vllm_neuron/model/<name>/`` unchanged, such an import would load the
    reference package's module instead of the port's, or fail where the
    reference is not installed. Every ``import`` and ``from ... import`` of
    ``vllm_neuron.model.<old>`` or a module under it is rewritten to
    ``vllm_neuron.model.<new>``; imports of other packages are left alone.
    Each rewritten import is noted with its position.
    """

    ID = "package-imports"
    PURPOSE = "every port"
    Params = PackageImportsParams
    FILES = ("model", "config", "factory", "init", "module", "tower")
    EXAMPLES = (
        Example(
            title="an absolute import of a sibling module",
            params={"old_package": "gpt_oss", "new_package": "my_moe"},
            before="""
                import vllm_neuron.functional as NF
                from vllm_neuron.model.gpt_oss.weight_loaders_bf16 import fused_qkv_bias_loader
                from vllm_neuron.model.gpt_oss_extra import helper
            """,
            after="""
                import vllm_neuron.functional as NF
                from vllm_neuron.model.my_moe.weight_loaders_bf16 import fused_qkv_bias_loader
                from vllm_neuron.model.gpt_oss_extra import helper
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> PackageImportsParams:
        return PackageImportsParams(old_package=port.reference_name, new_package=port.model_name)

    def _renamed(self, name: str | None) -> str | None:
        old, new = self.params.old_package, self.params.new_package
        if old == new or not own_package_module(name, old):
            return None
        return f"{MODEL_ROOT}.{new}" + name[len(f"{MODEL_ROOT}.{old}") :]  # type: ignore[index]

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        codemod = self

        class Rewriter(cst.CSTTransformer):
            def leave_ImportFrom(self, original, updated):
                new = codemod._renamed(dotted(updated.module) if updated.module else None)
                if new is None or updated.relative:
                    return updated
                ctx.note(*locate(module, original), f"import: {dotted(updated.module)} -> {new}")
                return updated.with_changes(module=parse_expr(new, module))

            def leave_ImportAlias(self, original, updated):
                new = codemod._renamed(dotted(updated.name))
                if new is None:
                    return updated
                ctx.note(*locate(module, original), f"import: {dotted(updated.name)} -> {new}")
                return updated.with_changes(name=parse_expr(new, module))

        return module.visit(Rewriter())
