"""Checkpoint key renames in ``load_weights``: segment-wise pattern renames
of dotted keys (longest pattern first, left to right, ``*`` matching one
segment; the rule of ``research.keys``, with wildcards), the translation of
two key maps given from the canonical Llama-style names, the record of the
renames applied (comment lines above ``mappings = {}``), and the string keys
of a ``load_weights`` (local string variables, their expansion, literals,
the checkpoint path of a parameter)."""

from __future__ import annotations

import re

import libcst as cst

from autoport_cst.transform.cst.vocabulary import simple_assign, string_text, walk


class KeyRenamer:
    """Segment-wise pattern renames, longest pattern first, left to right."""

    def __init__(self, renames: dict[str, str]) -> None:
        self.rules = sorted(
            ((old.split("."), new.split("."), old) for old, new in renames.items()),
            key=lambda rule: -len(rule[0]),
        )

    @staticmethod
    def _match(pattern: list[str], segments: list[str], at: int) -> list[str] | None:
        if at + len(pattern) > len(segments):
            return None
        stars = []
        for want, have in zip(pattern, segments[at:], strict=False):
            if want == "*":
                stars.append(have)
            elif want != have:
                return None
        return stars

    def _walk(self, text: str):
        segments = text.split(".")
        out: list[str] = []
        used: set[str] = set()
        i = 0
        while i < len(segments):
            for old, new, name in self.rules:
                stars = self._match(old, segments, i)
                if stars is not None:
                    it = iter(stars)
                    out += [next(it) if s == "*" else s for s in new]
                    used.add(name)
                    i += len(old)
                    break
            else:
                out.append(segments[i])
                i += 1
        return ".".join(out), used

    def apply(self, text: str) -> str:
        return self._walk(text)[0]

    def matched(self, text: str) -> set[str]:
        """Patterns that match ``text``, or whose replacement already appears in it."""
        found = set(self._walk(text)[1])
        segments = text.split(".")
        for _old, new, name in self.rules:
            if any(self._match(new, segments, i) is not None for i in range(len(segments))):
                found.add(name)
        return found


RECORD_MARKER = "# checkpoint key renames (reference -> checkpoint):"
FIELD = re.compile(r"\{[^{}]*\}")


def parameter_path(key: str) -> str | None:
    """The module path of a parameter named ``...<module>_weight`` (or
    ``_bias``), as a checkpoint key: ``...<module>.weight``. A copy for a
    variant (``...<module>_weight{suffix}``, the FP8 buffers) has the path of
    the parameter it copies."""
    head, _, leaf = key.rpartition(".")
    if leaf.endswith("}") and leaf.count("{") == 1 and not leaf.startswith("{"):
        leaf = leaf[: leaf.index("{")]
    for suffix in ("weight", "bias"):
        if leaf.endswith("_" + suffix) and len(leaf) > len(suffix) + 1:
            return (
                f"{head}.{leaf[: -len(suffix) - 1]}.{suffix}"
                if head
                else f"{leaf[: -len(suffix) - 1]}.{suffix}"
            )
        if leaf == suffix:
            return key
    return None


def rename_record(renames: dict[str, str]) -> list[str]:
    """The comment lines recording ``renames`` above ``mappings = {}``."""
    return [RECORD_MARKER] + [f"#   {old} -> {new}" for old, new in sorted(renames.items())]


def mappings_statement(fn: cst.FunctionDef) -> cst.SimpleStatementLine | None:
    """The ``mappings = {}`` statement of a load_weights."""
    for stmt in walk(fn):
        pair = simple_assign(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
        if pair is not None and isinstance(pair[0], cst.Name) and pair[0].value == "mappings":
            return stmt  # type: ignore[return-value]
    return None


def recorded_renames(stmt: cst.SimpleStatementLine | None) -> list[list[str]]:
    """Every record of renames above ``mappings = {}`` (the reference's own,
    then the ones applied on top of it), each as its comment lines."""
    if stmt is None:
        return []
    comments = [line.comment.value if line.comment is not None else "" for line in stmt.leading_lines]
    blocks: list[list[str]] = []
    open_block = False
    for text in comments:
        if text == RECORD_MARKER:
            blocks.append([RECORD_MARKER])
            open_block = True
        elif open_block and text.startswith("#   "):
            blocks[-1].append(text)
        else:
            open_block = False
    return blocks


def translate_key_maps(reference: dict[str, str], target: dict[str, str]) -> dict[str, str]:
    """Renames from the keys a reference loads to a target's, both given as
    maps from the canonical Llama-style segments (an empty map: Llama names)."""
    out: dict[str, str] = {}
    for canonical in sorted(set(reference) | set(target), key=lambda p: (p.count("."), p)):
        have = KeyRenamer(reference).apply(canonical)
        want = KeyRenamer(target).apply(canonical)
        if have != want and KeyRenamer(out).apply(have) != want:
            out[have] = want
    return out


def renamed_key_text(
    text: str, new_full: str, variables: dict[str, str], derived: dict[str, str], renamer: KeyRenamer
) -> str:
    """The text of a key whose expansion ``new_full`` the renames give: keep
    a leading ``{prefix}`` when the rename leaves it alone; use a
    ``{checkpoint_prefix}`` variable when the rename changes it (recorded in
    ``derived``: variable -> its checkpoint variable)."""
    if text.startswith("{"):
        var = text[1 : text.index("}")]
        if var in variables:
            expansion = variables[var]
            if new_full.startswith(expansion + "."):
                return "{" + var + "}" + new_full[len(expansion) :]
            renamed = renamer.apply(expansion)
            if new_full.startswith(renamed + "."):
                name = var if var.startswith("checkpoint_") else f"checkpoint_{var}"
                derived[var] = name
                return "{" + name + "}" + new_full[len(renamed) :]
    return new_full


def string_variables(fn: cst.FunctionDef) -> tuple[dict[str, str], dict[str, cst.SimpleStatementLine]]:
    """Local ``name = "<string>"`` / ``name = f"..."`` assignments of a
    function: name -> text (earlier variables expanded), and name -> statement."""
    variables: dict[str, str] = {}
    statements: dict[str, cst.SimpleStatementLine] = {}
    for stmt in walk(fn):
        pair = simple_assign(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
        if pair is None or not isinstance(pair[0], cst.Name):
            continue
        text = string_text(pair[1])
        if text is not None:
            variables[pair[0].value] = expand(text, variables)
            statements[pair[0].value] = stmt  # type: ignore[assignment]
    return variables, statements


def key_strings(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The string literals that are checkpoint keys in a mapping value: the
    value itself, the elements of a list or tuple, and, in the choice between
    expert layouts (``[a] if a in names else [b for j in range(n)] + [...]``),
    the strings of its test, branches, comprehensions and joined lists.
    Strings passed to calls are arguments, not keys, and pieces of a string
    built with ``+`` are no whole keys: both left out."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return [s for e in value.elements for s in key_strings(e.value)]
    if isinstance(value, cst.IfExp):
        return key_strings(value.test) + key_strings(value.body) + key_strings(value.orelse)
    if isinstance(value, cst.Comparison):
        return key_strings(value.left)
    if isinstance(value, cst.ListComp):
        return key_strings(value.elt)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
        lists = (cst.List, cst.ListComp, cst.BinaryOperation)
        if isinstance(value.left, lists) and isinstance(value.right, lists):  # lists joined, not a string
            return key_strings(value.left) + key_strings(value.right)
        return []
    if isinstance(value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
        return [value]
    return []


def expand(text: str, variables: dict[str, str]) -> str:
    """``text`` with its ``{name}`` fields of string variables replaced by their text."""
    for name, value in variables.items():
        text = text.replace("{" + name + "}", value)
    return text


def key_literal(text: str) -> str:
    """A string literal (an f-string when ``text`` has ``{expr}`` fields)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'f"{escaped}"' if "{" in text else f'"{escaped}"'


def rename_covered(pattern: str, matched: set[str]) -> bool:
    """Whether ``pattern`` matched a key, or is a container rename (self_attn
    -> attention) whose children all matched their own longer patterns."""
    return pattern in matched or any(other.startswith(pattern + ".") for other in matched)
