"""The ledger (docs/ledger.md): every GPU-second a training job held, in one category.

The job's held seconds come per bin from the accounting (share-weighted, the same seconds
as its `gpu_hours`), so the categories add up to the job's GPU-hours by construction. Each
bin is given to the categories by what the job's ranks were doing:

- runs are told apart by their processes' start times (`start_time`): a process that
  started after the job's last run was already stepping begins the next run;
- before a run's first step the held time is `startup` (from the allocation for the first
  run, from the process's start for later ones), after a run's last step and before the next
  run's processes start it is `restart`, after the last run's last step it is `stalled`
  while its process lives and `no_process` after (a process reports while it lives, and the
  agent exports when it last heard each rank and when a rank's last message said its monitor
  closed, after which the process trains no more; from an agent that does not, ranks whose series
  vanish while the job still holds its GPUs stopped reporting its --forget-after before they
  went);
- in between, the held time is split in proportion to the rank-seconds the run's counters
  grew by: compute, data wait, the rest of the step time (sync wait), checkpoint and
  evaluation. The split is over the run's whole stretch of steps (and, apart and in their
  place, over its steps on a blown-up model and those computed again), not sample by sample:
  a save or an evaluation reports its time only when it ends, often a sample or more after it
  began. A save or an evaluation counts on every rank for as long as its slowest rank
  reported it (grid.apart): the others' wait, which they report as step time, is taken back
  out of their steps;
- a stretch of samples that report nothing new for longer than `stalled.Config.interval_factor`
  usual step times is a stall: its time beyond the usual step and beyond the save or
  evaluation that ended it is `stalled`, and is taken back out of the step time that
  reported it. Samples missing altogether (a late scrape) are not a stall;
- steps a run completed after the step the next run resumed from (`global_step` against
  the next run's `resumed_from`) are `lost_progress`, their whole step time; of the others,
  those a rank reported a loss or gradient norm that was not finite with (the model had blown
  up: detectors.diverging.non_finite) are `diverged`, their whole step time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from burnrate.exporter.ledger import COUNTED, NAMES, PRODUCTIVE
from burnrate.exporter.telemetry import FORGET_AFTER_S, KEEPALIVE_S

from .accounting import Accounting, holder_seconds
from ..detectors.diverging import non_finite
from ..detectors.stalled import Config as StalledConfig
from ..grid.apart import CATEGORIES as APART, Stretch, reach, stretches
from ..grid.views import Grid, Views

_I = {name: i for i, name in enumerate(NAMES)}
# The categories a step's own time is split into; a stall is taken out of them.
_STEP_PARTS = [_I[n] for n in ("productive", "data_wait", "sync_wait", "lost_progress", "diverged")]
# The categories of time apart from the steps (saves, evaluations).
_APART = [_I[n] for n in APART]


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
    # category -> GPU-seconds per bin of `step` seconds from `start`, for drawing it over
    # time: only the categories that hold any, over the job's own stretch (a fleet's week of
    # jobs kept on the whole grid in float64 would be most of a gigabyte)
    timeline: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    gpus: float = 0.0                   # the most GPUs the job held at once
    start: float = 0.0                  # unix seconds: the job's first and last held sample
    end: float = 0.0
    saves: int = 0                      # checkpoints the job reported saving in the window
    save_seconds: float | None = None   # the loop's mean blocking time per save
    step: float = 0.0                   # the seconds of the grid the ledger was measured on

    @property
    def restarts(self) -> int:
        return max(len(self.runs) - 1, 0)

    def binned(self, category: str, start: float, step: float, n: int) -> np.ndarray:
        """The category's GPU-seconds in each of `n` bins of `step` seconds, bin k beginning at
        `start + k·step` (Views.begins' bins): on the grid the ledger was measured on, its own
        bins; on a coarser grid, the sums of the bins that begin within each."""
        part = self.timeline.get(category)
        if part is None or not len(part):
            return np.zeros(n)
        begins = self.start + self.step * np.arange(len(part))
        at = np.floor((begins - start) / step + 1e-6).astype(np.int64)
        inside = (at >= 0) & (at < n)
        return np.bincount(at[inside], weights=part[inside].astype(np.float64), minlength=n)

    def process_end(self) -> float | None:
        """When the job's last process ended while its GPUs were still held, to the ledger's bin:
        where the first bin that holds `no_process` time begins, so that what came before it
        and what came after it share no bin. None where no GPU was held after the process."""
        gone = self.timeline.get("no_process")
        if gone is None or not gone.any():
            return None
        return self.start + self.step * int(np.argmax(gone > 0))

    def gpus_after_exit(self) -> float:
        """The most GPUs the job held at once after its last process ended."""
        gone = self.timeline.get("no_process")
        return float(gone.max()) / self.step if gone is not None and len(gone) and self.step > 0 else 0.0

    def goodput(self, gpu_hours: float) -> float | None:
        productive = self.gpu_hours.get(PRODUCTIVE)
        return productive / gpu_hours if productive is not None and gpu_hours > 0 else None


def job_ledgers(v: Views, accounting: Accounting, stalled: StalledConfig = StalledConfig()) -> dict[tuple[str, str], Ledger]:
    """The ledger of every job that sent training telemetry and held GPUs in the window."""
    alloc_rows = v.job_rows(v.alloc)
    out = {}
    for job, rows in v.job_rows(v.rank).items():
        if job in alloc_rows and accounting.cell_seconds.size:
            held = holder_seconds(v, accounting, alloc_rows[job])
            if held.sum() > 0:
                out[job] = _ledger(v, rows, held, stalled)
    return out


def _ledger(v: Views, rows: np.ndarray, held: np.ndarray, stalled: StalledConfig) -> Ledger:
    rank = v.rank
    basis: dict[str, str] = {}

    widened: dict[str, np.ndarray] = {}

    def counter(name: str) -> np.ndarray:
        """The job's increases of a counter, float64, 0 where unknown; read-only, as categories
        share their counters."""
        if name not in widened:
            widened[name] = (np.nan_to_num(rank.values[name][rows].astype(np.float64)) if name in rank.values
                             else np.zeros((len(rows), v.n)))
            widened[name].flags.writeable = False
        return widened[name]

    steps, step_s = counter("steps"), counter("step_s")
    # Each counted category's rank-seconds, from the definitions the recording rules use too.
    parts = np.zeros((len(NAMES), len(rows), v.n))
    for category in COUNTED:
        if any(name not in rank.values or not np.isfinite(rank.values[name][rows]).any()
               for name, _ in category.counters):
            basis[category.name] = ("the telemetry has no counter for it (an older agent or monitor): its time is "
                                    "in the other categories of the steps around it")
        np.clip(sum(sign * counter(name) for name, sign in category.counters), 0.0, None, out=parts[_I[category.name]])
    present = rank.present[rows]
    blown = non_finite(v, rows)
    if not any(name in rank.values and (~np.isnan(rank.values[name][rows])).any() for name in ("loss", "grad_norm")):
        basis["diverged"] = ("its ranks report no loss or gradient norm, so steps that trained a model already blown "
                             "up cannot be told from the others: they are in productive, data_wait and sync_wait")
    run_of, starts = _runs(v, rows, steps > 0)
    if starts == [None]:
        basis["restart"] = ("the telemetry has no process start times (an older monitor), so runs are not "
                            "told apart: a restart reads as a stall")
    gauge = {name: rank.values[name][rows] if name in rank.values else np.full((len(rows), v.n), np.nan)
             for name in ("global_step", "resumed_from", "last_step_time")}
    runs = [_run_facts(v, run_of == k, steps, gauge, start) for k, start in enumerate(starts)]

    # When each bin's samples were seen, and the time they stand for (a raw sample's from its
    # time on, a step's point the step before it: Views.begins). A stretch of time takes the
    # part of each bin's held seconds that it covers.
    seen = v.time(np.arange(v.n))
    lo = seen - v.lag
    hi = lo + v.step

    def cover(t0: float, t1: float) -> np.ndarray:
        return np.clip((np.minimum(hi, t1) - np.maximum(lo, t0)) / v.step, 0.0, 1.0)

    seconds = np.zeros((len(NAMES), v.n))       # held seconds per bin, by category
    per_run = np.zeros((len(runs), len(NAMES)))
    lost_known = True

    def give(category: str, run: int, t0: float, t1: float) -> None:
        part = held * cover(t0, t1)
        seconds[_I[category]] += part
        per_run[run, _I[category]] += part.sum()

    cursor = -np.inf                    # where the time not yet given away begins
    after_last: dict[str, float] = {}   # seconds of saves and evaluations after the last run's last step
    unheld = 0.0                        # GPU-seconds of start-up, process start to first step, no one held
    # The job's last bin with held time, where that is the window's last with data (a grid's
    # final points may lie past the window's end, or past its last scrape: a sample's slack):
    # -1 where it let its GPUs go before.
    closing = int(np.flatnonzero(held > 0)[-1]) if (held > 0).any() else -1
    if closing >= 0 and seen[closing] + 2 * v.step <= v.frames.window.end:
        closing = -1
    heard, closed = (_latest(rank, name, rows) for name in ("last_report_time", "closed_time"))
    # Every rank of the last run said in its last message that its monitor closed: it trains no
    # more, whatever its process's exit takes.
    ended = bool(runs) and _closed(heard, closed, (present & (run_of == len(runs) - 1)).any(axis=1))
    for k, run in enumerate(runs):
        cells = run_of == k
        start = cursor if k == 0 or run["process_start"] is None else max(run["process_start"], cursor)
        if k > 0:
            give("restart", k - 1, cursor, start)
        if run["first"] is None:        # never stepped: start-up until the next run starts
            if k + 1 < len(runs):
                end = max(runs[k + 1]["process_start"] or start, start)
                give("startup", k, start, end)
                cursor = end
            else:
                cursor = start
            continue
        usual = _usual_step(step_s[cells], steps[cells])
        last = max(run["last_time"] or seen[run["last"]], start)
        if k == len(runs) - 1 and closing >= 0 and not ended and \
                (cells & present)[:, max(closing - 1, 0):closing + 1].any():
            taken, slack = _last_samples(v, rank, rows, cells & present, closing)
            if seen[taken] - last < max(stalled.interval_factor * usual, slack) + slack:
                # Still stepping when the window closes (a sample's slack: a rank's scrape may
                # come after the window's end): its last step is under way, through the time its
                # last sample holds for.
                last = hi[closing]
        # The first steps began as long before they reported as the time they report (or, in a
        # series' first sample, which has no increase to read, as their number of usual steps).
        reported = parts[:, cells[:, run["first"]], run["first"]].sum(axis=0)
        took = float(reported.max()) if len(reported) and reported.max() > 0 else usual * _steps_in(
            gauge, cells, run["first"], run["resumed_from"])
        begin = min(max((run["first_time"] or seen[run["first"]]) - took, start), last)
        # A rank's series begins with its first message (from an older monitor, after its first
        # steps): that alone does not make a run that started inside the window one that was
        # stepping before it.
        opened_stepping = k == 0 and (run["process_start"] is None or run["process_start"] < v.start) and \
            _stepping_at_first_sample(cells, gauge, run["resumed_from"])
        if opened_stepping:
            begin = start       # already past its first step when the window opened
        elif np.isfinite(begin) and run["first_time"] is not None and run["first_time"] > begin:
            # The first report's steps split the held time only as far as their time was held:
            # where a GPU is held from the rank's first message on (attribution by ranks), as
            # far as that came before them.
            first = cells[:, run["first"]]
            parts[:, first, run["first"]] *= _held_share(held, cover, begin, run["first_time"], v.step)
        run["first_step"] = begin + usual if np.isfinite(begin) else run["first_time"]
        give("startup", k, start, begin)
        if run["process_start"] is not None and np.isfinite(begin):
            unheld += _unheld(held, cover, max(run["process_start"], float(lo[0])), begin, v.step)
        nxt = runs[k + 1]["resumed_from"] if k + 1 < len(runs) else None
        if k + 1 < len(runs) and nxt is None:
            lost_known = False
        span = slice(run["first"], min(run["last"] + 2, v.n))    # a sample late at most: the last report
        mine = parts[:, :, span] * cells[None, :, span]
        if k == len(runs) - 1:
            # A save or an evaluation reported after the last run's last step (a framework's final
            # ones) came after it: the held time that follows the step is theirs, not the steps',
            # for as long as each blocked the job.
            after = slice(run["last"] + 1, v.n)
            for category in APART:
                mine[_I[category], :, after.start - span.start:] = 0.0
                after_last[category] = sum(s.seconds for s in stretches(
                    parts[_I[category], :, after] * cells[:, after], (cells & present)[:, after]))
        split = _step_split(mine, steps[:, span] * cells[:, span], gauge["global_step"][:, span], cells[:, span], nxt,
                            blown[:, span])
        blocked = [(_I[category], s) for category in APART
                   for s in stretches(mine[_I[category]], (cells & present)[:, span])]
        done = _spread(held * cover(begin, last), span, split, cells[:, span].sum(axis=0),
                       (cells & present)[:, span].any(axis=0), blocked, usual, stalled.interval_factor, v.step,
                       opened_stepping)
        seconds += done
        per_run[k] += done.sum(axis=1)
        cursor = last
    if runs:
        # After the last run's last step (or, if it never stepped, its start), the held time is
        # that of the saves and evaluations its ranks reported after it, then `stalled`
        # (`startup`) while the process lives and `no_process` after it ended.
        last = len(runs) - 1
        for category, took in after_last.items():
            give(category, last, cursor, cursor + took)
            cursor += took
        tail = held * cover(cursor, np.inf)
        reporting = present & (run_of == last)
        alive = _alive(v, reporting, _last_samples(v, rank, rows, reporting, v.n - 1), heard, ended, tail, cursor,
                       cover, lo, seen, _usual_step(step_s[run_of == last], steps[run_of == last]), stalled)
        waiting = _I["startup"] if runs[last]["first"] is None else _I["stalled"]
        for category, share in ((waiting, alive), (_I["no_process"], 1.0 - alive)):
            seconds[category] += tail * share
            per_run[last, category] += (tail * share).sum()
    hours = {name: float(seconds[i].sum()) / 3600 for i, name in enumerate(NAMES)}
    if unheld > 0:
        basis["startup"] = (f"its GPUs were not held for {unheld:,.0f} GPU-seconds of its runs' start-up, from their "
                            "processes' start to their first steps, so that time is in no job's: an agent without a "
                            "kubelet holds a GPU from its rank's first message, which its monitor sends as it is "
                            "created (an older monitor: after its first step)")
    if not lost_known:
        hours["lost_progress"] = None
        basis["lost_progress"] = ("a run restarted but the next run did not report the step it resumed from: "
                                  "steps computed again are counted as productive")
    for name in (*(c.name for c in COUNTED), "diverged"):
        if name in basis:
            hours[name] = None
    run_hours = [{name: float(per_run[k, i]) / 3600 for i, name in enumerate(NAMES)} for k in range(len(runs))]
    held_bins = np.flatnonzero(held > 0)
    saves, save_seconds = _saves(v, rows, parts[_I["checkpoint"]], held_bins)
    return Ledger(hours, basis, [RunLedger(r["process_start"], r["first_step"], r["last_time"], r["resumed_from"],
                                           r["last_number"], h) for r, h in zip(runs, run_hours)],
                  {name: seconds[i, held_bins[0]:held_bins[-1] + 1].astype(np.float32)
                   for i, name in enumerate(NAMES) if seconds[i].any()}, gpus=float(held.max() / v.step),
                  start=float(lo[held_bins[0]]), end=float(hi[held_bins[-1]]),
                  saves=saves, save_seconds=save_seconds, step=v.step)


def _held_share(held: np.ndarray, cover: Callable[[float, float], np.ndarray], t0: float, t1: float,
                step: float) -> float:
    """The share of [t0, t1) the job's GPUs (as many as it held at most) were held."""
    gpus = float(held.max()) / step
    return min(float((held * cover(t0, t1)).sum()) / (gpus * (t1 - t0)), 1.0) if gpus > 0 else 0.0


def _unheld(held: np.ndarray, cover: Callable[[float, float], np.ndarray], t0: float, t1: float, step: float) -> float:
    """GPU-seconds of [t0, t1) that the job's GPUs (as many as it held at most) were not held,
    beyond a sample at each end (what an edge is known to); 0 where it held them."""
    gpus = float(held.max()) / step
    missing = gpus * (t1 - t0) - float((held * cover(t0, t1)).sum())
    return missing if missing > 2 * step * gpus else 0.0


def _latest(rank: Grid, name: str, rows: np.ndarray) -> np.ndarray:
    """Each of `rows`' last value of a column read at its series' last sample (Grid.latest); NaN
    where it is not exported."""
    values = rank.latest.get(name)
    return values[rows] if values is not None else np.full(len(rows), np.nan)


def _closed(heard: np.ndarray, closed: np.ndarray, ranks: np.ndarray) -> bool:
    """Whether the last message the agent heard from each of `ranks` (a mask of the job's rows)
    said its monitor closed: `heard`, when it heard each last, `closed`, when it heard each close
    (NaN: not exported, or never)."""
    known = np.isfinite(heard) & ranks
    return bool(known.any() and (closed[known] >= heard[known]).all())


def _last_samples(v: Views, rank: Grid, rows: np.ndarray, cells: np.ndarray, until: int) -> tuple[int, float]:
    """The last bin up to `until` where one of `cells` (the job's `rows`) has a sample taken
    there, not one held over from an earlier bin (Grid.sampled; `until` where there is none), and
    how late a sample of theirs may come: the grid's step, or where they are scraped less often
    than that, the time between their last two samples (the median of the series'). So a job reads
    the same on its own grid and on a finer one (beside data sampled more often)."""
    taken = cells[:, :until + 1] if rank.sampled is None else cells[:, :until + 1] & rank.sampled[rows, :until + 1]
    bins = np.flatnonzero(taken.any(axis=0))
    apart = [b[-1] - b[-2] for b in map(np.flatnonzero, taken[taken.any(axis=1)]) if len(b) > 1]
    return (int(bins[-1]) if len(bins) else until), v.step * max(float(np.median(apart)) if apart else 1.0, 1.0)


def _until(cover: Callable[[float, float], np.ndarray], cursor: float, end: float) -> np.ndarray:
    """(bin,) of each bin's part after `cursor`, the share before `end`: in a bin that holds
    both, the time between them, not the product of their shares of the bin."""
    after = cover(cursor, np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(after > 0, np.clip(cover(cursor, end) / after, 0.0, 1.0), 0.0)


def _alive(v: Views, reporting: np.ndarray, last_samples: tuple[int, float], heard: np.ndarray, ended: bool,
           tail: np.ndarray, cursor: float, cover: Callable[[float, float], np.ndarray], lo: np.ndarray,
           seen: np.ndarray, usual: float, stalled: StalledConfig) -> np.ndarray:
    """(bin,) the share of each bin of the last run's `tail` (its held time after `cursor`, its
    last step) that its process was alive. `reporting`: the last run's ranks' samples, and the
    last bin where one was taken with how late one may come (_last_samples); `heard`:
    when the agent last heard each of the job's ranks (NaN: not exported); `ended`: each said
    then that its monitor closed; `cover(t0, t1)`: the share of each bin a stretch of time covers;
    `lo`, `seen`: where each bin's time begins, and when its samples were seen."""
    reported = reporting.any(axis=0)
    went = np.flatnonzero(reported)
    held_bins = np.flatnonzero(tail > 0)
    kept = len(held_bins) > 0 and bool(reported[held_bins[-2:]].any())     # reporting while its GPUs were held
    heard = heard[reporting.any(axis=1)]
    if np.isfinite(heard).any():
        # The agent's time of each rank's last message, keep-alives included: the process lived
        # until the latest, and on through its GPUs' last held time where its last sample heard
        # it then (a living process reports at least every KEEPALIVE_S; a sample is a step, or
        # a scrape interval, late at most), unless every rank's last message said its monitor
        # closed: it trained no more from then, whatever its exit took.
        latest = float(np.nanmax(heard))
        taken, slack = last_samples
        if kept and not ended and seen[taken] - latest <= slack + 2 * KEEPALIVE_S:
            return np.ones(v.n)
        return _until(cover, cursor, latest)
    # Without those times (an older agent), a process is alive while its ranks report: the
    # monitor reports while its process lives, hung or not (trainer.keepalive). The agent keeps
    # a rank's series for --forget-after after its last report, so series that go while the
    # GPUs are still held say the process ended that long before they went. GPUs let go sooner
    # after the last step than the `stalled` detector would call a stall were a job ending, not
    # a hang (its pod finishing and being deleted).
    alive = reported.astype(np.float64)
    if len(held_bins) and not kept:
        # (From the earliest its last sample can have been: a process that exited at its
        # last step, the usual case, has no stalled time after it.)
        alive *= _until(cover, cursor, lo[went[-1]] - FORGET_AFTER_S) if len(went) else 0.0
    # Series still there --forget-after (and a sample's slack) after the last step say the
    # process lived on, whenever its GPUs went; only series gone by then leave it open.
    lived_on = len(went) > 0 and lo[went[-1]] - FORGET_AFTER_S - v.step > cursor
    # (Two samples' slack: the last step and the release are each known to a sample.)
    short = max(stalled.interval_factor * usual, stalled.floor_minutes * 60)
    if len(held_bins) and not lived_on and seen[held_bins[-1]] - cursor + 2 * v.step < short:
        alive[:] = 0.0
    return alive


def _saves(v: Views, rows: np.ndarray, checkpoint_s: np.ndarray, held_bins: np.ndarray) -> tuple[int, float | None]:
    """Checkpoints saved while the job held GPUs (each new `last_checkpoint_time`), and the
    loop's mean blocking seconds per save (the job blocks for each as long as its slowest rank)."""
    times = v.rank.values.get("last_checkpoint_time")
    if times is None:
        return 0, None
    times = times[rows][:, held_bins[0]:held_bins[-1] + 1]
    saves = len(np.unique(times[np.isfinite(times) & (times >= v.time(held_bins[0]) - v.lag)]))
    if not saves or checkpoint_s.sum() <= 0:
        return saves, None
    return saves, sum(s.seconds for s in stretches(checkpoint_s, v.rank.present[rows])) / saves


def _runs(v: Views, rows: np.ndarray, stepped: np.ndarray) -> tuple[np.ndarray, list[float | None]]:
    """Each cell's run (-1: none) and each run's earliest process start. A process that
    started once the run before was stepping begins a new run; ranks of one launch start
    before any of them steps."""
    values = v.rank.values.get("start_time")
    present = v.rank.present[rows]
    if values is None or not np.isfinite(values[rows]).any():
        return np.where(present, 0, -1), [None]
    start = values[rows]
    finite = np.isfinite(start)
    distinct, value_of = np.unique(start[finite], return_inverse=True)
    # Each distinct start's first stepping sample, in one pass over the cells.
    first_col = np.full(len(distinct), np.inf)
    cols = np.nonzero(finite)[1][stepped[finite]]
    order = np.argsort(cols, kind="stable")
    seen, at = np.unique(value_of[stepped[finite]][order], return_index=True)
    first_col[seen] = cols[order][at]
    first_step = v.start + first_col * v.step
    cluster = np.zeros(len(distinct), np.int64)
    runs: list[float | None] = []
    stepping_since = np.inf
    for i, s in enumerate(distinct):
        if not runs or s > stepping_since:
            runs.append(float(s))
            stepping_since = np.inf
        cluster[i] = len(runs) - 1
        stepping_since = min(stepping_since, first_step[i])
    run_of = np.full(start.shape, -1)
    run_of[finite] = cluster[value_of]
    # A new process in the same pod reports its start before its first step; steps counted in
    # a sample whose step time is older than that start are the previous process's last ones.
    step_time = v.rank.values.get("last_step_time")
    if step_time is not None and len(runs) > 1:
        begun = np.array(runs)[np.maximum(run_of, 0)]
        earlier = (run_of > 0) & stepped & ~(step_time[rows] >= begun)
        run_of[earlier] -= 1
    return run_of, runs


def _run_facts(v: Views, cells: np.ndarray, steps: np.ndarray, gauge: dict[str, np.ndarray],
               start: float | None) -> dict:
    # A step gauge a new process in the same pod has not yet replaced is its predecessor's.
    own = cells & (gauge["last_step_time"] >= (start or -np.inf))
    step_times = np.where(own, gauge["last_step_time"], np.nan)
    # A series' first sample has no increase to read, but its step time says it stepped.
    counted = (cells & (steps > 0)).any(axis=0)
    stepping = counted | own.any(axis=0)
    first = int(np.argmax(stepping)) if stepping.any() else None
    last = int(v.n - 1 - np.argmax(counted[::-1])) if counted.any() else first
    # The least: a sample moved here from the next run (its last steps) carries that run's.
    resumed = np.where(cells, gauge["resumed_from"], np.nan)
    # The predecessor's last number, held over into this run's first samples, is not this run's
    # (it is higher where the run resumed from an earlier step), unless no step time tells them apart.
    number = np.where(own if own.any() else cells, gauge["global_step"], np.nan)
    return {"process_start": start, "first": first, "last": last, "first_step": None,
            "first_time": (_finite(np.nanmin, step_times[:, first]) or float(v.time(first))) if first is not None else None,
            "last_time": _finite(np.nanmax, step_times),
            "resumed_from": _int(_finite(np.nanmin, resumed)), "last_number": _int(_finite(np.nanmax, number))}


def _finite(reduce, values: np.ndarray) -> float | None:
    values = np.asarray(values, np.float64)
    return float(reduce(values)) if np.isfinite(values).any() else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def _step_split(parts: np.ndarray, steps: np.ndarray, global_step: np.ndarray, cells: np.ndarray,
                resumed_next: int | None, blown: np.ndarray) -> np.ndarray:
    """(category, bin) rank-seconds of one run's stepping span, with the steps computed again
    after the next run's resume point moved to lost_progress, and of the others those in bins
    where a rank reported its model blown up (`blown`: diverging.non_finite) to diverged: the
    ranks of a job train one model."""
    split = parts.sum(axis=1)
    own = [_I["productive"], _I["data_wait"], _I["sync_wait"]]
    step_parts = split[own]
    lost = np.zeros(split.shape[1])
    if resumed_next is not None:
        # A step number counts where its rank made steps: before a run's first step, the agent may
        # still hold the number its rank's previous process reached (stale step gauges), far above
        # where this run resumed from.
        number = np.where(cells & (steps > 0), global_step, -np.inf).max(axis=0)
        number = np.maximum.accumulate(np.where(np.isfinite(number), number, -np.inf))
        ranks = np.maximum(cells.sum(axis=0), 1)
        made = steps.sum(axis=0) / ranks                     # steps per rank in each bin
        before = number - made
        with np.errstate(invalid="ignore", divide="ignore"):
            lost = np.clip((number - np.maximum(before, resumed_next)) / made, 0.0, 1.0)
        lost = np.where((made > 0) & np.isfinite(lost), lost, 0.0)
        split[_I["lost_progress"]] = step_parts.sum(axis=0) * lost
    kept = step_parts * (1.0 - lost)
    diverged = (blown & cells).any(axis=0)
    split[_I["diverged"]] = kept.sum(axis=0) * diverged
    split[own] = kept * ~diverged
    return split


def _spread(held: np.ndarray, span: slice, split: np.ndarray, ranks: np.ndarray, sampled: np.ndarray,
            blocked: list[tuple[int, Stretch]], usual: float, stall_factor: float, step: float,
            opened_stepping: bool = False) -> np.ndarray:
    """(category, bin) seconds of a run's stepping stretch: `held` (its held seconds per bin),
    split by the run's counters over `span` (the bins they grew in). `blocked`: the run's saves
    and evaluations (grid.apart), each with its category. `opened_stepping`: the run was past its
    first step when the window opened, so samples before its first step in the window are a gap
    between steps too."""
    out = np.zeros((len(NAMES), len(held)))
    n = split.shape[1]
    # A save or an evaluation blocked every rank for as long as the slowest reported it: the
    # others' wait is its time too, which they reported in the time to their next step (after any
    # save or evaluation that follows it), on their own nodes' scrapes, a few bins before or after.
    stepped = np.flatnonzero(split[_STEP_PARTS].sum(axis=0) > 0)
    reaches = [reach(s, stepped, n) if s.waited > 0 else slice(s.first, s.last + 1) for _, s in blocked]
    # The steps' usual mix of parts, from the bins where no rank reported such a wait as a step's.
    plain = np.ones(n, dtype=bool)
    for (_, s), bins in zip(blocked, reaches):
        plain[bins] &= s.waited <= 0
    usual_mix = split[_STEP_PARTS][:, plain if plain.any() else slice(None)].sum(axis=1)
    usual_mix = usual_mix / usual_mix.sum() if usual_mix.sum() > 0 else usual_mix
    apart_s = np.zeros(n)               # each bin: how long the save or evaluation it reports blocked the job
    for (category, s), bins in zip(blocked, reaches):
        apart_s[bins.start:s.last + 1] += s.seconds
        if s.waited > 0:
            _take_back(split, bins, s.waited, usual_mix)
            split[category, s.last] += s.waited
    steps_time = split[_STEP_PARTS].sum(axis=0)
    apart = split[_APART].sum(axis=0)
    moved = steps_time + apart > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        unreported = np.where(ranks > 0, np.clip(1.0 - (steps_time + apart) / (ranks * step), 0.0, 1.0), 0.0)
    stall = np.zeros(n)                 # the share of each bin that is a stall
    idx = np.flatnonzero(moved)
    jumps = np.diff(idx) > 1
    gaps = list(zip(idx[:-1][jumps] + 1, idx[1:][jumps]))
    if opened_stepping and len(idx) and idx[0] > 0:
        gaps.insert(0, (0, idx[0]))     # a window that opened amid a stall
    for a, b in gaps:
        if not usual or not (sampled[a:b] & ~moved[a:b]).any():
            continue        # samples missing, not samples saying nothing happened
        gap = (b - a) * step
        # A save or an evaluation that ended the gap reports with the gap's end (or the ranks that
        # waited for it report their next step); steps reported there without one ended the gap
        # themselves, and a save reported after them came after them.
        stalled_s = gap - apart_s[b] - usual
        if gap <= stall_factor * usual or stalled_s <= step:
            continue        # a save or an evaluation, or steps this slow
        stall[a:b] = min(stalled_s / gap, 1.0)
        # The samples on either side hold the time each rank reported before it stopped and after
        # it went on (a sample late, or early, on nodes scraped at other moments): the rest of
        # them is the stall's too.
        for edge in (a - 1, b):
            if edge >= 0:
                stall[edge] = max(stall[edge], unreported[edge])
        # The step that ended the stall reported the stall as its own time: take it back out of
        # the phases it swelled (a hang in a collective is sync wait, one in the loader data wait).
        _take_back(split, slice(b, b + 1), stalled_s * ranks[b], usual_mix)
    stalls = np.zeros(len(held))
    stalls[span] = stall
    out[_I["stalled"]] = held * stalls
    rest = held * (1.0 - stalls)
    # The run's stretch in the order it went: the steps that count, from the first bin whose
    # model had blown up on (diverged), from the first step computed again on (lost_progress).
    # Each stretch is split by its own totals and takes the held time in its place, in
    # proportion to its rank-seconds (a save reported with a stretch's first bin came before
    # it: the earlier stretch's).
    total = split.sum(axis=1)
    if total.sum() <= 0:
        return out
    firsts = sorted({int(np.argmax(split[_I[c]] > 0)) for c in ("diverged", "lost_progress")
                     if (split[_I[c]] > 0).any()} - {0})
    stretch_totals = []
    for a, b in zip([0, *firsts], [*firsts, n]):
        totals = split[:, a:b].sum(axis=1)
        if a > 0:
            totals[_APART] -= split[_APART, a]
        if b < n:
            totals[_APART] += split[_APART, b]
        stretch_totals.append(totals)
    after = np.cumsum(rest[::-1])[::-1] - rest          # held seconds after each bin
    later = 0.0                                         # held seconds the stretches after this one take
    for totals in reversed(stretch_totals):
        take = rest.sum() * totals.sum() / total.sum()
        with np.errstate(invalid="ignore", divide="ignore"):
            weight = np.where(rest > 0, np.clip((later + take - after) / rest, 0.0, 1.0)
                              - np.clip((later - after) / rest, 0.0, 1.0), 0.0)
        if totals.sum() > 0:
            out += np.outer(totals / totals.sum(), rest * weight)
        later += take
    return out


def _take_back(split: np.ndarray, cols: slice, seconds: float, usual_mix: np.ndarray) -> None:
    """Take `seconds` (rank-seconds) of a wait that steps reported as their own back out of the
    step parts of `split`'s bins `cols`, from the parts it swelled beyond the run's usual mix of
    them (as much as they hold)."""
    body = split[_STEP_PARTS, cols]
    total = body.sum(axis=1)
    taken = min(seconds, float(total.sum()))
    excess = np.clip(total - usual_mix * (total.sum() - taken), 0.0, None)
    if excess.sum() <= 0:
        return
    with np.errstate(invalid="ignore", divide="ignore"):
        kept = np.where(total > 0, 1.0 - excess * (taken / excess.sum()) / total, 1.0)
    split[_STEP_PARTS, cols] = body * kept[:, None]


def _steps_in(gauge: dict[str, np.ndarray], cells: np.ndarray, col: int, resumed_from: int | None) -> float:
    """Steps a run had made by sample `col`, from its step number (at least one)."""
    number = np.where(cells[:, col], gauge["global_step"][:, col], np.nan)
    if not np.isfinite(number).any():
        return 1.0
    return max(float(np.nanmax(number)) - (resumed_from or 0), 1.0)


def _stepping_at_first_sample(cells: np.ndarray, gauge: dict[str, np.ndarray], resumed_from: int | None) -> bool:
    """Whether a run's first sample already counts steps beyond where it began."""
    seen = cells.any(axis=0)
    if not seen.any():
        return False
    first = int(np.argmax(seen))
    number = np.where(cells[:, first], gauge["global_step"][:, first], np.nan)
    return bool(np.isfinite(number).any() and np.nanmax(number) > (resumed_from or 0))


def _usual_step(step_s: np.ndarray, steps: np.ndarray) -> float:
    """Mean seconds per step (each rank counts every step, so the sums' ratio is per rank)."""
    made = steps.sum()
    return float(step_s.sum() / made) if made > 0 else 0.0
