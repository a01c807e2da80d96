"""A Hugging Face Trainer job's ledger, checked against the Trainer's own timings.

The Trainer (tests/huggingface_job.py: a small GPT-2 on CPU, two evaluations and two saves,
the last step's included, each slowed to last seconds) trains as a process of its own,
reporting through burnrate's callback to a real `burnrate agent` that records, holding the GPU
from the rank's first message until its process ends (local attribution: no kubelet here).
`burnrate analyze` over the recording prices the job: its evaluation and checkpoint time
agree with the Trainer's own `eval_runtime` and with each save's seconds, its first steps
are steps (not start-up), and the final evaluation and save after the last step are
evaluation and checkpoint, not a stall, under thresholds that call 1 s without a step one.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

pytest.importorskip("transformers")

from tests.conftest import PYTHON, ROOT  # noqa: E402
from tests.processes import agent  # noqa: E402

pytestmark = pytest.mark.slow

JOB, INTERVAL_S = "hf-ledger", 0.5
# Thresholds in minutes read as seconds, as the demo's: a stall is 5 usual steps, or 1 s.
THRESHOLDS = "stalled: {interval_factor: 5.0, floor_minutes: 0.0167}\n"
# The analysis' grid here is 1 s (its finest). The loop's seconds of steps, evaluations and saves
# are exact; the held time they split is known to a grid step at each end of the run, shared by
# the categories in proportion: a category is off by less than a step. The JSON document rounds
# GPU-hours to 1e-4 (0.36 s).
EDGES_S, ROUNDING_S = 1.0, 0.36


def test_a_hugging_face_job_s_ledger_agrees_with_the_trainer_s_own_timings(tmp_path):
    recording, out = tmp_path / "recording", tmp_path / "trainer.json"
    (tmp_path / "thresholds.yaml").write_text(THRESHOLDS)
    # No RANK or LOCAL_RANK: the Trainer would start torch.distributed.
    env = {**os.environ, "BURNRATE_TRAINING_JOB": JOB, "PYTHONPATH": ROOT, "TMPDIR": str(tmp_path)}
    with agent(tmp_path, "--interval", str(INTERVAL_S), "--attribution", "local", "--record", str(recording)) \
            as (_, sock, _proc):
        began = time.time()
        job = subprocess.run([PYTHON, os.path.join(ROOT, "tests", "huggingface_job.py"), str(out)], cwd=tmp_path,
                             env={**env, "BURNRATE_TELEMETRY_SOCKET": sock}, capture_output=True, text=True,
                             timeout=300)
        exited = time.time()
        assert job.returncode == 0, job.stderr[-3000:]
        time.sleep(3 * INTERVAL_S)       # the GPU let go, and written
    analyzed = subprocess.run([PYTHON, "-m", "burnrate", "analyze", "--recording", str(recording),
                               "--start", repr(began - 5), "--end", repr(time.time()),
                               "--detector-config", str(tmp_path / "thresholds.yaml"), "--format", "json"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    doc = json.loads(analyzed.stdout)
    trainer = json.loads(out.read_text())
    (priced,) = [j for j in doc["jobs"] if j["training_job"] == JOB]
    ledger = {name: figure["gpu_hours"] * 3600 for name, figure in priced["ledger"].items()}
    tolerance = EDGES_S + ROUNDING_S
    assert len(trainer["evaluations"]) == 2 and len(trainer["saves"]) == 2
    assert ledger["evaluation"] == pytest.approx(sum(trainer["evaluations"]), abs=tolerance), (ledger, trainer)
    assert ledger["checkpoint"] == pytest.approx(sum(trainer["saves"]), abs=tolerance), (ledger, trainer)
    # The steps before the first evaluation are steps: the monitor is created at the Trainer's
    # on_train_begin, and its first step follows at once.
    assert ledger["startup"] <= EDGES_S + ROUNDING_S, ledger
    steps_s = trainer["train_runtime"] - sum(trainer["evaluations"]) - sum(trainer["saves"])
    assert ledger["productive"] + ledger["data_wait"] + ledger["sync_wait"] == pytest.approx(steps_s, abs=tolerance)
    # After the final save the process closes its monitor, which says so, and exits; the agent
    # lets the GPU go at its next collection. Those seconds are the process's end, no stall.
    assert ledger["stalled"] <= ROUNDING_S, ledger
    assert ledger["no_process"] <= exited - trainer["ended"] + INTERVAL_S + EDGES_S + ROUNDING_S, (ledger, trainer)
    assert ledger["restart"] + ledger["lost_progress"] == 0.0, ledger
    assert sum(ledger.values()) == pytest.approx(priced["gpu_hours"] * 3600, abs=ROUNDING_S * len(ledger))
    assert not [f for f in doc["findings"] if f["training_job"] == JOB and f["kind"] == "stalled"], doc["findings"]
