"""The ledger of a training job that ran on a real GPU, checked against what its processes did.

tests/data/h200-ledger holds what one NVIDIA H200 machine gave (bench/RESULTS.md, "The ledger
of a job on an H200"): `burnrate agent --backend nvml --attribution local --record` taking the
telemetry of the reference trainer (gpt2-124m, bf16, torch.compile, batch 16 x 1024), which
saved every 400 steps, crashed before step 1001 (`--fault crash:at=1001`), and was resumed
20 s later from its step-800 checkpoint to step 1200:

- recording.tgz: the agent's recording (1 s samples);
- times.txt: the launcher's start and exit, by the wall clock of the shell that ran it;
- trainer.jsonl: the monitor's own records (`--telemetry-jsonl`);
- run1.log, run2.log: the trainer's progress lines.

The expected figures come from those files and from the agent's documented rule for a GPU under
local attribution (docs/agent.md: held from its rank's first report while its process runs and
until the rank has been silent 5 s), never from the analyzer.
"""
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT

DATA = Path(ROOT) / "tests" / "data" / "h200-ledger"
SAMPLE_S = 1.0          # the agent's collection interval: each edge is known to one sample
RELEASE_S = 5.0         # a rank's GPU stays held until it has been silent this long (three intervals, 5 s at least)


def stamps() -> dict[str, float]:
    """{"run1-start": t, "run1-exit": t, ...}: times.txt names each exit with its status."""
    pairs = (line.split() for line in (DATA / "times.txt").read_text().splitlines())
    return {re.sub(r"-exit-\d+$", "-exit", name): float(t) for name, t in pairs}


def records() -> list[dict]:
    return [json.loads(line) for line in (DATA / "trainer.jsonl").read_text().splitlines()]


def ms_per_step(log: str, first: int, last: int) -> float:
    """The trainer's own mean step time over the progress lines from step `first` to `last`."""
    lines = re.findall(r"^step (\d+)/\d+ loss \S+ ([\d.]+) ms/step", (DATA / log).read_text(), re.M)
    chosen = [float(ms) for step, ms in lines if first < int(step) <= last]
    return sum(chosen) / len(chosen) / 1000.0


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("h200")
    with tarfile.open(DATA / "recording.tgz") as tar:
        tar.extractall(root, filter="data")
    out = subprocess.run([PYTHON, "-m", "burnrate", "analyze", "--recording", str(root / "rec"), "--format", "json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (found,) = json.loads(out.stdout)["jobs"]
    return found


def seconds(job: dict, category: str) -> float:
    return job["ledger"][category]["gpu_hours"] * 3600


def test_the_gpu_is_held_while_a_rank_lives_and_not_while_none_does(job):
    """Held from each run's first report to its exit and release; the 40 s between the crashed
    run's release and the resumed run's first report the GPU was sampled free, and is no one's."""
    t, first = stamps(), {}
    for r in records():
        first.setdefault(r["start_time"], r["time"])
    (one, two) = sorted(first.values())
    lived = (t["run1-exit"] - one) + (t["run2-exit"] - two)
    assert lived - 2 * SAMPLE_S <= job["gpu_hours"] * 3600 <= lived + 2 * (RELEASE_S + SAMPLE_S)
    assert job["cost_dollars"] == pytest.approx(sum(v["dollars"] for v in job["ledger"].values()), abs=0.01)


def test_two_runs_are_told_apart_and_the_steps_computed_again_are_lost_progress(job):
    one, two = job["runs"]
    assert (one["resumed_from"], one["last_step_number"]) == (0, 1000)
    assert (two["resumed_from"], two["last_step_number"]) == (800, 1200)
    # Steps 801 to 1000 of the first run, at the trainer's own step time.
    assert seconds(job, "lost_progress") == pytest.approx(200 * ms_per_step("run1.log", 800, 1000), abs=SAMPLE_S)
    # The resumed run's steps after its first: that one (2.9 s, the compiler's cache warm) was over
    # before its first report, so before the agent held the GPU for it.
    assert two["ledger"]["productive"] * 3600 == pytest.approx(
        399 * ms_per_step("run2.log", 801, 1200), abs=2 * SAMPLE_S)


def test_checkpoints_are_the_saves_the_monitor_timed(job):
    """Three blocking saves of model and AdamW state (1.49 GB), 4.1 to 4.6 s each."""
    saves = [r["checkpoint_s"] for r in records() if r["checkpoint_s"]]
    assert len(saves) == 3 and all(4.0 < s < 4.7 for s in saves)
    assert seconds(job, "checkpoint") == pytest.approx(sum(saves), abs=3 * SAMPLE_S)


def test_start_up_no_one_held_is_said_not_read_as_none(job):
    """Local attribution holds a GPU from its rank's first report, after the first step: the
    start-up before it (imports, NCCL, the model, torch.compile's 24.8 s in the first step) is
    held by no one, and the ledger says how long rather than reading as a job that started at
    once. The first report is the first step as the series show it (a series' first sample has
    no increase to read), so the figure runs from each process's start to its first report."""
    first = {}
    for r in records():
        first.setdefault(r["start_time"], r["time"])
    unheld = sum(reported - started for started, reported in first.items())
    assert seconds(job, "startup") == 0.0
    said = re.search(r"not held for ([\d,]+) GPU-seconds of its runs' start-up", job["ledger_basis"]["startup"])
    assert float(said.group(1).replace(",", "")) == pytest.approx(unheld, abs=4 * SAMPLE_S)


def test_the_crash_costs_only_until_its_gpu_is_let_go(job):
    """After the crash the GPU is held until the dead rank's release: the restart is that and
    no more, and nothing is stalled."""
    last = max(r["time"] for r in records() if r["resumed_from"] == 0)
    crash = job["runs"][0]["ledger"]["restart"] * 3600
    assert 0 < crash <= stamps()["run1-exit"] - last + RELEASE_S + 2 * SAMPLE_S
    assert seconds(job, "stalled") == 0.0
