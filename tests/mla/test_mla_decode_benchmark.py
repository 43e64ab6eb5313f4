"""benchmarks/mla_decode.py times the absorbed and the expanded decode of the
same latent cache: the two forms it times compute the same attention."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from .conftest import ROOT


@pytest.fixture(scope="module")
def mla_benchmark():
    spec = importlib.util.spec_from_file_location(
        "mla_decode_benchmark", ROOT / "benchmarks" / "mla_decode.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_the_timed_forms_agree(mla_benchmark):
    tiny = mla_benchmark.SIZES[0]
    absorbed_ms, expanded_ms, difference = mla_benchmark.measure(tiny, repeat=1)
    assert difference < 1e-5  # float32 kernels: the same attention, rounded differently
    assert absorbed_ms > 0 and expanded_ms > 0


def test_validate_benchmark_prints_absorbed_and_expanded_decode(capsys):
    spec = importlib.util.spec_from_file_location(
        "validate_benchmark_mla", ROOT / "benchmarks" / "validate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    met = module.mla_decode(repeat=1)
    line = capsys.readouterr().out
    assert "absorbed" in line and "expanded" in line and " ms" in line
    assert ("met" if met else "MISSED") in line
