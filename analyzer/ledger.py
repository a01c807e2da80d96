"""The ledger (docs/ledger.md): every GPU-second a training job held, in one category.

The job's held seconds come per bin from the accounting (share-weighted, the same seconds
as its `gpu_hours`), so the categories add up to the job's GPU-hours by construction. Each
bin is given to the categories by what the job's ranks were doing:

- runs are told apart by their processes' start times (`start_time`): a process that
  started after the job's last run was already stepping begins the next run;
- before a run's first step the held time is `startup` (from the allocation for the first
  run, from the process's start for later ones), after a run's last step and before the next
  run's processes start it is `restart`, after the last run's last step it is `stalled`
  while the process is alive (its ranks still report, or its GPUs are busy above the idle
  utilization: a rank hung in a collective spins) and `no_process` once it is not;
- in between, each bin is split in proportion to the rank-seconds its counters grew by:
  compute, data wait, the rest of the step time (sync wait), checkpoint and evaluation. A
  bin whose counters did not grow takes the split of the bin that ends its gap (an
  evaluation or a slow step reports its time when it ends); a gap longer than
  `stalled.Config.interval_factor` usual step times, ended by steps alone, is a stall: its
  time beyond the usual step is `stalled`, and is taken out of the step time that reported it;
- steps a run completed after the step the next run resumed from (`global_step` against
  the next run's `resumed_from`) are `lost_progress`, their whole step time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from burnrate.exporter.ledger import NAMES, PRODUCTIVE

from .accounting import Accounting, holder_seconds
from .detectors.idle_gpu import Config as IdleConfig
from .detectors.stalled import Config as StalledConfig
from .views import Views

_I = {name: i for i, name in enumerate(NAMES)}
# The categories a step's own time is split into; a stall is taken out of them.
_STEP_PARTS = [_I[n] for n in ("productive", "data_wait", "sync_wait", "lost_progress")]


@dataclass(frozen=True)
class RunLedger:
    """One process lifetime of a job (all its ranks): what it did and what its time went to."""

    process_start: float | None       # unix seconds; None where the telemetry has no start time
    first_step: float | None
    last_step: float | None
    resumed_from: int | None
    last_step_number: int | None
    gpu_hours: dict[str, float]


@dataclass(frozen=True)
class Ledger:
    gpu_hours: dict[str, float | None]      # every category; None where it cannot be measured
    basis: dict[str, str] = field(default_factory=dict)     # category (or "ledger") -> why / what it holds
    runs: list[RunLedger] = field(default_factory=list)
    # category -> GPU-seconds per bin of the analysis grid, for drawing it over time
    timeline: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    gpus: float = 0.0                   # the most GPUs the job held at once
    start: float = 0.0                  # unix seconds: the job's first and last held sample
    end: float = 0.0
    saves: int = 0                      # checkpoints the job reported saving in the window
    save_seconds: float | None = None   # the loop's mean blocking time per save

    @property
    def restarts(self) -> int:
        return max(len(self.runs) - 1, 0)

    def goodput(self, gpu_hours: float) -> float | None:
        productive = self.gpu_hours.get(PRODUCTIVE)
        return productive / gpu_hours if productive is not None and gpu_hours > 0 else None


def job_ledgers(v: Views, accounting: Accounting, stalled: StalledConfig = StalledConfig(),
                idle_util_pct: float = IdleConfig().util_max_pct) -> dict[tuple[str, str], Ledger]:
    """The ledger of every job that sent training telemetry and held GPUs in the window."""
    alloc_rows = v.job_rows(v.alloc)
    out = {}
    for job, rows in v.job_rows(v.rank).items():
        if job in alloc_rows and accounting.cell_seconds.size:
            held = holder_seconds(v, accounting, alloc_rows[job])
            if held.sum() > 0:
                out[job] = _ledger(v, rows, held, _busy(v, alloc_rows[job], idle_util_pct), stalled)
    return out


def _busy(v: Views, rows: np.ndarray, idle_util_pct: float) -> np.ndarray:
    """(time,) whether any GPU the alloc rows hold runs above the idle utilization."""
    util = v.gpu.values.get("gpu_util")
    gpus = v.alloc.keys["gpu_row"].to_numpy()[rows]
    gpus = gpus[gpus >= 0]
    if util is None or not len(gpus):
        return np.zeros(v.n, bool)
    return (np.nan_to_num(util[gpus], nan=0.0) > idle_util_pct).any(axis=0)


def _ledger(v: Views, rows: np.ndarray, held: np.ndarray, busy: np.ndarray, stalled: StalledConfig) -> Ledger:
    rank = v.rank
    basis: dict[str, str] = {}

    def counter(name: str) -> np.ndarray:
        if name not in rank.values:
            return np.zeros((len(rows), v.n))
        return np.nan_to_num(rank.values[name][rows].astype(np.float64))

    for name, category in (("checkpoint_s", "checkpoint"), ("eval_s", "evaluation")):
        if name not in rank.values or not np.isfinite(rank.values[name][rows]).any():
            basis[category] = ("the telemetry has no such counter (an older agent or monitor): its time is "
                               "in the other categories of the steps around it")
    steps, step_s = counter("steps"), counter("step_s")
    wait, compute = counter("data_wait_s"), counter("compute_s")
    parts = np.zeros((len(NAMES), len(rows), v.n))
    parts[_I["data_wait"]], parts[_I["productive"]] = wait, compute
    parts[_I["sync_wait"]] = np.clip(step_s - compute - wait, 0.0, None)
    parts[_I["checkpoint"]], parts[_I["evaluation"]] = counter("checkpoint_s"), counter("eval_s")
    present = rank.present[rows]
    run_of, starts = _runs(v, rows, steps > 0)
    if starts == [None]:
        basis["restart"] = ("the telemetry has no process start times (an older monitor), so runs are not "
                            "told apart: a restart reads as a stall")
    gauge = {name: rank.values[name][rows] if name in rank.values else np.full((len(rows), v.n), np.nan)
             for name in ("global_step", "resumed_from", "last_step_time")}
    runs = [_run_facts(v, run_of == k, steps, gauge, start) for k, start in enumerate(starts)]

    seconds = np.zeros((len(NAMES), v.n))       # held seconds per bin, by category
    owner = np.full(v.n, -1)                    # the run each bin's seconds belong to
    lost_known = True
    pos = 0
    for k, run in enumerate(runs):
        cells = run_of == k
        begin = 0 if k == 0 else _bin(v, run["process_start"], pos)
        if k > 0:
            _assign(seconds, owner, held, pos, begin, "restart", k - 1)
            pos = max(pos, begin)
        if run["first"] is None:        # never stepped: start-up until the next run starts
            if k + 1 < len(runs):
                end = max(_bin(v, runs[k + 1]["process_start"], pos), pos)
                _assign(seconds, owner, held, pos, end, "startup", k)
                pos = end
            continue
        first = run["first"]
        if k == 0 and run["process_start"] is not None and run["process_start"] < v.start:
            # Already running when the window opened: its first bins are steps, not start-up.
            first = min(first, int(np.argmax(cells.any(axis=0))))
        _assign(seconds, owner, held, pos, first, "startup", k)
        nxt = runs[k + 1]["resumed_from"] if k + 1 < len(runs) else None
        if k + 1 < len(runs) and nxt is None:
            lost_known = False
        span = slice(first, run["last"] + 1)
        split = _step_split(np.where(cells[None], parts, 0.0)[:, :, span], steps[:, span] * cells[:, span],
                            gauge["global_step"][:, span], cells[:, span], nxt)
        usual = _usual_step(step_s[cells], steps[cells])
        _spread(seconds, owner, held, span, split, cells[:, span].sum(axis=0), usual, k, stalled.interval_factor,
                v.step)
        pos = run["last"] + 1
    if runs:
        # After the last run's last step (or, if it never stepped, its start), a process is alive
        # while its ranks report or it keeps the job's GPUs busy: a rank hung in a collective
        # spins its GPU after the agent has forgotten its silent series.
        last = len(runs) - 1
        alive = ((present & (run_of == last)).any(axis=0) | busy)[pos:]
        waiting = _I["startup"] if runs[last]["first"] is None else _I["stalled"]
        category = np.where(alive, waiting, _I["no_process"])
        seconds[category, np.arange(pos, v.n)] = held[pos:]
        owner[pos:] = last
    hours = {name: float(seconds[i].sum()) / 3600 for i, name in enumerate(NAMES)}
    if not lost_known:
        hours["lost_progress"] = None
        basis["lost_progress"] = ("a run restarted but the next run did not report the step it resumed from: "
                                  "steps computed again are counted as productive")
    for category in ("checkpoint", "evaluation"):
        if category in basis:
            hours[category] = None
    run_hours = [{name: float(seconds[i, owner == k].sum()) / 3600 for i, name in enumerate(NAMES)}
                 for k in range(len(runs))]
    held_bins = np.flatnonzero(held > 0)
    saves, save_seconds = _saves(v, rows, parts[_I["checkpoint"]], held_bins)
    return Ledger(hours, basis, [RunLedger(r["process_start"], r["first_time"], r["last_time"], r["resumed_from"],
                                           r["last_number"], h) for r, h in zip(runs, run_hours)],
                  {name: seconds[i] for i, name in enumerate(NAMES)}, gpus=float(held.max() / v.step),
                  start=float(v.time(held_bins[0])), end=float(v.time(held_bins[-1]) + v.step),
                  saves=saves, save_seconds=save_seconds)


def _saves(v: Views, rows: np.ndarray, checkpoint_s: np.ndarray, held_bins: np.ndarray) -> tuple[int, float | None]:
    """Checkpoints saved while the job held GPUs (each new `last_checkpoint_time`), and the
    loop's mean blocking seconds per save (every rank blocks for each save)."""
    times = v.rank.values.get("last_checkpoint_time")
    if times is None:
        return 0, None
    times = times[rows][:, held_bins[0]:held_bins[-1] + 1]
    saves = len(np.unique(times[np.isfinite(times) & (times >= v.time(held_bins[0]) - v.step)]))
    ranks = len(np.unique(v.rank.keys["rank"].to_numpy()[rows]))
    if not saves or checkpoint_s.sum() <= 0:
        return saves, None
    return saves, float(checkpoint_s.sum() / ranks / saves)


def _runs(v: Views, rows: np.ndarray, stepped: np.ndarray) -> tuple[np.ndarray, list[float | None]]:
    """Each cell's run (-1: none) and each run's earliest process start. A process that
    started once the run before was stepping begins a new run; ranks of one launch start
    before any of them steps."""
    values = v.rank.values.get("start_time")
    present = v.rank.present[rows]
    if values is None or not np.isfinite(values[rows]).any():
        return np.where(present, 0, -1), [None]
    start = values[rows]
    times = v.time(np.arange(v.n))
    distinct = np.unique(start[np.isfinite(start)])
    runs, cluster_of, first_step = [], {}, np.inf
    for s in distinct:
        if not runs or s > first_step:
            runs.append(float(s))
            first_step = np.inf
        cluster_of[s] = len(runs) - 1
        stepping = (start == s) & stepped
        if stepping.any():
            first_step = min(first_step, float(times[np.argmax(stepping.any(axis=0))]))
    run_of = np.full(start.shape, -1)
    for s, k in cluster_of.items():
        run_of[start == s] = k
    return run_of, runs


def _run_facts(v: Views, cells: np.ndarray, steps: np.ndarray, gauge: dict[str, np.ndarray],
               start: float | None) -> dict:
    stepping = (cells & (steps > 0)).any(axis=0)
    first = int(np.argmax(stepping)) if stepping.any() else None
    last = int(v.n - 1 - np.argmax(stepping[::-1])) if stepping.any() else None
    step_times = np.where(cells, gauge["last_step_time"], np.nan)
    resumed = np.where(cells, gauge["resumed_from"], np.nan)
    number = np.where(cells, gauge["global_step"], np.nan)
    return {"process_start": start, "first": first, "last": last,
            "first_time": _finite(np.nanmin, step_times[:, first]) if first is not None else None,
            "last_time": _finite(np.nanmax, step_times),
            "resumed_from": _int(_finite(np.nanmax, resumed)), "last_number": _int(_finite(np.nanmax, number))}


def _finite(reduce, values: np.ndarray) -> float | None:
    values = np.asarray(values, np.float64)
    return float(reduce(values)) if np.isfinite(values).any() else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def _bin(v: Views, t: float | None, default: int) -> int:
    if t is None:
        return default
    return int(np.clip(np.rint((t - v.start) / v.step), 0, v.n))


def _assign(seconds: np.ndarray, owner: np.ndarray, held: np.ndarray, lo: int, hi: int, category: str,
            run: int) -> None:
    if hi > lo:
        seconds[_I[category], lo:hi] = held[lo:hi]
        owner[lo:hi] = run


def _step_split(parts: np.ndarray, steps: np.ndarray, global_step: np.ndarray, cells: np.ndarray,
                resumed_next: int | None) -> np.ndarray:
    """(category, bin) rank-seconds of one run's stepping span, with the steps computed again
    after the next run's resume point moved to lost_progress."""
    split = parts.sum(axis=1)
    if resumed_next is None:
        return split
    number = np.where(cells, global_step, -np.inf).max(axis=0)
    number = np.maximum.accumulate(np.where(np.isfinite(number), number, -np.inf))
    ranks = np.maximum(cells.sum(axis=0), 1)
    made = steps.sum(axis=0) / ranks                     # steps per rank in each bin
    before = number - made
    with np.errstate(invalid="ignore", divide="ignore"):
        lost = np.clip((number - np.maximum(before, resumed_next)) / made, 0.0, 1.0)
    lost = np.where((made > 0) & np.isfinite(lost), lost, 0.0)
    step_parts = split[[_I["productive"], _I["data_wait"], _I["sync_wait"]]]
    split[_I["lost_progress"]] = step_parts.sum(axis=0) * lost
    split[[_I["productive"], _I["data_wait"], _I["sync_wait"]]] = step_parts * (1.0 - lost)
    return split


def _spread(seconds: np.ndarray, owner: np.ndarray, held: np.ndarray, span: slice, split: np.ndarray,
            ranks: np.ndarray, usual: float, run: int, stall_factor: float, step: float) -> None:
    """Give each held second of a stepping span to the categories, by its bin's split."""
    steps_time = split[_STEP_PARTS].sum(axis=0)
    apart = split[_I["checkpoint"]] + split[_I["evaluation"]]
    moved = steps_time + apart > 0
    n = len(moved)
    stall = np.zeros(n)                 # the share of each bin that is a stall
    idx = np.flatnonzero(moved)
    usual_mix = split[_STEP_PARTS].sum(axis=1)
    usual_mix = usual_mix / usual_mix.sum() if usual_mix.sum() > 0 else usual_mix
    jumps = np.diff(idx) > 1
    for lo, hi in zip(idx[:-1][jumps] + 1, idx[1:][jumps]):
        gap = (hi - lo) * step
        if apart[hi] > 0 or not usual or gap <= stall_factor * usual:
            continue        # an evaluation or a save ended it, or steps are this slow
        stall[lo:hi] = (gap - usual) / gap
        # The step that ended the stall reported the stall as its own time: take it back out of
        # the phases it swelled (a hang in a collective is sync wait, one in the loader data wait).
        body = split[_STEP_PARTS, hi]
        taken = min((gap - usual) * ranks[hi], body.sum())
        excess = np.clip(body - usual_mix * (body.sum() - taken), 0.0, None)
        if excess.sum() > 0:
            split[_STEP_PARTS, hi] = body - excess * (taken / excess.sum())
    # Bins whose counters did not move take the split of the bin that ends their gap.
    ahead = np.minimum.accumulate(np.where(moved, np.arange(n), n)[::-1])[::-1]
    ahead = np.minimum(ahead, n - 1)
    total = split.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(total > 0, split / total, 0.0)[:, ahead]
    h = held[span]
    seconds[:, span] = shares * (h * (1.0 - stall))
    seconds[_I["stalled"], span] += h * stall
    owner[span] = run


def _usual_step(step_s: np.ndarray, steps: np.ndarray) -> float:
    """Mean seconds per step (each rank counts every step, so the sums' ratio is per rank)."""
    made = steps.sum()
    return float(step_s.sum() / made) if made > 0 else 0.0
