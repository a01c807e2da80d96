"""The ledger of a real crash and resume, against what the trainer itself measured.

The reference trainer runs under torch's elastic launcher (2 ranks, CPU, gloo, the tiny
model), sending to a real `burnrate agent` that records. Run 1 checkpoints every
`EVERY` steps and one rank crashes before step `CRASH_AT`; after a pause, run 2 resumes
from the last checkpoint (step `RESUMED`) and trains to the end. `burnrate analyze
--recording` must then book, for the job, within one sampling interval of the trainer's own
figures (its telemetry JSON lines): the steps after the checkpoint that run 1 made and run 2
made again as lost progress, the time between run 1's last step and run 2's process start
as restart, run 2's own start-up, and the saves as checkpoint time.

Who holds the GPUs: the agent reads it from a stand-in kubelet (tests/kubelet_standin.py: the
real pod-resources gRPC service on a Unix socket), where the job's pod holds
both simulated GPUs across the restart, as a PyTorchJob's pod does while its container
restarts. Local attribution (agent.local) cannot: it lets a GPU go 5 s after its rank's last
report once the process is gone, and a crash to the resumed ranks' first report takes
longer here (the crashed launcher's teardown, a new launcher and two ranks importing torch).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from burnrate.analyzer.costing.cost import JobCost
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze
from burnrate.analyzer.sources import RecordingSource
from tests.conftest import PYTHON, ROOT
from tests.kubelet_standin import serving
from tests.processes import agent

pytestmark = pytest.mark.slow

JOB, NAMESPACE = "ledger-e2e", "test"
STEPS, EVERY, CRASH_AT = 40, 20, 38
RESUMED = (CRASH_AT - 1) // EVERY * EVERY       # the last checkpoint before the crash: step 20
INTERVAL_S = 1.0        # the agent's sampling interval, and the tolerance of every figure
PAUSE_S = 1.0
# A loader slowed to ~0.15 s a batch: the 17 steps lost take ~3 s, several intervals.
TRAIN = ["--nproc", "2", "--model", "tiny", "--batch-size", "4", "--seq-len", "32", "--report-every-steps", "1",
         "--steps", str(STEPS), "--checkpoint-every-steps", str(EVERY), "--fault", "starve:delay=0.15"]


@pytest.fixture(scope="module")
def kubelet():
    with serving() as servicer:
        yield servicer


def scrape(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return [line for line in resp.read().decode().splitlines() if not line.startswith("#")]


def label(line: str, name: str) -> str | None:
    key = f'{name}="'
    return line.split(key, 1)[1].split('"', 1)[0] if key in line else None


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Measured:
    job: dict              # the job in `burnrate analyze --format json`
    exact: JobCost         # the same, from the analyzer's API: figures not rounded
    expected: dict         # category -> seconds per GPU, from the trainer's own records
    got: dict              # category -> seconds per GPU, from the ledger
    figures: str           # both, for failure messages


@pytest.fixture(scope="module")
def crash_and_resume(tmp_path_factory, kubelet) -> Measured:
    """Run 1 crashes, run 2 resumes, the recording is analyzed: once for the module's tests."""
    tmp_path = tmp_path_factory.mktemp("ledger")
    recording = tmp_path / "recording"
    checkpoints = tmp_path / "ck"
    with agent(tmp_path, "--interval", f"{INTERVAL_S:g}", "--record", str(recording), "--attribution", "kubelet",
               "--kubelet-socket", kubelet.socket, "--refresh", "0.5") as (url, sock, _):
        gpus = sorted({label(line, "UUID") for line in scrape(url) if line.startswith("DCGM_FI_DEV_GPU_UTIL{")})
        assert len(gpus) == 2, gpus
        kubelet.hold(NAMESPACE, JOB, gpus)
        wait_for(lambda: sum(label(line, "pod") == JOB for line in scrape(url)
                             if line.startswith("DCGM_FI_DEV_GPU_UTIL{")) == 2, "the pod to hold both GPUs")
        # One pod, one job name, both launches: the kubelet's pod and the ranks' identity agree.
        env = {**os.environ, "BURNRATE_TELEMETRY_SOCKET": sock, "BURNRATE_TRAINING_JOB": JOB, "POD_NAME": JOB,
               "POD_NAMESPACE": NAMESPACE, "TMPDIR": str(tmp_path)}

        def train(*args: str, jsonl: str) -> subprocess.CompletedProcess:
            return subprocess.run([PYTHON, "-m", "burnrate", "train", *TRAIN, "--checkpoint-dir", str(checkpoints),
                                   "--telemetry-jsonl", str(tmp_path / jsonl), *args],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

        started = time.monotonic()
        first = train("--fault", f"crash:at={CRASH_AT}", jsonl="run1.jsonl")
        # The crashed rank, or the other one that its crash aborted, is named first.
        assert first.returncode == 1 and "failed with exit code" in first.stderr, \
            first.stdout[-2000:] + first.stderr[-3000:]
        paused = time.monotonic()
        time.sleep(PAUSE_S)
        pause = time.monotonic() - paused
        second = train("--resume", jsonl="run2.jsonl")
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
        assert f"resumed from step-{RESUMED:08d}.pt (step {RESUMED})" in second.stdout
        trained = time.monotonic() - started
        # The last reports are in the agent's table, and a sample of them is recorded.
        made = (CRASH_AT - 1) + (STEPS - RESUMED)
        wait_for(lambda: sorted(float(line.rsplit(" ", 1)[1]) for line in scrape(url)
                                if line.startswith("burnrate_train_steps_total{")) == [made, made],
                 "the agent to count every step")
        time.sleep(1.5 * INTERVAL_S)
    analyzed = subprocess.run([PYTHON, "-m", "burnrate", "analyze", "--recording", str(recording), "--format", "json"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    (job,) = [j for j in json.loads(analyzed.stdout)["jobs"] if (j["namespace"], j["training_job"]) == (NAMESPACE, JOB)]
    (exact,) = [j for j in analyze(RecordingSource(str(recording)).frames(), load_catalog()).jobs
                if (j.namespace, j.training_job) == (NAMESPACE, JOB)]

    # What the trainer measured, from its own records (each rank writes its own; the ranks step
    # together, so a figure per GPU is the mean over the two).
    run1, run2 = records(tmp_path / "run1.jsonl"), records(tmp_path / "run2.jsonl")
    ranks = 2
    assert max(r["step"] for r in run1) == CRASH_AT - 1
    assert {r["resumed_from"] for r in run1} == {0} and {r["resumed_from"] for r in run2} == {RESUMED}
    start2 = min(r["start_time"] for r in run2)
    first2 = min((r for r in run2 if r["steps"]), key=lambda r: r["time"])
    expected = {
        # Steps RESUMED+1 .. CRASH_AT-1: made by run 1, made again by run 2.
        "lost_progress": sum(r["step_s"] for r in run1 if r["step"] > RESUMED) / ranks,
        # From run 1's last step to the resumed processes' start.
        "restart": start2 - max(r["time"] for r in run1 if r["steps"]),
        "checkpoint": sum(r["checkpoint_s"] for r in run1 + run2) / ranks,
        # Run 2's start-up: from its processes' start to the start of its first step.
        "startup_of_run_2": first2["time"] - first2["step_s"] - start2,
    }
    assert job["gpus"] == 2 and exact.gpus == 2, job
    # The analyzer's own figures (the document's are rounded to 1e-4 GPU-hours, 0.18 s per GPU here).
    per_gpu = 3600 / exact.gpus
    got = {name: (hours * per_gpu if hours is not None else None) for name, hours in exact.ledger.gpu_hours.items()}
    runs = exact.ledger.runs
    got["startup_of_run_2"] = runs[1].gpu_hours["startup"] * per_gpu if len(runs) > 1 else None
    figures = (f"expected (s per GPU) {json.dumps({k: round(v, 3) for k, v in expected.items()})}\n"
               f"got {json.dumps({k: v if v is None else round(v, 3) for k, v in got.items()})}\n"
               f"pause {pause:.2f} s, both runs {trained:.1f} s\nruns: {json.dumps(job['runs'])}")
    print(figures)
    return Measured(job, exact, expected, got, figures)


def test_crash_and_resume_ledger_matches_what_the_trainer_measured(crash_and_resume):
    job, expected, got, figures = (crash_and_resume.job, crash_and_resume.expected, crash_and_resume.got,
                                   crash_and_resume.figures)
    assert [(r["resumed_from"], r["last_step_number"]) for r in job["runs"]] == [(0, CRASH_AT - 1),
                                                                                (RESUMED, STEPS)], figures
    assert expected["lost_progress"] > 2 * INTERVAL_S and expected["restart"] > 2 * INTERVAL_S, figures
    # Each within one sampling interval of what the trainer measured.
    for name in ("lost_progress", "restart", "checkpoint", "startup_of_run_2"):
        assert got[name] == pytest.approx(expected[name], abs=INTERVAL_S), (name, figures)
    # Every GPU-hour the job held is in exactly one category, and goodput is the productive
    # share of them: exactly in the analyzer's figures, and within the document's rounding
    # (each figure to 1e-4 GPU-hours, goodput to 1e-4) in its JSON.
    exact = crash_and_resume.exact
    assert None not in exact.ledger.gpu_hours.values() and job["ledger_basis"] == {}, job
    assert sum(exact.ledger.gpu_hours.values()) == pytest.approx(exact.gpu_hours, rel=1e-9), figures
    assert exact.goodput == pytest.approx(exact.ledger.gpu_hours["productive"] / exact.gpu_hours, rel=1e-9)
    assert 0 < exact.goodput < 1
    hours = [c["gpu_hours"] for c in job["ledger"].values()]
    assert sum(hours) == pytest.approx(job["gpu_hours"], abs=(len(hours) + 1) * 0.5e-4), figures
    assert job["goodput"] == pytest.approx(job["ledger"]["productive"]["gpu_hours"] / job["gpu_hours"],
                                           abs=0.5e-4 / job["gpu_hours"] + 0.5e-4), figures

