"""How long each sample stands for, so that time is true at any scrape interval.

A source reads a window on a grid of `step` seconds, but clusters are scraped every
10, 15, 30, 60 s or more, and not all at the same interval. A sample stands for its
series' own sampling interval, the way a Prometheus instant query keeps answering
with the last sample until the next one arrives: a sample holds until the next
sample of its series, or for one interval where the next is further away than the
staleness bound (a target that went away, not a missed scrape).

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
table is filled in the fine regime.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from agent.recording import TABLES

from .frames import Frames
from .series import ramps, series_codes

STALENESS_S = 300.0
"""Prometheus' default lookback delta: a series is current for five minutes after
its last sample, so missed scrapes and agent restarts shorter than that are bridged."""
BRIDGED_INTERVALS = 2.5
"""A series scraped less often than every two minutes still bridges one missed scrape."""
COARSE = 0.75
"""A series sampled this much faster than the step has several samples per step."""
HELD = ("gpu", "alloc")


def hold(frames: Frames, staleness_s: float = STALENESS_S) -> Frames:
    """The frames with every sample standing for its interval (module docstring)."""
    step = float(frames.step_s)
    limit = float(frames.window.end) + step
    tables = {name: hold_table(getattr(frames, name), TABLES[name][0], step, limit, staleness_s,
                               with_held=name in HELD)
              for name in TABLES}
    return replace(frames, **tables)


def series_intervals(t: np.ndarray, codes: np.ndarray, samples: np.ndarray, staleness_s: float) -> np.ndarray:
    """Each series' sampling interval (rows sorted by series, then time): the median
    of (time to the next row) / (samples in that row). Series with one row take the
    median of the others."""
    n_series = int(codes.max()) + 1 if len(codes) else 0
    same = codes[1:] == codes[:-1]
    gap = t[1:] - t[:-1]
    ok = same & (gap > 0) & (gap <= staleness_s)
    per = (pd.Series(gap[ok] / samples[1:][ok]).groupby(codes[:-1][ok]).median()
           if ok.any() else pd.Series(dtype=float))
    out = np.full(n_series, np.nan)
    out[per.index.to_numpy(np.int64)] = per.to_numpy()
    known = np.isfinite(out)
    out[~known] = float(np.median(out[known])) if known.any() else np.nan
    return out


def hold_table(frame: pd.DataFrame, keys: tuple[str, ...], step: float, limit: float,
               staleness_s: float = STALENESS_S, with_held: bool = True) -> pd.DataFrame:
    if not len(frame):
        out = frame.drop(columns="sample_count", errors="ignore")
        return out.assign(held_s=pd.Series(dtype="f8")) if with_held else out
    codes, _ = series_codes(frame, keys)
    order = np.argsort(codes, kind="stable")            # frames are time-sorted: this sorts by (series, t)
    c, t = codes[order], frame["t"].to_numpy()[order]
    samples = (np.maximum(np.nan_to_num(frame["sample_count"].to_numpy(np.float64)[order], nan=1.0), 1.0)
               if "sample_count" in frame
               else np.ones(len(t)))
    interval = series_intervals(t, c, samples, staleness_s)
    interval = np.where(np.isfinite(interval), interval, step)[c]
    nxt = np.append(np.where(c[1:] == c[:-1], t[1:] - t[:-1], np.inf), np.inf)
    coarse = interval < COARSE * step
    linked = np.where(coarse, nxt <= step * 1.01, nxt <= np.maximum(staleness_s, BRIDGED_INTERVALS * interval))
    linked_before = np.insert(linked[:-1], 0, False) & np.insert(c[1:] == c[:-1], 0, False)
    edge = np.where(coarse, np.minimum(samples * interval, step), interval)
    held = np.where(coarse, np.where(linked & linked_before, step, edge), np.where(linked, nxt, edge))
    held = np.clip(np.minimum(held, limit - t), 0.0, None)
    # Fine regime: a sample repeated into each grid point it stands for.
    copies = np.where(coarse, 1, np.maximum(np.ceil(held / step - 1e-9), 1)).astype(np.int64)
    source = frame.drop(columns="sample_count", errors="ignore")
    if (copies == 1).all():
        held_rows = np.empty(len(t))
        held_rows[order] = held
        return source.assign(held_s=held_rows) if with_held else source
    rows = np.repeat(order, copies)
    offset = ramps(copies)
    new_t = np.repeat(t, copies) + offset * step
    new_held = np.minimum(np.repeat(held, copies) - offset * step, step)
    resort = np.argsort(new_t, kind="stable")
    out = source.take(rows[resort]).reset_index(drop=True)
    out["t"] = new_t[resort]
    if with_held:
        out["held_s"] = new_held[resort]
    return out

