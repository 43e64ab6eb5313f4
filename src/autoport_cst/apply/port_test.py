"""The logit test every port gets.

``apply`` writes ``test/vllm_neuron/model/<name>/test_<name>_logits.py``.
The file is named after the port: the test directories are not packages
(a ``test`` package would shadow the standard library's, a ``vllm_neuron``
one the model packages), so pytest names each test module by its file name,
and the tests of many ports are collected side by side.

The test reruns the validations recorded in ``validated.json`` beside it
(``autoport_cst.validation_record``, ``autoport_cst.validate.recorded``): the
configs the port was validated on, not the architecture's default config.
``port`` records its runs there and ``validate`` adds its run on a port that
has the test.
"""

from __future__ import annotations

from string import Template

from autoport_cst.validation_record import PORT_TEST_ROOT, port_test_dir, port_test_path

__all__ = ["PORT_TEST_ROOT", "port_test_dir", "port_test_path", "port_test_source"]


def port_test_source(name: str, architecture: str) -> str:
    return _TEMPLATE.substitute(name=name, architecture=architecture)


_TEMPLATE = Template('''\
# SPDX-License-Identifier: Apache-2.0
"""Logit test of the $name port ($architecture) on CPU, written by autoport-cst.

Reruns every validation recorded in ``validated.json`` beside this file
(``autoport-cst port`` records its runs; ``autoport-cst validate`` adds its
run): the port and transformers on the checkpoint the port was validated on,
with the same TP and EP sizes, dtype, decode steps and prompts, within the
tolerances of autoport-cst validation. A tiny random checkpoint is rebuilt
from its recorded config.json and weights seed (nothing is downloaded). Run
from the root that holds ``vllm_neuron/``:

    python -m pytest test/vllm_neuron/model/$name/

With no validation recorded the test is skipped, not passed; so is a
recorded checkpoint directory that is no longer there. Needs
``autoport-cst[validate]``; without it the test is skipped.
"""

from pathlib import Path

import pytest

MODEL_NAME = "$name"  # package under vllm_neuron/model/
HF_ARCHITECTURE = "$architecture"  # config.json architectures[0]
HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parents[3] / "vllm_neuron" / "model" / MODEL_NAME

pytest.importorskip("torch", reason="needs autoport-cst[validate]")
recorded = pytest.importorskip("autoport_cst.validate.recorded", reason="needs autoport-cst[validate]")

RUNS = recorded.load_runs(HERE)
if not RUNS:
    pytestmark = pytest.mark.skip(reason=f"no validation recorded in {HERE / recorded.RECORD}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return recorded.CheckpointCache(tmp_path_factory.mktemp(MODEL_NAME))


@pytest.mark.parametrize("run", RUNS or [None], ids=[run["label"] for run in RUNS] or ["nothing-recorded"])
def test_logits_match_transformers(run, checkpoints):
    try:
        checkpoint = checkpoints.get(run)
    except recorded.CheckpointGone as gone:
        pytest.skip(str(gone))
    report = recorded.rerun(PACKAGE, run, checkpoint)
    assert report.equivalent, report.summary()
''')
