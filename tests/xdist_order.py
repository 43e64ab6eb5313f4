"""The order in which README's test command (``pytest -n 2 --dist loadfile``)
hands the test files to its workers: the costliest first.

pytest-xdist's ``loadfile`` hands out whole files (a module's fixtures are
made once), the files with the most tests first. Here the costliest are the
files of one or two tests that port and validate a model (the serve battery,
a whole ``port``): handed out last, one worker can still be running them
while the other has nothing left. Handed out first (longest processing time
first), the last files handed out are short ones, and the two workers end
close together.

A file is reckoned at its ``FILE_SECONDS``, or at ``SECONDS_PER_TEST`` a
test if that is more: the test time (setup, call and teardown) of its tests,
the larger of two measurements: the suite's 60 slowest tests in the
fresh-clone CI run of 70e184e (``--durations=60``, 2026-12-03, nothing else
running: 936 s, half of the two workers' time; the rest, about 1,000 s over
the other 2,584 tests, gives ``SECONDS_PER_TEST``), summed per file; and
``--durations=0`` of the 2,135 tests that a run of 801c055 finished before it
was stopped (load average 12 to 27), summed per file and divided by 4.9, the
median ratio of the 20 tests both runs list. Files under 5 s are left out. The
figures only order the files: a stale one costs balance, never a test.

Files added or changed since (2026-12-03, 15:00-15:15 UTC) are reckoned at
their CPU time alone (``/usr/bin/time -v``, ``pytest -n 0`` of the file,
user + system with the processes it starts) less 2.5 s, what a file of
light tests costs that way (the process's start and collection): here, on
one thread, that CPU time is close to the test time of a fresh-clone CI run
(``test_port_validates_a_llama``: 37.5 s of CPU alone, 37 s in CI).
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling

# seconds a test of a file not in FILE_SECONDS
SECONDS_PER_TEST = 0.4

FILE_SECONDS: dict[str, float] = {
    "tests/moe/test_codemods.py": 118,
    "tests/coverage_dense/test_dense_ports.py": 96,
    "tests/codemods_attention/test_properties.py": 93,
    "tests/codemods/test_properties.py": 87,
    "tests/codemods_attention/test_validations.py": 74,
    "tests/codemods_mlp/test_ports_starcoder2.py": 66,
    "tests/moe/test_ports.py": 53,
    "tests/codemods_attention/test_multipath_ports.py": 53,
    "tests/serve/test_smoke_battery.py": 50,
    "tests/research/test_named_computations.py": 43,
    "tests/validate/test_tiny_config_fit.py": 42,
    "tests/lint/test_reference_models.py": 41,
    "tests/coverage_dense/test_refusals.py": 39,
    "tests/coverage_moe/test_afmoe_port.py": 38,
    "tests/coverage_moe/test_cohere2_moe_port.py": 34,
    "tests/coverage_dense/test_nope_layer_types.py": 30,
    "tests/port/test_port_cli.py": 29,
    "tests/validate/test_qwen2_port.py": 27,
    "tests/port/test_required_llama3.py": 26,
    "tests/gpt_oss/test_port.py": 26,
    "tests/codemods_mlp/test_properties_mlp.py": 25,
    "tests/moe/test_reference.py": 24,
    "tests/codemods_mlp/test_ports_norms_and_scales.py": 23,
    "tests/lint/test_precommit.py": 23,
    "tests/codemods_attention/test_real_shapes.py": 22,
    "tests/coverage_moe/test_moe_norm_placement.py": 21,
    "tests/vlm/test_vision_spec.py": 21,
    "tests/gpt_oss/test_reference.py": 20,
    "tests/serve/test_kv_cache_specs.py": 20,
    "tests/port/test_interrupted_port.py": 19,
    "tests/validate/test_vocabulary_padding.py": 19,
    "tests/coverage_moe/test_rope_per_layer_type.py": 18,
    "tests/validate/test_validate_llama3.py": 18,
    "tests/port/test_required_moe.py": 17,
    "tests/codemods_mlp/test_split_decoder.py": 16,
    "tests/codemods_mlp/test_real_loaders.py": 16,
    "tests/coverage_moe/test_moe_ports_sigmoid_routers.py": 16,
    "tests/port/test_port_reuse.py": 16,
    "tests/codemods/test_rename_in_module.py": 15,
    "tests/validate/test_on_device_sampling.py": 15,
    "tests/codemods_mlp/test_checkpoint_layouts.py": 15,
    "tests/port/test_required_other_references.py": 15,
    "tests/coverage_moe/test_llama4_port.py": 14,
    "tests/serve/test_limits.py": 14,
    "tests/apply/test_parse_once.py": 14,
    "tests/codemods_attention/test_persimmon_qk_layernorm.py": 13,
    "tests/validate/test_package_import.py": 11,
    "tests/validate/test_cli.py": 11,
    "tests/coverage_dense/test_checkpoint_layout.py": 11,
    "tests/vlm/test_vision_codemods.py": 11,
    "tests/validate/test_prompt_embeds.py": 10,
    "tests/research/test_computed_features.py": 10,
    "tests/apply/test_apply_cli.py": 10,
    "tests/validate/test_wide_layouts.py": 10,
    "tests/cli/test_closed_output.py": 9,
    "tests/validate/test_phase_paths.py": 9,
    "tests/validate/test_broken_ports.py": 9,
    "tests/research/test_plan_cli.py": 6,
    "tests/gpt_oss/test_expert_parallel.py": 6,
    "tests/validate/test_lint_gate.py": 6,
    "tests/coverage_dense/test_mpt_softmax_scale.py": 6,
    "tests/test_mutation_benchmark.py": 5,
    "tests/validate/test_tiny_layer_variants.py": 5,
    "tests/spec/test_plan.py": 5,
    "tests/validate/test_tiny_nested_text_config.py": 5,
}


class CostliestFileFirst(LoadFileScheduling):
    """``loadfile`` scheduling that hands out the costliest pending file next."""

    def _assign_work_unit(self, node: Any) -> None:
        costliest = max(self.workqueue, key=lambda scope: file_cost(scope, len(self.workqueue[scope])))
        self.workqueue.move_to_end(costliest, last=False)
        super()._assign_work_unit(node)


def file_cost(path: str, tests: int) -> float:
    """The expected test time of the file at ``path`` with ``tests`` tests to run."""
    return max(FILE_SECONDS.get(path, 0.0), SECONDS_PER_TEST * tests)


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    return CostliestFileFirst(config, log)
