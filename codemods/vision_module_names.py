"""vision-module-names: the tower's checkpoint names of its MLP projections and merger parts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import dotted, statements, walk
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import ANY, Realizes

MAPPINGS_METHOD = "_vision_mappings"
RENAMER = "_tower_checkpoint_key"

RENAMER_CODE = '''
def _tower_checkpoint_key(key: str) -> str:
    """A tower checkpoint key written with the reference's module names, in
    the checkpoint's names (each name a run of whole dotted segments)."""
    # <-- MODEL-SPECIFIC: the checkpoint's names of the tower's MLP projections and merger parts
    renames = {renames}
    segments = key.split(".")
    for old, new in renames.items():
        width = old.count(".") + 1
        for at in range(len(segments) - width + 1):
            if ".".join(segments[at : at + width]) == old:
                segments[at : at + width] = new.split(".")
                break
    return ".".join(segments)
'''
RETURN = f"return {{name: {RENAMER}(key) for name, key in mappings.items()}}"


@dataclass(frozen=True)
class VisionModuleNamesParams:
    renames: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "The reference's checkpoint name -> the target's, under the tower prefix (mlp.linear_fc1 -> "
            "mlp.fc1, merger.norm -> merger.ln_q, ...).",
            "examples": [{"mlp.linear_fc1": "mlp.fc1", "merger.norm": "merger.ln_q"}],
        },
    )


class VisionModuleNames(Codemod):
    """Load the tower's MLP projections and merger parts under the checkpoint's names.

    The reference's tower mappings name the block MLP's projections and the
    merger's norm and projections as Qwen3-VL stores them
    (``mlp.linear_fc1``, ``merger.norm``, ``merger.linear_fc1``); Qwen2-VL
    stores the same tensors as ``mlp.fc1``, ``merger.ln_q`` and
    ``merger.mlp.0`` (its merger is an ``nn.Sequential``). The model file
    gets a ``_tower_checkpoint_key`` function holding the renames (whole
    dotted segments, so the deep-stack mergers' ``deepstack_merger_list.<i>.norm``
    is not the merger's ``merger.norm``), and ``_vision_mappings`` returns
    its entries with their checkpoint keys renamed. Parameters and loaders are
    unchanged: only where each is read from.

    Precondition: a ``_vision_mappings`` method ending in ``return mappings``.
    """

    ID = "vision-module-names"
    REALIZES = Realizes({"vision.module_names": ANY})
    Params = VisionModuleNamesParams
    FILES = ("model",)
    EXAMPLES = (
        Example(
            title="Qwen2-VL",
            params={"renames": {"mlp.linear_fc1": "mlp.fc1", "merger.linear_fc1": "merger.mlp.0"}},
            before="""
                class Qwen3VLForConditionalGeneration(nn.Module):
                    def _vision_mappings(self):
                        mappings = {"visual.merger.linear_fc1_weight": "model.visual.merger.linear_fc1.weight"}
                        return mappings
            """,
            after='''
                def _tower_checkpoint_key(key: str) -> str:
                    """A tower checkpoint key written with the reference's module names, in
                    the checkpoint's names (each name a run of whole dotted segments)."""
                    # <-- MODEL-SPECIFIC: the checkpoint's names of the tower's MLP projections and merger parts
                    renames = {"mlp.linear_fc1": "mlp.fc1", "merger.linear_fc1": "merger.mlp.0"}
                    segments = key.split(".")
                    for old, new in renames.items():
                        width = old.count(".") + 1
                        for at in range(len(segments) - width + 1):
                            if ".".join(segments[at : at + width]) == old:
                                segments[at : at + width] = new.split(".")
                                break
                    return ".".join(segments)


                class Qwen3VLForConditionalGeneration(nn.Module):
                    def _vision_mappings(self):
                        mappings = {"visual.merger.linear_fc1_weight": "model.visual.merger.linear_fc1.weight"}
                        return {name: _tower_checkpoint_key(key) for name, key in mappings.items()}
            ''',
        ),
        Example(
            title="no tower mappings",
            params={"renames": {"mlp.linear_fc1": "mlp.fc1"}},
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self):
                        return {}
            """,
            raises="no _vision_mappings method ending in 'return mappings'",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionModuleNamesParams:
        diff = next(d for d in diffs if d.path == "vision.module_names")
        reference, wanted = diff.reference or {}, diff.target or {}
        renames = {
            reference[role]: name for role, name in wanted.items() if reference.get(role, name) != name
        }
        return VisionModuleNamesParams(renames=renames)

    @classmethod
    def check_params(cls, params: VisionModuleNamesParams) -> list[str]:
        return [] if params.renames else ["renames: no name to change"]

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        site = _mappings_return(module)
        if site is None:
            raise ctx.refuse(f"no {MAPPINGS_METHOD} method ending in 'return mappings'")
        code = RENAMER_CODE.replace("{renames}", json.dumps(dict(self.params.renames)))
        if not _returns_renamed(site):
            module = rewrite(module, {id(site): lambda node: parse_statement(RETURN, module)})
        return add_functions(module, [code], replace=True)


def _mappings_return(module: cst.Module) -> cst.SimpleStatementLine | None:
    for func in [
        n for n in walk(module) if isinstance(n, cst.FunctionDef) and n.name.value == MAPPINGS_METHOD
    ]:
        last = statements(func)[-1] if statements(func) else None
        if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return):
            value = last.body[0].value
            if (isinstance(value, cst.Name) and value.value == "mappings") or _returns_renamed(last):
                return last
    return None


def _returns_renamed(stmt: cst.SimpleStatementLine) -> bool:
    return any(isinstance(n, cst.Call) and dotted(n.func) == RENAMER for n in walk(stmt))
