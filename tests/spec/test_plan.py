"""plan.json: loading, positioned errors, schema, naming."""

from __future__ import annotations

import json

import jsonschema
import pytest

from autoport_cst.errors import InputError, MultiInputError
from autoport_cst.plan import derive_class_prefix, load_plan, parse_plan, plan_schema

MINIMAL = {"version": 1, "name": "qwen2", "architecture": "Qwen2ForCausalLM"}


def test_example_plans_load_and_match_the_schema(repo_root):
    schema = plan_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for path in sorted((repo_root / "examples").glob("*.plan.json")):
        data = json.loads(path.read_text())
        jsonschema.validate(data, schema)
        plan = load_plan(path)
        assert plan.name == path.name.split(".")[0]


def test_qwen2_example(repo_root):
    plan = load_plan(repo_root / "examples" / "qwen2.plan.json")
    assert plan.prefix == "Qwen2"
    assert plan.architecture == "Qwen2ForCausalLM"
    assert plan.reference == "llama3"
    assert plan.spec.attention.qkv_bias and not plan.spec.attention.o_bias


@pytest.mark.parametrize(
    "name, prefix",
    [("qwen2", "Qwen2"), ("gpt_neox", "GptNeox"), ("qwen3_moe", "Qwen3Moe"), ("llama", "Llama")],
)
def test_derived_class_prefix(name, prefix):
    assert derive_class_prefix(name) == prefix


def test_class_prefix_override():
    plan = parse_plan({**MINIMAL, "name": "gpt_neox", "class_prefix": "GPTNeoX"})
    assert plan.prefix == "GPTNeoX"


def test_every_error_has_its_json_path():
    with pytest.raises(MultiInputError) as info:
        parse_plan(
            {
                "version": 1,
                "name": "qwen2",
                "spec": {"norm": {"kind": "batchnorm"}},
                "steps": [{"codemod": 3}, {"params": {}}],
                "colour": "blue",
            },
            "plan.json",
        )
    paths = sorted(e.position.json_path for e in info.value.errors)
    assert paths == sorted(
        [
            "$.architecture",
            "$.spec.norm.kind",
            "$.steps[0].codemod",
            "$.steps[1].codemod",
            "$.colour",
        ]
    )
    assert all(e.position.path == "plan.json" for e in info.value.errors)


@pytest.mark.parametrize(
    "change, path",
    [
        ({"version": 2}, "$.version"),
        ({"name": "Qwen2"}, "$.name"),
        ({"class_prefix": "qwen2"}, "$.class_prefix"),
        ({"architecture": "Qwen2 For CausalLM"}, "$.architecture"),
        ({"spec_version": 9}, "$.spec_version"),
    ],
)
def test_semantic_errors(change, path):
    with pytest.raises(MultiInputError) as info:
        parse_plan({**MINIMAL, **change})
    assert [e.position.json_path for e in info.value.errors] == [path]


def test_malformed_json_has_line_and_column(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{\n  "version": 1,\n  "name": "x"\n  "architecture": "X"\n}\n')
    with pytest.raises(InputError) as info:
        load_plan(path)
    assert info.value.position.line == 4
    assert info.value.position.column == 3
    assert "malformed JSON" in str(info.value)


def test_missing_plan_file(tmp_path):
    with pytest.raises(InputError, match="plan file not found"):
        load_plan(tmp_path / "missing.json")


def test_schema_rejects_what_the_loader_rejects():
    schema = plan_schema()
    bad = {**MINIMAL, "spec": {"attention": {"qkv_bias": "yes"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    with pytest.raises(MultiInputError):
        parse_plan(bad)
