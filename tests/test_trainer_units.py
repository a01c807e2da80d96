"""Trainer parts in one process: FLOPs, faults, config, data, checkpoints, telemetry, monitor."""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from burnrate.agent.telemetry.inbox import TelemetryInbox
from burnrate.exporter.telemetry import TelemetrySink
from burnrate.trainer import config
from burnrate.trainer.checkpoint import CheckpointDirInUse, CheckpointRefused, Checkpointer, young_interval
from burnrate.trainer.data import SyntheticTokens, TokenFile, batches
from burnrate.trainer.faults import Faults, InjectedCrash, parse_fault
from burnrate.trainer.flops import model_flops_per_token, peak_flops
from burnrate.trainer.model import GPT, MODELS
from burnrate.trainer.monitor import OWED, Monitor
from burnrate.trainer.telemetry import Identity

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


# --- FLOPs ---------------------------------------------------------------------------
def test_peak_on_cpu_is_labelled_an_estimate_and_can_be_overridden():
    assert peak_flops(torch.device("cpu")).source == "cpu-estimate"
    p = peak_flops(torch.device("cpu"), 5e11)
    assert (p.flops, p.source) == (5e11, "override")


# --- faults and config -------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["straggler:rank=1", "straggler:rank=1,factor=0.5", "starve:delay=x",
                                  "diverge:at=0", "stall:at=2.5", "crash", "oom:at=3", "crash:at=3,when=1"])
def test_bad_fault_specs_are_rejected(spec):
    with pytest.raises(ValueError, match="fault"):
        parse_fault(spec)


def test_faults_act_where_they_should():
    f = Faults(["diverge:at=3", "crash:at=4,rank=1", "starve:delay=0.25"], rank=1)
    assert [f.lr_scale(s) for s in (1, 2, 3, 9)] == [1, 1, 1e4, 1e4]
    assert f.data_delay == 0.25
    f.before_step(3)
    with pytest.raises(InjectedCrash):
        f.before_step(4)
    Faults(["crash:at=4,rank=1"], rank=0).before_step(4)   # another rank: no crash


def test_straggler_sleeps_in_proportion_to_its_own_compute():
    f = Faults(["straggler:rank=0,factor=3"], rank=0)
    t0 = time.perf_counter()
    f.straggle(0.05)
    assert 0.09 <= time.perf_counter() - t0 < 0.3


def test_cli_rejects_a_bad_fault_in_one_line():
    r = subprocess.run([PYTHON, "-m", "burnrate", "train", "--fault", "straggler:rank=1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["burnrate train: error: bad fault 'straggler:rank=1': missing factor"]


def test_loader_workers_under_a_too_long_tmpdir_are_one_line_not_a_hang(tmp_path):
    """Past 107 bytes a worker's socket cannot be made: each batch would be dropped with a
    traceback and the ranks would wait for it forever. 76 bytes of TMPDIR is one too many."""
    deep = tmp_path / ("d" * max(1, 76 - len(str(tmp_path)) - 1))
    deep.mkdir()
    assert len(str(deep)) == 76
    r = subprocess.run([PYTHON, "-m", "burnrate", "train", "--num-workers", "1", "--steps", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(deep)})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"burnrate train: error: --num-workers: the loader's workers hand batches over through sockets under {deep}, "
        "too long a path for them (a socket's holds 107 bytes): set TMPDIR to a shorter one"], r.stderr[-2000:]
    assert list(deep.iterdir()) == []
    shorter = deep.with_name(deep.name[1:])
    shorter.mkdir()
    r = subprocess.run([PYTHON, "-m", "burnrate.trainer", "--num-workers", "1", "--steps", "2", "--batch-size", "2",
                        "--seq-len", "16", "--telemetry-socket", str(tmp_path / "none.sock")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(shorter)})
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("command", [["-m", "burnrate", "train"], ["-m", "burnrate.trainer"]],
                         ids=["launcher", "rank"])
def test_a_fresh_run_into_another_runs_checkpoints_is_one_line(tmp_path, command):
    Checkpointer(tmp_path).save(9, _state(9))
    r = subprocess.run([PYTHON, *command, "--checkpoint-dir", str(tmp_path), "--steps", "2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    prog = "burnrate train" if command[1] == "burnrate" else "python -m burnrate.trainer"
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"{prog}: error: {tmp_path} holds another run's checkpoints (up to step 9): --resume continues that run, "
        "or give this one a new --checkpoint-dir"]
    assert [i.step for i in Checkpointer(tmp_path).manifests()] == [9]


def _refused(command: list[str], *args: str) -> list[str]:
    """The error lines of a launch that must be refused before training starts."""
    r = subprocess.run([PYTHON, *command, "--steps", "2", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stderr.strip().splitlines()


@pytest.mark.parametrize("command", [["-m", "burnrate", "train"], ["-m", "burnrate.trainer"]],
                         ids=["launcher", "rank"])
def test_a_resume_with_nothing_to_resume_is_one_line(tmp_path, command):
    """It used to train from step 0 as a new run and exit 0."""
    prog = "burnrate train" if command[1] == "burnrate" else "python -m burnrate.trainer"
    empty = tmp_path / "empty"
    assert _refused(command, "--checkpoint-dir", str(empty), "--resume") == [
        f"{prog}: error: --resume: {empty} holds no checkpoint to resume from: leave out --resume to start a new run "
        "there (or use --resume-or-start, which does either)"]
    assert not list(empty.glob("step-*"))
    # A manifest naming its model is refused before a rank builds anything.
    Checkpointer(tmp_path / "big", model="gpt2-124m").save(9, _state(9))
    assert _refused(command, "--checkpoint-dir", str(tmp_path / "big"), "--resume-or-start") == [
        f"{prog}: error: --resume: the checkpoints in {tmp_path / 'big'} are --model gpt2-124m's, not --model tiny's: "
        "resume with --model gpt2-124m, or give this model a new --checkpoint-dir"]


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line(tmp_path):
    """One whose manifest names no model (written before they did), of another shape."""
    state = {"step": 3, "model": {"wte.weight": torch.zeros(3, 3)}}
    info = Checkpointer(tmp_path).save(3, state)
    manifest = json.loads(info.path.with_suffix(".json").read_text())
    assert manifest.pop("model") == ""
    info.path.with_suffix(".json").write_text(json.dumps(manifest))
    assert _refused(["-m", "burnrate.trainer"], "--checkpoint-dir", str(tmp_path), "--resume") == [
        f"python -m burnrate.trainer: error: --resume: step-00000003.pt in {tmp_path} does not fit --model tiny "
        "(its tensors differ in name or shape)"]


def test_config_round_trips_through_flags():
    import argparse

    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    argv = ["--steps", "7", "--fault", "starve:delay=1", "--fault", "diverge:at=2", "--resume",
            "--checkpoint-dir", "/tmp/x", "--checkpoint-every", "young", "--no-compile", "--lr", "0.001"]
    cfg = config.from_args(parser.parse_args(argv))
    assert config.from_args(parser.parse_args(config.to_argv(cfg))) == cfg
    assert cfg.checkpoint.young and cfg.run.faults == ["starve:delay=1", "diverge:at=2"]
    with pytest.raises(config.ConfigError, match="--seq-len"):
        config.from_args(parser.parse_args(["--seq-len", "4096"]))


# --- data ----------------------------------------------------------------------------------
def test_synthetic_tokens_are_a_pure_function_of_the_index():
    a, b = SyntheticTokens(256, 16, seed=3), SyntheticTokens(256, 16, seed=3)
    assert torch.equal(a[5][0], b[5][0]) and torch.equal(a[5][0][1:], a[5][1][:-1])
    assert not torch.equal(a[5][0], a[6][0])


def test_token_file_windows(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    ds = TokenFile(str(path), 10)
    assert len(ds) == 99
    x, y = ds[2]
    assert x.tolist() == list(range(20, 30)) and y.tolist() == list(range(21, 31))


def test_batches_resume_at_the_data_position():
    ds = SyntheticTokens(256, 8, num_samples=64, seed=1)
    kw = dict(batch_size=4, rank=1, world_size=2, seed=1)
    fresh = batches(ds, **kw)
    # 8 batches per epoch and rank: position 10 is two batches into the second epoch.
    expected = [next(fresh)[0] for _ in range(13)][10:]
    resumed = batches(ds, start_step=10, **kw)
    assert all(torch.equal(next(resumed)[0], e) for e in expected)


def test_starve_delay_is_spent_in_the_loader_workers():
    ds = SyntheticTokens(256, 8, num_samples=64)
    it = batches(ds, batch_size=4, rank=0, world_size=1, seed=0, num_workers=1, delay=0.2)
    next(it)
    t0 = time.perf_counter()
    next(it), next(it)
    assert time.perf_counter() - t0 >= 0.3


# --- checkpoints -------------------------------------------------------------------------
def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((4,), float(step))}


def test_checkpoint_round_trip_pointer_and_keep(tmp_path):
    ck = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        ck.save(step, _state(step))
    assert [i.step for i in ck.manifests()] == [3, 2]
    state, info = ck.load()
    assert info.step == 3 and torch.equal(state["w"], torch.full((4,), 3.0))
    assert (tmp_path / "latest").read_text() == "step-00000003"


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    ck = Checkpointer(tmp_path, keep=3)
    ck.save(1, _state(1))
    _damage(ck.save(2, _state(2)))
    state, loaded = Checkpointer(tmp_path).load()
    assert loaded.step == 1 and state["step"] == 1


def test_a_fresh_run_is_refused_where_another_runs_checkpoints_are(tmp_path):
    Checkpointer(tmp_path).save(500, _state(500))
    with pytest.raises(CheckpointDirInUse, match="holds another run's checkpoints \\(up to step 500\\): --resume"):
        Checkpointer(tmp_path).claim_fresh()
    Checkpointer(tmp_path / "new").claim_fresh()        # an empty or new directory is free


def test_a_fresh_run_is_refused_where_only_unreadable_checkpoint_files_are(tmp_path):
    """A manifest cut short was skipped as if absent, and the fresh run wrote over its step."""
    (tmp_path / "step-00000007.json").write_text('{"step": 7, "sha')
    (tmp_path / "step-00000007.pt").write_bytes(b"weights")
    with pytest.raises(CheckpointDirInUse, match="holds another run's checkpoints \\(up to step 7\\)"):
        Checkpointer(tmp_path).claim_fresh()


def _damage(info) -> None:
    data = bytearray(info.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    info.path.write_bytes(bytes(data))


def test_resume_finds_nothing_to_resume_and_says_what_it_found(tmp_path):
    with pytest.raises(CheckpointRefused, match=f"^--resume: {tmp_path} holds no checkpoint to resume from: leave "
                                                "out --resume to start a new run there \\(or use --resume-or-start"):
        Checkpointer(tmp_path, model="tiny").resume_point(100)
    assert Checkpointer(tmp_path, model="tiny").resume(100, or_start=True) is None   # empty: start at step 0

    ck = Checkpointer(tmp_path, model="tiny")
    for step in (10, 20):
        _damage(ck.save(step, _state(step)))
    (tmp_path / "step-00000005.json").write_text("{")
    (tmp_path / "step-00000005.pt").write_bytes(b"")
    for or_start in (False, True):      # damaged checkpoints are never started over, even when asked to start
        with pytest.raises(CheckpointRefused) as refused:
            Checkpointer(tmp_path, model="tiny").resume_point(100, or_start)
        assert str(refused.value) == (
            f"--resume: {tmp_path} holds no good checkpoint (step-00000020.pt fails its checksum; step-00000010.pt "
            "fails its checksum; step-00000005 has no readable manifest): move them away to start a new run there")


def test_resume_refuses_another_models_checkpoints_before_reading_them(tmp_path):
    info = Checkpointer(tmp_path, model="gpt2-124m").save(30, _state(30))
    info.path.write_bytes(b"")      # never read: the manifest says whose it is
    with pytest.raises(CheckpointRefused) as refused:
        Checkpointer(tmp_path, model="tiny").resume(100)
    assert str(refused.value) == (f"--resume: the checkpoints in {tmp_path} are --model gpt2-124m's, not --model "
                                  "tiny's: resume with --model gpt2-124m, or give this model a new --checkpoint-dir")


def test_resume_refuses_to_reach_steps_where_another_runs_checkpoints_are(tmp_path):
    other = Checkpointer(tmp_path, model="tiny")
    for step in (40, 50):
        other.save(step, _state(step))
    other.release()
    mine = Checkpointer(tmp_path, model="tiny")
    mine.save(10, _state(10))
    mine.release()
    state, info = Checkpointer(tmp_path, model="tiny").resume(39)     # stops short of theirs: goes ahead
    assert info.step == 10 and info.run == mine.run
    with pytest.raises(CheckpointRefused, match="also holds another run's checkpoints at steps this run would write "
                                                "\\(step-00000040, step-00000050\\): move them away first"):
        Checkpointer(tmp_path, model="tiny").resume(60)


def test_a_resumed_run_loads_prunes_and_falls_back_only_within_itself(tmp_path):
    """Two runs' files in one directory (copied there, or from before runs were named):
    pruning once kept the highest steps whatever run they were, deleting the file
    `latest` named; a resume could load the other run's weights."""
    other = Checkpointer(tmp_path, keep=5)
    for step in (700, 800):
        other.save(step, _state(step))
    other.release()                         # each run ended before the next wrote: one writer at a time
    mine = Checkpointer(tmp_path, keep=2)
    for step in (10, 20):
        mine.save(step, _state(step))
    mine.release()
    resumed = Checkpointer(tmp_path, keep=2)
    state, info = resumed.load()
    assert info.step == 20 and resumed.run == mine.run != other.run
    for step in (21, 22):
        resumed.save(step, _state(step))
    runs = {(i.step, i.run) for i in resumed.manifests()}
    assert runs == {(22, mine.run), (21, mine.run), (800, other.run), (700, other.run)}
    assert (tmp_path / ((tmp_path / "latest").read_text() + ".pt")).exists()
    newest = resumed.manifests()[2]          # step 22: damage it
    assert newest.step == 22
    newest.path.write_bytes(b"torn")
    state, info = Checkpointer(tmp_path).load()
    assert (info.step, info.run) == (21, mine.run)     # its own older one, not the other run's step 800


def test_sigkill_during_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    """A writer saving ~16 MB checkpoints in a loop is SIGKILLed at several points; every
    time, the directory still yields a verified checkpoint."""
    script = textwrap.dedent(f"""
        import torch
        from burnrate.trainer.checkpoint import Checkpointer
        ck = Checkpointer({str(tmp_path)!r}, keep=2)
        step = 0
        while True:
            step += 1
            ck.save(step, {{"step": step, "w": torch.full((4 << 20,), float(step))}})
            print(step, flush=True)
    """)
    for delay in (0.05, 0.13, 0.21, 0.37):
        # Each writer is a new run counting from step 1: what it printed is what it completed.
        proc = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline()   # at least one complete save before the kill
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        completed = max([1] + [int(line) for line in proc.stdout.read().split()])
        state, info = Checkpointer(tmp_path, keep=2).load()
        assert state["step"] == info.step and float(state["w"][-1]) == info.step
        # A kill never loses a checkpoint that was complete (one may have completed unprinted).
        assert completed <= info.step <= completed + 1
    Checkpointer(tmp_path).hold_for_writing()     # the next writer cleans up after a killed one
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_young_interval():
    assert young_interval(30.0, 6 * 3600) == pytest.approx(math.sqrt(2 * 30 * 21600))


# --- telemetry and monitor -------------------------------------------------------------------
@pytest.fixture
def agent_socket(tmp_path):
    path = str(tmp_path / "t.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def _received(sock: socket.socket) -> list[dict]:
    """The monitor's reports, after the hello it sends as it is created and before the message
    that says it closed, where it did (its last, with nothing counted)."""
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(json.loads(sock.recv(65536)))
    except BlockingIOError:
        hello, *reports = out
        assert is_hello(hello), hello
        if reports and reports[-1]["final"]:
            closing = reports.pop()
            assert all(closing[k] == 0 for k in OWED), closing
        assert not any(r["final"] for r in reports)
        return reports


def is_hello(message: dict) -> bool:
    """A monitor's first message: the rank and its process, nothing counted, no figure."""
    return all(message[k] == 0 for k in OWED) and (message["loss"], message["grad_norm"], message["mfu"]) == (
        None, None, None) and message["step"] == (message["resumed_from"] or 0) and message["start_time"] > 0


def test_sending_without_an_agent_never_fails(tmp_path):
    sink = TelemetrySink(str(tmp_path / "nobody.sock"))
    sink.send({"v": 1})
    assert (sink.sent, sink.dropped) == (0, 1)
    sink.close()


def test_identity_from_pod_environment():
    ident = Identity.from_env("cli", {"POD_NAME": "llm-7b-worker-3", "POD_NAMESPACE": "ml",
                                      "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})
    assert ident == Identity("llm-7b", "ml", "llm-7b-worker-3", 5, 1, 8)
    assert Identity.from_env("cli", {"BURNRATE_TRAINING_JOB": "j", "POD_NAME": "x-worker-0"}).training_job == "j"
    assert Identity.from_env("cli", {}).training_job == "cli"


def test_monitor_in_a_plain_loop_reports_the_contract_fields(agent_socket, tmp_path):
    path, sock = agent_socket
    model = GPT(MODELS["tiny"])
    opt = torch.optim.AdamW(model.parameters())

    def loader():
        for _ in range(4):
            time.sleep(0.02)   # a slow loader: data wait must show it
            x = torch.randint(0, 256, (2, 16))
            yield x, x

    jsonl = tmp_path / "t.jsonl"
    mon = Monitor(model, seq_len=16, every_steps=2, socket_path=path, jsonl_path=str(jsonl), job="unit")
    for x, y in mon.wrap(loader()):
        with mon.compute():
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        mon.step(samples=len(x), loss=loss)
    with mon.checkpoint():
        time.sleep(0.01)
    mon.close()

    records = _received(sock)
    assert [r["step"] for r in records] == [2, 4, 4]
    assert records == [json.loads(line) for line in jsonl.read_text().splitlines()]
    first = records[0]
    for key in ("v", "training_job", "namespace", "pod", "rank", "world_size", "step", "time", "steps", "step_s",
                "data_wait_s", "compute_s", "samples", "tokens", "flops", "loss", "grad_norm", "mfu",
                "local_rank", "checkpoint_time", "checkpoint_s"):
        assert key in first
    assert first["v"] == 1 and first["training_job"] == "unit"
    assert (first["steps"], first["samples"], first["tokens"]) == (2, 4, 64)
    assert first["flops"] == pytest.approx(64 * model_flops_per_token(model, 16))
    assert first["data_wait_s"] >= 0.04 and 0 < first["compute_s"] < first["step_s"]
    assert first["peak_source"] == "cpu-estimate" and 0 < first["mfu"] < 1
    assert records[-1]["steps"] == 0 and records[-1]["checkpoint_s"] >= 0.01 and records[-1]["checkpoint_time"]


def test_non_finite_loss_is_sent_as_nan(agent_socket):
    path, sock = agent_socket
    mon = Monitor(flops_per_token=1.0, every_steps=1, socket_path=path)
    mon.step(samples=1, tokens=1, loss=torch.tensor(float("nan")), grad_norm=float("inf"))
    mon.close()
    assert is_hello(json.loads(sock.recv(65536)))
    raw = sock.recv(65536)
    assert b'"loss":NaN' in raw and b'"grad_norm":Infinity' in raw


def test_the_agent_inbox_accepts_every_record(tmp_path):
    """The agent's own inbox, on a real socket: nothing rejected, deltas summed."""
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        mon = Monitor(flops_per_token=10.0, seq_len=4, every_steps=2, socket_path=str(inbox.path), job="j")
        for loss in (1.0, float("nan"), float("inf"), 2.0, 3.0):
            with mon.compute():
                pass
            mon.step(samples=2, loss=loss)
        mon.close()
        assert inbox.wait_idle(5)
        assert dict(inbox.rejected) == {}
        (state,) = inbox.ranks()
    assert state.key.training_job == "j"
    assert (state.values["steps"], state.values["tokens"], state.values["flops"]) == (5, 40, 400)


def test_gradient_accumulation_counts_every_micro_batch(agent_socket):
    """Four micro-batches per optimizer step: the step carries all their samples and tokens,
    and the mean of their own (undivided) losses."""
    path, sock = agent_socket
    with Monitor(flops_per_token=2.0, seq_len=8, every_steps=1, socket_path=path) as mon:
        for step in range(2):
            with mon.compute():
                for loss in (1.0, 2.0, 3.0, torch.tensor(6.0)):
                    mon.micro_batch(samples=4, loss=loss)
            mon.step()
    first, second = _received(sock)
    assert (first["steps"], first["samples"], first["tokens"], first["flops"]) == (1, 16, 128, 256.0)
    assert first["loss"] == 3.0 and second["step"] == 2 and second["samples"] == 16
    with pytest.raises(ValueError, match="micro_batch"):
        Monitor(socket_path=path).step()


def test_a_fetch_inside_the_step_is_wait_and_never_also_compute(agent_socket):
    """nanoGPT prefetches its next batch in the middle of the step: that time is data wait,
    and compute plus wait stay within the step."""
    path, sock = agent_socket
    with Monitor(flops_per_token=1.0, seq_len=4, every_steps=3, socket_path=path) as mon:
        for _ in range(3):
            with mon.compute():
                time.sleep(0.01)                 # compute
                with mon.data_wait():
                    time.sleep(0.03)             # get_batch() inside the step
            mon.step(samples=1)
    (record,) = _received(sock)
    assert record["data_wait_s"] >= 0.09
    assert 0.03 <= record["compute_s"] < 0.06
    assert record["compute_s"] + record["data_wait_s"] <= record["step_s"]


def test_eval_and_checkpoint_time_stay_out_of_the_steps(agent_socket):
    path, sock = agent_socket
    with Monitor(flops_per_token=1.0, seq_len=4, every_steps=2, socket_path=path) as mon:
        mon.step(samples=1)
        with mon.eval():
            time.sleep(0.05)
        with mon.checkpoint():
            time.sleep(0.05)
        mon.step(samples=1)
    # The step before the evaluation goes out as it begins, not due yet (every 2 steps): held
    # back through it, it would read as made after it.
    before, record = _received(sock)
    assert (before["steps"], before["eval_s"], before["checkpoint_s"]) == (1, 0.0, 0.0)
    assert record["eval_s"] >= 0.05 and record["checkpoint_s"] >= 0.05
    assert record["steps"] == 1 and record["step_s"] < 0.05


def test_a_loop_that_never_closes_still_sends_its_last_steps(tmp_path):
    """Without close() the monitor flushes at interpreter exit: no partial interval is lost."""
    jsonl = tmp_path / "t.jsonl"
    script = textwrap.dedent(f"""
        from burnrate.monitor import Monitor
        mon = Monitor(flops_per_token=1.0, seq_len=4, every_s=3600, socket_path={str(tmp_path / 'no.sock')!r},
                      jsonl_path={str(jsonl)!r})
        for _ in range(7):
            mon.step(samples=2)
    """)
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert sum(r["steps"] for r in records) == 7 and sum(r["samples"] for r in records) == 14


def test_only_the_rank_s_own_process_says_it_closed(agent_socket):
    """A child forked from the rank's process inherits its monitor's close at exit: the child's
    exit says nothing, the process's own close says it once."""
    path, sock = agent_socket
    script = textwrap.dedent(f"""
        import os, sys
        from burnrate.monitor import Monitor
        mon = Monitor(flops_per_token=1.0, seq_len=4, every_steps=1, socket_path={path!r})
        mon.step(samples=2)
        child = os.fork()
        if child == 0:
            sys.exit(0)          # an interpreter's exit, which runs what it inherited at exit
        os.waitpid(child, 0)
        mon.step(samples=2)
    """)
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    messages = [json.loads(sock.recv(65536)) for _ in range(4)]
    assert [m["final"] for m in messages] == [False, False, False, True]
    assert [m["steps"] for m in messages[1:]] == [1, 1, 0]
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(65536)


def test_no_agent_is_said_once_with_the_socket_path(tmp_path, caplog):
    path = str(tmp_path / "nobody.sock")
    with caplog.at_level(logging.WARNING, logger="burnrate.monitor"):
        with Monitor(flops_per_token=1.0, seq_len=4, every_steps=1, socket_path=path) as mon:
            for _ in range(5):
                mon.step(samples=1)
    (warning,) = [r for r in caplog.records if r.name == "burnrate.monitor"]
    assert path in warning.getMessage() and "no agent is listening" in warning.getMessage()
    # the hello, five reports, at close one more that carries what none of them delivered, and
    # the close itself
    assert mon.sink.dropped == 8
