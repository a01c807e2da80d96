"""Each detector on small hand-built frames: it fires on the fault, and stays quiet
on the healthy version of the same fleet."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from burnrate.exporter.recording import TABLES
from burnrate.analyzer.detectors import DETECTORS, DetectorConfig, Views, detect_all
from burnrate.analyzer.detectors import dataloader_starvation, diverging, gpu_error, idle_gpu, low_mfu, stalled
from burnrate.analyzer.detectors import straggler, thermal_throttle, unallocated_gpu
from burnrate.analyzer.detectors.findings import iso
from burnrate.analyzer.grid.views import last_counts, runs
from burnrate.analyzer.grid.frames import Frames, Window

T0 = 1_800_000_000.0
STEP = 15.0
N = 480                     # two hours
H100 = "NVIDIA H100 80GB HBM3"


def _uuid(host: str, gpu: int) -> str:
    return f"GPU-{host}-{gpu}"


class Fleet:
    """Builds Frames series by series: whole numpy columns, one row per sample."""

    def __init__(self, n: int = N) -> None:
        self.n = n
        self.t = T0 + np.arange(n) * STEP
        self.rows: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}

    def _add(self, table: str, labels: dict[str, str], values: dict[str, np.ndarray], mask=None) -> None:
        names, columns = TABLES[table]
        mask = np.ones(self.n, bool) if mask is None else np.asarray(mask, bool)
        data = {"t": self.t[mask]}
        for name in names:
            data[name] = labels.get(name, "")
        for name in columns:
            value = values.get(name, np.nan)
            data[name] = np.broadcast_to(np.asarray(value, np.float64), (self.n,))[mask]
        self.rows[table].append(pd.DataFrame(data))

    def gpu(self, host: str, gpu: int, util=95.0, up=1.0, clock=1980.0, throttle=0.0, model=H100) -> None:
        labels = {"gpu": str(gpu), "UUID": _uuid(host, gpu), "device": f"nvidia{gpu}", "modelName": model,
                  "Hostname": host}
        self._add("gpu", labels, {"gpu_util": util, "up": up, "sm_clock_mhz": clock, "throttle_reasons": throttle})

    def alloc(self, host: str, gpu: int, pod: str, job: str, namespace: str = "ml", share=1.0, mask=None) -> None:
        labels = {"gpu": str(gpu), "UUID": _uuid(host, gpu), "device": f"nvidia{gpu}", "modelName": H100,
                  "Hostname": host, "namespace": namespace, "pod": pod, "training_job": job}
        self._add("alloc", labels, {"share": share}, mask)

    def rank(self, job: str, rank: int, host: str, steps=10.0, step_s=10.0, wait_s=0.2, compute_s=8.0,
             loss=None, grad=None, mfu=0.45, tokens=40960.0, namespace: str = "ml", mask=None,
             checkpoint_s=None, eval_s=None) -> None:
        """Per-sample deltas in; the cumulative counters the agent exports out (a save's or an
        evaluation's only where given, as an older monitor exports neither)."""
        per = lambda v: np.broadcast_to(np.asarray(v, np.float64), (self.n,))  # noqa: E731
        steps_a = per(steps)
        values = {"steps": np.cumsum(steps_a), "step_s": np.cumsum(per(step_s)), "data_wait_s": np.cumsum(per(wait_s)),
                  "compute_s": np.cumsum(per(compute_s)), "tokens": np.cumsum(per(tokens)),
                  "samples": np.cumsum(steps_a * 8), "flops": np.cumsum(steps_a * 1e15), "mfu": mfu,
                  "loss": per(2.0) if loss is None else loss, "grad_norm": per(1.0) if grad is None else grad,
                  "world_size": 2.0, "last_step_time": np.maximum.accumulate(np.where(steps_a > 0, self.t, 0.0))}
        values.update({name: np.cumsum(per(v)) for name, v in (("checkpoint_s", checkpoint_s), ("eval_s", eval_s))
                       if v is not None})
        labels = {"namespace": namespace, "pod": f"{job}-{rank}", "training_job": job, "rank": str(rank),
                  "Hostname": host}
        self._add("rank", labels, values, mask)

    def node(self, host: str, instance_type: str = "p5.48xlarge", capacity: str = "on-demand", gpus: int = 8,
             model: str = H100) -> None:
        self._add("node", {"Hostname": host, "instance_type": instance_type, "capacity_type": capacity,
                           "zone": "us-east-1a", "gpu_model": model, "gpu_count": str(gpus)}, {"cpu_utilization": 0.3})

    def xid(self, host: str, gpu: int, code: int, counts: np.ndarray) -> None:
        labels = {"gpu": str(gpu), "UUID": _uuid(host, gpu), "device": f"nvidia{gpu}", "modelName": H100,
                  "Hostname": host, "xid": str(code)}
        self._add("xid", labels, {"count": counts}, counts > 0)

    def frames(self, rows_end_steps: bool = False) -> Frames:
        """Each row a sample standing from its time on, or (`rows_end_steps`) what a store answers at
        its time: the step before it (a counter's increase over it, the state at its end)."""
        tables = {}
        for name, (labels, columns) in TABLES.items():
            parts = self.rows[name]
            if parts:
                frame = pd.concat(parts, ignore_index=True).sort_values("t", kind="stable", ignore_index=True)
            else:
                frame = pd.DataFrame({"t": pd.Series(dtype="f8"), **{c: pd.Series(dtype="f8") for c in columns},
                                      **{n: pd.Series(dtype=str) for n in labels}})
            for label in labels:
                frame[label] = frame[label].astype("category")
            tables[name] = frame
        return Frames(Window(T0, T0 + (self.n - 1) * STEP), STEP, rows_end_steps=rows_end_steps, **tables)


def healthy_job(f: Fleet, job: str = "llm", host: str = "node-a", ranks: int = 4,
                per_rank: dict[int, dict] | None = None) -> None:
    f.node(host)
    for r in range(ranks):
        f.gpu(host, r)
        f.alloc(host, r, f"{job}-{r}", job)
        f.rank(job, r, host, **(per_rank or {}).get(r, {}))


def kinds(findings) -> list[str]:
    return sorted(f.kind for f in findings)


def test_healthy_job_has_no_findings():
    f = Fleet()
    healthy_job(f)
    assert detect_all(f.frames()) == []


def test_empty_window_gives_no_findings():
    empty = Fleet(n=0).frames()
    assert detect_all(empty) == []
    for detect in DETECTORS.values():
        assert detect(empty) == []


def test_runs_bridges_short_gaps_and_drops_short_runs():
    mask = np.array([[1, 1, 0, 1, 1, 0, 0, 0, 1]], bool)
    found = runs(mask, min_len=3, max_gap=1)
    assert [(r.start, r.end) for r in found] == [(0, 5)]
    assert [(r.start, r.end) for r in runs(mask, min_len=1)] == [(0, 2), (3, 5), (8, 9)]


def test_idle_gpu_fires_on_an_allocated_gpu_at_zero():
    f = Fleet()
    f.node("nb")
    f.gpu("nb", 0, util=0.0)
    f.alloc("nb", 0, "jupyter-0", "jupyter", namespace="notebooks")
    found = idle_gpu.detect(f.frames())
    assert kinds(found) == ["idle_gpu"]
    assert found[0].pod == "jupyter-0" and found[0].gpu == "0"
    assert found[0].wasted_gpu_hours == pytest.approx(N * STEP / 3600)


def test_an_episode_spans_what_its_samples_stand_for_raw_or_as_a_stores_points():
    f = Fleet()
    f.node("nb")
    util = np.full(N, 90.0)
    util[100:300] = 0.0        # 50 minutes: the samples of bins 100 to 299
    f.gpu("nb", 0, util=util)
    f.alloc("nb", 0, "svc-0", "svc")
    # A raw sample stands from its time to the next; a store's point for the step before it.
    [raw] = idle_gpu.detect(f.frames())
    assert (raw.start, raw.end) == (T0 + 100 * STEP, T0 + 300 * STEP)
    [points] = idle_gpu.detect(f.frames(rows_end_steps=True))
    assert (points.start, points.end) == (T0 + 99 * STEP, T0 + 299 * STEP)
    assert points.wasted_gpu_hours == raw.wasted_gpu_hours == pytest.approx(200 * STEP / 3600)


def test_idle_gpu_needs_sustained_idleness():
    f = Fleet()
    f.node("nb")
    util = np.full(N, 90.0)
    util[100:200] = 0.0        # 25 minutes: under the 30-minute default
    f.gpu("nb", 0, util=util)
    f.alloc("nb", 0, "svc-0", "svc")
    assert idle_gpu.detect(f.frames()) == []


def test_unallocated_gpu_and_its_waste():
    f = Fleet()
    f.node("spare")
    f.gpu("spare", 3, util=0.0)
    found = unallocated_gpu.detect(f.frames())
    assert [(x.hostname, x.gpu) for x in found] == [("spare", "3")]
    assert found[0].wasted_gpu_hours == pytest.approx(2.0)


def test_dataloader_starvation_from_telemetry_with_severity():
    for wait, severity in ((0.8, "warning"), (6.0, "critical")):
        f = Fleet()
        healthy_job(f, ranks=2, per_rank={r: {"wait_s": wait} for r in range(2)})
        found = dataloader_starvation.detect(f.frames())
        assert [(x.kind, x.severity) for x in found] == [("dataloader_starvation", severity)]
        assert found[0].evidence["data_wait_share"] == pytest.approx(wait / 10.0, rel=0.01)


def test_dataloader_starvation_below_five_percent_is_quiet():
    f = Fleet()
    healthy_job(f, ranks=2, per_rank={r: {"wait_s": 0.4} for r in range(2)})
    assert dataloader_starvation.detect(f.frames()) == []


def test_dataloader_starvation_from_sawtooth_without_telemetry():
    f = Fleet()
    f.node("n")
    saw = np.where(np.arange(N) % 4 == 0, 100.0, 3.0)
    for g in range(2):
        f.gpu("n", g, util=saw)
        f.alloc("n", g, f"etl-{g}", "etl")
        f.gpu("n", g + 2, util=95.0)
        f.alloc("n", g + 2, f"steady-{g}", "steady")
    found = dataloader_starvation.detect(f.frames())
    assert [(x.training_job, x.evidence["signal"][:3]) for x in found] == [("etl", "GPU")]


def test_straggler_names_rank_pod_node_and_gpu():
    f = Fleet()
    healthy_job(f, ranks=4, per_rank={2: {"compute_s": 11.0}})
    found = straggler.detect(f.frames())
    assert [(x.rank, x.pod, x.hostname, x.gpu) for x in found] == [(2, "llm-2", "node-a", "2")]
    assert found[0].evidence["slowdown"] == pytest.approx(11 / 8, rel=0.01)
    # Each interval the straggler computes 3 s longer, and all four ranks wait for it.
    assert found[0].wasted_gpu_hours == pytest.approx(3.0 * (N - 1) * 4 / 3600, rel=0.05)


def test_straggler_with_two_ranks_compares_with_the_other():
    f = Fleet()
    healthy_job(f, ranks=2, per_rank={1: {"compute_s": 10.0}})
    assert [x.rank for x in straggler.detect(f.frames())] == [1]


def test_straggler_without_telemetry_from_a_slower_clocked_gpu():
    f = Fleet()
    f.node("n")
    for g in range(4):
        f.gpu("n", g, util=100.0 if g == 1 else 80.0, clock=1500.0 if g == 1 else 1980.0)
        f.alloc("n", g, f"j-{g}", "j")
    found = straggler.detect(f.frames())
    assert [(x.gpu, x.pod) for x in found] == [("1", "j-1")]


def test_stalled_job_while_gpus_stay_allocated():
    f = Fleet()
    steps = np.where(np.arange(N) < 200, 10.0, 0.0)
    healthy_job(f, ranks=2, per_rank={r: {"steps": steps, "step_s": np.where(steps > 0, 10.0, 0.0)} for r in range(2)})
    found = stalled.detect(f.frames())
    assert kinds(found) == ["stalled"]
    assert found[0].start == pytest.approx(T0 + 199 * STEP)
    assert found[0].wasted_gpu_hours == pytest.approx(2 * (N - 199) * STEP / 3600, rel=0.02)


def _opening_at(frames: Frames, col: int) -> Frames:
    """The frames of a window that opens at sample `col`, with the counts before it a source gives."""
    start = T0 + col * STEP
    tables = {name: getattr(frames, name)[getattr(frames, name)["t"] >= start].reset_index(drop=True) for name in TABLES}
    return replace(frames, window=Window(start, frames.window.end), **tables,
                   rank_before=last_counts(frames.rank[frames.rank["t"] < start]))


def test_a_window_that_opens_amid_a_stall_finds_it_from_its_start():
    """No step in the window: the ranks' step time says when the job last stepped, and their
    counters' totals how long its steps took."""
    f = Fleet()
    steps = np.where(np.arange(N) < 200, 10.0, 0.0)
    healthy_job(f, ranks=2, per_rank={r: {"steps": steps, "step_s": np.where(steps > 0, 10.0, 0.0)} for r in range(2)})
    found = stalled.detect(_opening_at(f.frames(), 300))
    assert kinds(found) == ["stalled"]
    assert found[0].start == T0 + 300 * STEP and found[0].end == pytest.approx(T0 + N * STEP)
    assert found[0].evidence["last_step"] == iso(T0 + 199 * STEP) and found[0].evidence["usual_step_seconds"] == 1.0
    assert found[0].wasted_gpu_hours == pytest.approx(2 * (N - 300) * STEP / 3600, rel=0.02)


def test_a_window_that_opens_as_a_new_process_starts_up_does_not_date_a_stall_from_the_old_ones_step():
    """The step time a restarted trainer's ranks report until its first step is the previous
    process's: its 7.5-minute start-up in the window is no stall, however long ago that step was."""
    f = Fleet()
    steps = np.where((np.arange(N) < 200) | (np.arange(N) >= 330), 10.0, 0.0)
    healthy_job(f, ranks=2, per_rank={r: {"steps": steps} for r in range(2)})
    frames = f.frames()
    frames.rank["start_time"] = np.where(frames.rank["t"] >= T0 + 290 * STEP, T0 + 290 * STEP, T0)
    assert stalled.detect(_opening_at(frames, 300)) == []
    assert kinds(stalled.detect(frames)) == ["stalled"]      # seen whole, the silence since that step is one


def paused(begin: int, end: int, apart: str, live: bool) -> dict[str, np.ndarray]:
    """Steps stop over [begin, end) for a save or an evaluation (`apart`): its seconds reported
    as it goes (`live`), or all in the sample where it ends."""
    steps = np.full(N, 10.0)
    steps[begin:end] = 0.0
    seconds = np.zeros(N)
    if live:
        seconds[begin:end] = STEP
    else:
        seconds[end - 1] = (end - begin) * STEP
    return {"steps": steps, apart: seconds}


@pytest.mark.parametrize("live", [True, False], ids=["heard as it goes", "reported as it ends"])
@pytest.mark.parametrize("apart", ["checkpoint_s", "eval_s"])
def test_a_save_or_an_evaluation_longer_than_the_floor_is_no_stall(apart, live):
    """20 minutes without a step, the loop saving (or evaluating) throughout: that time is the
    ledger's `checkpoint` (`evaluation`), not a stall."""
    f = Fleet()
    healthy_job(f, ranks=2, per_rank={r: paused(200, 280, apart, live) for r in range(2)})
    assert stalled.detect(f.frames()) == []
    f = Fleet()
    healthy_job(f, ranks=2, per_rank={r: {"steps": paused(200, 280, apart, live)["steps"]} for r in range(2)})
    assert kinds(stalled.detect(f.frames())) == ["stalled"]       # the same silence, nothing said of it


def test_a_hang_after_an_evaluation_is_a_stall_from_its_end():
    f = Fleet()
    per_rank = paused(200, 240, "eval_s", live=False)
    per_rank["steps"][240:] = 0.0           # no step after it, to the window's end
    healthy_job(f, ranks=2, per_rank={r: per_rank for r in range(2)})
    [found] = stalled.detect(f.frames())
    assert found.evidence["last_step"] == iso(T0 + 199 * STEP)
    assert found.evidence["save_or_evaluation_ended"] == iso(T0 + 239 * STEP)
    assert found.start == pytest.approx(T0 + 239 * STEP)
    assert found.wasted_gpu_hours == pytest.approx(2 * (N - 239) * STEP / 3600, rel=0.02)


def test_a_restart_heard_from_its_monitors_creation_is_starting_up_not_stalled():
    """The old process's last step at bin 199; a new one starts at bin 210, heard from its monitor's
    creation on (with nothing counted), through a 22-minute start-up to its first step at bin 300."""
    f = Fleet()
    steps = np.where((np.arange(N) < 200) | (np.arange(N) >= 300), 10.0, 0.0)
    healthy_job(f, ranks=2, per_rank={r: {"steps": steps} for r in range(2)})
    frames = f.frames()
    frames.rank["start_time"] = np.where(frames.rank["t"] >= T0 + 210 * STEP, T0 + 210 * STEP, T0)
    assert stalled.detect(frames) == []
    frames.rank["start_time"] = T0                  # the same process all along: a hang
    assert kinds(stalled.detect(frames)) == ["stalled"]


def test_short_pause_is_not_a_stall():
    f = Fleet()
    steps = np.full(N, 10.0)
    steps[200:230] = 0.0        # 7.5 minutes, under the 10-minute floor
    healthy_job(f, ranks=2, per_rank={r: {"steps": steps} for r in range(2)})
    assert stalled.detect(f.frames()) == []


def test_stalled_idle_gpus_are_not_reported_again_as_idle():
    f = Fleet()
    f.node("n")
    steps = np.where(np.arange(N) < 100, 10.0, 0.0)
    for r in range(2):
        f.gpu("n", r, util=np.where(np.arange(N) < 100, 95.0, 0.0))
        f.alloc("n", r, f"llm-{r}", "llm")
        f.rank("llm", r, "n", steps=steps)
    frames = f.frames()
    assert "idle_gpu" in kinds(idle_gpu.detect(frames))
    assert kinds(detect_all(frames)) == ["stalled"]


def test_diverging_on_nan_loss():
    f = Fleet()
    loss = np.linspace(3.0, 2.0, N)
    loss[300:] = np.nan
    healthy_job(f, ranks=2, per_rank={r: {"loss": loss} for r in range(2)})
    found = diverging.detect(f.frames())
    assert [(x.kind, x.severity) for x in found] == [("diverging", "critical")]
    assert found[0].start == pytest.approx(T0 + 300 * STEP)
    assert found[0].to_dict()["evidence"]["loss_after"] == "nan"


def test_loss_never_reported_is_not_divergence():
    f = Fleet()
    loss = np.full(N, 2.0)
    loss[:50] = np.nan          # the gauge is unset until the first log step
    healthy_job(f, ranks=2, per_rank={r: {"loss": loss} for r in range(2)})
    assert diverging.detect(f.frames()) == []


def test_diverging_on_loss_spike_and_grad_norm_spike():
    f = Fleet()
    loss = np.full(N, 2.0)
    loss[300:] = 5.0
    healthy_job(f, ranks=2, per_rank={r: {"loss": loss} for r in range(2)})
    found = diverging.detect(f.frames())
    assert found and found[0].evidence["signals"] == ["loss_spike"]
    f = Fleet()
    grad = np.full(N, 1.0)
    grad[300:305] = 40.0
    healthy_job(f, ranks=2, per_rank={r: {"grad": grad} for r in range(2)})
    assert diverging.detect(f.frames())[0].evidence["signals"] == ["grad_norm_spike"]


def test_a_run_that_blows_up_after_one_healthy_report_is_diverging():
    """The level before the spike holds: a trailing mean that took in the blown-up
    values would call them normal after one report."""
    f = Fleet()
    loss = np.full(N, np.nan)
    loss[50] = 5.4
    loss[51:] = 80.0 + 50.0 * np.sin(np.arange(N - 51))      # finite, 30 to 130, never back
    healthy_job(f, ranks=2, per_rank={r: {"loss": loss} for r in range(2)})
    found = diverging.detect(f.frames())
    assert [x.evidence["signals"] for x in found] == [["loss_spike"]]
    assert found[0].start == pytest.approx(T0 + 51 * STEP)


def test_single_loss_blip_is_not_divergence():
    f = Fleet()
    loss = np.full(N, 2.0)
    loss[300] = 5.0
    healthy_job(f, ranks=2, per_rank={r: {"loss": loss} for r in range(2)})
    assert diverging.detect(f.frames()) == []


def test_one_report_held_over_several_steps_counts_once():
    """Read at a step finer than the trainers report, each report repeats into several
    bins with no step between: one spiked report is still one blip; three are a spike,
    dated at the first."""
    every = 5                                   # a report every fifth bin
    reported = np.arange(N) % every == 0
    steps = np.where(reported, 10.0, 0.0)

    def held(spiked_reports: int) -> np.ndarray:
        loss = np.full(N, 2.0) + np.repeat(np.arange(N // every) * 1e-4, every)   # each report its own value
        loss[300:300 + spiked_reports * every] = 5.0 + np.repeat(np.arange(spiked_reports), every)
        return loss

    f = Fleet()
    healthy_job(f, ranks=2, per_rank={r: {"loss": held(1), "steps": steps} for r in range(2)})
    assert diverging.detect(f.frames()) == []
    f = Fleet()
    healthy_job(f, ranks=2, per_rank={r: {"loss": held(3), "steps": steps} for r in range(2)})
    found = diverging.detect(f.frames())
    assert [x.evidence["signals"] for x in found] == [["loss_spike"]]
    assert found[0].start == pytest.approx(T0 + 300 * STEP)


def test_thermal_throttle_needs_the_bits_and_a_low_clock():
    f = Fleet()
    f.node("n")
    hot = np.arange(N) >= 200
    f.gpu("n", 0, clock=np.where(hot, 1300.0, 1980.0), throttle=np.where(hot, 0x40, 0))
    f.gpu("n", 1, clock=1980.0, throttle=0x20)           # bit set but full clock: no cost
    f.gpu("n", 2, clock=np.where(hot, 1300.0, 1980.0), throttle=np.where(hot, 0x4, 0))   # power cap
    f.gpu("n", 3)
    f.alloc("n", 0, "llm-0", "llm")
    found = thermal_throttle.detect(f.frames())
    assert [(x.gpu, x.pod, x.training_job) for x in found] == [("0", "llm-0", "llm")]
    assert found[0].evidence["throttle_reasons"] == ["0x40"]


def test_gpu_error_from_xid_and_lost_gpu():
    f = Fleet()
    f.node("n")
    up = np.where(np.arange(N) >= 400, 0.0, 1.0)
    f.gpu("n", 0, up=up)
    f.gpu("n", 1)
    f.alloc("n", 0, "llm-0", "llm")
    counts = np.where(np.arange(N) >= 100, 1.0, 0.0) + np.where(np.arange(N) >= 400, 1.0, 0.0)
    f.xid("n", 1, 13, counts)
    f.xid("n", 0, 79, np.where(np.arange(N) >= 400, 1.0, 0.0))
    found = sorted(gpu_error.detect(f.frames()), key=lambda x: (x.gpu, x.start))
    assert [(x.gpu, x.severity) for x in found] == [("0", "critical"), ("1", "warning"), ("1", "warning")]
    assert found[0].evidence["xid_events"] == {"79": 1}
    assert found[0].wasted_gpu_hours == pytest.approx(80 * STEP / 3600)


def test_low_mfu_below_the_floor_only():
    f = Fleet()
    healthy_job(f, ranks=2, per_rank={r: {"mfu": 0.08} for r in range(2)})
    found = low_mfu.detect(f.frames())
    assert [(x.kind, x.severity) for x in found] == [("low_mfu", "critical")]
    assert found[0].wasted_gpu_hours == pytest.approx(found[0].evidence["gpu_hours"] * (1 - 0.08 / 0.25))
    f = Fleet()
    healthy_job(f, ranks=2)
    assert low_mfu.detect(f.frames()) == []
    assert low_mfu.detect(f.frames(), low_mfu.Config(floor=0.5))


def test_config_thresholds_are_honoured_through_detect_all():
    f = Fleet()
    healthy_job(f, ranks=2, per_rank={r: {"wait_s": 0.8} for r in range(2)})
    frames = f.frames()
    assert kinds(detect_all(frames)) == ["dataloader_starvation"]
    strict = replace(DetectorConfig(), dataloader_starvation=dataloader_starvation.Config(warning_share=0.2))
    assert detect_all(frames, strict) == []


def test_views_are_shared_and_frames_untouched():
    f = Fleet()
    healthy_job(f)
    frames = f.frames()
    before = frames.rank.copy()
    views = Views(frames)
    assert views.rank is views.rank
    detect_all(views)
    pd.testing.assert_frame_equal(frames.rank, before)


def test_every_finding_serializes_with_the_contract_fields():
    f = Fleet()
    f.node("n")
    f.gpu("n", 0, util=0.0)
    f.alloc("n", 0, "nb-0", "nb")
    d = idle_gpu.detect(f.frames())[0].to_dict()
    assert list(d) == ["kind", "severity", "namespace", "training_job", "Hostname", "gpu", "pod", "rank", "start",
                       "end", "wasted_gpu_hours", "wasted_dollars", "evidence", "recommendation"]
    assert d["start"].endswith("Z") and d["recommendation"].endswith(".")
    assert not any(isinstance(v, float) and math.isnan(v) for v in d["evidence"].values())


def _owned(frames: Frames, **owners: str) -> Frames:
    """The frames with pod -> controller kind, as kube-state-metrics reports them."""
    rows = [("ml", pod, kind, pod) for pod, kind in owners.items()]
    return replace(frames, owners=pd.DataFrame(rows, columns=["namespace", "pod", "owner_kind", "owner_name"]))


def test_a_server_using_a_fifth_of_its_gpus_is_underused_and_its_sawtooth_is_not_starvation():
    f = Fleet()
    f.node("node-a")
    rng = np.random.default_rng(0)
    for g in range(2):
        # Traffic in five-minute bursts at 40%, near 0% between: a fifth on average, two GPUs for two hours.
        f.gpu("node-a", g, util=np.where(np.arange(N) % 40 < 20, 40.0, 0.5) + rng.uniform(0, 1, N))
        f.alloc("node-a", g, "chat-7d9f-x2k4q", "chat")
    found = detect_all(_owned(f.frames(), **{"chat-7d9f-x2k4q": "Deployment"}))
    [under] = [x for x in found if x.kind == "underused_gpu"]
    assert not [x for x in found if x.kind == "dataloader_starvation"]
    assert under.training_job == "chat" and under.gpu == "0,1" and under.evidence["class"] == "serving"
    assert under.evidence["mean_util_pct"] == pytest.approx((40.5 + 1.0) / 2, abs=0.5)
    assert under.wasted_gpu_hours == pytest.approx(4.0 * (1 - under.evidence["mean_util_pct"] / 60.0))
    assert "MIG" in under.recommendation


def test_a_training_job_at_low_utilization_is_not_called_underused():
    f = Fleet()
    healthy_job(f)
    for g in range(4):
        f.rows["gpu"][g]["gpu_util"] = 15.0
    assert "underused_gpu" not in kinds(detect_all(f.frames()))


def test_a_starving_jobs_low_mfu_does_not_count_its_waste_twice():
    f = Fleet()
    healthy_job(f, per_rank={r: {"wait_s": 7.0, "compute_s": 2.5, "mfu": 0.08} for r in range(4)})
    found = {x.kind: x for x in detect_all(f.frames())}
    starving, low = found["dataloader_starvation"], found["low_mfu"]
    assert low.evidence["waste_counted_under"] == ["dataloader_starvation"]
    assert low.wasted_gpu_hours == pytest.approx(max(low.evidence["gross_wasted_gpu_hours"]
                                                     - starving.wasted_gpu_hours, 0.0))
    held = 4 * (N * STEP) / 3600
    assert starving.wasted_gpu_hours + low.wasted_gpu_hours <= held
