"""The ledger on hand-built runs whose every interval is known: two runs with a crash, a
resume from an older checkpoint and a hang, an evaluation and a stall inside a run, the
null a missing resume point gives, and the findings read from it. (The independent check
against a generator that shares nothing with the analyzer is tests/test_contract_ledger.py.)"""
from __future__ import annotations

import json

import numpy as np
import pytest

from burnrate.agent.telemetry.schema import validate
from burnrate.agent.telemetry.state import RankTable
from burnrate.analyzer.costing import ledger_findings
from burnrate.analyzer.costing.ledger import Ledger, RunLedger
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.grid.apart import stretches
from burnrate.analyzer.output.report import analyze, render_table, to_document
from burnrate.exporter.ledger import NAMES
from burnrate.exporter.telemetry import encode
from burnrate.trainer.monitor import Monitor
from tests.test_detectors import STEP, T0, Fleet, paused

GPUS = 2
BIN_GPU_HOURS = STEP * GPUS / 3600


def two_runs(resumed: bool = True, fresh_pod: bool = False) -> Fleet:
    """480 bins of 15 s, 2 ranks on 2 GPUs held throughout.
    Run 1 starts at bin 0, steps from bin 20 to 199 (10 steps a bin: 12 s compute, 1 s data
    wait, 2 s the rest), crashes after step 1800; its last checkpoint was step 1500 (bin 169).
    Run 2 starts at bin 210, resumes from 1500, steps from bin 220 to 400, then hangs with its
    ranks still reporting until the end."""
    f = Fleet()
    f.node("node-a")
    b = np.arange(f.n)
    run1, run2 = (b >= 20) & (b <= 199), (b >= 220) & (b <= 400)
    stepping = run1 | run2
    number = np.where(b <= 199, np.clip(10 * (b - 19), 0, None), 1500 + np.clip(10 * (np.minimum(b, 400) - 219), 0, None))
    start = np.where(b < 210, T0, T0 + 210 * STEP)
    alive = (b <= 199) | (b >= 210)
    for r in range(GPUS):
        per = _held_and_stepping(f, r, stepping)
        pods = {"mask": alive}
        if fresh_pod:
            for mask, pod in ((b <= 199, f"llm-{r}"), (b >= 210, f"llm-{r}-b")):
                _rank(f, r, pod, {k: np.where(mask, v, 0.0) for k, v in per.items()}, number, start,
                      np.where(b < 210, 0.0, 1500.0) if resumed else None, mask)
            continue
        _rank(f, r, f"llm-{r}", per, number, start, np.where(b < 210, 0.0, 1500.0) if resumed else None, **pods)
    return f


def _held_and_stepping(f: Fleet, r: int, stepping: np.ndarray) -> dict:
    """GPU r of node-a held by llm's pod throughout; its rank's figures a bin where it steps:
    10 steps of 12 s compute, 1 s data wait and 2 s the rest."""
    f.gpu("node-a", r)
    f.alloc("node-a", r, f"llm-{r}", "llm")
    return {"steps": np.where(stepping, 10.0, 0.0), "step_s": np.where(stepping, 15.0, 0.0),
            "wait_s": np.where(stepping, 1.0, 0.0), "compute_s": np.where(stepping, 12.0, 0.0),
            "tokens": np.where(stepping, 1000.0, 0.0)}


def _rank(f: Fleet, r: int, pod: str, per: dict, number, start, resumed, mask) -> None:
    f.rank("llm", r, "node-a", steps=per["steps"], step_s=per["step_s"], wait_s=per["wait_s"],
           compute_s=per["compute_s"], tokens=per["tokens"], mask=mask)
    frame = f.rows["rank"][-1]
    frame["pod"] = pod
    frame["global_step"] = number[mask]
    frame["start_time"] = start[mask]
    frame["resumed_from"] = resumed[mask] if resumed is not None else np.nan
    frame["checkpoint_s"] = 0.0
    frame["eval_s"] = 0.0


def ledger_of(f: Fleet, job: str = "llm") -> dict:
    # Each bin as a store answers it: the step that ends at its time.
    report = analyze(f.frames(rows_end_steps=True), load_catalog())
    doc = to_document(report)
    return next(j for j in doc["jobs"] if j["training_job"] == job), doc, report


@pytest.mark.parametrize("fresh_pod", [False, True], ids=["same pod", "new pod"])
def test_two_runs_split_exactly(fresh_pod):
    job, doc, _ = ledger_of(two_runs(fresh_pod=fresh_pod))
    hours = {k: v["gpu_hours"] for k, v in job["ledger"].items()}
    kept = 150 + 181
    # A bin stands for the step before it: run 2's start at bin 210's time leaves that
    # bin to the restart, and its first steps (bin 220) began at bin 219's time.
    expected = {"startup": 29, "restart": 11, "lost_progress": 30, "productive": kept * 12 / 15,
                "data_wait": kept / 15, "sync_wait": kept * 2 / 15, "checkpoint": 0, "evaluation": 0,
                "diverged": 0, "stalled": 79, "no_process": 0}
    for name in NAMES:
        assert hours[name] == pytest.approx(expected[name] * BIN_GPU_HOURS, abs=1e-3), name
    assert sum(hours.values()) == pytest.approx(job["gpu_hours"], abs=1e-3)
    assert job["goodput"] == pytest.approx(hours["productive"] / job["gpu_hours"], abs=1e-4)
    runs = job["runs"]
    assert [r["resumed_from"] for r in runs] == [0, 1500]
    assert [r["last_step_number"] for r in runs] == [1800, 3310]
    assert runs[1]["process_start"] == "2027-01-15T08:52:30Z"
    assert sum(runs[0]["ledger"].values()) == pytest.approx(211 * BIN_GPU_HOURS, abs=1e-3)
    assert runs[0]["ledger"]["restart"] == pytest.approx(11 * BIN_GPU_HOURS, abs=1e-3)
    assert runs[1]["ledger"]["stalled"] == pytest.approx(79 * BIN_GPU_HOURS, abs=1e-3)
    # Dollars at the job's own rate, summing to its cost.
    dollars = sum(v["dollars"] for v in job["ledger"].values())
    assert dollars == pytest.approx(job["cost_dollars"], abs=0.01)
    assert doc["accounting"]["ledger"]["lost_progress"]["gpu_hours"] == pytest.approx(hours["lost_progress"])
    # The advice's times are the job's own: its restart (gap and start-up) and its failure rate.
    assert job["advice"]["basis"]["restart_seconds"] == job["advice"]["basis"]["mtbf_seconds"] == "measured: 1 restarts"


def blown_up(loss: bool = True) -> Fleet:
    """One run on 2 GPUs held throughout 480 bins: steps from bin 20 to 399 (10 a bin: 12 s
    compute, 1 s data wait, 2 s the rest), the model blown up at bin 300 (its loss NaN from
    there on, as the agent exports a NaN the trainer reports), then GPUs held idle to the end."""
    f = Fleet()
    f.node("node-a")
    b = np.arange(f.n)
    stepping = (b >= 20) & (b <= 399)
    for r in range(GPUS):
        per = _held_and_stepping(f, r, stepping)
        _rank(f, r, f"llm-{r}", per, np.clip(10 * (np.minimum(b, 399) - 19), 0, None), np.full(f.n, T0),
              np.zeros(f.n), b < 420)
        frame = f.rows["rank"][-1]
        frame["loss"] = np.where(b[b < 420] >= 300, np.nan, 2.0) if loss else np.nan
        frame["grad_norm"] = np.where(b[b < 420] >= 300, np.nan, 1.0) if loss else np.nan
    return f


def test_steps_after_the_model_blew_up_are_diverged_in_their_place():
    job, doc, report = ledger_of(blown_up())
    hours = {k: v["gpu_hours"] for k, v in job["ledger"].items()}
    # Bins 300 to 399 held steps of a model already blown up: their whole step time, 100 bins;
    # the 280 bins before it split 12:1:2.
    good = 280
    assert hours["diverged"] == pytest.approx(100 * BIN_GPU_HOURS, abs=1e-3)
    assert hours["productive"] == pytest.approx(good * 12 / 15 * BIN_GPU_HOURS, abs=1e-3)
    assert hours["data_wait"] == pytest.approx(good / 15 * BIN_GPU_HOURS, abs=1e-3)
    assert hours["sync_wait"] == pytest.approx(good * 2 / 15 * BIN_GPU_HOURS, abs=1e-3)
    assert sum(hours.values()) == pytest.approx(job["gpu_hours"], abs=1e-3)
    assert job["goodput"] == pytest.approx(hours["productive"] / job["gpu_hours"], abs=1e-4)
    # The diverged time is where it happened, after the steps that counted.
    ledger = next(j.ledger for j in report.jobs if j.training_job == "llm")
    diverged, productive = ledger.timeline["diverged"], ledger.timeline["productive"]   # from bin 0, held
    assert productive[20:300].sum() == pytest.approx(productive.sum(), rel=0.01)
    assert diverged[300:400].sum() == pytest.approx(diverged.sum(), rel=0.01)
    kinds = {f["kind"] for f in doc["findings"] if f["training_job"] == "llm"}
    assert "diverging" in kinds


def test_without_a_loss_diverged_is_null_and_says_why():
    job, _, _ = ledger_of(blown_up(loss=False))
    assert job["ledger"]["diverged"] is None
    assert "no loss or gradient norm" in job["ledger_basis"]["diverged"]
    assert sum(v["gpu_hours"] for v in job["ledger"].values() if v) == pytest.approx(job["gpu_hours"], abs=1e-3)


def test_a_restart_without_its_resume_point_leaves_lost_progress_unknown():
    job, _, report = ledger_of(two_runs(resumed=False))
    assert job["ledger"]["lost_progress"] is None
    assert "resumed from" in job["ledger_basis"]["lost_progress"]
    assert job["runs"][1]["resumed_from"] is None
    # Still every hour somewhere: the steps computed again read as the run's own.
    known = sum(v["gpu_hours"] for v in job["ledger"].values() if v is not None)
    assert known == pytest.approx(job["gpu_hours"], abs=1e-3)
    assert "lost_progress" in render_table(report).split("LEDGER")[1].splitlines()[3]


def test_a_job_without_telemetry_has_no_ledger_and_says_why():
    f = two_runs()
    f.gpu("node-a", 5)
    f.alloc("node-a", 5, "batch-0", "batch-job")
    job, doc, _ = ledger_of(f, "batch-job")
    assert job["ledger"] is None and job["goodput"] is None
    assert job["ledger_basis"]["ledger"]
    assert doc["accounting"]["ledger_jobs"] == 1


def test_evaluation_and_a_stall_inside_a_run():
    """One run: steps every bin, but bins 100-103 evaluate (reported as 60 s of eval_s at bin
    104), and bins 200-239 hang (no step until bin 240 reports 40 bins' time as step time)."""
    f = Fleet()
    f.node("node-a")
    b = np.arange(f.n)
    quiet = ((b >= 100) & (b < 104)) | ((b >= 200) & (b < 240))
    steps = np.where(quiet, 0.0, 10.0)
    step_s = np.where(quiet, 0.0, 15.0)
    step_s[240] = 15.0 * 41          # the hung step ends with the stall in its time
    f.gpu("node-a", 0)
    f.alloc("node-a", 0, "llm-0", "llm")
    f.rank("llm", 0, "node-a", steps=steps, step_s=step_s, wait_s=np.where(quiet, 0.0, 1.0),
           compute_s=np.where(quiet, 0.0, 12.0))
    frame = f.rows["rank"][-1]
    frame["global_step"] = np.cumsum(steps)
    frame["start_time"] = T0 - 3600.0
    frame["resumed_from"] = 0.0
    frame["checkpoint_s"] = 0.0
    frame["eval_s"] = np.cumsum(np.where(b == 104, 60.0, 0.0))
    job, _, _ = ledger_of(f)
    hours = {k: v["gpu_hours"] for k, v in job["ledger"].items()}
    one = STEP / 3600
    # Bin 104 holds 15 s of steps and 60 s of evaluation: the 5 bins split 60:15.
    assert hours["evaluation"] == pytest.approx(5 * 60 / 75 * one, abs=1e-4)
    # The 40 silent bins, less the usual 1.5 s step, are a stall.
    assert hours["stalled"] == pytest.approx((40 * STEP - 1.5) / 3600, abs=1e-4)
    assert hours["productive"] + hours["data_wait"] + hours["sync_wait"] == pytest.approx(
        (480 - 5 - 40) * one + 5 * 15 / 75 * one + 1.5 / 3600, abs=1e-3)
    assert hours["sync_wait"] / hours["productive"] == pytest.approx(2 / 12, rel=0.01)
    assert hours["startup"] == 0 and hours["restart"] == 0


def _rank_of_llm(f: Fleet, rank: int, steps: np.ndarray, step_s: np.ndarray, compute_s: np.ndarray | None = None,
                 **apart) -> None:
    """Job llm's rank on GPU `rank` of node-a, its own (12 s of compute in each bin that steps,
    unless given), started an hour before the window, from step 0."""
    f.gpu("node-a", rank)
    f.alloc("node-a", rank, f"llm-{rank}", "llm")
    f.rank("llm", rank, "node-a", steps=steps, step_s=step_s, wait_s=0.0,
           compute_s=np.where(steps > 0, 12.0, 0.0) if compute_s is None else compute_s, **apart)
    frame = f.rows["rank"][-1]
    frame["global_step"] = np.cumsum(steps)
    frame["start_time"] = T0 - 3600.0
    frame["resumed_from"] = 0.0


@pytest.mark.parametrize("live", [True, False], ids=["heard as it goes", "reported as it ends"])
def test_a_twenty_minute_evaluation_is_evaluation_in_the_ledger_and_no_stall_in_the_findings(live):
    """The `stalled` finding and the ledger read a long evaluation alike: neither calls it a stall."""
    f = Fleet()
    f.node("node-a")
    per = paused(200, 280, "eval_s", live)
    steps = per["steps"]
    _rank_of_llm(f, 0, steps, np.where(steps > 0, 15.0, 0.0), eval_s=per["eval_s"], checkpoint_s=0.0)
    job, doc, _ = ledger_of(f)
    hours = {k: v["gpu_hours"] for k, v in job["ledger"].items()}
    assert hours["stalled"] == 0
    assert hours["evaluation"] == pytest.approx(80 * STEP / 3600, abs=STEP / 3600)
    assert [x["kind"] for x in doc["findings"] if x["training_job"] == "llm"] == []


@pytest.mark.parametrize("live", [True, False], ids=["heard as it goes", "reported as it ends"])
def test_a_save_from_rank_0_alone_blocks_every_rank_in_the_ledger_and_the_findings(live):
    """Rank 0 alone saves for 20 minutes (nanoGPT's `if master_process:` save) while rank 1 waits
    for it, and reports that wait as its next step's time: the ledger books the save on both GPUs
    and takes the wait back out of rank 1's step, neither it nor the `stalled` finding calls any
    of it a stall, and the save's blocking time is the whole 20 minutes."""
    f = Fleet()
    f.node("node-a")
    per = paused(200, 280, "checkpoint_s", live)
    steps = per["steps"]
    step_s = np.where(steps > 0, 15.0, 0.0)
    waited = step_s.copy()
    waited[280] += 80 * STEP
    for rank, (took, step_time) in enumerate(((per["checkpoint_s"], step_s), (0.0, waited))):
        _rank_of_llm(f, rank, steps, step_time, checkpoint_s=took, eval_s=0.0)
        saved = T0 + 279 * STEP if rank == 0 else np.nan      # rank 0's save, known from its end
        f.rows["rank"][-1]["last_checkpoint_time"] = np.where(np.arange(f.n) >= 279, saved, np.nan)
    job, doc, report = ledger_of(f)
    hours = {k: v["gpu_hours"] for k, v in job["ledger"].items()}
    assert hours["stalled"] == 0
    assert hours["checkpoint"] == pytest.approx(2 * 80 * STEP / 3600, abs=2 * STEP / 3600)
    assert hours["sync_wait"] / hours["productive"] == pytest.approx(3 / 12, rel=0.01)
    # The save blocked the loop for its 20 minutes: what Daly's interval is measured from, and a
    # sixth of the loop in saves is more than it advises. No stall.
    (ledger,) = [j.ledger for j in report.jobs if j.training_job == "llm"]
    assert (ledger.saves, ledger.save_seconds) == (1, pytest.approx(80 * STEP))
    (found,) = [x for x in doc["findings"] if x["training_job"] == "llm"]
    assert found["kind"] == "checkpoint_overhead" and found["evidence"]["save_seconds"] == pytest.approx(80 * STEP)


@pytest.mark.parametrize("slowdown", [1.0, 1.6], ids=["even", "rank 1 slower"])
def test_saves_from_rank_0_alone_make_no_straggler_of_the_rank_that_waits(slowdown):
    """Rank 0 alone saves for 90 s every 10 minutes; rank 1 waits for each in its next step's
    compute (DDP's collectives in its backward pass), more than a 5-minute block's own compute.
    That wait is the save's (grid.apart), not a slower rank: no straggler unless rank 1 computes
    slower between the saves too, and the ledger's compute is what each rank computed."""
    f = Fleet()
    f.node("node-a")
    b = np.arange(f.n)
    saving = (b % 40 >= 30) & (b % 40 < 36)             # bins 30-35 of every 40: the save
    steps = np.where(saving, 0.0, 10.0)
    waited = np.where(b % 40 == 36, 6 * STEP, 0.0)      # rank 1's next step: the save's 90 s more
    saves = np.where(b % 40 == 35, 6 * STEP, 0.0)
    for rank, (took, extra, computes) in enumerate(((saves, 0.0, 8.0), (0.0, waited, 8.0 * slowdown))):
        _rank_of_llm(f, rank, steps, np.where(saving, 0.0, 15.0) + extra,
                     compute_s=np.where(saving, 0.0, computes) + extra, checkpoint_s=took, eval_s=0.0)
    job, doc, _ = ledger_of(f)
    found = [(x["kind"], x.get("rank")) for x in doc["findings"] if x["training_job"] == "llm"]
    assert found == ([] if slowdown == 1.0 else [("straggler", 1)])
    hours = {k: v["gpu_hours"] for k, v in job["ledger"].items()}
    assert hours["checkpoint"] == pytest.approx(2 * 12 * 6 * STEP / 3600, abs=2 * STEP / 3600)
    steps_h = hours["productive"] + hours["data_wait"] + hours["sync_wait"]
    assert hours["productive"] / steps_h == pytest.approx(8.0 * (1 + slowdown) / 30, rel=0.01)


def test_one_save_reported_on_two_nodes_a_bin_apart_is_one_stretch():
    """Each node's scrape falls at its own moment: the ranks' reports of one save lie in
    neighbouring bins, and the job was blocked once, for as long as the slowest rank said."""
    reported = np.zeros((4, 30))
    reported[:2, 10] = 60.0             # node a's ranks
    reported[2:, 11] = 61.0             # node b's, a bin later
    reported[0, 14] = 5.0               # rank 0 alone, 3 bins after: the same save still
    reported[:, 25] = 30.0              # every rank, later: another save
    present = np.ones_like(reported, dtype=bool)
    first, second = stretches(reported, present)
    assert (first.first, first.last, first.seconds) == (10, 14, 65.0)
    assert first.waited == pytest.approx(0 + 5 + 4 + 4)
    assert (second.first, second.last, second.seconds, second.waited) == (25, 25, 30.0, 0.0)
    reported[0, 14] = 0.0
    reported[0, 15] = 5.0               # 4 bins after: a save of its own
    assert [s.seconds for s in stretches(reported, present)] == [61.0, 5.0, 30.0]


def _ledger(runs: int, lost: float, restart: float, startup: list[float], checkpoint: float = 0.0,
            saves: int = 10, save_seconds: float | None = 30.0, hours: float = 10.0, gpus: float = 8) -> Ledger:
    names = dict.fromkeys(NAMES, 0.0)
    names.update(lost_progress=lost, restart=restart, checkpoint=checkpoint, startup=sum(startup),
                 productive=hours * gpus - lost - restart - checkpoint - sum(startup))
    return Ledger(names, runs=[RunLedger(None, None, None, 0, 0, {**dict.fromkeys(NAMES, 0.0), "startup": s})
                               for s in startup][:runs], gpus=gpus, start=T0, end=T0 + hours * 3600,
                  saves=saves, save_seconds=save_seconds)


def test_lost_progress_finding_gives_dalys_interval_from_measured_figures():
    # 2 restarts in 10 h on 8 GPUs: M = 5 h; C = 30 s -> tau = sqrt(2*30*18000) - 30 = 1009 s.
    ledger = _ledger(3, lost=2 * 8 * 0.5, restart=0.2, startup=[0.1, 0.1, 0.1])
    (f,) = [x for x in ledger_findings.detect({("ml", "llm"): ledger}, {}) if x.kind == "lost_progress"]
    tau = (2 * 30 * 18000) ** 0.5 - 30
    assert f.evidence["advised_interval_s"] == pytest.approx(tau)
    assert f.evidence["mtbf_basis"].startswith("measured: 2 restarts")
    assert f.evidence["lost_minutes_per_restart"] == pytest.approx(30.0)
    assert f.wasted_gpu_hours == pytest.approx((1800 - tau / 2) * 2 * 8 / 3600)
    assert f.recommendation.startswith("Restarts lost 30 min of steps each; checkpoint every 17 min (Daly's "
                                       "interval for a 30 s save and 5.0 h between failures)")


def test_no_lost_progress_finding_when_the_loss_is_what_the_interval_costs():
    tau = (2 * 30 * 18000) ** 0.5 - 30
    lost = 2 * 8 * (tau / 2) / 3600
    assert not [x for x in ledger_findings.detect({("ml", "llm"): _ledger(3, lost, 0.2, [0.1] * 3)}, {})
                if x.kind == "lost_progress"]


def test_checkpoint_overhead_and_slow_startup():
    # No restart: the prior M; 10 % of the loop in saves is far above C/(tau+C).
    ledger = _ledger(1, 0.0, 0.0, [8 * 25 / 60], checkpoint=8.0)
    found = {x.kind: x for x in ledger_findings.detect({("ml", "llm"): ledger}, {("ml", "llm"): 100 * 3600.0})}
    over = found["checkpoint_overhead"]
    tau = (2 * 30 * 360000) ** 0.5 - 30
    assert over.evidence["optimal_share"] == pytest.approx(30 / (tau + 30))
    assert over.evidence["mtbf_basis"].startswith("no restart")
    assert over.wasted_gpu_hours == pytest.approx(8.0 - 30 / (tau + 30) * (80 - 8 * 25 / 60))
    slow = found["slow_startup"]
    assert slow.evidence["startup_minutes"] == [pytest.approx(25.0)]
    assert slow.wasted_gpu_hours == pytest.approx(15 / 60 * 8)


def test_the_monitor_sends_its_start_and_resume_point_and_the_agent_exports_them(tmp_path):
    sent = []
    mon = Monitor(flops_per_token=1.0, seq_len=4, start_step=1500, every_steps=1, socket_path=str(tmp_path / "none"),
                  on_report=sent.append)
    with mon.checkpoint():
        pass
    mon.step(samples=2)
    mon.close()
    record = sent[0]
    assert record["resumed_from"] == 1500 and record["step"] == 1501
    assert 0 < record["start_time"] <= record["time"]
    table = RankTable(max_ranks=8, max_ranks_per_job=8, forget_after_s=60)
    assert table.add(validate(encode(record)), now=record["time"])
    values = table.states()[0].values
    assert values["global_step"] == 1501 and values["resumed_from"] == 1500
    assert values["start_time"] == record["start_time"] and values["checkpoint_s"] == record["checkpoint_s"] > 0
    # A loop that does not say where it resumed sends null, never a made-up 0.
    unknown = []
    Monitor(flops_per_token=1.0, seq_len=4, every_steps=1, socket_path=str(tmp_path / "none"),
            on_report=unknown.append).step(samples=1)
    assert unknown[0]["resumed_from"] is None
    assert json.loads(encode(unknown[0]))["resumed_from"] is None


def ended_job(alive_until: int, stepping_until: int = 199) -> Fleet:
    """2 ranks on 2 GPUs held the whole two hours; steps from bin 20 to `stepping_until`, the
    process alive (its ranks reporting, the agent hearing them) until bin `alive_until`, after
    which the pods hold the GPUs idle with no process."""
    f = Fleet()
    f.node("node-a")
    b = np.arange(f.n)
    stepping = (b >= 20) & (b <= stepping_until)
    alive = b <= alive_until
    for r in range(GPUS):
        f.gpu("node-a", r, util=np.where(stepping, 95.0, 0.0))
        f.alloc("node-a", r, f"llm-{r}", "llm")
        per = {"steps": np.where(stepping, 10.0, 0.0), "step_s": np.where(stepping, 15.0, 0.0),
               "wait_s": np.where(stepping, 0.5, 0.0), "compute_s": np.where(stepping, 12.0, 0.0),
               "tokens": np.where(stepping, 1000.0, 0.0)}
        _rank(f, r, f"llm-{r}", per, np.clip(10 * (np.minimum(b, stepping_until) - 19), 0, None),
              np.full(f.n, T0), np.zeros(f.n), alive)
        f.rows["rank"][-1]["last_report_time"] = f.t[alive]
    return f


@pytest.mark.parametrize("alive_until, stalled_minutes", [(200, None), (300, 25.25)],
                         ids=["exited at its last step", "hung 25 min, then died"])
def test_gpus_held_after_the_process_ended_are_held_after_exit_not_a_stall(alive_until, stalled_minutes):
    """The pods hold the GPUs to the window's end after the process ended: that time is the
    ledger's no_process and the held_after_exit finding's waste, with advice to release the
    GPUs; a stall is only the time the process lived on without a step, and the idle GPUs are
    neither counted again nor a finding of their own."""
    job, doc, report = ledger_of(ended_job(alive_until))
    found = {f.kind: f for f in report.findings if f.training_job == "llm"}
    assert set(found) == {"held_after_exit"} | ({"stalled"} if stalled_minutes else set()), found
    held = found["held_after_exit"]
    no_process = job["ledger"]["no_process"]["gpu_hours"]
    assert no_process == pytest.approx((479 - alive_until) * BIN_GPU_HOURS, abs=2 * BIN_GPU_HOURS)
    assert held.wasted_gpu_hours == pytest.approx(no_process, abs=1e-4)   # the document rounds to 4 places
    assert held.start == pytest.approx(T0 + alive_until * STEP, abs=2 * STEP)
    assert held.evidence["gpus_held"] == pytest.approx(GPUS)
    assert "cleanPodPolicy" in held.recommendation
    if stalled_minutes:
        stall = found["stalled"]
        assert stall.end == pytest.approx(held.start)
        assert stall.evidence["stalled_minutes"] == pytest.approx(stalled_minutes, abs=0.5)
        # An episode as every other finding is, found again or not: its basis in its evidence.
        assert stall.evidence["episodes"] == 1 and stall.evidence["hours"] == pytest.approx(stalled_minutes / 60, abs=0.01)
        assert stall.wasted_gpu_hours == pytest.approx(job["ledger"]["stalled"]["gpu_hours"], abs=2 * BIN_GPU_HOURS)
    waste = {f["kind"]: f["wasted_gpu_hours"] for f in doc["findings"] if f.get("training_job") == "llm"}
    assert sum(waste.values()) == pytest.approx(no_process + job["ledger"]["stalled"]["gpu_hours"],
                                                abs=2 * BIN_GPU_HOURS)


def test_a_process_that_hangs_until_the_window_closes_is_stalled_to_the_end():
    job, _, report = ledger_of(ended_job(alive_until=479))
    found = {f.kind: f for f in report.findings if f.training_job == "llm"}
    assert set(found) == {"stalled"}
    assert job["ledger"]["no_process"]["gpu_hours"] == 0.0
    assert found["stalled"].end == pytest.approx(T0 + 479 * STEP, abs=STEP)
