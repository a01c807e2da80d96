"""The monitor in torchtitan's own Trainer, selected by the job's config alone: its Llama 3
debug model trains under the real torchrun on CPU (tests/torchtitan_job.py says what
stands in for the accelerator) with 2-way gradient accumulation, checkpoints and
validation. The agent's inbox receives exact counts on a real socket, and every step's
record agrees with what torchtitan itself logs: its checkpoint times, and its loss and
gradient norm, which the steps between its logs carry."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan")

from burnrate.agent.telemetry.inbox import TelemetryInbox  # noqa: E402
from burnrate.trainer.flops import palm_flops_per_token  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.framework_runs import ahead_of_reports, assert_ledger_facts, heard_every_20ms  # noqa: E402
from tests.torchtitan_job import (CHECKPOINT_EVERY, GLOBAL_BATCH, LOG_FREQ, SEQ, SLOW_BATCH_S, SLOW_SAVE_S,  # noqa: E402
                                  STEPS, VALIDATE_EVERY)

pytestmark = pytest.mark.slow

LAYERS, HEADS, HEAD_DIM = 6, 16, 16   # torchtitan's Llama 3 debug model


def run_job(tmp_path, inbox) -> tuple[str, list[dict[str, float]]]:
    """The job's log, and what the agent had of its rank every 20 ms while it ran."""
    env = {"BURNRATE_TELEMETRY_SOCKET": str(inbox.path), "BURNRATE_TRAINING_JOB": "titan",
           "POD_NAMESPACE": "ml", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TMPDIR": str(tmp_path)}   # torchrun's log directory and triton's caches go there, not into /tmp
    with heard_every_20ms(inbox) as heard:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                               os.path.join(ROOT, "tests", "torchtitan_job.py"), str(tmp_path)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout + done.stderr, heard


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One run of the job for every test here: its work folder, its log, the agent's rank and
    what the agent had heard as it ran."""
    tmp_path = tmp_path_factory.mktemp("torchtitan")
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        log, heard = run_job(tmp_path, inbox)
        assert inbox.wait_idle(5)
        assert dict(inbox.rejected) == {}
        (rank,) = inbox.ranks()
    return tmp_path, log, rank, heard


def records_of(tmp_path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (tmp_path / "rank0.jsonl").read_text().splitlines())}


def test_torchtitans_trainer_reports_exact_counts_and_its_own_figures(job):
    tmp_path, log, rank, _ = job
    flops = json.loads((tmp_path / "flops.json").read_text())
    v = rank.values
    samples = STEPS * GLOBAL_BATCH
    assert rank.key.training_job == "titan" and rank.key.namespace == "ml"
    assert (v["steps"], v["samples"], v["tokens"]) == (STEPS, samples, samples * SEQ)
    # torchtitan's own FLOPs per token, which are burnrate's count (PaLM: the output
    # projection counted) plus the attention term, which burnrate reads from a config
    # torchtitan's model does not carry, and 6 per RMSNorm gain, which torchtitan counts in N
    # and burnrate, counting matmul weights only, does not.
    assert v["flops"] == samples * SEQ * flops["torchtitan"]
    norm_gains = (2 * LAYERS + 1) * HEADS * HEAD_DIM
    assert flops["torchtitan"] == (palm_flops_per_token(norm_gains, LAYERS, HEADS, HEAD_DIM, SEQ)
                                   + flops["burnrate"])
    assert 0 < v["compute_s"] and v["compute_s"] + v["data_wait_s"] <= v["step_s"]
    assert_ledger_facts(rank, STEPS)

    records = records_of(tmp_path)
    assert sorted(records) == list(range(1, STEPS + 1))
    for step, r in records.items():
        assert (r["steps"], r["samples"], r["tokens"]) == (1, GLOBAL_BATCH, GLOBAL_BATCH * SEQ)
        assert r["compute_s"] + r["data_wait_s"] <= r["step_s"]
        validated = step == 1 or step % VALIDATE_EVERY == 0
        assert (r["eval_s"] > 0) == validated, step
    # torchtitan times each save it makes between steps; the one after the last step ends
    # the run and is not timed (the module's docstring says why).
    saved = [float(s) for s in re.findall(r"Finished saving the checkpoint in ([\d.]+) seconds", log)]
    saves = [s for s in range(1, STEPS) if s % CHECKPOINT_EVERY == 0]
    assert [s for s, r in records.items() if r["checkpoint_s"] > 0] == saves and len(saved) == len(saves)
    for step, seconds in zip(saves, saved):
        r = records[step]
        assert seconds - 0.005 <= r["checkpoint_s"] <= seconds + 0.5
        # Kept out of the step: what is neither compute nor data wait is a fraction of it.
        assert r["step_s"] - r["compute_s"] - r["data_wait_s"] < r["checkpoint_s"] / 2


def test_steps_between_torchtitans_logs_carry_the_newest_loss_it_logged(job):
    """torchtitan hands over loss and gradient norm only on its logging steps (1 and every
    `log_freq`): each step's record has the newest it logged, and the last step, not a
    logging step here, sends the last logged ones to the agent."""
    tmp_path, log, rank, _ = job
    records = records_of(tmp_path)
    logged = {int(s): (float(loss), float(norm)) for s, loss, norm
              in re.findall(r"- step: +(\d+) +loss: +([\d.]+) +grad_norm: +([\d.]+)", log)}
    assert sorted(logged) == [s for s in range(1, STEPS + 1) if s == 1 or s % LOG_FREQ == 0]
    assert STEPS not in logged and sorted(records) == list(range(1, STEPS + 1))
    for step, r in records.items():
        newest = logged[max(s for s in logged if s <= step)]
        # torchtitan prints the loss to 5 decimals, the gradient norm to 4.
        assert r["loss"] == pytest.approx(newest[0], abs=1e-5), step
        assert r["grad_norm"] == pytest.approx(newest[1], abs=1e-4), step
    last = logged[max(logged)]
    assert (rank.values["loss"], rank.values["grad_norm"]) == pytest.approx(last, abs=1e-4)


def test_torchtitans_saves_and_validations_are_heard_while_they_last_and_counted_once(job):
    """torchtitan tells its metrics processor of neither a save nor a validation until the next
    step: the save is known from the job's checkpoint settings where the step's work ends, the
    validation from its first batch, and keep-alives carry each one's seconds so far, so the
    agent's counters grow before the step's report (a long one is neither a stall nor paged as
    one). Once reported, each is counted once."""
    tmp_path, log, rank, heard = job
    records = records_of(tmp_path)
    sent = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    # A step closes at the next one's start, after its save and validation: what the agent had
    # while step - 1 was its last is what it heard of step's.
    ahead = {name: {step + 1: a for step, a in ahead_of_reports(sent, heard, name, range(STEPS)).items()}
             for name in ("checkpoint_s", "eval_s")}
    saves = [s for s in range(1, STEPS) if s % CHECKPOINT_EVERY == 0]
    validations = [s for s in range(1, STEPS + 1) if s == 1 or s % VALIDATE_EVERY == 0]
    for step in range(1, STEPS + 1):
        most_checkpoint, most_eval = ahead["checkpoint_s"][step], ahead["eval_s"][step]
        # Never more than the step's own report then holds.
        assert most_checkpoint <= records[step]["checkpoint_s"] + 1e-6, step
        assert most_eval <= records[step]["eval_s"] + 1e-6, step
        assert (most_checkpoint > SLOW_SAVE_S / 2) == (step in saves), (step, most_checkpoint)
        assert (most_eval > SLOW_BATCH_S) == (step in validations), (step, most_eval)
    assert rank.values["checkpoint_s"] == pytest.approx(sum(r["checkpoint_s"] for r in sent), abs=1e-6)
    assert rank.values["eval_s"] == pytest.approx(sum(r["eval_s"] for r in sent), abs=1e-6)
