"""The ledger of a training job that ran on a real GPU, checked against what its processes did.

Two runs on one NVIDIA H200 (bench/RESULTS.md, "a training job's ledger"): the reference trainer
(gpt2-124m, bf16, torch.compile, batch 16 x 1024) saved every 400 steps, crashed before step
1001 (`--fault crash:at=1001`) and was resumed 20 s later from its step-800 checkpoint to step
1200, its telemetry taken by `burnrate agent --backend nvml --record` sampling every second.

- tests/data/h200-ledger: the agent attributed the GPU by its rank (`--attribution local`, no
  kubelet), so the GPU was held from the rank's first report and let go after it exited;
- tests/data/h200-ledger-pod: `bench/gpu/ledger_run.py`, a pod holding the GPU throughout
  (a stand-in kubelet, `--attribution kubelet`), as in Kubernetes;
- tests/data/h100-ledger: the same job on an NVIDIA H100 (`bench/gpu/run --only ledger-local`),
  its monitor heard from its creation, so that local attribution held the GPU before the first
  step; tests/data/h100-ledger-pod beside it, in a pod;
- tests/data/h200-ledger-exit: the same job with no pod again, on an H200, by the agent that
  lets a rank's GPU go at the first collection after its process ends.

Each holds recording.tgz (the agent's recording), times.txt (the launches' start and exit by
the wall clock of the process that ran them; the pod's hold), trainer.jsonl (the monitor's own
records, `--telemetry-jsonl`) and run1.log, run2.log (the trainer's progress lines). The
expected figures come from those and from the agent's documented rule for a GPU under local
attribution (docs/agent.md), never from the analyzer.
"""
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT

LOCAL = Path(ROOT) / "tests" / "data" / "h200-ledger"
POD = Path(ROOT) / "tests" / "data" / "h200-ledger-pod"
HELLO = Path(ROOT) / "tests" / "data" / "h100-ledger"
EXIT = Path(ROOT) / "tests" / "data" / "h200-ledger-exit"
SAMPLE_S = 1.0          # the agent's collection interval: each edge is known to one sample
RELEASE_S = 5.0         # a rank's GPU stays held until it has been silent this long (three intervals, 5 s at least)


def stamps(data: Path = LOCAL) -> dict[str, float]:
    """{"run1-start": t, "run1-exit": t, ...}: times.txt names each exit with its status."""
    pairs = (line.split() for line in (data / "times.txt").read_text().splitlines())
    return {re.sub(r"-exit-\d+$", "-exit", name): float(t) for name, t in pairs}


def records(data: Path = LOCAL) -> list[dict]:
    return [json.loads(line) for line in (data / "trainer.jsonl").read_text().splitlines()]


def ms_per_step(log: str, first: int, last: int, data: Path = LOCAL) -> float:
    """The trainer's own mean step time over the progress lines from step `first` to `last`."""
    lines = re.findall(r"^step (\d+)/\d+ loss \S+ ([\d.]+) ms/step", (data / log).read_text(), re.M)
    chosen = [float(ms) for step, ms in lines if first < int(step) <= last]
    return sum(chosen) / len(chosen) / 1000.0


def analysed(data: Path, tmp: Path) -> dict:
    """The one job `burnrate analyze --recording` finds in `data`'s recording."""
    with tarfile.open(data / "recording.tgz") as tar:
        (top,) = {name.split("/")[0] for name in tar.getnames()}
        tar.extractall(tmp, filter="data")
    out = subprocess.run([PYTHON, "-m", "burnrate", "analyze", "--recording", str(tmp / top), "--format", "json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (found,) = json.loads(out.stdout)["jobs"]
    return found


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return analysed(LOCAL, tmp_path_factory.mktemp("h200"))


@pytest.fixture(scope="module")
def pod_job(tmp_path_factory):
    return analysed(POD, tmp_path_factory.mktemp("h200-pod"))


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
    once: from each process's start to its first step's start."""
    first = {}
    for r in records():
        first.setdefault(r["start_time"], r["time"] - r["step_s"])
    unheld = sum(began - started for started, began in first.items())
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


def test_a_pod_held_job_s_start_up_restart_and_steps_computed_again_are_what_its_processes_did(pod_job):
    """The pod holds the GPU from before the first launch to the end: each run's start-up runs
    to its first step's start (the first run's from the pod's hold: imports, NCCL, the model;
    torch.compile's 21.3 s is its first step), the restart from the crashed run's last report
    to the resumed process's start, then the steps after 800 computed again and the saves."""
    t, recs = stamps(POD), records(POD)
    one = [r for r in recs if r["resumed_from"] == 0]
    two = [r for r in recs if r["resumed_from"] == 800]
    run1, run2 = pod_job["runs"]
    assert [(r["resumed_from"], r["last_step_number"]) for r in (run1, run2)] == [(0, 1000), (800, 1200)]
    began = [r[0]["time"] - r[0]["step_s"] for r in (one, two)]
    assert run1["ledger"]["startup"] * 3600 == pytest.approx(began[0] - t["held"], abs=2 * SAMPLE_S)
    assert run2["ledger"]["startup"] * 3600 == pytest.approx(began[1] - two[0]["start_time"], abs=2 * SAMPLE_S)
    restart = two[0]["start_time"] - max(r["time"] for r in one if r["steps"])
    assert seconds(pod_job, "restart") == pytest.approx(restart, abs=2 * SAMPLE_S)
    assert seconds(pod_job, "lost_progress") == pytest.approx(sum(r["step_s"] for r in one if r["step"] > 800),
                                                             abs=SAMPLE_S)
    assert seconds(pod_job, "checkpoint") == pytest.approx(sum(r["checkpoint_s"] for r in recs), abs=2 * SAMPLE_S)
    assert pod_job["ledger_basis"] == {}
    assert pod_job["gpu_hours"] * 3600 >= t["run2-exit"] - t["held"]


def test_the_gpu_bench_prints_the_pod_s_ledger_beside_its_processes(pod_job):
    """bench/gpu/ledger_run.py's table, from the same files: what a GPU machine's run prints."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
    import ledger_run

    table = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:3]
             for line in ledger_run.rows(pod_job, records(POD), stamps(POD)) if line.startswith("| ")}
    assert table["startup"] == ["17.3 + 15.1", "16.2 + 15.1"]
    assert table["restart"] == ["28.1", "28.0"] and table["lost_progress"] == ["6.5", "6.6"]
    assert table["checkpoint"] == ["12.2", "12.0"]


@pytest.fixture(scope="module")
def hello_job(tmp_path_factory):
    return analysed(HELLO, tmp_path_factory.mktemp("h100"))


def test_a_monitor_heard_from_its_creation_has_its_first_steps_held_without_a_kubelet(hello_job):
    """On the H100 the monitor said hello when the trainer made it, just before the first step:
    under local attribution the GPU was held from then, so each run's first step (torch.compile's
    22.9 s, the resumed run's 3.4 s) is productive, where the H200's older monitor left them in no
    one's time. What comes before the monitor (imports, the model) is still held by no one, and
    the ledger says how long."""
    job, recs = hello_job, records(HELLO)
    one = [r for r in recs if r["resumed_from"] == 0]
    two = [r for r in recs if r["resumed_from"] == 800]
    run1, run2 = job["runs"]
    assert one[0]["step_s"] > 20 and two[0]["step_s"] > 3
    assert run1["ledger"]["productive"] * 3600 == pytest.approx(sum(r["step_s"] for r in one if r["step"] <= 800),
                                                                abs=2 * SAMPLE_S)
    assert run2["ledger"]["productive"] * 3600 == pytest.approx(sum(r["step_s"] for r in two), abs=2 * SAMPLE_S)
    unheld = sum(r[0]["time"] - r[0]["step_s"] - r[0]["start_time"] for r in (one, two))
    assert seconds(job, "startup") == 0.0
    said = re.search(r"not held for ([\d,]+) GPU-seconds of its runs' start-up", job["ledger_basis"]["startup"])
    assert float(said.group(1).replace(",", "")) == pytest.approx(unheld, abs=4 * SAMPLE_S)


def test_the_gpu_bench_prints_the_ledger_with_no_pod_beside_its_processes(hello_job):
    """With no pod, each run's start-up by its processes runs from its own start."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
    import ledger_run

    lines = ledger_run.rows(hello_job, records(HELLO), stamps(HELLO))
    table = {line.split(" | ")[0].strip("| "): [cell.strip(" |") for cell in line.split(" | ")[1:4]]
             for line in lines if line.startswith("| ")}
    assert table["startup"] == ["0.0 + 0.0", "13.8 + 16.3", "run 1: its process start to its first step's start; "
                                "run 2: its process start to its first step's start"]
    assert table["checkpoint"][:2] == ["14.0", "14.1"]


def test_a_gpu_let_go_at_its_rank_s_exit_charges_the_job_nothing_after_it(tmp_path):
    """The agent that held a rank's GPU 5 s past its last message charged those seconds to the
    job: 3.2 s of `stalled` after the resumed run's exit on the H100 (tests/data/h100-ledger).
    Let go at its process's end, nothing after either run's exit is the job's: the crash's
    restart is its last report to its exit, within a sample."""
    job, t, recs = analysed(EXIT, tmp_path), stamps(EXIT), records(EXIT)
    assert seconds(job, "stalled") == 0.0 and seconds(job, "no_process") == 0.0
    last = max(r["time"] for r in recs if r["resumed_from"] == 0)
    assert seconds(job, "restart") == pytest.approx(t["run1-exit"] - last, abs=SAMPLE_S)
    assert seconds(job, "productive") == pytest.approx(sum(r["step_s"] for r in recs if r["step"] <= 800
                                                           or r["resumed_from"] == 800), abs=2 * SAMPLE_S)
