"""The order in which README's test command (``pytest -n 2 --dist loadfile``)
hands the test files to its workers: the costliest first.

pytest-xdist's ``loadfile`` hands out whole files (a module's fixtures are
made once), the files with the most tests first. Here the costliest are the
files of one or two tests that port and validate a model (the serve battery,
a whole ``port``): handed out last, one worker can still be running them
while the other has nothing left. Handed out first (longest processing time
first), the last files handed out are short ones, and the two workers end
close together.

A file is reckoned at ``SECONDS_PER_TEST`` a test plus its ``FILE_SECONDS``:
the suite's 60 slowest tests (``--durations=60`` of the fresh-clone CI run of
70e184e, 2026-12-03, nothing else running: 936 s, half of its two workers'
time) summed per file; the rest of that time, about 1,000 s over the other
2,584 tests, gives ``SECONDS_PER_TEST``. The figures only order the files: a
stale one costs balance, never a test.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling

# seconds a test, besides its file's FILE_SECONDS
SECONDS_PER_TEST = 0.4

FILE_SECONDS: dict[str, float] = {
    "tests/moe/test_ports.py": 53,
    "tests/codemods_attention/test_multipath_ports.py": 53,
    "tests/serve/test_smoke_battery.py": 50,
    "tests/validate/test_qwen2_port.py": 45,
    "tests/moe/test_codemods.py": 33,
    "tests/coverage_dense/test_dense_ports.py": 33,
    "tests/coverage_moe/test_afmoe_port.py": 31,
    "tests/codemods_attention/test_properties.py": 31,
    "tests/port/test_port_cli.py": 29,
    "tests/codemods_attention/test_validations.py": 29,
    "tests/gpt_oss/test_port.py": 26,
    "tests/moe/test_reference.py": 24,
    "tests/lint/test_precommit.py": 23,
    "tests/codemods_attention/test_real_shapes.py": 22,
    "tests/vlm/test_vision_spec.py": 21,
    "tests/coverage_moe/test_moe_norm_placement.py": 21,
    "tests/serve/test_kv_cache_specs.py": 20,
    "tests/gpt_oss/test_reference.py": 20,
    "tests/validate/test_vocabulary_padding.py": 19,
    "tests/port/test_interrupted_port.py": 19,
    "tests/coverage_dense/test_refusals.py": 19,
    "tests/coverage_moe/test_rope_per_layer_type.py": 18,
    "tests/coverage_dense/test_nope_layer_types.py": 18,
    "tests/codemods_mlp/test_ports_starcoder2.py": 18,
    "tests/port/test_required_moe.py": 17,
    "tests/port/test_port_reuse.py": 16,
    "tests/coverage_moe/test_moe_ports_sigmoid_routers.py": 16,
    "tests/codemods_mlp/test_split_decoder.py": 16,
    "tests/codemods_mlp/test_real_loaders.py": 16,
    "tests/port/test_required_other_references.py": 15,
    "tests/codemods_mlp/test_checkpoint_layouts.py": 15,
    "tests/serve/test_limits.py": 14,
    "tests/coverage_moe/test_llama4_port.py": 14,
    "tests/apply/test_parse_once.py": 14,
    "tests/validate/test_validate_llama3.py": 11,
    "tests/validate/test_package_import.py": 11,
    "tests/validate/test_cli.py": 11,
    "tests/coverage_dense/test_checkpoint_layout.py": 11,
    "tests/validate/test_wide_layouts.py": 10,
    "tests/validate/test_prompt_embeds.py": 10,
    "tests/research/test_computed_features.py": 10,
    "tests/validate/test_phase_paths.py": 9,
    "tests/validate/test_broken_ports.py": 9,
    "tests/codemods/test_properties.py": 9,
    "tests/cli/test_closed_output.py": 9,
}


class CostliestFileFirst(LoadFileScheduling):
    """``loadfile`` scheduling that hands out the costliest pending file next."""

    def _assign_work_unit(self, node: Any) -> None:
        costliest = max(self.workqueue, key=lambda scope: file_cost(scope, len(self.workqueue[scope])))
        self.workqueue.move_to_end(costliest, last=False)
        super()._assign_work_unit(node)


def file_cost(path: str, tests: int) -> float:
    """The expected test time of the file at ``path`` with ``tests`` tests to run."""
    return FILE_SECONDS.get(path, 0.0) + SECONDS_PER_TEST * tests


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    return CostliestFileFirst(config, log)
