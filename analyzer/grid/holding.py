"""How long each sample stands for, so that time is true at any scrape interval.

A source reads a window on a grid of `step` seconds, but clusters are scraped every
10, 15, 30, 60 s or more, and not all at the same interval. A sample stands for its
series' own sampling interval, the way a Prometheus instant query keeps answering
with the last sample until the next one arrives: a sample holds until the next
sample of its series, or for one interval where the next is further away than the
staleness bound (a target that went away, not a missed scrape). A holder's series that
stops while its GPU's own series goes on was let go, not missed: the GPU was sampled
without that holder, so the gap is not the holder's time, however short.

Each series' interval comes from its own data: the median time between its
samples. Two regimes follow from it:

- fine (the interval is at least the step): every sample is repeated into the grid
  points it stands for, so detectors see a value in every step, and `held_s` splits
  its time among them. A 60 s cluster read at 15 s steps counts its GPU-time once,
  not a quarter of it.
- coarse (several samples fall in one step, e.g. a week at Prometheus' 55 s steps):
  rows are already one per step; a step in the middle of a run stands for the whole
  step, a run's first and last step only for the samples it holds (`sample_count` × the
  interval), so a job's GPU-hours do not grow with the step of a longer window.

`held_s` is added to the gpu and alloc tables (what GPU-time is made of); every
table is filled in the fine regime. The rank table also gets `repeated`: True on the
rows filled in, which are no new report, so that a counter's increase is known to
stand for the whole interval up to the sample that shows it (analyzer.grid.views), and a
detector tells a new report from one held over.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from burnrate.exporter import labels as L
from burnrate.exporter.recording import TABLES

from .frames import Frames, grid_size
from .series import ramps, series_numbers

STALENESS_S = 300.0
"""Prometheus' default lookback delta: a series is current for five minutes after
its last sample, so missed scrapes and agent restarts shorter than that are bridged."""
BRIDGED_INTERVALS = 2.5
"""A series scraped less often than every two minutes still bridges one missed scrape."""
PAIRS = 64
"""Gaps per series that its interval is the median of: enough to see through missed
scrapes and jitter, few enough that a week of a thousand GPUs takes no time."""
COARSE = 0.75
"""A series sampled this much faster than the step has several samples per step."""
HELD = ("gpu", "alloc")
MARKED = ("rank",)
REPEATED = "repeated"
ALSO_NEXT = "also_next_point"
# A GPU is observed as one series whoever holds it; a holder is a (GPU, pod, job).
SERIES = {"gpu": ("UUID",), "alloc": ("UUID", "namespace", "pod", "training_job")}


def hold(frames: Frames, staleness_s: float = STALENESS_S) -> Frames:
    """The frames with every sample standing for its interval (module docstring)."""
    step = float(frames.step_s)
    limit = float(frames.window.end)        # the window's last samples hold their interval, no further
    # Where the grid's last point stops taking samples (it may lie past the window's end): a raw
    # sample that stands for that point is repeated into it, whatever its phase. A step's point
    # (rows_end_steps) stands for the step before it, never for a later one.
    reach = (None if frames.rows_end_steps
             else float(frames.window.start) + (grid_size(frames.window, step) - 0.5) * step)
    # One table after the other: side by side their row-long temporaries add up, and on a day of
    # 1,024 GPUs that was the read's peak (0.65-0.77 GB above the frames against 0.42 GB, for 0.2-0.4 s).
    return replace(frames, **{name: hold_table(getattr(frames, name), SERIES.get(name, TABLES[name][0]), step, limit,
                                               staleness_s, with_held=name in HELD, marked=name in MARKED,
                                               device=frames.gpu if name == "alloc" else None, reach=reach)
                              for name in TABLES})


def series_intervals(t: np.ndarray, codes: np.ndarray, samples: np.ndarray, staleness_s: float,
                     per_series: int = PAIRS) -> np.ndarray:
    """Each series' sampling interval (rows sorted by series, then time): the median
    of (time to the next row) / (samples in that row) over up to `per_series` pairs
    spread along the series, the lower of the middle two where they are even: an interval
    the series had (one that went from 15 s samples to 1 s ones as often is sampled every
    second, not every 8). Series with one row take the median of the others."""
    n_series = int(codes.max()) + 1 if len(codes) else 0
    rows = np.bincount(codes, minlength=n_series)
    begin = np.cumsum(rows) - rows
    pairs = np.maximum(rows - 1, 0)
    # Evenly spread pair positions within each series: a bounded, vectorized median. A series
    # of fewer pairs takes each of them once (spread over `per_series`, it took its first ones
    # only: two samples 3 ms apart at an agent's start were a short series' interval).
    k = np.arange(per_series)
    at = begin[:, None] + (k[None, :] * pairs[:, None]) // np.clip(pairs, 1, per_series)[:, None]
    valid = k[None, :] < pairs[:, None]
    at = np.where(valid, at, 0)
    gap = t[np.minimum(at + 1, len(t) - 1)] - t[at]
    ratio = gap / samples[np.minimum(at + 1, len(t) - 1)]
    ratio = np.where(valid & (gap > 0) & (gap <= staleness_s), ratio, np.nan)
    with np.errstate(all="ignore"):
        known = ~np.isnan(ratio).all(axis=1)
        out = np.full(n_series, np.nan)
        out[known] = np.nanquantile(ratio[known], 0.5, axis=1, method="lower")
    found = np.isfinite(out)
    out[~found] = float(np.median(out[found])) if found.any() else np.nan
    return out


def hold_table(frame: pd.DataFrame, keys: tuple[str, ...], step: float, limit: float,
               staleness_s: float = STALENESS_S, with_held: bool = True, marked: bool = False,
               device: pd.DataFrame | None = None, reach: float | None = None) -> pd.DataFrame:
    """`marked`: the rows filled in are named in a `repeated` column. `device`: the gpu table,
    for a table of holders: a gap in a holder's series in which its GPU was sampled is a
    release, and is not bridged. `reach`: no row is repeated to this time or later (the last
    grid point's upper edge); where not given, none past `limit`."""
    def unfilled(out: pd.DataFrame) -> pd.DataFrame:
        return out.assign(**{REPEATED: np.zeros(len(out), bool)}) if marked else out

    if not len(frame):
        out = frame.drop(columns="sample_count", errors="ignore")
        return unfilled(out.assign(held_s=pd.Series(dtype="f4")) if with_held else out)
    codes = series_numbers(frame, keys)
    if not with_held and "sample_count" in frame and _every_series_coarse(codes, frame["sample_count"].to_numpy()):
        return unfilled(frame.drop(columns="sample_count"))
    if "sample_count" in frame:
        held = _on_grid(frame["t"].to_numpy(), codes, frame["sample_count"].to_numpy(), step)
        if held is not None:
            out = frame.drop(columns="sample_count")
            return unfilled(out.assign(held_s=held) if with_held else out)
    # Frames are time-sorted, so a stable sort by series gives (series, t) order; numpy
    # radix-sorts 16-bit integers.
    narrow = np.int16 if len(codes) and codes.max() < 2 ** 15 else np.int32
    order = np.argsort(codes.astype(narrow), kind="stable")
    c, t = codes[order], frame["t"].to_numpy()[order]
    samples = (np.maximum(np.nan_to_num(frame["sample_count"].to_numpy(np.float64)[order], nan=1.0), 1.0)
               if "sample_count" in frame
               else np.ones(len(t)))
    interval = series_intervals(t, c, samples, staleness_s)
    interval = np.where(np.isfinite(interval), interval, step)
    released = (_released(frame[L.UUID], order, c, t, interval, device)
                if device is not None and len(device) and L.UUID in frame else np.zeros(len(t), bool))
    # (The copies into the grid's last point are a few, one a series: a byte a row holds them.)
    held, copies, tail = np.empty(len(t)), np.empty(len(t), np.int64), np.zeros(len(t), np.int8)
    # A block of whole series at a time: each row looks only at its series' neighbours, and a
    # dozen row-long temporaries of a day of a thousand ranks were the read's peak.
    for a, b in _blocks(c):
        held[a:b], copies[a:b], tail[a:b] = _held(t[a:b], c[a:b], samples[a:b], interval[c[a:b]], step, limit,
                                                  staleness_s, released[a:b], reach)
    source = frame.drop(columns="sample_count", errors="ignore")
    if (copies == 1).all():
        held_rows = np.empty(len(t), np.float32)     # seconds: float32 holds them to the millisecond
        held_rows[order] = held
        out = unfilled(source.assign(held_s=held_rows) if with_held else source)
        if not tail.any():
            return out
        # Each such row stands for one point more, the grid's last (a copy there would hold
        # none of its seconds): a mark the grid reads (views.build_grid), where a copied row
        # would make the whole table be copied to append a few.
        also = np.zeros(len(t), bool)
        also[order[tail > 0]] = True
        return out.assign(**{ALSO_NEXT: also})
    copies += tail
    rows = np.repeat(order, copies)
    offset = ramps(copies)
    new_t = np.repeat(t, copies) + offset * step
    rest = np.repeat(held, copies) - offset * step
    # The last of a sample's own copies carries the rest; those into the grid's last point, none.
    own = np.repeat(copies - tail, copies)
    new_held = np.where(offset < own, np.where(offset == own - 1, rest, np.minimum(rest, step)), 0.0)
    resort = np.argsort(new_t, kind="stable")
    out = source.take(rows[resort]).reset_index(drop=True)
    out["t"] = new_t[resort]
    if with_held:
        out["held_s"] = new_held[resort].astype(np.float32)
    if marked:
        out[REPEATED] = (offset > 0)[resort]
    return out


def _every_series_coarse(codes: np.ndarray, samples: np.ndarray) -> bool:
    """Whether every series holds several samples in a typical point: read at such a step, a
    table has nothing to fill. Series by series: in a fleet scraped at 1 s beside one at 15 s,
    a 5 s step holds five samples of the first in a point and a third of one of the second, whose
    points between its samples must be filled (a table-wide mean of the counts, over 2, read the
    second's steps as none). And row by row: a series with more single-sample points than its
    two ends was sampled slower than the step in part (15 s history before 1 s live data, read
    at 3 s steps), and its history's points between samples must be filled too."""
    counted = np.fmax(np.nan_to_num(samples, nan=1.0), 1.0)
    rows = np.bincount(codes)
    counts = np.bincount(codes, weights=counted, minlength=len(rows))
    single = np.bincount(codes, weights=counted <= 1, minlength=len(rows))
    return bool((counts >= 2 * rows).all() and (single <= 2).all())


# Rows held at once by hold_table's general path (whole series each, so a block may be longer).
BLOCK_ROWS = 1 << 20


def _blocks(codes: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges of about BLOCK_ROWS, each of whole series (rows sorted by series)."""
    starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    cuts = np.unique(starts[np.searchsorted(starts, np.arange(BLOCK_ROWS, len(codes), BLOCK_ROWS))
                            .clip(max=max(len(starts) - 1, 0))]) if len(starts) else np.empty(0, np.int64)
    bounds = [0, *cuts.tolist(), len(codes)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _held(t: np.ndarray, c: np.ndarray, samples: np.ndarray, interval: np.ndarray, step: float, limit: float,
          staleness_s: float, released: np.ndarray, reach: float | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seconds each row (sorted by series, then time) stands for, the grid points it is
    repeated into, from its series' `interval` (one per row), and the further copies, holding
    none of its seconds, that carry a series' last sample into the grid's last point past the
    window's end (`reach`). A `released` row is its holder's last before a release: it holds
    one interval, as before an outage."""
    nxt = np.append(np.where(c[1:] == c[:-1], t[1:] - t[:-1], np.inf), np.inf)
    bridged = (nxt <= np.maximum(staleness_s, BRIDGED_INTERVALS * interval)) & ~released
    # A lone sample whose series' next one comes steps later stands for the time until then,
    # whatever the series' usual interval: 15 s history before 1 s live samples on a 3 s grid.
    lone = (samples <= 1) & (nxt > step * 1.01) & bridged
    coarse = (interval < COARSE * step) & ~lone
    linked = np.where(coarse, nxt <= step * 1.01, bridged)
    linked_before = np.insert(linked[:-1], 0, False) & np.insert(c[1:] == c[:-1], 0, False)
    edge = np.where(coarse, np.minimum(samples * interval, step), interval)
    held = np.where(coarse, np.where(linked & linked_before, step, edge), np.where(linked, nxt, edge))
    shares = np.append((c[1:] == c[:-1]) & (t[1:] == t[:-1]), False) & coarse     # with the next row
    if shares.any():
        # Rows that share a series' point (a GPU whose labels, its holder's, changed within the
        # step) share its time, by their samples: the step, or at a run's edge their samples'.
        begins = np.flatnonzero(~np.insert(shares[:-1], 0, False))
        ends = np.append(begins[1:], len(t)) - 1
        group = np.repeat(np.arange(len(begins)), np.diff(np.append(begins, len(t))))
        total = np.add.reduceat(samples, begins)
        point = np.where(linked_before[begins] & linked[ends], step, np.minimum(total * interval[begins], step))
        shared = (ends - begins > 0)[group]
        held = np.where(shared, point[group] * samples / total[group], held)
    # A fine sample holds forward from its time, at most one interval past the window's
    # end (n samples stand for n intervals, whatever the step); a coarse row stands for
    # the step before it.
    held = np.where(coarse, held, np.clip(np.minimum(held, limit + interval - t), 0.0, None))
    # Fine regime: a sample repeated into each grid point it stands for.
    copies = np.where(coarse, 1, np.maximum(np.ceil(held / step - 1e-9), 1)).astype(np.int64)
    # No copy past the window's end: the last copy in it carries the rest.
    copies = np.clip(copies, 1, np.maximum(np.floor((limit - t) / step + 1e-9) + 1, 1).astype(np.int64))
    tail = np.zeros(len(t), np.int8)
    if reach is not None:
        # The grid's last point takes the samples up to half a step past it: a series' last
        # sample that stands past the window's end is repeated into it however it is phased (a
        # GPU sampled 0.6 of a step before the end is reporting at it).
        last = np.flatnonzero(np.isinf(nxt))
        last = last[~coarse[last] & (t[last] + held[last] > limit)]
        tail[last] = np.clip(np.ceil((reach - t[last]) / step - 1e-9) - copies[last], 0, None)
    return held, copies, tail


def _released(uuid: pd.Series, order: np.ndarray, c: np.ndarray, t: np.ndarray, interval: np.ndarray,
              device: pd.DataFrame) -> np.ndarray:
    """Rows (sorted by series, then time: `order` sorts the frame whose `uuid` column is given)
    after which their holder's series pauses for more than an interval and a half while its
    GPU's series (`device`, the gpu table, sampled by the same exporter at the same moments)
    has a sample in the pause, half an interval clear of either end: the exporter saw the GPU
    without that holder. A pause with no sample of the GPU either is a missed scrape, bridged."""
    nxt = np.append(np.where(c[1:] == c[:-1], t[1:] - t[:-1], np.inf), np.inf)
    gap = np.flatnonzero(np.isfinite(nxt) & (nxt > 1.5 * interval[c]))
    out = np.zeros(len(t), bool)
    if not len(gap):
        return out
    # Pauses are few: only their GPUs' samples are looked at, by category code, not by name.
    paused = uuid.to_numpy()[order[gap]]
    names = pd.Index(pd.unique(paused))
    gpus = pd.Categorical(device[L.UUID])
    dev_code = names.get_indexer(gpus.categories)[gpus.codes]
    dev_code[gpus.codes < 0] = -1
    mine = dev_code >= 0
    if not mine.any():
        return out
    # One sorted key per sample, (GPU, time): a GPU's samples in a pause are one searchsorted
    # away. Times relative to the earliest keep the key exact to a microsecond.
    dev_t = device["t"].to_numpy(np.float64)[mine]
    origin = min(float(dev_t.min()), float(t.min()))
    span = max(float(dev_t.max()), float(t.max())) - origin + 1.0
    keys = np.sort(dev_code[mine] * span + (dev_t - origin))
    code = names.get_indexer(paused)
    margin = 0.5 * interval[c[gap]]
    lo = code * span + (t[gap] + margin - origin)
    hi = code * span + (t[gap] + nxt[gap] - margin - origin)
    out[gap] = np.searchsorted(keys, hi, "left") > np.searchsorted(keys, lo, "right")
    return out


def _on_grid(t: np.ndarray, codes: np.ndarray, samples: np.ndarray, step: float) -> np.ndarray | None:
    """`held_s` of a reduced frame, float32 (one row per series and grid point, several samples
    per step) without sorting: a run's inner steps stand for the whole step, its first
    and last for their samples; each row stands for the step before its time, so
    none reaches past the window. None where a series is sampled slower than the step
    (it needs filling: the general path) or rows are off the grid. Whole-length passes
    are few: a week of a thousand GPUs is eleven million rows, and only run edges
    need more than the step. Row-long temporaries are few and made in place: two tables
    are held side by side, and this was the peak of a week's read."""
    first = float(t[0])
    col = np.subtract(t, first)
    col /= step
    np.rint(col, out=col)
    series = int(codes.max()) + 1
    # Cell numbers in int32 where the grid has fewer cells than that counts: the row-long
    # indices below in half the memory (a week of a thousand GPUs' alloc table: 35 M cells).
    cells = (float(col.max()) + 2) * series
    col = col.astype(np.int32 if cells < np.iinfo(np.int32).max else np.int64)
    probe = np.linspace(0, len(t) - 1, min(len(t), 4096)).astype(np.int64)
    if np.abs(first + col[probe] * step - t[probe]).max() > 1e-6 * step:
        return None
    # Time-major cells, as the rows come: the look-ups walk memory in order. A spare
    # point at the end, so that no run reads past the grid.
    present = np.zeros((int(col.max()) + 2) * series, bool)
    cell = col * series
    cell += codes
    present[cell] = True
    near = np.add(cell, series)
    after = present[near]
    np.subtract(cell, series, out=near)
    before = present[np.maximum(near, 0, out=near)]
    del near
    before &= col > 0
    shared, group = _sharing_points(present, cell, col, series, len(t))
    del cell
    edge = np.flatnonzero(~(after & before))
    del col
    samples = np.fmax(samples, 1.0)             # NaN (a point no count answered for) is one sample
    if (~(after[edge] | before[edge]) & (samples[edge] <= 1)).any():
        return None     # a lone sample between steps without any: a series slower than the step in part
    # A series' interval: its inner steps' time over the samples in them (a point two rows share
    # is one step).
    apart = np.union1d(edge, shared)
    counted = np.bincount(codes, weights=samples, minlength=series) - \
        np.bincount(codes[apart], weights=samples[apart], minlength=series)
    steps = np.bincount(codes, minlength=series) - np.bincount(codes[apart], minlength=series)
    with np.errstate(invalid="ignore", divide="ignore"):
        interval = np.where(steps > 0, step * steps / counted, np.nan)
    known = np.isfinite(interval)
    if not known.any() or (interval[known] >= COARSE * step).any():
        return None
    interval[~known] = np.median(interval[known])
    held = np.full(len(t), step, np.float32)    # seconds: float32 holds them to the millisecond
    held[edge] = np.minimum(samples[edge] * interval[codes[edge]], step)
    if len(shared):
        # Rows that share a series' point (a GPU whose labels, its holder's, changed within the
        # step) share its time, by their samples: the step, or at a run's edge their samples'.
        total = np.bincount(group, weights=samples[shared])
        point = np.where(after[shared] & before[shared], step,
                         np.minimum(total[group] * interval[codes[shared]], step))
        held[shared] = point * samples[shared] / total[group]
    return held


def _sharing_points(present: np.ndarray, cell: np.ndarray, col: np.ndarray, series: int,
                    rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows that share a (point, series) cell with another, and each one's group (rows of
    one cell). Few and found without sorting every row: only the points that hold fewer cells
    than rows are looked at."""
    if int(np.count_nonzero(present)) == rows:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    cells = present.reshape(-1, series).sum(axis=1)
    crowded = np.bincount(col, minlength=len(cells)) > cells
    candidates = np.flatnonzero(crowded[col])
    _, group, count = np.unique(cell[candidates], return_inverse=True, return_counts=True)
    keep = count[group] > 1
    _, group = np.unique(group[keep], return_inverse=True)
    return candidates[keep], group
