"""checkpoint-keys: map parameters to a checkpoint's own key names (and layouts)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst_helpers import (
    classes,
    dotted,
    keyword_arg,
    method,
    parse_expr,
    parse_statement,
    rewrite,
    simple_assign,
    string_text,
    walk,
)
from autoport_cst.transform.layers import (
    kwarg_code,
    loader_sites,
    loop_attrs,
    strings_of,
)
from autoport_cst.transform.mappings import mapping_entries

TRANSPOSING_LOADERS = (
    "sharding_weight_loader",
    "sharding_weight_loader_with_padding",
    "fused_qkv_weight_loader",
    "fused_qkv_split_loader",
    "fused_part_loader",
)


@dataclass(frozen=True)
class CheckpointKeysParams:
    renames: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "Dotted key patterns as the reference names them -> the checkpoint's names, matched on "
            "whole segments anywhere in a key, longest first; '*' matches one segment and is carried over "
            "(e.g. {'model': 'gpt_neox', 'self_attn.o_proj': 'attention.dense', 'mlp.up_proj': 'mlp.c_fc'})."
        },
    )
    in_out_params: tuple[str, ...] = field(
        default=(),
        metadata={
            "doc": "Parameter attributes whose checkpoint tensors are stored [in, out] (GPT-2 Conv1D), "
            "e.g. ['up_proj_weight', 'down_proj_weight']: their loaders stop transposing."
        },
    )


class CheckpointKeys(Codemod):
    """Rewrite the checkpoint keys of ``load_weights`` for a checkpoint that
    names its tensors differently, and the loaders of tensors stored ``[in, out]``.

    ``renames`` maps dotted key patterns, as the reference's mapping values
    spell them, to the checkpoint's: ``{"model": "gpt_neox", "self_attn.o_proj":
    "attention.dense", "embed_tokens": "embed_in", "norm": "final_layer_norm",
    "lm_head": "embed_out"}`` turns ``f"{prefix}.self_attn.o_proj.weight"`` with
    ``prefix = f"model.layers.{layer_id}"`` into
    ``f"{checkpoint_prefix}.attention.dense.weight"``, where
    ``checkpoint_prefix = f"gpt_neox.layers.{layer_id}"`` is added next to
    ``prefix``. Patterns match whole segments (``norm`` never matches
    ``input_layernorm``), the longest pattern first, left to right; ``*``
    matches one segment and is copied to the same place in the replacement.
    Only mapping *values* (checkpoint keys) change: the keys, which are
    parameter names, stay.

    ``in_out_params`` names parameters whose checkpoint tensors are already
    ``[in, out]`` (GPT-2 ``Conv1D``): their loaders get
    ``is_storage_transposed=False``. Transposing them anyway loads a wrong
    model that still produces fluent-looking text.

    Runs after every codemod that adds mapping entries, so that the entries
    they add are renamed too. Preconditions: a ``load_weights`` with
    ``mappings[...]`` entries; every pattern matches some checkpoint key (or
    its replacement already does: the codemod is idempotent); each
    ``in_out_params`` parameter has a loader that transposes (in a loop, every
    parameter of the loop must be listed).

    Proposed spec field (realized by this codemod once it exists):
    ``checkpoint.key_map: dict[str, str]`` (these ``renames``) and
    ``checkpoint.linear_layout: "out_in" | "in_out"``.
    """

    ID = "checkpoint-keys"
    Params = CheckpointKeysParams
    # every codemod that adds, removes or rewrites mapping entries
    AFTER = (
        "add-qkv-bias",
        "attention-sinks",
        "fused-checkpoint",
        "lm-head-bias",
        "mlp-bias",
        "mlp-kind",
        "norm-placement",
        "parallel-residual",
        "qk-norm",
        "remove-qk-norm",
        "router-bias",
        "routing-bias",
        "shared-experts",
        "swap-norm",
    )
    EXAMPLES = (
        Example(
            title="GPT-NeoX key names",
            params={
                "renames": {
                    "model": "gpt_neox",
                    "self_attn.o_proj": "attention.dense",
                    "embed_tokens": "embed_in",
                    "norm": "final_layer_norm",
                    "lm_head": "embed_out",
                }
            },
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["model.norm.weight"] = "model.norm.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "model.embed_tokens.weight"
                        else:
                            mappings["lm_head.weight"] = "lm_head.weight"
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            checkpoint_prefix = f"gpt_neox.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{checkpoint_prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{checkpoint_prefix}.attention.dense.weight"
                        mappings["model.embed_tokens.weight"] = "gpt_neox.embed_in.weight"
                        mappings["model.norm.weight"] = "gpt_neox.final_layer_norm.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "gpt_neox.embed_in.weight"
                        else:
                            mappings["lm_head.weight"] = "embed_out.weight"
            """,
        ),
        Example(
            title="Conv1D checkpoints store linear weights [in, out]",
            params={"renames": {"mlp.up_proj": "mlp.c_fc"}, "in_out_params": ["up_proj_weight"]},
            before="""
                class Gpt2MLP(nn.Module):
                    def __init__(self, config):
                        set_weight_loader(
                            self.up_proj_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n, is_storage_transposed=True),
                        )

                    def load_weights(self, path):
                        mappings = {}
                        mappings["mlp.up_proj_weight"] = "mlp.up_proj.weight"
            """,
            after="""
                class Gpt2MLP(nn.Module):
                    def __init__(self, config):
                        set_weight_loader(
                            self.up_proj_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n, is_storage_transposed=False),
                        )

                    def load_weights(self, path):
                        mappings = {}
                        mappings["mlp.up_proj_weight"] = "mlp.c_fc.weight"
            """,
        ),
        Example(
            title="a pattern that matches no key",
            params={"renames": {"self_attn.dense": "attention.dense"}},
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        mappings["model.norm.weight"] = "model.norm.weight"
            """,
            raises="no checkpoint key of load_weights",
        ),
    )

    @classmethod
    def check_params(cls, params: CheckpointKeysParams) -> list[str]:
        problems = []
        if not params.renames and not params.in_out_params:
            problems.append("nothing to do: give renames or in_out_params")
        for old, new in params.renames.items():
            if not old or not new or "" in old.split(".") or "" in new.split("."):
                problems.append(f"rename {old!r} -> {new!r}: patterns are non-empty dotted names")
            elif old.split(".").count("*") != new.split(".").count("*"):
                problems.append(f"rename {old!r} -> {new!r}: both sides need the same number of '*'")
        return problems

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> CheckpointKeysParams:
        return CheckpointKeysParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        loads = [m for c in classes(module) if (m := method(c, "load_weights")) is not None]
        entries = [e for fn in loads for e in mapping_entries(fn)]
        if not entries:
            raise ctx.precondition(f"{self.ID}: no load_weights with mappings[...] = ... entries in this file")
        edits: dict = {}
        if self.params.renames:
            edits.update(self._rename_edits(module, loads, ctx))
        if self.params.in_out_params:
            edits.update(self._layout_edits(module, ctx))
        return rewrite(module, edits)

    # -- key renames -------------------------------------------------------------

    def _rename_edits(self, module: cst.Module, loads: list[cst.FunctionDef], ctx: FileContext) -> dict:
        renamer = _Renamer(self.params.renames)
        edits: dict = {}
        matched: set[str] = set()
        for fn in loads:
            variables, assignments = _string_variables(fn)
            derived: dict[str, str] = {}  # variable -> checkpoint variable name
            for entry in mapping_entries(fn):
                for node in strings_of(entry.value):
                    text = string_text(node)
                    if text is None:
                        continue
                    full = _expand(text, variables)
                    matched |= renamer.matched(full)
                    new_full = renamer.apply(full)
                    if new_full == full:
                        continue
                    new_text = self._new_text(text, new_full, variables, derived, renamer)
                    new_node = parse_expr(_literal(new_text), module)
                    edits[id(node)] = lambda updated, new_node=new_node: new_node.with_changes(
                        lpar=updated.lpar, rpar=updated.rpar
                    )
            for var, checkpoint_var in derived.items():
                if checkpoint_var in variables:
                    continue
                stmt = assignments[var]
                new_value = renamer.apply(variables[var])
                new_stmt = parse_statement(f"{checkpoint_var} = {_literal(new_value)}", module)
                edits[id(stmt)] = lambda updated, new_stmt=new_stmt: cst.FlattenSentinel([updated, new_stmt])
        unmatched = [old for old in self.params.renames if old not in matched]
        if unmatched:
            raise ctx.precondition(
                f"{self.ID}: rename pattern(s) {', '.join(repr(p) for p in unmatched)} match(es) no checkpoint "
                "key of load_weights (patterns match whole dotted segments of the reference's keys)"
            )
        return edits

    @staticmethod
    def _new_text(text: str, new_full: str, variables: dict[str, str], derived: dict[str, str],
                  renamer: "_Renamer") -> str:
        """Keep a leading ``{prefix}`` when the rename leaves it alone; use a
        ``{checkpoint_prefix}`` variable when the rename changes it."""
        if text.startswith("{"):
            var = text[1: text.index("}")]
            if var in variables:
                expansion = variables[var]
                if new_full.startswith(expansion + "."):
                    return "{" + var + "}" + new_full[len(expansion):]
                renamed = renamer.apply(expansion)
                if new_full.startswith(renamed + "."):
                    name = var if var.startswith("checkpoint_") else f"checkpoint_{var}"
                    derived[var] = name
                    return "{" + name + "}" + new_full[len(renamed):]
        return new_full

    # -- [in, out] checkpoint tensors --------------------------------------------

    def _layout_edits(self, module: cst.Module, ctx: FileContext) -> dict:
        wanted = set(self.params.in_out_params)
        sites = {}
        for cls in classes(module):
            for attr, site in loader_sites(cls).items():
                if attr in wanted:
                    sites[attr] = site
        missing = sorted(wanted - set(sites))
        if missing:
            raise ctx.precondition(
                f"{self.ID}: no loader attached to {', '.join(missing)} (set_weight_loader(self.<attr>, ...))"
            )
        edits: dict = {}
        for attr, site in sites.items():
            if site.in_loop and not set(loop_attrs(site.statement)) <= wanted:  # type: ignore[arg-type]
                others = sorted(set(loop_attrs(site.statement)) - wanted)  # type: ignore[arg-type]
                raise ctx.precondition(
                    f"{self.ID}: {attr} shares its loader loop with {', '.join(others)}; list them in "
                    "in_out_params too, or unroll the loop",
                    site.statement,
                    module,
                )
            loader = site.loader
            if loader is None or dotted(loader.func) not in TRANSPOSING_LOADERS:
                raise ctx.precondition(
                    f"{self.ID}: the loader of {attr} is not one of {', '.join(TRANSPOSING_LOADERS)}",
                    site.statement,
                    module,
                )
            if kwarg_code(loader, "is_storage_transposed") in (None, "False"):
                continue
            arg = keyword_arg(loader, "is_storage_transposed")
            edits[id(arg)] = lambda updated: updated.with_changes(value=cst.Name("False"))
        return edits


class _Renamer:
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
        for want, have in zip(pattern, segments[at:]):
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
        for old, new, name in self.rules:
            if any(self._match(new, segments, i) is not None for i in range(len(segments))):
                found.add(name)
        return found


def _string_variables(fn: cst.FunctionDef) -> tuple[dict[str, str], dict[str, cst.SimpleStatementLine]]:
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
            variables[pair[0].value] = _expand(text, variables)
            statements[pair[0].value] = stmt  # type: ignore[assignment]
    return variables, statements


def _expand(text: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        text = text.replace("{" + name + "}", value)
    return text


def _literal(text: str) -> str:
    """A string literal (an f-string when ``text`` has ``{expr}`` fields)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'f"{escaped}"' if "{" in text else f'"{escaped}"'
