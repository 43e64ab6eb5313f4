"""rename-classes: give every class of the package the port's prefix."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.base import locate
from autoport_cst.transform.cst.vocabulary import code_of
from autoport_cst.transform.edit.scope_rename import (
    attribute_references,
    rename_in_module,
    rename_targets,
    string_references,
)
from autoport_cst.transform.edit.words import line_col, locate_prose, prose_token_positions, rename_words


@dataclass(frozen=True)
class RenameClassesParams:
    old_prefix: str | None = field(
        default=None, metadata={"doc": "Prefix to replace; default: the reference's prefix."}
    )
    new_prefix: str | None = field(
        default=None, metadata={"doc": "New prefix; default: the port's class prefix."}
    )
    overrides: dict[str, str] = field(
        default_factory=dict,
        metadata={"doc": "Explicit per-class renames, applied on top of the prefix map."},
    )
    rename_text: bool = field(
        default=True,
        metadata={"doc": "Also rename whole words in strings, docstrings and comments."},
    )
    rename_prefix_word: bool = field(
        default=True,
        metadata={"doc": "In that text pass, also rename the bare prefix word (`Llama` -> `Qwen2`)."},
    )


class RenameClasses(Codemod):
    """Rename every class that carries the reference's prefix, and all uses.

    The rename table is built from the classes defined anywhere in the package
    (``LlamaRMSNorm``, ``LlamaConfig``, ``LlamaForCausalLM`` ...): a class
    whose name is the old prefix followed by a capitalised remainder gets the
    new prefix, unless ``overrides`` names it explicitly.

    Identifiers are renamed through LibCST scope analysis: a class definition,
    every reference to it, and package-relative imports of it
    (``from .config import LlamaConfig``, ``from .model import LlamaForCausalLM
    as Model``). Names imported from elsewhere are left alone even when they
    are spelled the same (``from transformers import LlamaConfig``), and so are
    functions, attributes and local variables.

    A second, separate pass renames whole words in strings, docstrings,
    comments and Markdown: the table's class names and, unless
    ``rename_prefix_word`` is off, the bare prefix word. Words inside hub IDs,
    paths and URLs (anything with ``/``) and versioned model names
    (``Llama-3.1-8B``) are untouched, as is any other case form (``llama3``,
    ``LLAMA``). Every text edit is listed as a note with its position.

    Applying the codemod to its own output changes nothing. If the package has
    neither old-prefix nor new-prefix classes, it is a precondition error.
    """

    ID = "rename-classes"
    PURPOSE = "class prefix"
    Params = RenameClassesParams
    FILES = ("model", "config", "factory", "init", "docs", "module", "companion", "tower")
    EXAMPLES = (
        Example(
            title="classes, uses, relative imports and docstrings",
            params={"old_prefix": "Llama", "new_prefix": "Qwen2"},
            package_classes=("LlamaConfig",),
            before='''
                from transformers import LlamaConfig as HFLlamaConfig

                from .config import LlamaConfig


                class LlamaMLP(nn.Module):
                    """Llama MLP; see meta-llama/Llama-3.1-8B."""


                class LlamaModel(nn.Module):
                    def __init__(self, config: LlamaConfig):
                        self.mlp = LlamaMLP(config)  # one LlamaMLP per layer
                        self.rope_type = "llama3"
            ''',
            after='''
                from transformers import LlamaConfig as HFLlamaConfig

                from .config import Qwen2Config


                class Qwen2MLP(nn.Module):
                    """Qwen2 MLP; see meta-llama/Llama-3.1-8B."""


                class Qwen2Model(nn.Module):
                    def __init__(self, config: Qwen2Config):
                        self.mlp = Qwen2MLP(config)  # one Qwen2MLP per layer
                        self.rope_type = "llama3"
            ''',
        ),
        Example(
            title="a local variable that shadows a class name is not a use of it",
            params={"old_prefix": "Llama", "new_prefix": "GPTNeoX", "rename_text": False},
            before="""
                class LlamaAttention:
                    pass


                def build():
                    LlamaAttention = make_other()
                    return LlamaAttention
            """,
            after="""
                class GPTNeoXAttention:
                    pass


                def build():
                    LlamaAttention = make_other()
                    return LlamaAttention
            """,
        ),
        Example(
            title="lazy import with an alias and __all__",
            role="factory",
            path="factory.py",
            params={"old_prefix": "Llama", "new_prefix": "Qwen2"},
            package_classes=("LlamaConfig", "LlamaForCausalLM"),
            before="""
                from .config import LlamaConfig

                __all__ = ["LlamaConfig", "build"]


                def build(config):
                    from .model import LlamaForCausalLM as Model

                    return Model(LlamaConfig(config))
            """,
            after="""
                from .config import Qwen2Config

                __all__ = ["Qwen2Config", "build"]


                def build(config):
                    from .model import Qwen2ForCausalLM as Model

                    return Model(Qwen2Config(config))
            """,
        ),
        Example(
            title="a sibling module reached through a module alias",
            role="module",
            path="quantization.py",
            params={"old_prefix": "Llama", "new_prefix": "Qwen2", "rename_text": False},
            package_classes=("LlamaAttention", "LlamaMLP"),
            before="""
                def resolve_classes(spec):
                    from . import model as _bf16

                    if spec is None:
                        return _bf16.LlamaAttention, _bf16.LlamaMLP
                    return getattr(_bf16, "LlamaAttention"), None
            """,
            after="""
                def resolve_classes(spec):
                    from . import model as _bf16

                    if spec is None:
                        return _bf16.Qwen2Attention, _bf16.Qwen2MLP
                    return getattr(_bf16, "Qwen2Attention"), None
            """,
        ),
        Example(
            title="a drafter importing the package's classes by their absolute module name",
            role="module",
            path="eagle3_model.py",
            params={"old_prefix": "Llama", "new_prefix": "Qwen2", "rename_text": False},
            package_classes=("LlamaDecoderLayer", "LlamaRMSNorm"),
            reference="llama3",
            before="""
                from vllm_neuron.model.llama3.model import LlamaDecoderLayer, LlamaRMSNorm


                class Eagle3Drafter(nn.Module):
                    def __init__(self, config):
                        self.layer = LlamaDecoderLayer(config, 0)
            """,
            after="""
                from vllm_neuron.model.llama3.model import Qwen2DecoderLayer, Qwen2RMSNorm


                class Eagle3Drafter(nn.Module):
                    def __init__(self, config):
                        self.layer = Qwen2DecoderLayer(config, 0)
            """,
        ),
        Example(
            title="a class reached through an object the rename cannot follow",
            role="module",
            path="quantization.py",
            params={"old_prefix": "Llama", "new_prefix": "Qwen2", "rename_text": False},
            package_classes=("LlamaAttention",),
            before="""
                def resolve_classes(name):
                    implementation = importlib.import_module(name)
                    return implementation.LlamaAttention
            """,
            raises="the rename cannot follow them",
        ),
        Example(
            title="no class with either prefix",
            params={"old_prefix": "Llama", "new_prefix": "Qwen2"},
            before="""
                class Helper:
                    pass
            """,
            raises="no class named Llama<Role> or Qwen2<Role>",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> RenameClassesParams:
        return RenameClassesParams(old_prefix=port.reference_prefix, new_prefix=port.class_prefix)

    # -- the rename table ------------------------------------------------------

    def _prefixes(self, port: PortContext) -> tuple[str, str]:
        return (
            self.params.old_prefix or port.reference_prefix,
            self.params.new_prefix or port.class_prefix,
        )

    def table(self, port: PortContext) -> dict[str, str]:
        """Old class name -> new class name, for classes of the package."""
        old, new = self._prefixes(port)
        table: dict[str, str] = {}
        if old != new:
            for name in sorted(port.package_classes):
                if new.startswith(old) and name.startswith(new):
                    continue  # already renamed (new prefix extends the old one)
                rest = name[len(old) :]
                if name.startswith(old) and (not rest or rest[0].isupper()):
                    table[name] = new + rest
        for name, renamed in self.params.overrides.items():
            if name in port.package_classes:
                table[name] = renamed
        return {k: v for k, v in table.items() if k != v}

    def _check(self, ctx: FileContext) -> dict[str, str]:
        table = self.table(ctx.port)
        if not table:
            old, new = self._prefixes(ctx.port)
            if not any(n.startswith(old) or n.startswith(new) for n in ctx.port.package_classes):
                raise ctx.precondition(
                    f"rename-classes: no class named {old}<Role> or {new}<Role> in the package "
                    f"(classes found: {', '.join(sorted(ctx.port.package_classes)) or 'none'})"
                )
        return table

    def _word_table(self, table: dict[str, str], port: PortContext) -> dict[str, str]:
        words = dict(table)
        old, new = self._prefixes(port)
        if self.params.rename_prefix_word and old != new:
            words.setdefault(old, new)
        return words

    # -- transformation --------------------------------------------------------

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        table = self._check(ctx)
        if not table:
            return module
        targets = rename_targets(module, table, ctx.port.reference_name)
        through_modules, unknown = attribute_references(module, table, ctx.port.reference_name)
        if unknown:
            raise _unfollowed(unknown, module, ctx)
        targets |= through_modules
        words = self._word_table(table, ctx.port) if self.params.rename_text else {}
        strings = string_references(module, table, ctx.port.reference_name)
        renamed = rename_in_module(module, targets, table, words, strings)
        if renamed.text_edits:
            tokens = renamed.prose_tokens
            if tokens is None:
                tokens = prose_token_positions(renamed.code or module.code)
            positions = locate_prose(tokens, [raw for raw, _ in renamed.text_edits])
            for (raw, edits), position in zip(renamed.text_edits, positions, strict=False):
                line0, col0 = position or (0, 0)
                for edit in edits:
                    line, col = line_col(raw, edit.offset)
                    ctx.note(
                        line0 + line,
                        (col0 if line == 0 else 1) + col,
                        f"text: {edit.old} -> {edit.new}",
                    )
        return renamed.module

    def transform_text(self, text: str, ctx: FileContext) -> str:
        table = self._check(ctx)
        if not self.params.rename_text or not table:
            return text
        new_text, edits = rename_words(text, self._word_table(table, ctx.port))
        for edit in edits:
            line, col = line_col(text, edit.offset)
            ctx.note(line + 1, col + 1, f"text: {edit.old} -> {edit.new}")
        return new_text


def _unfollowed(unknown: list[cst.Attribute], module: cst.Module, ctx: FileContext):
    """A class reached through something that is not a module of the package:
    renaming the class would leave this access pointing at the old name."""
    where = []
    for node in unknown:
        line, column = locate(module, node)
        where.append(f"  {ctx.path}:{line}:{column}: {code_of(node)}")
    return ctx.precondition(
        "rename-classes: these accesses reach a class of the package through an object that is "
        "neither a module of the package nor an import, so the rename cannot follow them:\n"
        + "\n".join(where),
        unknown[0],
        module,
    )
