"""Dense (series × time) views of the frames, built once and shared by the detectors.

Every source samples on a regular grid (`Frames.step_s`), so a long frame of
millions of rows becomes a few 2-D numpy arrays: one row per series, one column per
time bin, NaN where no sample exists. Runs, rolling sums and cross-series medians
are then whole-array operations, which is what keeps a week of a thousand GPUs
within seconds.

This is the analyzer's interface for whoever draws an analysis: a Report carries the
views it was computed from, and the dashboard reads them rather than build its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, NamedTuple
from functools import cached_property

import numpy as np
import pandas as pd

from .frames import RANK_COUNTERS, RANK_LATEST, Frames, grid_size, values_at
from .holding import ALSO_NEXT, REPEATED, STALENESS_S, hold
from .runs import label_runs
from . import workers
from .series import category_codes, last_of, ramps, series_codes, series_numbers
from .workloads import WorkloadClass, classify

# Time-sliced and MIG GPUs carry no single owner in the gpu table, so ownership
# always comes from the alloc table; these are the columns that name a holder.
HOLDER = ("namespace", "pod", "training_job")
# A rank series is one job's rank in one pod: a dev pod, or a host outside Kubernetes,
# that runs one job after another keeps each job's steps and time apart.
RANK_KEY = ("namespace", "training_job", "pod", "rank")
RANK_LABELS = ("Hostname",)
RANK_TIMES = ("last_step_time", "last_checkpoint_time", "start_time")
# Step numbers, which the ledger compares with the step a run resumed from: float32, exact up
# to 2**24 steps, where float64 would add 180 MB to a week of a thousand ranks.
RANK_STEPS = ("global_step", "resumed_from")
RANK_GAUGES = ("mfu", "loss", "grad_norm") + RANK_TIMES + RANK_STEPS
GPU_SIGNALS = ("gpu_util", "up", "sm_clock_mhz", "throttle_reasons")
HELD = ("held_s",)    # seconds each sample stands for (analyzer.grid.holding)
# The value columns the detectors and the cost model read, per table: what a
# source needs to fetch for an analysis (the dashboard's charts read more).
ANALYSIS_COLUMNS = {"gpu": GPU_SIGNALS, "alloc": ("share",), "rank": RANK_COUNTERS + RANK_GAUGES + RANK_LATEST,
                    "node": (), "xid": ("count",)}


def invalid_mfu(mfu: np.ndarray) -> np.ndarray:
    """Where an MFU is a figure no GPU can reach: below 0 or above 1 (a peak of FLOPs set too
    low, or a hostile sender). NaN is no figure at all, and is left as absent."""
    with np.errstate(invalid="ignore"):
        return ~np.isnan(mfu) & ~((mfu >= 0) & (mfu <= 1))


def invalid_mfu_note(jobs: Mapping[tuple[str, str], int]) -> list[str]:
    """The report's note of the jobs whose MFU samples were dropped, (namespace, job) -> how many."""
    if not jobs:
        return []
    named = ", ".join(f"{namespace}/{job}" for namespace, job in sorted(jobs)[:5]) + (" …" if len(jobs) > 5 else "")
    return [f"{sum(jobs.values()):,} MFU samples outside 0-100% dropped, of {named}: "
            "their MFU is from the valid samples, unknown where none is left"]


@dataclass(frozen=True)
class Grid:
    keys: pd.DataFrame                 # one row per series, label columns, RangeIndex = row number
    values: dict[str, np.ndarray]      # column -> (series, time) array, NaN where absent
    present: np.ndarray                # (series, time) bool: a sample exists
    sampled: np.ndarray | None = None  # (series, time) bool: a new sample, not one held over (analyzer.grid.holding)
    # counter -> each series' count at its last sample in the window (NaN where it has none):
    # what its process had made in all by then, whether or not the window saw it grow.
    totals: dict[str, np.ndarray] = field(default_factory=dict)
    # column -> each series' value at its last sample in the window (NaN where it has none),
    # for a column only that is read (build_grid's `latest`): a row each, not a grid.
    latest: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.keys)


def last_rows(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """The last row of each value of `column` (frames are sorted by time)."""
    if not len(frame):
        return frame
    raw, size = category_codes(frame[column])
    last = last_of(raw + 1, size + 1)
    return frame.take(last[last >= 0])


def last_counts(rank: pd.DataFrame) -> pd.DataFrame:
    """Each rank series' last row (rows sorted by time): its counts before a window
    (Frames.rank_before)."""
    if not len(rank):
        return rank
    numbers = series_numbers(rank, RANK_KEY)
    last = last_of(numbers, int(numbers.max()) + 1)
    return rank.take(last[last >= 0]).reset_index(drop=True)


def build_grid(frame: pd.DataFrame, by: tuple[str, ...], columns: tuple[str, ...],
               start: float, step: float, n: int, labels: tuple[str, ...] = (),
               counters: tuple[str, ...] = (), wide: tuple[str, ...] | None = None,
               summed: tuple[str, ...] = (), release: bool = False,
               counted_before: pd.DataFrame | None = None, latest: tuple[str, ...] = (),
               from_start: bool = False) -> Grid:
    """`counters` become per-bin increases (counter_delta), spread over the bins their
    sample stands for where the frame says which rows are held over (`spread`); a series'
    first sample's increase is read from its row in `counted_before` (its counters before the
    window, Frames.rank_before) where that is no further back than the staleness bound, and
    with `from_start` is the sample's own count where that counts from its process's start
    (_born_in_window); `latest` columns keep each series' value at its last sample only (Grid.latest);
    `summed` columns add up the rows that fall in one bin (time held,
    analyzer.grid.holding) where others keep the last, in float32 where that holds every
    sum exactly (readers widen them before they multiply); float64 columns stay float64 only
    when named in `wide` (all of them when it is None): a week of timestamps needs the
    precision, a loss or an increase does not. With `release`, the frame's `t`, its `repeated`
    marks and `columns` are deleted from it as each is taken: the grid holds them instead of
    beside them (Views' `release`)."""
    codes, keys = series_codes(frame, by, labels)
    # Half up, not to even: samples a store aligned half a step off the window's start would
    # otherwise pair up in every other bin, and no two bins in a row would hold a counter.
    # Row-long arrays are made in place: the rank and gpu grids are built side by side.
    col = codes
    if len(frame):
        col = np.subtract(frame["t"].to_numpy(), start)
        col /= step
        col += 0.5
        col = np.floor(col, out=col).astype(np.int64)
    if release and "t" in frame.columns:
        del frame["t"]
    keep = (col >= 0) & (col < n)
    if not keep.all():
        codes, col = codes[keep], col[keep]
    s = len(keys)
    cell = codes * n                       # one flat index, computed once for every column
    cell += col
    del codes, col
    # Rows that also stand for the next point, the grid's last (analyzer.grid.holding): held
    # over into it, as a repeated row is, none of their seconds or counts with them.
    also = None
    if ALSO_NEXT in frame.columns:
        also = frame[ALSO_NEXT].to_numpy(bool)
        if release:
            del frame[ALSO_NEXT]
        also = (also if keep.all() else also[keep]) & (cell % n < n - 1)
    after = cell[also] + 1 if also is not None else None
    present = np.zeros((s, n), bool)
    present.ravel()[cell] = True
    sampled = None
    if REPEATED in frame.columns:
        fresh = ~frame[REPEATED].to_numpy(bool)
        if release:
            del frame[REPEATED]
        sampled = np.zeros((s, n), bool)
        sampled.ravel()[cell[fresh if keep.all() else fresh[keep]]] = True
    owner = _owners(present, sampled) if counters and sampled is not None and not sampled[present].all() else None
    before = _counted_before(counted_before, counters, keys, by, present, start, step) if counters else None
    born = _born_in_window(frame, keep, cell, present, n, start) if counters and from_start else None
    values, totals, lasts = {}, {}, {}
    cumulative = np.empty((s, n)) if counters else None     # one buffer for every counter
    last = n - 1 - np.argmax(present[:, ::-1], axis=1) if counters else None
    if after is not None:
        # Present there from here on: its counters' increase there is unknown (the interval
        # after a series' last sample), as spread makes it where rows were repeated.
        present.ravel()[after] = True
    # Sums first: their float64 bincount is briefly beside its float32 copy, before the other grids exist.
    for name in sorted(columns, key=lambda c: c not in summed):
        if name in latest:
            at = last_of(cell // n, s)
            lasts[name] = np.full(s, np.nan)
            if len(cell):
                rows = np.maximum(at, 0) if keep.all() else np.flatnonzero(keep)[np.maximum(at, 0)]
                lasts[name] = np.where(at >= 0, values_at(frame[name], rows), np.nan)
            if release:
                del frame[name]
            continue
        data = frame[name].to_numpy()
        if release:
            del frame[name]
        if not keep.all():
            data = data[keep]
        if name in summed:
            total = np.bincount(cell, weights=data, minlength=s * n)
            # A reduced read has one row a cell: its float32 seconds, exact in half the memory.
            narrow = total.astype(np.float32)
            values[name] = (narrow if _same(narrow, total) else total).reshape(s, n)
            del total, narrow
            continue
        if name in counters:
            cumulative.fill(np.nan)
            cumulative.ravel()[cell] = data
            totals[name] = cumulative[np.arange(s), last]
            delta = counter_delta(cumulative)
            if before is not None and name in before[2]:
                _first_increase(delta, cumulative, before[0], before[1], before[2][name])
            if born is not None:
                rows, cols = born
                unknown = np.isnan(delta[rows, cols])
                delta[rows[unknown], cols[unknown]] = cumulative[rows[unknown], cols[unknown]]
            values[name] = delta if owner is None else spread(delta, *owner)
            continue
        exact = data.dtype == np.float64 and (wide is None or name in wide)
        arr = np.full((s, n), np.nan, dtype=np.float64 if exact else np.float32)
        arr.ravel()[cell] = data
        if after is not None:
            arr.ravel()[after] = data[also]
        values[name] = arr
    return Grid(keys, {name: values[name] for name in columns if name not in latest}, present, sampled, totals, lasts)


def _counted_before(counted: pd.DataFrame | None, counters: tuple[str, ...], keys: pd.DataFrame,
                    by: tuple[str, ...], present: np.ndarray, start: float, step: float
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """The grid rows with a count before the window, each one's first bin, and the counts
    (by column): where the first sample is within the staleness bound of that count, as a
    missed scrape is bridged and a series gone for longer is not (analyzer.grid.holding)."""
    if counted is None or not len(counted) or not len(keys):
        return None
    index = pd.MultiIndex.from_frame(keys[list(by)])
    at = index.get_indexer(pd.MultiIndex.from_frame(counted[list(by)].astype(str)))
    found = np.flatnonzero(at >= 0)
    rows = at[found]
    mine = present[rows]
    seen, first = mine.any(axis=1), np.argmax(mine, axis=1)
    when = counted["t"].to_numpy()[found]
    since = start + first * step - when
    usable = seen & (since > 0) & (since <= STALENESS_S)
    counts = {c: counted[c].to_numpy(np.float64)[found][usable] for c in counters if c in counted.columns}
    return rows[usable], first[usable], counts


# A rank's own steps (its global step less the step it resumed from) and its process's start.
PROCESS_COUNT = ("steps", "global_step", "resumed_from", "start_time")


def _born_in_window(frame: pd.DataFrame, keep: np.ndarray, cell: np.ndarray, present: np.ndarray, n: int,
                    start: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The rank series (grid rows, first bins) whose first sample counts from its process's
    start: the process started in the window, and the steps counted are exactly the steps it
    made (its global step less its resume step), so no earlier process's counts are in them
    (the agent counts a rank from 0 when it first hears it). That sample's counts are then its
    increase: the first steps of a process started in the window are read, not guessed, as a
    process that followed another in the same pod already is. A series whose counts carry an
    earlier process's, or whose process did not say where it resumed, stays unread there."""
    if any(c not in frame.columns for c in PROCESS_COUNT) or not len(cell):
        return None
    series = np.flatnonzero(present.any(axis=1))
    first = np.argmax(present[series], axis=1)
    row_of = np.full(present.size, -1, np.int64)
    row_of[cell] = np.arange(len(cell))
    rows = row_of[series * n + first]
    if not keep.all():
        rows = np.flatnonzero(keep)[rows]
    steps, step, resumed, started = (frame[c].to_numpy()[rows].astype(np.float64) for c in PROCESS_COUNT)
    mine = (started >= start) & (steps > 0) & (steps == step - resumed)
    return series[mine], first[mine]


def _first_increase(delta: np.ndarray, cumulative: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                    before: np.ndarray) -> None:
    """Each row's first bin's increase from its count before the window (a drop is a reset)."""
    now = cumulative[rows, cols]
    increase = np.where(now >= before, now - before, now)
    known = np.isfinite(increase) & np.isnan(delta[rows, cols])
    delta[rows[known], cols[known]] = increase[known]


def _same(narrow: np.ndarray, wide: np.ndarray, at_once: int = 1 << 20) -> bool:
    """np.array_equal of two flat arrays, a slice at a time: no widened copy of the whole."""
    return all(np.array_equal(narrow[at:at + at_once], wide[at:at + at_once]) for at in range(0, len(wide), at_once))


def _owners(present: np.ndarray, sampled: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each bin, the bin of the sample whose increase covers it and how many bins that
    increase covers: a sample held over into later bins (analyzer.grid.holding) is no new
    report, so the next sample's increase happened across them all. Known is False
    where no later sample tells (the last sample's interval, or one the series left)."""
    s, n = present.shape
    cols = np.arange(n, dtype=np.int32)
    boundary = sampled | ~present
    # The first boundary at or after each bin, and the last one before each bin.
    after = np.where(boundary, cols, n)
    after = np.minimum.accumulate(after[:, ::-1], axis=1)[:, ::-1]
    before = np.full((s, n), -1, np.int32)
    before[:, 1:] = np.where(boundary[:, :-1], cols[:-1], -1)
    before = np.maximum.accumulate(before, axis=1)
    rows = np.arange(s)[:, None]
    known = present & (after < n)
    at = np.minimum(after, n - 1)
    known &= sampled[rows, at]
    return at, (at - before[rows, at]).astype(np.float32), known


def spread(delta: np.ndarray, at: np.ndarray, bins: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Each sample's increase shared evenly among the bins it stands for (_owners): a
    counter read every 15 s on a 1 s grid increases in every bin, not in one of 15."""
    out = delta[np.arange(len(delta))[:, None], at] / bins
    out[~known] = np.nan
    return out.astype(np.float32, copy=False)


def counter_delta(cumulative: np.ndarray) -> np.ndarray:
    """Per-bin increase of a cumulative counter; a drop is a reset, so the new value
    is the increase (Prometheus' `increase` semantics). NaN where either end is absent."""
    delta = np.empty(cumulative.shape, np.float32)
    delta[:, :1] = np.nan
    if cumulative.shape[1] > 1:
        # Subtracted in float64 (counters run to 1e12 and beyond), stored as float32,
        # without a full-size float64 temporary.
        after = delta[:, 1:]
        np.subtract(cumulative[:, 1:], cumulative[:, :-1], out=after, casting="same_kind")
        np.copyto(after, cumulative[:, 1:], where=after < 0, casting="same_kind")
    return delta


class Run(NamedTuple):
    row: int
    start: int
    end: int            # exclusive


@dataclass(frozen=True)
class Runs:
    """Stretches as three parallel arrays; iterating yields `Run`s."""
    row: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.row)

    def __iter__(self) -> Iterator[Run]:
        return map(Run._make, zip(self.row.tolist(), self.start.tolist(), self.end.tolist()))

    def where(self, keep: np.ndarray) -> Runs:
        return Runs(self.row[keep], self.start[keep], self.end[keep])


def runs(mask: np.ndarray, min_len: int = 1, max_gap: int = 0) -> Runs:
    """Contiguous True stretches of each row.

    Gaps of at most `max_gap` False bins between two True stretches are bridged, so a
    single noisy sample does not split a sustained condition.
    """
    mask = np.asarray(mask, bool)
    if max_gap > 0 and mask.size:
        holes = _bounds(~mask)
        inner = holes.where((holes.start > 0) & (holes.end < mask.shape[1]) & (holes.end - holes.start <= max_gap))
        if len(inner):
            mask = mask.copy()
            length = inner.end - inner.start
            rows = np.repeat(inner.row, length)
            cols = np.repeat(inner.start, length) + ramps(length)
            mask[rows, cols] = True
    out = _bounds(mask)
    return out.where(out.end - out.start >= min_len)


def _bounds(mask: np.ndarray) -> Runs:
    s, n = mask.shape
    padded = np.zeros((s, n + 2), np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    r0, c0 = np.nonzero(edges == 1)
    _, c1 = np.nonzero(edges == -1)
    return Runs(r0, c0, c1)


def window_sum(arr: np.ndarray, half: int) -> np.ndarray:
    """Centered rolling sum over 2·half+1 bins along time, NaN counted as 0."""
    filled = np.nan_to_num(arr, nan=0.0).astype(np.float64)
    cs = np.zeros((arr.shape[0], arr.shape[1] + 1))
    np.cumsum(filled, axis=1, out=cs[:, 1:])
    n = arr.shape[1]
    hi = np.minimum(np.arange(n) + half + 1, n)
    lo = np.maximum(np.arange(n) - half, 0)
    return cs[:, hi] - cs[:, lo]


def trailing_mean(arr: np.ndarray, k: int) -> np.ndarray:
    """Mean of the k bins before each bin (excluding it), finite values only; NaN where none."""
    ok = np.isfinite(arr)
    filled = np.where(ok, arr, 0.0).astype(np.float64)
    n = arr.shape[1]
    cs = np.zeros((arr.shape[0], n + 1))
    cc = np.zeros((arr.shape[0], n + 1))
    np.cumsum(filled, axis=1, out=cs[:, 1:])
    np.cumsum(ok, axis=1, out=cc[:, 1:])
    hi = np.arange(n)
    lo = np.maximum(hi - k, 0)
    count = cc[:, hi] - cc[:, lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, (cs[:, hi] - cs[:, lo]) / count, np.nan)


def job_name(training_job: pd.Series, pod: pd.Series) -> pd.Series:
    """A pod outside any training job is a job of its own, named after the pod."""
    return training_job.where(training_job != "", pod)


class Views:
    """Lazily built grids of one `Frames`; each is computed at most once.

    With `release`, the frames are handed over: each grid takes the gpu, alloc and rank
    tables' times and value columns out of them as it is built (build_grid), so that an
    analysis holds its grids rather than grids and frames (a week of a thousand GPUs: 1.7 GB
    less), and a job with several runs is renamed in the frames themselves (label_runs).
    Their labels and the other tables stay. For a caller that reads no value column of
    those tables after the analysis: not the dashboard, whose job page draws from them."""

    def __init__(self, frames: Frames, class_overrides: Mapping[str, str] | None = None,
                 release: bool = False) -> None:
        # Frames built by hand rather than read by a source: each sample stands for its interval too.
        self.frames = label_runs(frames if "held_s" in frames.gpu.columns else hold(frames), in_place=release)
        self.release = release
        self.step = float(frames.step_s)
        self.start = float(frames.window.start)
        # A step's point stands for the step before it (Frames.rows_end_steps).
        self.lag = self.step if frames.rows_end_steps else 0.0
        self.n = grid_size(frames.window, self.step)
        self._job_rows: dict[int, dict[tuple[str, str], np.ndarray]] = {}
        self.class_overrides = dict(class_overrides or {})
        self.dropped_mfu: dict[tuple[str, str], int] = {}     # (namespace, job) -> MFU samples out of range

    def span(self, minutes: float) -> int:
        """Samples that cover `minutes` (at least one): run lengths and windows."""
        return max(int(np.ceil(minutes * 60 / self.step)), 1)

    def gap(self, minutes: float) -> int:
        """Whole samples that fit in `minutes`: the holes a run may have and stay one run."""
        return int(minutes * 60 // self.step)

    def build(self) -> Views:
        """Every grid and job index, built side by side (numpy releases the GIL) and
        before detectors share the views from several threads."""
        with workers.pool(self.frames, 2) as pool:
            grids = [pool.submit(lambda name=name: getattr(self, name)) for name in ("rank", "gpu")]
            for future in grids:
                future.result()
        for grid in (self.alloc, self.rank):
            self.job_rows(grid)
        self.held, self.nodes, self.telemetry_jobs, self.classes
        return self

    @classmethod
    def of(cls, data: Frames | Views) -> Views:
        return data if isinstance(data, Views) else cls(data)

    def time(self, col: int | np.ndarray) -> float | np.ndarray:
        """The bins' times: a raw sample's, or a step's point."""
        return self.start + np.asarray(col) * self.step

    def begins(self, col: int | np.ndarray) -> float | np.ndarray:
        """Where the time the bins stand for begins, never before the window: a finding's start,
        and (the bin after its last) its end. From a step's point, the step before it: a state
        that a point first shows changed after the point before it."""
        return np.maximum(self.time(col) - self.lag, self.start)

    def blocks(self, minutes: float) -> np.ndarray:
        """The first bin of each block of `minutes`, the blocks on the clock's multiples of that
        length rather than on the window's start, so that any window cuts the same data into
        the same blocks (each bin in the block its time's middle falls in)."""
        middle = self.time(np.arange(self.n)) - self.lag + self.step / 2
        block = np.floor(middle / (minutes * 60))
        return np.flatnonzero(np.r_[True, block[1:] != block[:-1]])

    def bin_of(self, t: float) -> int:
        """The bin whose stretch of time (from where `begins` puts it) holds `t`; unbounded."""
        return int(np.floor((t - self.start + self.lag) / self.step))

    @cached_property
    def gpu(self) -> Grid:
        """One row per physical GPU (by UUID), labelled with its Hostname, index and model."""
        f = self.frames.gpu
        cols = tuple(c for c in GPU_SIGNALS + HELD if c in f.columns)
        return build_grid(f, ("UUID",), cols, self.start, self.step, self.n,
                          labels=("Hostname", "gpu", "modelName"), summed=HELD, release=self.release)

    @cached_property
    def alloc(self) -> Grid:
        f = self.frames.alloc
        cols = ("share",) + tuple(c for c in HELD if c in f.columns)
        held = f["share"].to_numpy() > 0
        if not held.all():
            f = f[held]
            if self.release:     # the rows held are a copy: the whole table's columns go now
                self.frames.alloc.drop(columns=["t", *cols], inplace=True)
        # A (GPU, pod, job) names an allocation; the other labels follow from it.
        grid = build_grid(f, ("UUID", "namespace", "pod", "training_job"), cols,
                          self.start, self.step, self.n, labels=("Hostname", "gpu"), summed=HELD, release=self.release)
        keys = grid.keys
        keys["job"] = job_name(keys["training_job"], keys["pod"])
        row_of = pd.Series(np.arange(self.gpu.size), index=self.gpu.keys["UUID"].to_numpy())
        keys["gpu_row"] = keys["UUID"].map(row_of).fillna(-1).astype(np.int64).to_numpy()
        return grid

    @cached_property
    def held(self) -> np.ndarray:
        """(gpu, time) share of each GPU held by any pod."""
        held = np.zeros((self.gpu.size, self.n), np.float32)
        by_gpu, gpus, starts = self.holders_by_gpu
        if len(by_gpu):
            shares = self.alloc.values["share"][by_gpu]      # a copy: its NaNs (no sample) are zeroed in place
            np.copyto(shares, 0.0, where=np.isnan(shares))
            held[gpus] = np.add.reduceat(shares, starts, axis=0)
        return held

    @cached_property
    def holders_by_gpu(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The allocation rows of known GPUs grouped by GPU (in row order within a GPU), the
        GPU rows of the groups and where each starts: one np.*.reduceat per figure, no
        per-element scatter (np.add.at took 1.4 s on a week's 3,216 holders)."""
        rows = self.alloc.keys["gpu_row"].to_numpy() if self.alloc.size else np.zeros(0, np.int64)
        known = np.flatnonzero(rows >= 0)
        by_gpu = known[np.argsort(rows[known], kind="stable")]
        gpus, starts = np.unique(rows[by_gpu], return_index=True)
        return by_gpu, gpus, starts

    @cached_property
    def rank(self) -> Grid:
        f = self.frames.rank
        cols = tuple(c for c in RANK_COUNTERS + RANK_GAUGES + RANK_LATEST if c in f.columns)
        grid = build_grid(f, RANK_KEY, cols, self.start, self.step, self.n, labels=RANK_LABELS,
                          counters=RANK_COUNTERS, wide=RANK_TIMES, release=self.release,
                          counted_before=self.frames.rank_before, latest=RANK_LATEST, from_start=True)
        keys = grid.keys
        keys["job"] = job_name(keys["training_job"], keys["pod"])
        keys["rank_no"] = pd.to_numeric(keys["rank"], errors="coerce")
        if "mfu" in grid.values:
            # Dropped here, where every reader of MFU (cost, low_mfu, the dashboard) takes it from.
            bad = invalid_mfu(grid.values["mfu"])
            grid.values["mfu"][bad] = np.nan
            per_row = bad.sum(axis=1)
            for row in np.flatnonzero(per_row):
                job = (str(keys["namespace"].iat[row]), str(keys["job"].iat[row]))
                self.dropped_mfu[job] = self.dropped_mfu.get(job, 0) + int(per_row[row])
        return grid

    @cached_property
    def nodes(self) -> pd.DataFrame:
        """The last-known facts of each node, indexed by Hostname."""
        cols = ["instance_type", "capacity_type", "zone", "gpu_model", "gpu_count"]
        last = last_rows(self.frames.node, "Hostname")
        return pd.DataFrame({c: last[c].astype(str).to_numpy() for c in cols},
                            index=pd.Index(last["Hostname"].astype(str).to_numpy(), name="Hostname"))

    def job_rows(self, grid: Grid) -> dict[tuple[str, str], np.ndarray]:
        """Row numbers of each (namespace, job) in an alloc or rank grid."""
        if id(grid) not in self._job_rows:
            keys = grid.keys
            groups = keys.groupby(["namespace", "job"], sort=True).indices if len(keys) else {}
            self._job_rows[id(grid)] = {(str(ns), str(job)): rows for (ns, job), rows in groups.items()}
        return self._job_rows[id(grid)]

    @cached_property
    def telemetry_jobs(self) -> set[tuple[str, str]]:
        return set(self.job_rows(self.rank))

    @cached_property
    def classes(self) -> dict[tuple[str, str], WorkloadClass]:
        """Each job's workload class and the evidence for it (analyzer.grid.workloads)."""
        pods: dict[tuple[str, str], set[str]] = {}
        for grid in (self.alloc, self.rank):
            names = grid.keys["pod"].to_numpy()
            for job, rows in self.job_rows(grid).items():
                pods.setdefault(job, set()).update(names[rows])
        # The owners of these pods alone: the owners table is the whole fleet's, analysed in parts.
        owners = self.frames.owners
        if len(owners):
            wanted = [(job[0], p) for job, names in pods.items() for p in names]
            owners = owners[pd.MultiIndex.from_arrays([owners["namespace"], owners["pod"]]).isin(wanted)]
        kind_of = dict(zip(zip(owners["namespace"], owners["pod"]), owners["owner_kind"]))
        return {job: classify(job, sorted(names), [kind_of[(job[0], p)] for p in sorted(names) if (job[0], p) in kind_of],
                              job in self.telemetry_jobs, self.class_overrides)
                for job, names in pods.items()}

    @cached_property
    def step_phases(self) -> pd.DataFrame | None:
        """Each rank series' mean seconds per step over the window, by phase: waiting for
        data, its own compute, and the rest (waiting for other ranks, the optimizer,
        logging). None where the telemetry has no step counters."""
        rank = self.rank
        needed = ("steps", "step_s", "data_wait_s", "compute_s")
        if any(c not in rank.values for c in needed):
            return None
        total = {c: np.nansum(rank.values[c], axis=1, dtype=np.float64) for c in needed}
        steps = np.where(total["steps"] > 0, total["steps"], np.nan)
        wait, compute = total["data_wait_s"] / steps, total["compute_s"] / steps
        other = np.clip(total["step_s"] / steps - wait - compute, 0, None)
        return pd.DataFrame({"rank": rank.keys["rank_no"].to_numpy(), "wait": wait, "compute": compute,
                             "other": other})

    def rank_steps(self, rows: np.ndarray) -> RankSteps:
        """The phases of each rank among `rows` (one job's rank series). A rank restarted on
        another pod is the same rank: its series are merged."""
        phases = self.step_phases
        if phases is None or not len(rows):
            return RankSteps.none()
        merged = phases.iloc[rows].groupby("rank", sort=True).mean()
        return RankSteps([str(int(r)) if float(r).is_integer() else str(r) for r in merged.index],
                         merged["wait"].to_numpy(), merged["compute"].to_numpy(), merged["other"].to_numpy())


@dataclass(frozen=True)
class RankSteps:
    """Mean seconds per step of each rank, split into its phases."""

    ranks: list[str]
    data_wait: np.ndarray
    compute: np.ndarray
    other: np.ndarray               # waiting for other ranks (collectives), optimizer, logging

    @classmethod
    def none(cls) -> RankSteps:
        return cls([], np.zeros(0), np.zeros(0), np.zeros(0))


def median_over_rows(values: np.ndarray) -> np.ndarray:
    """np.nanmedian(values, axis=0) for the few rows of one job, by one sort:
    numpy's nanmedian falls back to masked arrays column by column, 100x slower."""
    values = np.asarray(values, np.float64)
    finite = np.isfinite(values)
    ordered = np.sort(np.where(finite, values, np.nan), axis=0)     # NaN sorts last
    count = finite.sum(axis=0)
    cols = np.arange(values.shape[1])
    lo, hi = np.maximum((count - 1) // 2, 0), np.minimum(count // 2, max(len(values) - 1, 0))
    with np.errstate(invalid="ignore"):
        middle = (ordered[lo, cols] + ordered[hi, cols]) / 2 if len(values) else np.full(len(cols), np.nan)
    return np.where(count > 0, middle, np.nan)


def fmean(values: np.ndarray) -> float | None:
    """Mean of the finite values, None when there are none."""
    values = np.asarray(values, np.float64)
    ok = np.isfinite(values)
    return float(values[ok].mean()) if ok.any() else None


def block_sum(arr: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums over the blocks of bins that begin at `starts` (Views.blocks), NaN counted as 0."""
    return np.add.reduceat(np.nan_to_num(arr.astype(np.float64), copy=False), starts, axis=1)


def holder_of(v: Views, gpu_row: int, start: int, end: int) -> dict[str, str | None]:
    """namespace/training_job/pod of the pod that held a GPU longest in [start, end)."""
    keys = v.alloc.keys
    rows = np.nonzero(keys["gpu_row"].to_numpy() == gpu_row)[0]
    if not len(rows):
        return {"namespace": None, "training_job": None, "pod": None}
    held = np.nan_to_num(v.alloc.values["share"][rows, start:end]).sum(axis=1)
    if held.max() <= 0:
        return {"namespace": None, "training_job": None, "pod": None}
    k = keys.iloc[rows[int(np.argmax(held))]]
    return {"namespace": k["namespace"], "training_job": k["job"], "pod": k["pod"]}
