"""Two-rank DDP runs of the tiny model through the real `burnrate train` entry point:
torch's elastic launcher, gloo, one process per rank. Each fault is checked the way the
analyzer will see it, through the telemetry records the ranks write."""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch

from burnrate.agent.telemetry.inbox import TelemetryInbox

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "trainer_tiny_2rank_loss.json"
BASE = ["--nproc", "2", "--model", "tiny", "--batch-size", "4", "--seq-len", "32", "--report-every-steps", "1"]


@pytest.fixture
def tmp_path():
    """A short one: the launches' TMPDIR lies inside it, and a loader's worker makes its
    sockets under TMPDIR, whose paths hold 107 bytes (trainer.config)."""
    with tempfile.TemporaryDirectory(prefix="burnrate-ddp-") as tmp:
        yield Path(tmp)


def _command(tmp: Path, *args: str) -> list[str]:
    # No agent listens on this socket: training must not notice.
    return [sys.executable, "-m", "burnrate", "train", *BASE, "--telemetry-socket", str(tmp / "no-agent.sock"),
            "--telemetry-jsonl", str(tmp / "telemetry.jsonl"), *args]


def _scratch(tmp: Path, name: str = "scratch") -> Path:
    """A launch's temp directory (one apart for launchers the test may kill, which cannot
    remove their own)."""
    scratch = tmp / name
    scratch.mkdir(exist_ok=True)
    return scratch


def _train(tmp: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    scratch = _scratch(tmp)
    r = subprocess.run(_command(tmp, *args), cwd=ROOT, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "TMPDIR": str(scratch)})
    if ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # The launcher's log directory and the ranks' error files go with the launch, failed or not;
    # torch's compiled-kernel cache (torchinductor_<user>) is a cache, meant to stay.
    assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == []
    return r


def _start(tmp: Path, *args: str) -> subprocess.Popen:
    # A session of its own, so that the test can end the launcher and its ranks together.
    return subprocess.Popen(_command(tmp, *args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "TMPDIR": str(_scratch(tmp, "scratch-started"))})


def _records(tmp: Path) -> list[dict]:
    path = tmp / "telemetry.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _by_rank(records: list[dict], key: str, after: int = 0) -> dict[int, float]:
    out: dict[int, float] = {}
    for r in records:
        if r["steps"] and r["step"] > after:
            out[r["rank"]] = out.get(r["rank"], 0.0) + r[key]
    return out


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _kill(proc: subprocess.Popen) -> None:
    # The elastic launcher starts its ranks in process groups of their own: end the
    # whole tree, found before the launcher dies and the ranks are re-parented.
    if proc.poll() is None:
        ranks = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
        psutil.wait_procs(ranks, timeout=10)
    proc.wait()


def test_two_rank_run_matches_the_golden_losses(tmp_path):
    _train(tmp_path, "--steps", "20")
    records = _records(tmp_path)
    losses = {r["step"]: r["loss"] for r in records if r["rank"] == 0 and r["steps"]}
    assert sorted(losses) == list(range(1, 21))
    if os.environ.get("BURNRATE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({str(k): v for k, v in sorted(losses.items())}, indent=1) + "\n")
    golden = {int(k): v for k, v in json.loads(GOLDEN.read_text()).items()}
    # Float reductions differ a little across CPU instruction sets; a behaviour change does not.
    for step, expected in golden.items():
        assert losses[step] == pytest.approx(expected, rel=1e-4, abs=1e-4), step
    assert losses[20] < losses[1]
    for r in records:
        assert r["v"] == 1 and r["world_size"] == 2 and r["training_job"] == "local"
    assert {r["rank"] for r in records} == {0, 1}
    assert all(r["tokens"] == 4 * 32 and r["samples"] == 4 for r in records if r["steps"] == 1)


def test_telemetry_reaches_the_agent_inbox(tmp_path):
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        _train(tmp_path, "--steps", "6", "--report-every-steps", "2", "--telemetry-socket", str(inbox.path),
               "--job-name", "reference")
        assert inbox.wait_idle(5)
        assert dict(inbox.rejected) == {}
        states = inbox.ranks()
    assert sorted(s.key.rank for s in states) == [0, 1]
    for s in states:
        assert s.key.training_job == "reference" and s.values["steps"] == 6 and s.values["world_size"] == 2


def test_resume_after_a_crash_is_bitwise_identical(tmp_path):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    straight.mkdir(), crashed.mkdir()
    common = ["--steps", "8", "--checkpoint-every-steps", "2"]
    _train(straight, *common, "--checkpoint-dir", str(straight / "ck"))

    r = _train(crashed, *common, "--checkpoint-dir", str(crashed / "ck"), "--fault", "crash:at=6,rank=1", ok=False)
    assert r.returncode == 1 and "rank 1 failed" in r.stderr
    assert max(x["step"] for x in _records(crashed)) == 5   # crash before step 6: steps stop at 5

    r = _train(crashed, *common, "--checkpoint-dir", str(crashed / "ck"), "--resume")
    assert "resumed from step-00000004.pt (step 4)" in r.stdout

    a = torch.load(straight / "ck" / "step-00000008.pt", weights_only=True)
    b = torch.load(crashed / "ck" / "step-00000008.pt", weights_only=True)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for pid, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][pid][key]), (pid, key)
    assert a["scheduler"] == b["scheduler"]


def test_a_resume_with_only_damaged_checkpoints_or_another_model_is_one_line_and_overwrites_nothing(tmp_path):
    """Both used to launch the ranks: damaged checkpoints were trained over from step 0 by a
    new run that exited 0, and another model was a traceback from every rank."""
    ck = tmp_path / "ck"
    _train(tmp_path, "--steps", "4", "--checkpoint-every-steps", "2", "--checkpoint-dir", str(ck))
    other = _train(tmp_path, "--steps", "6", "--checkpoint-dir", str(ck), "--resume", "--model", "gpt2-124m", ok=False)
    assert other.returncode == 2 and other.stderr.strip().splitlines() == [
        f"burnrate train: error: --resume: the checkpoints in {ck} are --model tiny's, not --model gpt2-124m's: "
        "resume with --model tiny, or give this model a new --checkpoint-dir"]
    for name in ("step-00000002.pt", "step-00000004.pt"):
        (ck / name).write_bytes((ck / name).read_bytes()[:-1])      # a copy cut short
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    for flag in ("--resume", "--resume-or-start"):
        r = _train(tmp_path, "--steps", "6", "--checkpoint-dir", str(ck), flag, ok=False)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"burnrate train: error: --resume: {ck} holds no good checkpoint (step-00000004.pt fails its checksum; "
            "step-00000002.pt fails its checksum): move them away to start a new run there"]
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before


def test_resume_or_start_starts_in_an_empty_directory_and_resumes_after(tmp_path):
    """A PyTorchJob's one command for its first start and its restarts."""
    ck = tmp_path / "ck"
    first = _train(tmp_path, "--steps", "2", "--checkpoint-dir", str(ck), "--resume-or-start")
    assert f"{ck} holds no checkpoint: starting at step 0" in first.stdout
    again = _train(tmp_path, "--steps", "4", "--checkpoint-dir", str(ck), "--resume-or-start")
    assert "resumed from step-00000002.pt (step 2)" in again.stdout
    assert [r["step"] for r in _records(tmp_path) if r["rank"] == 0 and r["steps"]] == [1, 2, 3, 4]


def test_sigterm_saves_an_emergency_checkpoint_and_exits_0(tmp_path):
    ck = tmp_path / "ck"
    proc = _start(tmp_path, "--steps", "100000", "--checkpoint-dir", str(ck))
    try:
        _wait_for(lambda: any(r["step"] >= 3 for r in _records(tmp_path)))
        proc.send_signal(signal.SIGTERM)   # to the launcher, as Kubernetes signals a pod's first process
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
    finally:
        _kill(proc)
    manifest = json.loads((ck / ((ck / "latest").read_text() + ".json")).read_text())
    assert manifest["reason"] == "sigterm" and 3 <= manifest["step"] < 100000
    # Both ranks agreed on the step to stop at.
    last = {r["rank"]: r["step"] for r in _records(tmp_path)}
    assert last == {0: manifest["step"], 1: manifest["step"]}


def test_sigterm_while_the_launcher_starts_leaves_no_log_directory(tmp_path):
    """SIGTERM as soon as the launcher has made its log directory, before torch's launcher has a
    handler for it (a demo or a pod stopped the moment it started): the directory goes too."""
    scratch = _scratch(tmp_path, "scratch-started")
    proc = _start(tmp_path, "--steps", "100000")
    try:
        _wait_for(lambda: any(p.name.startswith("burnrate-train-") for p in scratch.iterdir()), timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, 128 + signal.SIGTERM), proc.stderr.read()[-3000:]
    finally:
        _kill(proc)
    assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_stall_stops_the_step_counter_while_the_processes_live(tmp_path):
    proc = _start(tmp_path, "--steps", "100000", "--fault", "stall:at=5")
    try:
        _wait_for(lambda: {r["rank"] for r in _records(tmp_path) if r["step"] == 4} == {0, 1})
        time.sleep(2.0)
        assert proc.poll() is None
        assert max(r["step"] for r in _records(tmp_path)) == 4
    finally:
        _kill(proc)


def test_a_stalled_run_still_stops_on_sigterm_with_a_checkpoint(tmp_path):
    """Kubernetes evicting a hung job: SIGTERM to the launcher reaches the stalled ranks,
    which save the last step they finished and exit, leaving no process behind."""
    ck = tmp_path / "ck"
    proc = _start(tmp_path, "--steps", "100000", "--fault", "stall:at=5", "--checkpoint-dir", str(ck))
    try:
        _wait_for(lambda: {r["rank"] for r in _records(tmp_path) if r["step"] == 4} == {0, 1})
        family = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
    finally:
        _kill(proc)
    assert psutil.wait_procs(family, timeout=10)[1] == []
    manifest = json.loads((ck / ((ck / "latest").read_text() + ".json")).read_text())
    assert (manifest["reason"], manifest["step"]) == ("sigterm", 4)


def test_ranks_end_with_a_killed_launcher_and_one_writer_holds_the_directory(tmp_path):
    """SIGKILL of `burnrate train` used to orphan its ranks, which trained on and kept
    writing checkpoints while a `--resume` trained beside them in the same directory.
    Now a second writer is refused while they live, and they end with their launcher,
    saving as on SIGTERM; then the resume goes ahead."""
    ck = tmp_path / "ck"
    proc = _start(tmp_path, "--steps", "100000", "--checkpoint-dir", str(ck))
    ranks: list[psutil.Process] = []
    try:
        _wait_for(lambda: any(r["step"] >= 3 for r in _records(tmp_path)))
        ranks = psutil.Process(proc.pid).children(recursive=True)
        beside = _train(tmp_path, "--steps", "100000", "--checkpoint-dir", str(ck), "--resume", ok=False)
        assert beside.returncode == 2 and beside.stderr.strip().splitlines() == [
            f"burnrate train: error: another process is writing checkpoints to {ck}: stop it (or wait for it "
            "to end) first"]
        proc.send_signal(signal.SIGKILL)       # the launcher alone, as an OOM kill or a node agent would
        proc.wait()
        gone, alive = psutil.wait_procs(ranks, timeout=60)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        _kill(proc)
        for rank in ranks:      # re-parented once the launcher died: not in its tree any more
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
    manifest = json.loads((ck / ((ck / "latest").read_text() + ".json")).read_text())
    assert manifest["reason"] == "sigterm" and manifest["step"] >= 3
    resumed = _train(tmp_path, "--steps", str(manifest["step"] + 2), "--checkpoint-dir", str(ck), "--resume")
    assert f"resumed from step-{manifest['step']:08d}.pt (step {manifest['step']})" in resumed.stdout


def test_ranks_blocked_on_their_loaders_end_with_a_killed_launcher(tmp_path):
    """A rank waiting on a DataLoader that never delivers gets the launcher's death as SIGTERM,
    but its handler only asks for a stop at the next step boundary, which never comes: it ends
    --orphan-grace after its launcher died, and its loader's worker with it."""
    proc = _start(tmp_path, "--steps", "5", "--fault", "starve:delay=600", "--num-workers", "1",
                  "--orphan-grace", "2")
    family: list[psutil.Process] = []
    ranks: list[psutil.Process] = []
    try:
        def loading() -> bool:      # both ranks and their loaders' workers (the ranks' children) are up
            nonlocal family, ranks
            ranks = psutil.Process(proc.pid).children()
            family = psutil.Process(proc.pid).children(recursive=True)
            return len(ranks) == 2 and all(rank.children() for rank in ranks)
        _wait_for(loading, timeout=120)
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)       # the launcher alone
        proc.wait()
        killed = time.monotonic()
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert alive == [], [p.cmdline() for p in alive]
        assert time.monotonic() - killed >= 2.0     # the grace, not the SIGTERM, ended them
        errors = proc.stderr.read()
        for rank in ranks:
            assert f"process {rank.pid}: its parent ({proc.pid}) ended 2 s ago and it has not: exiting" in errors, \
                errors[-3000:]
    finally:
        _kill(proc)
        for p in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


@pytest.mark.serial   # a share of measured compute time: run alone (tests/conftest.py SERIAL)
def test_straggler_has_the_longest_compute(tmp_path):
    _train(tmp_path, "--steps", "25", "--fault", "straggler:rank=1,factor=2")
    records = _records(tmp_path)
    compute = _by_rank(records, "compute_s", after=5)   # past warm-up
    step = _by_rank(records, "step_s", after=5)
    assert compute[1] >= 1.5 * compute[0], compute
    # The all-reduce makes both ranks wait for the slow one: wall time is the same.
    assert step[0] == pytest.approx(step[1], rel=0.25)


@pytest.mark.serial   # a share of measured step time: run alone (tests/conftest.py SERIAL)
def test_starved_loader_shows_as_data_wait(tmp_path):
    # A delay well above a tiny step's compute, so that the share holds on a busy machine
    # too (the loader's prefetching hides as much of the delay as the compute takes).
    _train(tmp_path, "--steps", "5", "--fault", "starve:delay=1.0", "--num-workers", "1")
    records = _records(tmp_path)
    wait, step = _by_rank(records, "data_wait_s", after=1), _by_rank(records, "step_s", after=1)
    for rank in (0, 1):
        assert wait[rank] / step[rank] > 0.5


def test_diverge_blows_up_the_loss(tmp_path):
    _train(tmp_path, "--steps", "10", "--fault", "diverge:at=5")
    losses = [r["loss"] for r in _records(tmp_path) if r["rank"] == 0 and r["steps"]]
    before, after = losses[:4], losses[5:]
    assert all(not math.isfinite(v) or v > 3 * max(before) for v in after), losses
