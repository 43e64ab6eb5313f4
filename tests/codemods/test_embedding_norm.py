"""embedding-norm on the reference models' own backbones: the norm built as
the final norm, applied once after every lookup path joins (the prompt
embeddings merged), its tensors mapped beside the final norm's."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.transform.base import run_on_source
from autoport_cst.transform.library import get_codemod

REFERENCES = Path(__file__).resolve().parents[2] / "reference_models"


@pytest.mark.parametrize("reference", ["starcoder2", "llama3", "qwen3"])
def test_the_norm_is_built_applied_and_mapped_like_the_final_one(reference):
    source = (REFERENCES / reference / "model.py").read_text()
    cls = get_codemod("embedding-norm")
    output, _ = run_on_source(cls(cls.Params()), source)
    compile(output, "model.py", "exec")
    lines = [line.strip() for line in output.splitlines()]
    final = next(line for line in lines if line.startswith("self.norm = "))
    built = [line for line in lines if line.startswith("self.embed_norm = ")]
    assert built == [final.replace("self.norm = ", "self.embed_norm = ")]
    applied = [i for i, line in enumerate(lines) if line == "hidden_states = self.embed_norm(hidden_states)"]
    merged = [i for i, line in enumerate(lines) if line.startswith("hidden_states = NF.merge_prompt_embeds(")]
    assert len(applied) == 1 and len(merged) == 1 and applied[0] == merged[0] + 2  # after its comment
    finals = [line for line in lines if line.startswith('mappings["model.norm.')]
    assert finals
    for line in finals:
        assert line.replace("model.norm.", "model.embed_norm.") in lines
    again, _ = run_on_source(cls(cls.Params()), output)
    assert again == output


def test_checkpoint_keys_renames_the_checkpoint_key_only():
    """The entries embedding-norm adds keep the parameter's name when
    checkpoint-keys renames the module to the checkpoint's (BLOOM), the two
    run on the same tree as apply runs them (not re-parsed in between)."""
    import libcst as cst

    from autoport_cst.transform.base import FileContext, PortContext

    module = cst.parse_module((REFERENCES / "llama3" / "model.py").read_text())
    norm, keys = get_codemod("embedding-norm"), get_codemod("checkpoint-keys")
    renames = {"model.embed_norm": "transformer.word_embeddings_layernorm"}
    port = PortContext()
    for codemod in (norm(norm.Params()), keys(keys.parse_params({"renames": renames}))):
        module = codemod.transform_module(module, FileContext("model.py", "model", port, codemod.ID))
    lines = {line.strip() for line in module.code.splitlines()}
    expected = 'mappings["model.embed_norm.weight"] = "transformer.word_embeddings_layernorm.weight"'
    assert expected in lines
