"""key-formats: load a checkpoint in either of transformers' key formats."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.mappings import MAPPING_NAME, mapping_entries
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import classes, method, walk
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.tree import rewrite

HELPER = "_in_either_key_format"

HELPER_CODE = '''
def _in_either_key_format(mappings: dict, names, renames: dict, own=()) -> dict:
    """``mappings`` with each checkpoint key the checkpoint does not have
    replaced by its name in transformers' other key format when the
    checkpoint has that one; ``own``: the model's parameter names, which the
    loader reads under their own name when ``mappings`` has no entry (each
    gets one when only its other-format name is in the checkpoint).
    ``renames``: the tails (after the layer index; ``*`` one segment) of the
    keys transformers names differently when it saves (module tree ->
    save_pretrained), applied either way. A key under neither name, or under
    two other names (renames that permute names), stays, for the loader to
    refuse it by name."""
    pairs = [*renames.items(), *((saved, tree) for tree, saved in renames.items())]

    def other(key: str) -> str:
        parts = key.split(".")
        found = set()
        for old, new in pairs:
            pattern = old.split(".")
            tail = parts[len(parts) - len(pattern) :]
            if len(tail) != len(pattern) or any(p not in ("*", t) for p, t in zip(pattern, tail)):
                continue
            stars = iter([t for p, t in zip(pattern, tail) if p == "*"])
            head = parts[: len(parts) - len(pattern)]
            renamed = ".".join([*head, *(next(stars) if s == "*" else s for s in new.split("."))])
            if renamed in names:
                found.add(renamed)
        return found.pop() if len(found) == 1 else key

    def resolve(value):
        if isinstance(value, str):
            return value if value in names else other(value)
        return [resolve(item) for item in value]

    resolved = {parameter: resolve(value) for parameter, value in mappings.items()}
    for parameter in own:
        if parameter not in resolved and parameter not in names and other(parameter) != parameter:
            resolved[parameter] = other(parameter)
    return resolved
'''


@dataclass(frozen=True)
class KeyFormatsParams:
    renames: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "Tails of the checkpoint keys (after the layer index, '*' one segment) that transformers "
            "names differently in its two key formats, module tree -> save_pretrained "
            "({'lm_head.weight': 'embed_out.weight'}); research derives them from transformers' conversion "
            "mapping of the architecture (research.key_formats).",
            "examples": (
                {"lm_head.weight": "embed_out.weight"},
                {
                    "mlp.gate.weight": "block_sparse_moe.gate.weight",
                    "mlp.experts.*.gate_proj.weight": "block_sparse_moe.experts.*.w1.weight",
                },
            ),
        },
    )


class KeyFormats(Codemod):
    """Let ``load_weights`` load a checkpoint in either of transformers' key
    formats: the names of its module tree (what a tiny checkpoint built from
    the model's state dict has) or those ``save_pretrained`` writes (what the
    hub holds: GPT-NeoX's ``embed_out``, HY-V3's ``mlp.router.gate``,
    MiniMax-M2's ``block_sparse_moe.experts.<j>.w1``).

    Before the statement that hands ``mappings`` to the checkpoint loader
    (``checkpoint.load_sharded_pipelined(..., mappings, ...)``), the mapping
    goes through ``_in_either_key_format``: a key the checkpoint does not
    have becomes its other-format name when the checkpoint has that one
    (``renames``, matched on the key's last segments either way), and so does
    a parameter the mapping leaves to its own name (the real vllm_neuron
    llama3 maps only the keys it renames); a key under neither name stays,
    and the loader refuses it naming the key. The
    port's own key renames (checkpoint-keys) and both expert layouts are
    untouched: this only adds the other format's name of each.

    Preconditions: every ``load_weights`` with ``mappings[...]`` entries
    hands ``mappings`` to a call on a checkpoint object
    (``<checkpoint>.<method>(..., mappings, ...)``) in its own body.
    Idempotent: a ``load_weights`` that calls the helper already is left
    alone.
    """

    ID = "key-formats"
    PURPOSE = "checkpoint keys"
    Params = KeyFormatsParams
    EXAMPLES = (
        Example(
            title="GPT-NeoX: the hub's embed_out for lm_head",
            params={"renames": {"lm_head.weight": "embed_out.weight"}},
            before="""
                class GPTNeoXForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        mappings["lm_head.weight"] = "lm_head.weight"
                        checkpoint = SafetensorsCheckpoint(path)
                        result = checkpoint.load_sharded_pipelined(self.rank, self, mappings)
                        return result
            """,
            after=HELPER_CODE.lstrip("\n")
            + "\n"
            + textwrap.dedent(
                """
                class GPTNeoXForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        mappings["lm_head.weight"] = "lm_head.weight"
                        checkpoint = SafetensorsCheckpoint(path)
                        # checkpoint keys in either of transformers' key formats (module tree, save_pretrained)
                        mappings = _in_either_key_format(mappings, set(checkpoint.get_tensor_names()), {"lm_head.weight": "embed_out.weight"}, own=[name for name, _ in self.named_parameters()])
                        result = checkpoint.load_sharded_pipelined(self.rank, self, mappings)
                        return result
                """
            ),
        ),
        Example(
            title="a mapping no checkpoint loader receives",
            params={"renames": {"lm_head.weight": "embed_out.weight"}},
            before="""
                class GPTNeoXForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        mappings["lm_head.weight"] = "lm_head.weight"
                        return load_all(mappings)
            """,
            raises="hands mappings to no checkpoint loader",
        ),
    )

    @classmethod
    def check_params(cls, params: KeyFormatsParams) -> list[str]:
        problems = [] if params.renames else ["renames: give the tails transformers renames"]
        for old, new in params.renames.items():
            if not old or not new or "" in old.split(".") or "" in new.split("."):
                problems.append(f"rename {old!r} -> {new!r}: tails are non-empty dotted names")
            elif old.split(".").count("*") != new.split(".").count("*"):
                problems.append(f"rename {old!r} -> {new!r}: both sides need the same number of '*'")
        return problems

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        for cls in classes(module):
            fn = method(cls, "load_weights")
            if fn is None or not mapping_entries(fn) or _calls_helper(fn):
                continue
            statement, checkpoint = _loader_statement(fn)
            if statement is None:
                raise ctx.precondition(
                    f"{self.ID}: {cls.name.value}.load_weights hands mappings to no checkpoint loader "
                    f"(<checkpoint>.<method>(..., {MAPPING_NAME}, ...) in its body)",
                    fn,
                    module,
                )
            line = parse_statement(
                f"{MAPPING_NAME} = {HELPER}({MAPPING_NAME}, set({checkpoint}.get_tensor_names()), "
                f"{json.dumps(self.params.renames)}, own=[name for name, _ in self.named_parameters()])",
                module,
            ).with_changes(
                leading_lines=[
                    cst.EmptyLine(
                        comment=cst.Comment(
                            "# checkpoint keys in either of transformers' key formats (module tree, "
                            "save_pretrained)"
                        )
                    )
                ]
            )
            edits[id(statement)] = lambda updated, line=line: cst.FlattenSentinel([line, updated])
        if not edits:
            return module
        return add_functions(rewrite(module, edits), [HELPER_CODE])


def _calls_helper(fn: cst.FunctionDef) -> bool:
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == HELPER for n in walk(fn)
    )


def _loader_statement(fn: cst.FunctionDef) -> tuple[cst.CSTNode | None, str]:
    """The statement of ``fn``'s body that passes ``mappings`` to a method of
    a named object, and that object's name."""
    for statement in fn.body.body:
        for node in walk(statement):
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.value, cst.Name)
                and any(isinstance(a.value, cst.Name) and a.value.value == MAPPING_NAME for a in node.args)
            ):
                return statement, node.func.value.value
    return None, ""
