"""Every codemod's inline examples, run as tests: output compared byte for
byte, precondition examples must fail with the documented message, and every
output is a fixed point (applying the codemod again changes nothing)."""

from __future__ import annotations

import pytest

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import PortContext, run_example, run_on_source
from autoport_cst.transform.library import library

CASES = [
    pytest.param(cls, example, id=f"{cls.ID}-{number}")
    for cls in library().values()
    for number, example in enumerate(cls.EXAMPLES, 1)
]


@pytest.mark.parametrize("codemod_cls, example", CASES)
def test_example(codemod_cls, example):
    if example.raises is not None:
        with pytest.raises(PreconditionError) as info:
            run_example(codemod_cls, example)
        assert example.raises in str(info.value)
        assert info.value.position is not None and info.value.position.path == example.path
        return
    output, _ = run_example(codemod_cls, example)
    assert output == example.expected
    if example.path.endswith(".py"):
        compile(output, example.path, "exec")


@pytest.mark.parametrize("codemod_cls, example", [c for c in CASES if c.values[1].raises is None])
def test_example_output_is_a_fixed_point(codemod_cls, example):
    output, _ = run_example(codemod_cls, example)
    codemod = codemod_cls(codemod_cls.parse_params(example.params))
    port = PortContext(package_classes=frozenset(example.package_classes))
    again, _ = run_on_source(codemod, output, example.path, example.role, port)
    assert again == output
