"""The per-job ledger against ground truth from tests/contract_ledger.py.

That generator is written from the ledger's interface definition alone (the burnrate_train_*
metrics, the agent's forget-after rule, the category definitions); it reads no analyzer,
agent, exporter or simulator code, so these tests do not share the analyzer's assumptions.

First the generator itself (its truth adds up to the held time exactly, a small case matches
hand arithmetic, its series behave as the agent's would). Then the analyzer:

- drawn jobs (hypothesis, derandomized: the same examples in CI; BURNRATE_EXAMPLES=N for more,
  BURNRATE_RANDOM=1 for new ones, BURNRATE_SHRINK=1 to shrink a failure) and five fixed jobs,
  imported into a real VictoriaMetrics (one per module, each job in a time slot of its own: an
  import and an analysis take a fraction of a second) and read through the analyzer's Prometheus
  source: the job is one entry of class training; every category within 1 % of the job's
  GPU-hours or W GPUs x one edge allowance (a scrape interval and twice its jitter, a step, the
  report lag and period) per edge bounding it; the categories sum to the job's GPU-hours, its own
  and the truth's; goodput; dollars at the job's price; one `runs` entry per run with the right
  resumed_from, last_step_number, process_start, first and last step; the fleet's
  accounting.ledger and goodput equal to the one training job's;
- a restart with no burnrate_train_resumed_from_step: lost_progress null (never 0) with a
  reason, runs' resumed_from null, and the step categories between the truth's and the truth's
  plus the lost steps (they cannot be told apart);
- a job with no telemetry: ledger and goodput null with a reason, and the fleet's ledger not
  reading as a known 0;
- one job back-filled into a real Prometheus and read by `burnrate analyze --prometheus`;
- two windows that both hold the whole job give the same ledger (one edge allowance at each end).
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
from dataclasses import replace
from datetime import datetime

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings, strategies as st

from tests.conftest import PYTHON, ROOT
from tests.contract_fleet import Series, backfill_prometheus, import_victoria
from tests.contract_ledger import (BASE_TIME, CATEGORIES, FORGET_AFTER_S, H, REPORT_LAG_S, REPORT_PERIOD_S,
                                   TRAIN_COUNTERS, JobSpec, LedgerCase, RunSpec, agent_view, edge_s, generate,
                                   ledger_jobs, tolerance)
from tests.processes import prometheus, victoria_metrics

HELD_AFTER_EXIT_MINUTES = 10.0   # docs/findings.md
SLOTS_FROM = 1104537600.0     # 2005-01-01T00:00:00Z: each analysed case gets 3 days of its own from here
_slots = itertools.count()
# no shrinking by default: a failing example is reported as drawn, within the time budget
PHASES = (Phase.explicit, Phase.reuse, Phase.generate) + ((Phase.shrink,) if os.environ.get("BURNRATE_SHRINK") else ())
EXAMPLES = int(os.environ.get("BURNRATE_EXAMPLES", "50"))
DRAWN = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("BURNRATE_RANDOM"),
                 database=None, phases=PHASES,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                        HealthCheck.data_too_large])


# ---------------------------------------------------------------------------------------------
# the generator itself

def _hand_case(gap_s: float = 50.0, **spec) -> LedgerCase:
    """1 GPU, steps of exactly 1 s (compute 0.8, data 0.1, sync 0.1), a 10 s checkpoint every 40
    steps; run 1 starts 100 s after the allocation, loads for 200 s, does steps 1..100 and
    crashes; run 2 starts gap_s later in the same pod, resumes from 80, loads for 200 s and does
    steps 81..180; the pod goes with its last step."""
    run = RunSpec(steps=100, step_s=1.0, startup_s=200.0, compute=(0.8,), data_wait=(0.1,), gap_s=gap_s)
    return generate(JobSpec(nodes=(("gpu-node-a", 1),), interval_s=60.0, runs=(run, run), checkpoint_every=40,
                            checkpoint_s=10.0, eval_every=None, eval_s=0.0, alloc_start=BASE_TIME,
                            schedule_s=100.0, step_jitter=0.0, **spec))


def _one(case: LedgerCase, name: str):
    (s,) = [s for s in case.series if s.name == name]
    return s


def test_a_small_case_matches_hand_arithmetic():
    case = _hand_case()
    p1, p2 = case.processes
    assert (p1.start, p1.first_begin, p1.last_step_at) == (BASE_TIME + 100, BASE_TIME + 300, BASE_TIME + 420)
    assert (p2.start, p2.resumed_from, p2.first_begin, p2.last_step_at) == (BASE_TIME + 470, 80, BASE_TIME + 670,
                                                                            BASE_TIME + 790)
    seconds = {c: v * H for c, v in case.truth.ledger.items()}
    want = {"startup": 300 + 200, "restart": 50, "productive": 0.8 * (80 + 100), "data_wait": 0.1 * 180,
            "sync_wait": 0.1 * 180, "lost_progress": 20, "checkpoint": 40, "evaluation": 0, "diverged": 0,
            "stalled": 0, "no_process": 0}
    assert seconds == pytest.approx(want, abs=1e-6)
    assert case.truth.gpu_hours * H == pytest.approx(790)
    assert [(r["resumed_from"], r["last_step_number"]) for r in case.truth.runs] == [(0, 100), (80, 180)]
    # the agent keeps the rank (50 s < forget-after): its counters go on across the restart
    steps = _one(case, "burnrate_train_steps_total")
    assert steps.v[-1] == 200 and (steps.v[1:] >= steps.v[:-1]).all()
    assert _one(case, "burnrate_train_global_step").v[-1] == 180
    assert _one(case, "burnrate_train_resumed_from_step").v[-1] == 80
    assert _one(case, "burnrate_train_checkpoint_seconds_total").v[-1] == 40
    # exported until forget-after past the last report, which is the last step
    assert steps.t[-1] >= BASE_TIME + 790 + REPORT_LAG_S and steps.t[-1] < BASE_TIME + 790 + FORGET_AFTER_S + 1


def test_a_blown_up_model_s_steps_are_diverged_unless_computed_again():
    """Run 1 blows up at step 61 (after its step-40 save); run 2 resumes from 40, the last save
    before it, and blows up at its 91st step, 131: steps 41 to 100 of run 1 are computed again
    (lost progress, blown up or not), steps 131 to 140 of run 2 trained nothing."""
    run = RunSpec(steps=100, step_s=1.0, startup_s=200.0, compute=(0.8,), data_wait=(0.1,), gap_s=50.0)
    case = generate(JobSpec(nodes=(("gpu-node-a", 1),), interval_s=60.0, runs=(replace(run, diverge_after=60),
                                                                               replace(run, diverge_after=90)),
                            checkpoint_every=40, checkpoint_s=10.0, eval_every=None, eval_s=0.0, alloc_start=BASE_TIME,
                            schedule_s=100.0, step_jitter=0.0))
    assert case.processes[1].resumed_from == 40
    seconds = {c: v * H for c, v in case.truth.ledger.items()}
    assert (seconds["lost_progress"], seconds["diverged"]) == pytest.approx((60, 10))
    assert seconds["productive"] == pytest.approx(0.8 * (40 + 90))
    loss = _one(case, "burnrate_train_loss")
    assert np.isinf(loss.v).any() and np.isfinite(loss.v).any()


def test_step_gauges_of_a_restarted_trainer_are_stale_or_absent_until_its_first_step():
    def between(s):  # after run 2's start is reported, before its first step
        return s.v[(s.t > BASE_TIME + 471 + REPORT_LAG_S) & (s.t < BASE_TIME + 670)]

    stale, fresh = _hand_case(), _hand_case(stale_step_gauges=False)
    assert set(between(_one(stale, "burnrate_train_global_step"))) == {100}
    assert set(between(_one(stale, "burnrate_train_last_step_timestamp_seconds"))) == {BASE_TIME + 420}
    assert between(_one(fresh, "burnrate_train_global_step")).size == 0
    assert set(between(_one(fresh, "burnrate_train_start_timestamp_seconds"))) == {BASE_TIME + 470}
    assert _one(fresh, "burnrate_train_global_step").v[-1] == 180


def test_a_rank_forgotten_between_runs_counts_from_zero_again():
    case = _hand_case(gap_s=400.0)
    steps = _one(case, "burnrate_train_steps_total")
    fall = (steps.v[1:] < steps.v[:-1]).nonzero()[0]
    assert fall.size == 1
    # the series vanished for a while: gone forget-after past the crash, back after the restart
    gone, back = steps.t[fall[0]], steps.t[fall[0] + 1]
    assert gone < BASE_TIME + 420 + FORGET_AFTER_S + REPORT_LAG_S and back > BASE_TIME + 820
    assert steps.v[-1] == 100
    assert case.truth.ledger["restart"] * H == pytest.approx(400)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=ledger_jobs())
def test_generated_truth_adds_up_and_series_behave(spec):
    case = generate(spec)
    t = case.truth
    for rank, cats in enumerate(t.per_rank):
        assert sum(cats.values()) == pytest.approx(t.held_s[rank], abs=1e-6)
        assert min(cats.values()) >= -1e-9, cats
    # Each rank's to a microsecond (an epoch time in float64 rounds to 0.24 us), the job's to that per rank.
    assert sum(t.ledger.values()) == pytest.approx(t.gpu_hours, abs=1e-6 * len(t.per_rank) / H)
    assert t.goodput == pytest.approx(t.ledger["productive"] / t.gpu_hours)
    held = sum(h.end - h.start for h in case.holds for _ in h.gpus) / H
    assert held == pytest.approx(t.gpu_hours)
    assert case.start <= min(h.start for h in case.holds) and max(h.end for h in case.holds) <= case.end
    # a later run resumes from the last checkpoint at or before the previous run's last step
    for prev, nxt in zip(case.processes, case.processes[1:]):
        assert prev.resumed_from <= nxt.resumed_from <= prev.last_step
        assert nxt.resumed_from % spec.checkpoint_every == 0 or nxt.resumed_from == prev.resumed_from
        assert prev.end <= nxt.start
    # a last run's hang ends with its pods, or its pods outlive it by more than forget-after and
    # two scrapes (its series go while they hold: the end is seen)
    if spec.runs[-1].hang_s:
        last = case.processes[-1]
        after = [h.end - last.end for h in case.holds if h.pod in last.pods and h.start <= last.start < h.end]
        assert all(a == 0 for a in after) or min(after) > FORGET_AFTER_S + 2 * spec.interval_s
    for s in case.series:
        assert (s.t[1:] > s.t[:-1]).all() and s.t[0] >= case.start and s.t[-1] < case.end, s.name
    # counters fall only where the agent forgot the rank: forget-after or more past a process's end
    for s in case.series:
        if s.name in TRAIN_COUNTERS:
            ends = [p.end for p in case.processes if s.labels["pod"] in p.pods]
            for i in (s.v[1:] < s.v[:-1]).nonzero()[0]:
                assert any(d <= s.t[i] and s.t[i + 1] - d >= FORGET_AFTER_S for d in ends), (s.name, s.labels)


def test_the_agent_view_is_gone_forget_after_past_the_last_report():
    case = _hand_case()
    tau = np.array([BASE_TIME + 790 + REPORT_LAG_S + 1, BASE_TIME + 790 + FORGET_AFTER_S + REPORT_LAG_S + 1])
    view = agent_view(case.processes, 0, 1, tau)
    assert view["burnrate_train_steps_total"][0] == 200 and np.isnan(view["burnrate_train_steps_total"][1])


# ---------------------------------------------------------------------------------------------
# the analyzer against the truth

@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    with victoria_metrics(tmp_path_factory.mktemp("vm")) as server:
        yield server


def in_slot(spec: JobSpec) -> LedgerCase:
    """The job in a time slot of its own in the shared store (3 days from 2005 on each)."""
    return generate(replace(spec, alloc_start=SLOTS_FROM + next(_slots) * 3 * 86400.0 + 7200.0))


@functools.cache
def catalog():
    """The default prices, read once: parsing them took a twentieth of the drawn cases' time."""
    from burnrate.analyzer.costing.pricing import load_catalog
    return load_catalog(None)


def analyse(url: str, case: LedgerCase, start: float | None = None, end: float | None = None) -> tuple[dict, float]:
    """The analysis as `--format json` gives it, and the step it read the store at."""
    from burnrate.analyzer.grid.frames import Window
    from burnrate.analyzer.output.report import analyze, to_document
    from burnrate.analyzer.sources import PrometheusSource

    window = Window(case.start if start is None else start, case.end if end is None else end)
    source = PrometheusSource(url, min_step_s=case.spec.interval_s)
    report = analyze(source.frames(window), catalog())
    return json.loads(json.dumps(to_document(report))), source.step_for(window)


def the_job(doc: dict, case: LedgerCase) -> dict:
    spec = case.spec
    mine = [j for j in doc["jobs"] if j["namespace"] == spec.namespace
            and (j["training_job"] == spec.name or j["training_job"].startswith(spec.name + "@"))]
    names = [j["training_job"] for j in mine]
    assert names == [spec.name], f"the job should be one entry, got {names}\n{case.describe()}"
    return mine[0]


def _ts(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# Where the time of a save or evaluation the window does not see reported goes instead: the wait
# after the last step (docs/ledger.md, Edges).
UNREPORTED = ("checkpoint", "evaluation", "stalled", "no_process")


def unreported_s(case: LedgerCase, unit_s: float) -> float:
    """Seconds of the last run's saves and evaluations that end within one edge allowance of the
    window's end: each reports its time only when it is over, so the window may hold none of it."""
    last = case.processes[-1]
    late = case.end - unit_s
    return float(np.sum(last.ckpt[last.ckpt_end > late]) + np.sum(last.evals[last.eval_end > late]))


def ledger_errors(job: dict, case: LedgerCase, unit_s: float, resumed_from_known: bool = True) -> list[str]:
    """Every way the job's ledger, goodput and runs differ from the truth beyond tolerance."""
    t, spec, W = case.truth, case.spec, case.spec.world_size
    errors: list[str] = []
    per_edge = W * unit_s / H

    hidden = W * unreported_s(case, unit_s) / H

    def tol(category: str) -> float:
        return tolerance(case, category, unit_s) + (hidden if category in UNREPORTED else 0.0)

    if job.get("class") != "training":
        errors.append(f"class {job.get('class')!r}, expected 'training'")
    if abs(job["gpu_hours"] - t.gpu_hours) > tol("sum"):
        errors.append(f"gpu_hours: expected {t.gpu_hours:.4f}, got {job['gpu_hours']:.4f} (tol {tol('sum'):.4f})")
    ledger = job.get("ledger")
    if not isinstance(ledger, dict):
        return errors + [f"ledger is {ledger!r} (basis {job.get('ledger_basis')!r})"]
    if set(ledger) != set(CATEGORIES):
        errors.append(f"ledger keys {sorted(ledger)} != {sorted(CATEGORIES)}")
    price = job["cost_dollars"] / job["gpu_hours"] if job.get("cost_dollars") and job["gpu_hours"] else None
    total = 0.0
    for c in CATEGORIES:
        got = ledger.get(c)
        if c == "lost_progress" and not resumed_from_known:
            continue
        if got is None:
            errors.append(f"{c}: null (basis {job.get('ledger_basis', {}).get(c)!r}), expected {t.ledger[c]:.4f}")
            continue
        total += got["gpu_hours"]
        if abs(got["gpu_hours"] - t.ledger[c]) > tol(c):
            errors.append(f"{c}: expected {t.ledger[c]:.4f} GPU-h, got {got['gpu_hours']:.4f} "
                          f"(off {got['gpu_hours'] - t.ledger[c]:+.4f}, tol {tol(c):.4f})")
        if price is not None and abs(got["dollars"] - got["gpu_hours"] * price) > 0.005 + 1e-3 * got["dollars"]:
            errors.append(f"{c}: dollars {got['dollars']} != {got['gpu_hours']} GPU-h x {price:.4f} $/GPU-h")
    if resumed_from_known:
        # the categories add up to the job's GPU-hours, its own and the truth's
        if abs(total - job["gpu_hours"]) > per_edge * t.edges["sum"] + 1e-3:
            errors.append(f"categories sum to {total:.4f}, the job's gpu_hours is {job['gpu_hours']:.4f}")
        if abs(total - t.gpu_hours) > tol("sum"):
            errors.append(f"categories sum to {total:.4f}, the truth's gpu_hours is {t.gpu_hours:.4f}")
    goodput = job.get("goodput")
    goodput_tol = (tol("productive") + tol("sum") * t.goodput) / t.gpu_hours + 1e-3
    if goodput is None or abs(goodput - t.goodput) > goodput_tol:
        errors.append(f"goodput: expected {t.goodput:.4f}, got {goodput} (tol {goodput_tol:.4f})")
    runs = job.get("runs")
    if not isinstance(runs, list) or len(runs) != len(t.runs):
        errors.append(f"runs: expected {len(t.runs)}, got {None if runs is None else len(runs)}: {runs}")
        return errors
    # The last steps of a run may fall after its last scrape: within one scrape of its end (a
    # trainer restarted at once, or pods gone), or, where the window ends first, within one
    # scrape and one query-grid step of the window's end.
    scrape = spec.interval_s + 2 * spec.jitter_s + REPORT_LAG_S + REPORT_PERIOD_S
    for i, (got, want) in enumerate(zip(runs, t.runs)):
        p = case.processes[i]
        seen_by = min(p.last_step_at - scrape, case.end - scrape - spec.interval_s)
        seen = max(1, int(np.searchsorted(p.step_end, seen_by, side="right")))
        first_seen = p.resumed_from + seen
        expected_resume = want["resumed_from"] if resumed_from_known else None
        if got.get("resumed_from") != expected_resume:
            errors.append(f"run {i + 1}: resumed_from {got.get('resumed_from')!r}, expected {expected_resume}")
        number = got.get("last_step_number")
        if not isinstance(number, int) or not first_seen <= number <= want["last_step_number"]:
            errors.append(f"run {i + 1}: last_step_number {number!r}, expected {want['last_step_number']}"
                          + (f" (or from {first_seen}, seen before its end)" if first_seen < p.last_step else ""))
        start = _ts(got.get("process_start"))
        if start is None or abs(start - want["process_start"]) > 1.5:
            errors.append(f"run {i + 1}: process_start {got.get('process_start')}, expected "
                          f"{want['process_start'] - case.alloc_start:.1f} s after A0")
        for key in ("first_step", "last_step"):
            at = _ts(got.get(key))
            # the first step is seen as it completes; either its beginning or its end is right
            lo = want["first_step_begin"] if key == "first_step" else float(p.step_end[seen - 1])
            if at is None or not lo - unit_s <= at <= want[key] + unit_s:
                rel = None if at is None else at - case.alloc_start
                errors.append(f"run {i + 1}: {key} at {rel} s after A0, expected {want[key] - case.alloc_start:.1f}")
    return errors


def exit_errors(doc: dict, job: dict, case: LedgerCase, unit_s: float) -> list[str]:
    """The GPUs held after the last process ended, where that is over `held_after_exit_minutes`
    (docs/findings.md), are the `held_after_exit` finding, whose waste is the ledger's
    `no_process`, and no `stalled` finding runs past that process end: a stall is a living
    process's. (A shorter tail stays in the stall.)"""
    mine = [f for f in doc["findings"] if f.get("training_job") == job["training_job"]
            and f.get("namespace") == job["namespace"]]
    ended = max(p.end for p in case.processes) if case.processes else None
    if ended is None or not case.spec.telemetry:
        return []
    held = [f for f in mine if f["kind"] == "held_after_exit"]
    after_min = (min(case.alloc_end, case.end) - ended) / 60
    limit = HELD_AFTER_EXIT_MINUTES
    errors = [f"stalled until {f['end']}, {_ts(f['end']) - ended:.0f} s after the last process ended"
              for f in mine if f["kind"] == "stalled" and _ts(f["end"]) > ended + unit_s
              and after_min > limit + 2 * unit_s / 60]
    if after_min > limit + 2 * unit_s / 60 and not held:
        errors.append(f"no held_after_exit finding for {after_min:.1f} min held after the process ended")
    if after_min < limit - 2 * unit_s / 60 and held:
        errors.append(f"held_after_exit for {after_min:.1f} min held after the process ended")
    no_process = ((job.get("ledger") or {}).get("no_process") or {}).get("gpu_hours")
    errors += [f"held_after_exit wasted {f['wasted_gpu_hours']} GPU-h, the ledger's no_process {no_process}"
               for f in held if no_process is None or abs(f["wasted_gpu_hours"] - no_process) > 1e-3]
    return errors


def fleet_errors(doc: dict, job: dict) -> list[str]:
    """The fleet's accounting carries the ledger summed over training jobs: here the one job."""
    acc = doc["accounting"]
    errors = []
    if not isinstance(acc.get("ledger"), dict) or not isinstance(job.get("ledger"), dict):
        return [f"accounting.ledger {acc.get('ledger')!r}"]
    for c in CATEGORIES:
        a, j = acc["ledger"].get(c), job["ledger"].get(c)
        if j is None:
            # the one training job's figure is unknown: the fleet's must not read as a known 0
            if a is not None and not a.get("jobs_unknown"):
                errors.append(f"accounting.ledger.{c} {a}, but the only training job's is null")
        elif a is None or abs(a["gpu_hours"] - j["gpu_hours"]) > 1e-3:
            errors.append(f"accounting.ledger.{c} {a} != the job's {j}")
    # (a goodput of 0 is a figure: a job whose every step trained a blown-up model)
    if job.get("goodput") is not None and (acc.get("goodput") is None or abs(acc["goodput"] - job["goodput"]) > 1e-3):
        errors.append(f"accounting.goodput {acc.get('goodput')} != the job's {job['goodput']}")
    return errors


def check(doc: dict, case: LedgerCase, step_s: float, **kwargs) -> None:
    job = the_job(doc, case)
    unit = edge_s(case) + max(0.0, step_s - case.spec.interval_s)
    errors = ledger_errors(job, case, unit, **kwargs) + fleet_errors(doc, job) + exit_errors(doc, job, case, unit)
    got = {c: (v or {}).get("gpu_hours") for c, v in (job.get("ledger") or {}).items()}
    assert not errors, ("\n".join(errors) + f"\n{case.describe()}\n  analyzer: {got}, goodput {job.get('goodput')}, "
                        f"gpu_hours {job['gpu_hours']}\n  basis {job.get('ledger_basis')}\n  runs {job.get('runs')}")


@pytest.mark.slow
@DRAWN
@given(spec=ledger_jobs())
def test_any_job_s_ledger_matches_its_truth(vm, spec):
    case = in_slot(spec)
    # A run that comes back from step 0 after its ranks were forgotten is, by docs/analyze.md's rule
    # (one name can cover several runs), a new submission of the same name: another job, not this one's restart.
    assume(not any(p.resumed_from == 0 and p.start - q.end > FORGET_AFTER_S
                   for q, p in zip(case.processes, case.processes[1:])))
    import_victoria(case, vm.url)
    doc, step = analyse(vm.url, case)
    check(doc, case, step)


# fixed cases: every path once, whatever the draw

def _run(steps: int = 1500, step_s: float = 1.5, world: int = 2, **kw) -> RunSpec:
    return RunSpec(steps=steps, step_s=step_s, startup_s=kw.pop("startup_s", 240.0),
                   compute=(0.7, 0.62, 0.66, 0.7)[:world], data_wait=(0.1, 0.12, 0.05, 0.1)[:world], **kw)


def restarted(**spec) -> JobSpec:
    """Three runs on 2 GPUs over two nodes: a stall in run 1, a crash and a restart in the same
    pods, a crash and an eviction (new pods), and a finish that leaves the pods 20 min idle."""
    runs = (_run(stall_after=600, stall_s=900.0),
            _run(steps=1800, gap_s=120.0),
            _run(steps=1200, new_pods=True, release_s=20.0, pending_s=300.0, pull_s=90.0))
    return JobSpec(**{**dict(nodes=(("gpu-node-a", 1), ("gpu-node-b", 1)), interval_s=15.0, runs=runs,
                             checkpoint_every=500, checkpoint_s=40.0, eval_every=700, eval_s=120.0,
                             alloc_start=BASE_TIME, pod_skew_s=(0.0, 12.0), schedule_s=150.0, keep_s=1200.0,
                             before_s=1800.0, after_s=900.0, jitter_s=1.0, phase_s=4.0, bystander=True, seed=5),
                      **spec})


def behind() -> JobSpec:
    """A drawn job: run 2, in the same pods 147 s after run 1's last step (within the store's
    5-minute lookback), resumes from step 1395 and ends at 2033, before run 1's last step (2056),
    so run 1's last number is held over into run 2's first samples."""
    return JobSpec(nodes=(("gpu-node-a", 4), ("gpu-node-b", 4)), interval_s=15.0, runs=(
        RunSpec(steps=2056, step_s=0.8690578135668628, startup_s=30.0,
                compute=(0.7171, 0.7692, 0.7157, 0.7007, 0.7853, 0.7938, 0.7925, 0.7227),
                data_wait=(0.0227, 0.0168, 0.0239, 0.0216, 0.0177, 0.0153, 0.0085, 0.0164), stall_after=None,
                stall_s=0.0, hang_s=0.0, new_pods=False, gap_s=10.0, release_s=0.0, pending_s=100.0, pull_s=5.0),
        RunSpec(steps=638, step_s=0.7514167292209603, startup_s=266.23839652925363,
                compute=(0.3825, 0.4024, 0.4108, 0.4444, 0.405, 0.3846, 0.4259, 0.4484), data_wait=(0.0,) * 8,
                stall_after=440, stall_s=600.0, hang_s=1573.1011131396472, new_pods=False,
                gap_s=147.12824254901594, release_s=28.709948320662754, pending_s=273.4464547599699,
                pull_s=160.7986395895734)),
        checkpoint_every=1395, checkpoint_s=10.0, eval_every=1372, eval_s=293.6074357989098,
        alloc_start=1748822400.0, pod_skew_s=(1.501931632578271, 8.510085909203782e-145),
        schedule_s=483.25387108441504, keep_s=0.0, before_s=2325.403344301865, after_s=1482.7601225993808,
        jitter_s=2.00001, phase_s=9.63927937460306, namespace="ml", name="llm-pretrain", telemetry=True,
        report_resumed_from=True, bystander=False, step_jitter=0.1, stale_step_gauges=False, seed=0)


def evaluating() -> JobSpec:
    """A drawn job: three runs scraped every 60 s whose last evaluation (143 s) ends 32 s before
    the job does, the window closing with it: the window holds no report of that evaluation."""
    return JobSpec(nodes=(("gpu-node-a", 4),), interval_s=60.0, runs=(
        RunSpec(steps=1117, step_s=1.1370171576864683, startup_s=176.8881339992552, compute=(0.45, 0.4527, 0.5, 0.4419),
                data_wait=(0.1094, 0.1078, 0.0925, 0.1333), gap_s=116.1898514975041, release_s=39.4452863348257,
                pending_s=578.237638986363, pull_s=196.63952493807147),
        RunSpec(steps=1522, step_s=0.9715727960950895, startup_s=390.75511271347733,
                compute=(0.5433, 0.5461, 0.5258, 0.6), data_wait=(0.2417, 0.1164, 0.2526, 0.2472), gap_s=20.0,
                release_s=35.486003440916285, pending_s=60.4986308272619, pull_s=265.8286547787912),
        RunSpec(steps=706, step_s=1.0336416250135376, startup_s=406.31129498513326,
                compute=(0.6844, 0.7749, 0.7837, 0.7789), data_wait=(0.0,) * 4, new_pods=True,
                gap_s=528.2970740974354, release_s=54.364445006268056, pending_s=7.643761674336915,
                pull_s=87.10563295263377)),
        checkpoint_every=1394, checkpoint_s=118.37007455806042, eval_every=2069, eval_s=142.94170675201536,
        alloc_start=1751126400.0, pod_skew_s=(0.0,), schedule_s=305.34063122797755, keep_s=0.0,
        before_s=826.4903777342453, after_s=0.3333333333333333, jitter_s=0.0, phase_s=32.406660474622555,
        namespace="ml", name="llm-pretrain", telemetry=True, report_resumed_from=True, bystander=True,
        step_jitter=0.1, stale_step_gauges=False, seed=1000000)


def saved_after() -> JobSpec:
    """A drawn job scraped every 60 s: a 1,171 s stall ends with two steps, then a 102 s save that
    reports a sample later. The save came after the stall, and takes none of its time."""
    return JobSpec(nodes=(("gpu-node-a", 2),), interval_s=60.0, runs=(
        RunSpec(steps=1260, step_s=1.863915276878814, startup_s=333.1345227697245, compute=(0.4286, 0.45),
                data_wait=(0.1626, 0.0835), stall_after=1133, stall_s=1170.8612529240256, gap_s=460.54104828644944,
                release_s=26.284064524271727, pending_s=419.3506481564266, pull_s=189.8983287281233),),
        checkpoint_every=284, checkpoint_s=102.10670666293453, eval_every=482, eval_s=283.2272101257137,
        alloc_start=1748822400.0, pod_skew_s=(13.100529884477268,), schedule_s=300.0, keep_s=0.0,
        before_s=2598.2388388778195, after_s=0.5, jitter_s=10.246504169334958, phase_s=7.03655703310572,
        namespace="ml", name="llm-pretrain", telemetry=True, report_resumed_from=True, bystander=True,
        step_jitter=0.1, stale_step_gauges=True, seed=0)


def stall_edges() -> JobSpec:
    """A drawn job on two nodes scraped every 60 s with 9 s of jitter: a 600 s stall between
    steps, with no save near it. The samples on either side of the stall each hold one node's
    last (or first) step and the other node's silence: most of those samples is the stall."""
    return JobSpec(nodes=(("gpu-node-a", 1), ("gpu-node-b", 1)), interval_s=60.0, runs=(
        RunSpec(steps=356, step_s=2.320722410143498, startup_s=108.76577069775003, compute=(0.5418, 0.579),
                data_wait=(0.0001, 0.0), gap_s=444.9281247954814, release_s=53.63280359862333,
                pending_s=256.6916565655775, pull_s=62.36748376452601),
        RunSpec(steps=1051, step_s=2.4082134394281964, startup_s=205.41422676300618, compute=(0.6309, 0.7263),
                data_wait=(0.0193, 0.0241), stall_after=892, stall_s=600.0, gap_s=14.835715623542805,
                release_s=9.210332702258716, pending_s=0.0, pull_s=5.0)),
        checkpoint_every=520, checkpoint_s=84.09101073566733, eval_every=None, eval_s=163.9672964438023,
        alloc_start=1750255200.0, pod_skew_s=(5.960464477539063e-08, 18.19792897330873), schedule_s=250.9094300216338,
        keep_s=0.0, before_s=436.12059394731085, after_s=138.61923493122214, jitter_s=9.239223596700834,
        phase_s=55.09269311885595, namespace="ml", name="llm-pretrain", telemetry=True, report_resumed_from=True,
        bystander=False, step_jitter=0.1, stale_step_gauges=True, seed=102167)


def eval_reported_apart() -> JobSpec:
    """A drawn job on two nodes scraped every 15 s, 7.9 s apart: a 289 s evaluation ends, one
    node's report of it (spread over two bins of the grid) comes two bins before the other's.
    The whole gap is the evaluation's, not half of it a stall."""
    return JobSpec(nodes=(("gpu-node-a", 1), ("gpu-node-b", 1)), interval_s=15.0, runs=(
        RunSpec(steps=1991, step_s=1.8080972675248004, startup_s=227.86770910283389, compute=(0.5488, 0.6224),
                data_wait=(0.3816, 0.1646), gap_s=62.890907945397245, release_s=55.97813627552628,
                pending_s=241.75651128325245, pull_s=209.2657123969063),
        RunSpec(steps=1627, step_s=1.7198574417518593, startup_s=322.37423535063454, compute=(0.793, 0.7935),
                data_wait=(0.017, 0.029), new_pods=True, gap_s=173.83032115204412, release_s=3.7329834847258345,
                pending_s=77.62571551991188, pull_s=36.649086724150706)),
        checkpoint_every=748, checkpoint_s=61.42001645037132, eval_every=682, eval_s=289.08399221394774,
        alloc_start=1750028400.0, pod_skew_s=(1.401298464324817e-45, 1.224590867569151), schedule_s=30.0,
        keep_s=1595.9454861107981, before_s=1993.9038951405003, after_s=1975.0547227141062,
        jitter_s=1.0663474896434297, phase_s=7.893956804995198, namespace="ml", name="llm-pretrain", telemetry=True,
        report_resumed_from=True, bystander=False, step_jitter=0.1, stale_step_gauges=True, seed=11858)


def kept_after_exit() -> JobSpec:
    """A drawn job scraped every 60 s with 11 s of jitter: it exits at its last step and its pods
    hold the GPUs 8 minutes more. Its series go forget-after later: all of that time is no_process,
    none of it stalled (the last sample is dated from the earliest it can have been)."""
    return JobSpec(nodes=(("gpu-node-a", 4),), interval_s=60.0, runs=(
        RunSpec(steps=260, step_s=2.783474464984015, startup_s=49.72947243408238,
                compute=(0.8807, 0.804, 0.8929, 0.8304), data_wait=(0.0172, 0.0096, 0.0191, 0.0128), gap_s=30.0,
                release_s=12.625708761374542, pending_s=219.59294957618772, pull_s=121.4947764720003),),
        checkpoint_every=534, checkpoint_s=5.000000000000001, eval_every=None, eval_s=165.06879782091627,
        alloc_start=1748826000.0, pod_skew_s=(0.0,), schedule_s=171.51161876121475, keep_s=480.0,
        before_s=0.02, after_s=3115.579455924848, jitter_s=10.774824324997073, phase_s=28.978356480813584,
        namespace="ml", name="llm-pretrain", telemetry=True, report_resumed_from=True, bystander=True,
        step_jitter=0.1, stale_step_gauges=False, seed=65706980)


def hung_at_close() -> JobSpec:
    """A drawn job on two GPUs scraped every 15 s with 1.2 s of jitter: its last step is 10
    minutes before the window closes, the process hung since and its series still there. The
    grid's last points (a jittered scrape, the tail after the last point) read no holder, so the
    GPUs seem to go under 10 minutes after the last step; the series outlived --forget-after,
    so the process lived on: all of it is stalled, not a job ending."""
    return JobSpec(nodes=(("gpu-node-a", 2),), interval_s=15.0, runs=(
        RunSpec(steps=1402, step_s=2.566, startup_s=30.0, compute=(0.85, 0.8167), data_wait=(0.0, 0.0),
                stall_after=141, stall_s=600.0, hang_s=600.0),),
        checkpoint_every=484, checkpoint_s=5.0, eval_every=None, eval_s=100.0,
        alloc_start=1748822400.0, pod_skew_s=(1.457,), schedule_s=5.78, keep_s=0.0,
        before_s=186.76, after_s=0.0, jitter_s=1.2, phase_s=6.0, seed=0)


def closed_mid_sample() -> JobSpec:
    """A drawn job on four GPUs scraped every 60 s whose monitor closes with its last step, 8 s
    before its pod goes. The last step and the close fall in one 60 s sample, which holds the
    tail after the step: the ledger read a quarter of that sample as stalled (its share after
    the step times its share before the close), 59 GPU-seconds of a stall that never was."""
    return JobSpec(nodes=(("gpu-node-a", 4),), interval_s=60.0, runs=(
        RunSpec(steps=236, step_s=2.388, startup_s=565.47, compute=(0.654, 0.6415, 0.6284, 0.6028),
                data_wait=(0.0,) * 4, diverge_after=23),),
        checkpoint_every=258, checkpoint_s=68.88, eval_every=456, eval_s=44.51, alloc_start=1748822400.0,
        pod_skew_s=(7.559,), schedule_s=68.88, keep_s=0.0, before_s=810.65, after_s=1222.35, jitter_s=0.5,
        phase_s=33.933, bystander=True, saves_on_rank0=True, stale_step_gauges=False, seed=33149)


# Jobs drawn at random that once failed, each as it was drawn.
DRAWN = {case.__name__: case for case in (behind, evaluating, saved_after, stall_edges, eval_reported_apart,
                                           kept_after_exit, hung_at_close, closed_mid_sample)}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["restarted", "fresh_gauges", "hung", "hung_then_died", "forgotten", "single",
                                     "finished_saving", "recreated", "saved_by_rank_0", "blew_up",
                                     "resumed_far_back", *DRAWN])
# from an agent that exports its ranks' last-report times, and from one that does not
@pytest.mark.parametrize("heard", [True, False], ids=["last_report", "forget_after"])
def test_fixed_jobs_ledgers_match_their_truth(vm, variant, heard):
    spec = DRAWN[variant]() if variant in DRAWN else restarted()
    if variant == "fresh_gauges":  # the agent drops a restarted trainer's step gauges until its first step
        spec = replace(spec, stale_step_gauges=False)
    elif variant in ("hung", "hung_then_died"):
        # run 2 hangs until an eviction; the last run hangs until its pods go, or hangs 25 minutes,
        # dies (a collective's timeout) and leaves its pods holding the GPUs 20 minutes more
        runs = spec.runs
        spec = replace(spec, runs=(runs[0], replace(runs[1], hang_s=1200.0),
                                   replace(runs[2], release_s=2.0, hang_s=1500.0)),
                       keep_s=1200.0 if variant == "hung_then_died" else 0.0)
    elif variant == "forgotten":  # a restart in the same pods after more than forget-after
        spec = replace(spec, runs=(spec.runs[0], replace(spec.runs[1], gap_s=900.0), spec.runs[2]))
    elif variant == "recreated":
        # run 2 in pods re-created under the old names (as a PyTorchJob re-creates a failed pod), after
        # their GPUs were free 4 minutes: a pause in the pods' series shorter than the staleness bound
        spec = replace(spec, runs=(spec.runs[0], replace(spec.runs[1], new_pods=True, same_names=True, release_s=5.0,
                                                         pending_s=240.0, pull_s=30.0), spec.runs[2]))
    elif variant == "single":    # one run on 4 GPUs of one node that finishes and frees them at once
        spec = replace(spec, runs=(_run(steps=4000, world=4),), keep_s=0.0, nodes=(("gpu-node-a", 4),),
                       pod_skew_s=(0.0,), interval_s=30.0)
    elif variant == "finished_saving":
        # the last run ends as frameworks end training: a 40 s save and a 120 s evaluation after its
        # last step, then the pods free the GPUs 20 minutes later
        spec = replace(spec, runs=(*spec.runs[:2], replace(spec.runs[2], final_save=True)))
    elif variant == "saved_by_rank_0":
        # rank 0 alone saves, 90 s every 200 steps and once more after the last step, and evaluates,
        # while the other rank waits for it (nanoGPT's `if master_process:` block): the job was
        # blocked for each save and each evaluation
        spec = replace(spec, saves_on_rank0=True, evals_on_rank0=True, checkpoint_s=90.0, checkpoint_every=200,
                       runs=(*spec.runs[:2], replace(spec.runs[2], final_save=True)))
    elif variant == "blew_up":
        # run 2's model blows up at step 1600 (run 3 resumes from the step-1500 save before it:
        # run 2's steps after 1500 are lost progress, blown up or not) and run 3's at step 2101:
        # its last 600 steps trained nothing
        spec = replace(spec, runs=(spec.runs[0], replace(spec.runs[1], diverge_after=599),
                                   replace(spec.runs[2], diverge_after=600)))
    elif variant == "resumed_far_back":
        # run 1 blows up at step 301, before its first save, and steps on to 1500; run 2 starts
        # again from 0 in the same pods, where the agent holds run 1's step number, 1500, until
        # run 2's first step, and stops at 1000; run 3 resumes from its save at 500
        runs = spec.runs
        spec = replace(spec, runs=(replace(runs[0], diverge_after=300), replace(runs[1], steps=1000), runs[2]))
    case = in_slot(replace(spec, report_last_heard=heard))
    import_victoria(case, vm.url)
    doc, step = analyse(vm.url, case)
    check(doc, case, step)
    if variant == "resumed_far_back":
        assert [p.resumed_from for p in case.processes] == [0, 0, 500]
    if variant == "blew_up":
        assert case.truth.ledger["diverged"] > 0.4 and case.truth.ledger["lost_progress"] > 1.4
    if variant == "recreated":
        # The GPUs were sampled free while the pods were away: none of that is the job's. Each pod
        # hold's two edges are known to a scrape interval; the pause is 0.14 GPU-hours.
        edges_h = 2 * len(case.holds) * case.spec.interval_s / 3600
        assert the_job(doc, case)["gpu_hours"] == pytest.approx(sum(case.truth.held_s) / 3600, abs=edges_h)


@pytest.mark.slow
@pytest.mark.parametrize("hang_s, after_s", [(240.0, 900.0), (400.0, 900.0), (240.0, 0.0)],
                         ids=["short_hang_released", "hang_past_forget_after_released", "short_hang_at_close"])
def test_a_short_hang_is_stalled_by_the_last_report_times(vm, hang_s, after_s):
    """A hang shorter than the `stalled` detector's 10 minutes, ended with its pods. Its series
    outlive the pods by --forget-after, which says the process lived until they went; but where
    the window closes first, the series alone cannot tell that hang from an exit (the ledger of
    an agent without last-report times reads a job ending). The agent's time of each rank's
    last report can."""
    spec = replace(restarted(), runs=(_run(steps=2000, hang_s=hang_s, release_s=2.0),), keep_s=0.0,
                   after_s=after_s)
    case = in_slot(spec)
    assert case.truth.ledger["stalled"] > 0 and case.truth.ledger["no_process"] < 0.01, case.describe()
    import_victoria(case, vm.url)
    doc, step = analyse(vm.url, case)
    check(doc, case, step)
    older = in_slot(replace(spec, report_last_heard=False))
    import_victoria(older, vm.url)
    doc, step = analyse(vm.url, older)
    if after_s < FORGET_AFTER_S:
        ledger = the_job(doc, older)["ledger"]
        assert ledger["stalled"]["gpu_hours"] < 0.1 * older.truth.ledger["stalled"], ledger
    else:
        check(doc, older, step)


@pytest.mark.slow
@pytest.mark.parametrize("closed", [True, False], ids=["close_exported", "older_monitor"])
def test_gpus_let_go_seconds_after_a_closed_monitor_are_no_process(vm, closed):
    """One run on 2 GPUs scraped every second finishes, and its pods let the GPUs go 3 s after its
    last report, as the window closes: sooner than a living process's silence can be told from an
    ended one's (a keep-alive every 2 s, a sample late). Where that last report said the monitor
    closed, those seconds are `no_process`; from an older monitor or agent, the run reads as
    stepping on through them (docs/ledger.md)."""
    spec = replace(restarted(), runs=(_run(steps=300, step_s=1.0, startup_s=30.0),), keep_s=3.0,
                   nodes=(("gpu-node-a", 2),), pod_skew_s=(0.0,), interval_s=1.0, jitter_s=0.0, phase_s=0.3,
                   before_s=60.0, after_s=0.0, bystander=False, report_closed=closed)
    case = in_slot(spec)
    assert case.truth.ledger["no_process"] == pytest.approx(2 * 3.0 / 3600) and case.truth.ledger["stalled"] == 0
    import_victoria(case, vm.url)
    doc, step = analyse(vm.url, case)
    ledger = {c: v["gpu_hours"] for c, v in the_job(doc, case)["ledger"].items()}
    truth = case.truth.ledger
    check(doc, case, step)
    if closed:      # 4.3 of the 6 GPU-seconds; the rest at the window's end, within a sample
        assert ledger["no_process"] >= 0.5 * truth["no_process"] and ledger["stalled"] <= 0.0001, ledger
        assert ledger["productive"] == pytest.approx(truth["productive"], abs=0.0001)
    else:           # 0.1111 against 0.1102
        assert ledger["no_process"] == 0 and ledger["productive"] > truth["productive"] + 0.0005, ledger


@pytest.mark.slow
@pytest.mark.slow
def test_a_blown_up_loss_the_store_dropped_still_reads_as_diverged(vm):
    """A trainer's NaN loss is a sample Prometheus keeps and VictoriaMetrics drops: the rank's
    other series go on without it, which reads as not finite too."""
    spec = restarted()
    spec = replace(spec, runs=(*spec.runs[:2], replace(spec.runs[2], diverge_after=600)))
    case = in_slot(spec)
    case.series = [Series(s.name, s.labels, s.t[np.isfinite(s.v)], s.v[np.isfinite(s.v)])
                   if s.name == "burnrate_train_loss" else s for s in case.series]
    import_victoria(case, vm.url)
    doc, step = analyse(vm.url, case)
    check(doc, case, step)
    assert the_job(doc, case)["ledger"]["diverged"]["gpu_hours"] > 0.4


def test_without_resumed_from_lost_progress_is_null_not_zero(vm):
    case = in_slot(restarted(report_resumed_from=False))
    assert case.truth.ledger["lost_progress"] > 0
    import_victoria(case, vm.url)
    doc, step = analyse(vm.url, case)
    job = the_job(doc, case)
    assert isinstance(job.get("ledger"), dict), job.get("ledger_basis")
    assert job["ledger"]["lost_progress"] is None, (job["ledger"]["lost_progress"], case.describe())
    basis = (job.get("ledger_basis") or {}).get("lost_progress")
    assert isinstance(basis, str) and basis.strip(), job.get("ledger_basis")
    # Steps computed again cannot be told from the others, so the step categories may hold them:
    # together they lie between the truth's counted steps and those plus the lost ones.
    t = case.truth
    unit = edge_s(case) + max(0.0, step - case.spec.interval_s)
    margin = sum(tolerance(case, c, unit) for c in ("productive", "data_wait", "sync_wait"))
    stepped = sum(job["ledger"][c]["gpu_hours"] for c in ("productive", "data_wait", "sync_wait"))
    counted = sum(t.ledger[c] for c in ("productive", "data_wait", "sync_wait"))
    assert counted - margin <= stepped <= counted + t.ledger["lost_progress"] + margin, (stepped, counted, basis)
    assert [r.get("resumed_from") for r in job["runs"]] == [None] * len(case.processes), job["runs"]
    assert [r.get("last_step_number") for r in job["runs"]] == [p.last_step for p in case.processes]
    assert fleet_errors(doc, job) == []


@pytest.mark.slow
def test_without_telemetry_there_is_no_ledger(vm):
    case = in_slot(restarted(telemetry=False))
    assert not any(s.name.startswith("burnrate_train_") for s in case.series)
    import_victoria(case, vm.url)
    doc, _ = analyse(vm.url, case)
    job = the_job(doc, case)
    assert job["gpu_hours"] == pytest.approx(case.truth.gpu_hours, rel=0.01)
    assert job.get("ledger") is None and job.get("goodput") is None, (job.get("ledger"), job.get("goodput"))
    basis = job.get("ledger_basis") or {}
    assert isinstance(basis, dict) and isinstance(basis.get("ledger"), str) and basis["ledger"].strip(), basis
    # the fleet's ledger sums the training jobs': with the only one unknown, nothing reads as a known 0
    acc = doc["accounting"]
    assert acc.get("goodput") is None, acc.get("goodput")
    assert acc.get("ledger") is None and acc.get("training_jobs_without_ledger") == 1, acc


@pytest.mark.slow
@settings(max_examples=max(3, EXAMPLES // 5), deadline=None, derandomize=not os.environ.get("BURNRATE_RANDOM"),
          database=None, phases=PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=ledger_jobs())
def test_two_windows_holding_the_whole_job_give_the_same_ledger(vm, spec):
    case = in_slot(spec)
    import_victoria(case, vm.url)
    narrow, step = analyse(vm.url, case)
    wide, wide_step = analyse(vm.url, case, start=case.start - 5400.0, end=case.end + 3 * 3600.0)

    def entries(doc: dict) -> list[dict]:
        # whatever the analyzer makes of the job (one entry, or one per instance it sees), the same in both
        return [j for j in doc["jobs"] if j["namespace"] == spec.namespace
                and (j["training_job"] == spec.name or j["training_job"].startswith(spec.name + "@"))]

    a_all, b_all = entries(narrow), entries(wide)
    assert [j["training_job"] for j in a_all] == [j["training_job"] for j in b_all], case.describe()
    unit = edge_s(case) + max(0.0, max(step, wide_step) - case.spec.interval_s)
    per_edge = case.spec.world_size * unit / H
    # A save or an evaluation that ends within an edge of the job's window's end may have its
    # report in the wider window only (docs/ledger.md, Edges), as ledger_errors allows it.
    hidden = case.spec.world_size * unreported_s(case, unit) / H
    diffs = []
    for a, b in zip(a_all, b_all):
        if (a.get("ledger") is None) != (b.get("ledger") is None):
            diffs.append(f"{a['training_job']}: ledger {a.get('ledger')} vs {b.get('ledger')}")
            continue
        for c in CATEGORIES:
            x, y = (a["ledger"] or {}).get(c), (b["ledger"] or {}).get(c)
            # the windows differ only at their ends: one edge allowance at each
            allowed = 2 * per_edge + 1e-3 + (hidden if c in UNREPORTED else 0.0)
            if (x is None) != (y is None) or (x is not None and abs(x["gpu_hours"] - y["gpu_hours"]) > allowed):
                diffs.append(f"{a['training_job']} {c}: {x} in the job's window, {y} in the wider one")
        if [r.get("resumed_from") for r in a["runs"]] != [r.get("resumed_from") for r in b["runs"]]:
            diffs.append(f"runs {a['runs']} vs {b['runs']}")
    assert not diffs, "\n".join(diffs) + "\n" + case.describe()



def steady_cut(case: LedgerCase, where: float) -> float | None:
    """A time amid a run's steps, three edge allowances from its start and end and from any save,
    evaluation or stall, in steps no later run computes again (a window that ends before a
    restart cannot know them lost); None where the job has no such time."""
    margin = 3 * edge_s(case)
    times = []
    for k, p in enumerate(case.processes):
        busy = np.flatnonzero((p.ckpt > 0) | (p.evals > 0) | (p.stall > 0))
        spans = np.stack([p.step_end[busy], p.step_end[busy] + p.ckpt[busy] + p.evals[busy] + p.stall[busy]], axis=1)
        kept = p.global_step <= (case.processes[k + 1].resumed_from if k + 1 < len(case.processes) else np.inf)
        for t in p.step_begin[kept]:
            if p.first_begin + margin <= t <= p.step_end[-1] - margin and \
                    not ((spans[:, 0] < t + margin) & (spans[:, 1] > t - margin)).any():
                times.append(float(t))
    return times[int(where * len(times))] if times else None


@pytest.mark.slow
@settings(max_examples=max(3, EXAMPLES // 5), deadline=None, derandomize=not os.environ.get("BURNRATE_RANDOM"),
          database=None, phases=PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(spec=ledger_jobs(), where=st.floats(0.0, 1.0, exclude_max=True))
def test_a_job_cut_in_two_windows_costs_in_them_what_it_does_in_one(vm, spec, where):
    """A window that ends amid a run's steps, and one that opens there, hold between them the
    job's GPU-hours and every category of its ledger as one window over it all does."""
    case = in_slot(spec)
    cut = steady_cut(case, where)
    assume(cut is not None)
    import_victoria(case, vm.url)
    (whole, step), (before, step_a), (after, step_b) = (analyse(vm.url, case), analyse(vm.url, case, end=cut),
                                                        analyse(vm.url, case, start=cut))

    def entries(doc: dict) -> list[dict]:
        return [j for j in doc["jobs"] if j["namespace"] == spec.namespace
                and (j["training_job"] == spec.name or j["training_job"].startswith(spec.name + "@"))]

    def total(docs: list[dict], category: str | None) -> float | None:
        parts = [j["gpu_hours"] if category is None else ((j.get("ledger") or {}).get(category) or {}).get("gpu_hours")
                 for doc in docs for j in entries(doc)]
        return None if None in parts else sum(parts)

    assert all(entries(doc) for doc in (whole, before, after)), case.describe()
    unit = edge_s(case) + max(0.0, max(step, step_a, step_b) - case.spec.interval_s)
    allowed = 2 * case.spec.world_size * unit / H + 1e-3     # the cut is an edge of each part
    diffs = []
    for category in (None, *CATEGORIES):
        one, two = total([whole], category), total([before, after], category)
        if (one is None) != (two is None):
            diffs.append(f"{category}: {one} in one window, {two} in two")
        elif one is not None and abs(one - two) > allowed:
            diffs.append(f"{category or 'gpu_hours'}: {one:.4f} in one window, {two:.4f} in two (allowed {allowed:.4f})")
    assert not diffs, "\n".join(diffs) + f"\ncut at {cut - case.alloc_start:.0f} s after A0\n" + case.describe()
    # The window that closes amid the steps holds no time after them: its last sample's is theirs.
    cut_run = max(entries(before), key=lambda j: max(r["last_step"] or "" for r in j["runs"]))
    assert cut_run["ledger"]["no_process"]["gpu_hours"] == 0.0, case.describe()


@pytest.mark.slow
@pytest.mark.parametrize("share", [0.2, 0.8])
def test_a_window_that_opens_amid_a_stall_reads_the_rest_of_it_as_stalled(vm, share):
    """The first run's 900 s stall, cut `share` of the way in: the window that opens there holds
    the rest of it as `stalled`, and between them the two windows hold every other step category
    as one window does (how the first window reads the stall's start is docs/ledger.md's
    Liveness: it cannot tell a hang from a finish that soon after the last step)."""
    case = in_slot(restarted())
    run = case.processes[0]
    at = int(np.flatnonzero(run.stall > 0)[0])
    cut = float(run.step_end[at] + share * run.stall[at])
    import_victoria(case, vm.url)
    docs = [analyse(vm.url, case)[0], analyse(vm.url, case, end=cut)[0], analyse(vm.url, case, start=cut)[0]]
    whole, before, after = ({c: the_job(doc, case)["ledger"][c]["gpu_hours"] for c in CATEGORIES} for doc in docs)
    allowed = 2 * case.spec.world_size * edge_s(case) / H + 1e-3
    rest = case.spec.world_size * (run.step_end[at] + run.stall[at] - cut) / H
    assert after["stalled"] == pytest.approx(rest, abs=allowed), (after, rest)
    for c in ("productive", "data_wait", "sync_wait", "checkpoint", "evaluation", "lost_progress"):
        assert before[c] + after[c] == pytest.approx(whole[c], abs=allowed), (c, before, after, whole)

@pytest.mark.slow
def test_a_back_filled_prometheus_read_by_the_cli_gives_the_truth(tmp_path):
    case = generate(restarted())
    blocks = backfill_prometheus(case, tmp_path)
    with prometheus(tmp_path, storage=blocks) as prom:
        out = subprocess.run(
            [PYTHON, "-m", "burnrate", "analyze", "--prometheus", prom.url, "--start", f"{case.start:.3f}",
             "--end", f"{case.end:.3f}", "--scrape-interval", f"{case.spec.interval_s:g}", "--format", "json"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    check(doc, case, case.spec.interval_s)
