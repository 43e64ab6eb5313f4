"""``import_settled``: a group of imports with the garbage collector paused,
what is alive afterwards frozen out of later collections; an imported group
costs nothing, a module that does not import is left to its user."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from autoport_cst.settled_imports import import_settled


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "settled_probe_module.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("settled_probe_module", None)
    gc.unfreeze()


def test_imports_with_the_collector_paused_then_freezes(module_dir: Path):
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    assert import_settled(["settled_probe_module", "no_such_module_here"]) == ["settled_probe_module"]
    assert sys.modules["settled_probe_module"].COLLECTING is False
    assert gc.isenabled()  # restored
    assert gc.get_freeze_count() > frozen
    frozen = gc.get_freeze_count()
    assert import_settled(["settled_probe_module"]) == []  # already imported: nothing collected or frozen
    # frozen objects still die when their last reference goes (another thread of an
    # xdist worker drops some): nothing frozen means the count did not grow
    assert gc.get_freeze_count() <= frozen


def test_a_disabled_collector_stays_disabled(module_dir: Path):
    gc.disable()
    try:
        import_settled(["settled_probe_module"])
        assert not gc.isenabled()
    finally:
        gc.enable()
