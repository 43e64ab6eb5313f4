"""tests/validation_depth.py: within ``without_follow_ups`` the
``validate_model`` that ``port`` imports runs without follow-ups (but on the
first checkpoint it is given, with ``planned_too`` false), and after it the
package's own function is back; with --run-slow every architecture is
validated in full."""

from __future__ import annotations

import pytest

from tests.validation_depth import (
    FULL,
    OWN,
    PLANNED,
    feature_depth,
    follow_up_options,
    port_depth,
    validates_fully,
    without_follow_ups,
)


def test_the_port_s_validate_model_runs_without_follow_ups_then_is_restored(monkeypatch):
    import autoport_cst.validate as validate
    import autoport_cst.validate.api as api

    seen: list[dict] = []
    monkeypatch.setattr(api, "validate_model", lambda *args, **options: seen.append(options))
    # an earlier test's monkeypatch of the package may have left the name in its namespace
    before = vars(validate).get("validate_model")
    with without_follow_ups() as calls:
        from autoport_cst.validate import validate_model  # as port() and port_variants import it

        validate_model("package", "checkpoint", dtype="fp32", config_variants=True)
    assert calls == [("package", "checkpoint")]
    assert seen == [{"dtype": "fp32", "config_variants": False, "parallel_layouts": False}]
    assert vars(validate).get("validate_model") is before
    assert validate.validate_model is (api.validate_model if before is None else before)


def test_follow_ups_on_the_planned_config_only(monkeypatch):
    """``port`` validates the planned checkpoint (fp32, then bf16), then the
    varied one (``port_variants``): only the planned keeps its follow-ups."""
    import autoport_cst.validate.api as api

    seen: list[tuple[str, dict]] = []
    monkeypatch.setattr(api, "validate_model", lambda *args, **options: seen.append((args[1], options)))
    asked: list = []
    with without_follow_ups(planned_too=False, asked=asked) as calls:
        from autoport_cst.validate import validate_model

        validate_model("package", "planned", dtype="fp32")
        validate_model("package", "planned", dtype="bf16")
        validate_model("package", "varied", dtype="fp32", parallel_layouts=True)
    assert [args[1] for args in calls] == ["planned", "planned", "varied"]
    # as the caller asked, before the follow-ups were turned off
    assert [(args[1], options) for args, options in asked] == [
        ("planned", {"dtype": "fp32"}),
        ("planned", {"dtype": "bf16"}),
        ("varied", {"dtype": "fp32", "parallel_layouts": True}),
    ]
    off = {"config_variants": False, "parallel_layouts": False}
    assert seen == [
        ("planned", {"dtype": "fp32"}),
        ("planned", {"dtype": "bf16"}),
        ("varied", {"dtype": "fp32", **off}),
    ]


def test_port_depths(pytestconfig, monkeypatch):
    monkeypatch.delenv("AUTOPORT_RUN_SLOW", raising=False)
    if pytestconfig.getoption("--run-slow"):
        assert port_depth(pytestconfig, "B", frozenset({"A"})) == FULL == feature_depth(pytestconfig)
        return
    assert port_depth(pytestconfig, "A", frozenset({"A"})) == PLANNED == feature_depth(pytestconfig)
    assert port_depth(pytestconfig, "B", frozenset({"A"})) == OWN
    monkeypatch.setenv("AUTOPORT_RUN_SLOW", "1")
    assert port_depth(pytestconfig, "B", frozenset({"A"})) == FULL == feature_depth(pytestconfig)


def test_every_architecture_is_validated_in_full_with_run_slow(pytestconfig, monkeypatch):
    monkeypatch.delenv("AUTOPORT_RUN_SLOW", raising=False)
    slow = bool(pytestconfig.getoption("--run-slow"))
    assert validates_fully(pytestconfig, "A", frozenset({"A"}))
    assert validates_fully(pytestconfig, "B", frozenset({"A"})) is slow
    monkeypatch.setenv("AUTOPORT_RUN_SLOW", "1")
    assert validates_fully(pytestconfig, "B", frozenset({"A"}))


@pytest.mark.parametrize(
    "full, options", [(True, {}), (False, {"config_variants": False, "parallel_layouts": False})]
)
def test_follow_up_options(full, options):
    assert follow_up_options(full) == options


@pytest.mark.usefixtures("shared_reference_runs")
def test_a_module_with_shared_reference_runs_keeps_them(tmp_path):
    """tests/conftest.py's ``shared_reference_runs``: within, a transformers run
    kept on a checkpoint is found again (the module's validations reuse it)."""
    from autoport_cst.validate.reference_reuse import keep_run, kept_run

    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    prompts = ((1, 2, 3),)
    assert kept_run(tmp_path, prompts, 4) is None
    keep_run(tmp_path, prompts, 4, [[5, 6]], {"fp32": "outputs"})
    assert kept_run(tmp_path, prompts, 4) == ([[5, 6]], {"fp32": "outputs"})
    assert kept_run(tmp_path, prompts, 8) is None, "another number of decode steps"
