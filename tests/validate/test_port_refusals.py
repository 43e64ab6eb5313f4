"""A layout the port refuses with a NotImplementedError of its own (a guard a
codemod wrote) is reported as not run by the default parallel checks, not as a
wrong port; a NotImplementedError from the stand-in stays a failure."""

from __future__ import annotations

from types import SimpleNamespace

from autoport_cst.validate.parallel_checks import LAYOUTS, check_parallel_layouts
from autoport_cst.validate.port_failure import PortFailure, is_port_refusal
from autoport_cst.validate.report import PortFailureInfo, ValidationReport


def _raised_in(filename: str) -> BaseException:
    code = compile("raise NotImplementedError('q/k norms with attention data parallelism')", filename, "exec")
    try:
        exec(code, {})
    except NotImplementedError as error:
        return error
    raise AssertionError("not raised")


def test_a_guard_in_the_port_is_a_refusal():
    guard = _raised_in("/tmp/out/vllm_neuron/model/olmo2/model.py")
    assert is_port_refusal(guard)
    try:
        raise PortFailure("build", "NotImplementedError: ...") from guard
    except PortFailure as failure:
        assert failure.refusal


def test_the_stand_in_refusing_an_option_is_not_the_ports_refusal():
    assert not is_port_refusal(_raised_in("/x/src/autoport_cst/validate/standin/functional.py"))
    assert not is_port_refusal(ValueError("wrong shape"))
    assert not PortFailure("decode", "ValueError: ...").refusal
    assert PortFailure("build", "rank 1: NotImplementedError", refusal=True).refusal  # from a rank


def test_a_failure_names_the_function_of_the_port_it_came_from():
    """``raised_in`` is read from the traceback, the innermost frame of the
    port's own code (a config guard: ``check_assumed_config``), never from the
    message; a failure passed on keeps the name given."""
    code = compile(
        "def check_assumed_config(values):\n    raise ValueError('head_dim is 8')\ncheck_assumed_config({})",
        "/tmp/out/vllm_neuron/model/helium/config.py",
        "exec",
    )
    try:
        exec(code, {})
    except ValueError as error:
        guard = error
    try:
        raise PortFailure("build", "ValueError: in __init__)") from guard
    except PortFailure as failure:
        assert failure.raised_in == "check_assumed_config"
        assert not failure.refusal
    assert PortFailure("decode", "NotImplementedError").raised_in is None
    assert (
        PortFailure("build", "rank 1: ...", raised_in="check_assumed_config").raised_in
        == "check_assumed_config"
    )


def _report(failure: PortFailureInfo | None = None) -> ValidationReport:
    report = ValidationReport("port", "ckpt", "LlamaForCausalLM", "factory", {}, equivalent=failure is None)
    report.failure = failure
    return report


def test_a_refused_layout_is_not_run_and_the_others_are():
    def validate(**options):
        if options.get("attention_dp"):
            return _report(PortFailureInfo("build", "NotImplementedError: guard", refusal=True))
        return _report()

    report = _report()
    check_parallel_layouts(report, validate)
    assert report.equivalent
    assert len(report.parallel_layouts) == len(LAYOUTS)
    refused = [e for e in report.parallel_layouts if e["equivalent"] is None]
    assert refused and all(e["summary"].startswith("not run: the port refuses it") for e in refused)


def test_a_crash_that_is_not_a_refusal_fails_the_report():
    def validate(**options):
        return _report(PortFailureInfo("decode", "RuntimeError: shape mismatch"))

    report = _report()
    check_parallel_layouts(report, validate)
    assert not report.equivalent
    assert SimpleNamespace(**report.parallel_layouts[0]).equivalent is False
