"""README's test command hands the costliest test files out first
(tests/xdist_order.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("xdist")

from tests.xdist_order import FILE_SECONDS, CostliestFileFirst, file_cost  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class _Config:
    """What the scheduler reads of pytest's config: two local workers."""

    def getvalue(self, name: str) -> object:
        return {"tx": ["2*popen"], "dist": "loadfile"}[name]


class _Node:
    shutting_down = False

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)


def test_every_file_named_with_its_cost_is_a_test_file() -> None:
    missing = [path for path in FILE_SECONDS if not (ROOT / path).is_file()]
    assert missing == []


def test_the_costliest_pending_file_goes_first() -> None:
    heavy = next(iter(sorted(FILE_SECONDS, key=FILE_SECONDS.__getitem__, reverse=True)))
    collection = [f"tests/many.py::test_{i}" for i in range(20)] + [
        f"{heavy}::test_it",
        "tests/one.py::test_it",
    ]
    assert file_cost(heavy, 1) > file_cost("tests/many.py", 20) > file_cost("tests/one.py", 1)
    scheduler = CostliestFileFirst(_Config())  # type: ignore[arg-type]
    node = _Node()
    scheduler.registered_collections[node] = collection
    for nodeid in collection:
        scheduler.workqueue.setdefault(nodeid.split("::")[0], {})[nodeid] = False
    handed = []
    while scheduler.workqueue:
        scheduler._assign_work_unit(node)
        handed.append(collection[node.sent[-1][0]].split("::")[0])
    assert handed == [heavy, "tests/many.py", "tests/one.py"]  # loadfile alone: many, heavy, one
