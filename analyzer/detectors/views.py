"""Dense (series × time) views of the frames, built once and shared by the detectors.

Every source samples on a regular grid (`Frames.step_s`), so a long frame of
millions of rows becomes a few 2-D numpy arrays: one row per series, one column per
time bin, NaN where no sample exists. Runs, rolling sums and cross-series medians
are then whole-array operations, which is what keeps a week of a thousand GPUs
within seconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from ..frames import Frames

# Time-sliced and MIG GPUs carry no single owner in the gpu table, so ownership
# always comes from the alloc table; these are the columns that name a holder.
HOLDER = ("namespace", "pod", "training_job")
# A rank series is named by its pod and rank; its job and node follow from the pod.
RANK_KEY = ("namespace", "pod", "rank")
RANK_LABELS = ("training_job", "Hostname")
RANK_COUNTERS = ("steps", "step_s", "data_wait_s", "compute_s", "tokens", "flops")
RANK_GAUGES = ("mfu", "loss", "grad_norm", "last_step_time")


@dataclass(frozen=True)
class Grid:
    keys: pd.DataFrame                 # one row per series, label columns, RangeIndex = row number
    values: dict[str, np.ndarray]      # column -> (series, time) array, NaN where absent
    present: np.ndarray                # (series, time) bool: a sample exists

    @property
    def size(self) -> int:
        return len(self.keys)


def _category_codes(column: pd.Series) -> tuple[np.ndarray, int]:
    cat = column if column.dtype == "category" else column.astype("category")
    return cat.cat.codes.to_numpy().astype(np.int64), len(cat.cat.categories)


def _codes(frame: pd.DataFrame, by: tuple[str, ...], labels: tuple[str, ...] = ()
           ) -> tuple[np.ndarray, pd.DataFrame]:
    """Series number per row (0..S-1) and the labels of each series (from its first row)."""
    names = by + labels
    if len(frame) == 0:
        return np.zeros(0, np.int64), pd.DataFrame({c: pd.Series(dtype=object) for c in names})
    if len(by) == 1:
        # One categorical key: its codes already number the series; drop unused categories.
        raw, size = _category_codes(frame[by[0]])
        used = np.bincount(raw + 1, minlength=size + 1) > 0
        codes = (np.cumsum(used) - 1)[raw + 1]
    else:
        combined = np.zeros(len(frame), np.int64)
        for col in by:
            raw, size = _category_codes(frame[col])
            combined = combined * (size + 1) + (raw + 1)
        codes, _ = pd.factorize(combined)
    first = np.empty(codes.max() + 1, np.int64)
    # Reversed assignment leaves each series' first row: numpy keeps the last write.
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    keys = pd.DataFrame({c: frame[c].take(first).astype(str).to_numpy() for c in names})
    return codes.astype(np.int64), keys


def last_rows(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """The last row of each value of `column` (frames are sorted by time)."""
    if not len(frame):
        return frame
    raw, size = _category_codes(frame[column])
    last = np.full(size + 1, -1, np.int64)
    last[raw + 1] = np.arange(len(raw))
    return frame.take(last[last >= 0])


def build_grid(frame: pd.DataFrame, by: tuple[str, ...], columns: tuple[str, ...],
               start: float, step: float, n: int, labels: tuple[str, ...] = ()) -> Grid:
    codes, keys = _codes(frame, by, labels)
    col = np.rint((frame["t"].to_numpy() - start) / step).astype(np.int64) if len(frame) else codes
    keep = (col >= 0) & (col < n)
    if not keep.all():
        codes, col = codes[keep], col[keep]
    s = len(keys)
    present = np.zeros((s, n), bool)
    present[codes, col] = True
    values = {}
    for name in columns:
        data = frame[name].to_numpy()
        if not keep.all():
            data = data[keep]
        arr = np.full((s, n), np.nan, dtype=np.float64 if data.dtype == np.float64 else np.float32)
        arr[codes, col] = data
        values[name] = arr
    return Grid(keys, values, present)


def counter_delta(cumulative: np.ndarray) -> np.ndarray:
    """Per-bin increase of a cumulative counter; a drop is a reset, so the new value
    is the increase (Prometheus' `increase` semantics). NaN where either end is absent."""
    delta = np.full(cumulative.shape, np.nan, np.float32)
    if cumulative.shape[1] > 1:
        d = np.diff(cumulative, axis=1)
        delta[:, 1:] = np.where(d < 0, cumulative[:, 1:], d)
    return delta


def runs(mask: np.ndarray, min_len: int = 1, max_gap: int = 0) -> pd.DataFrame:
    """Contiguous True stretches of each row: columns row, start, end (exclusive).

    Gaps of at most `max_gap` False bins between two True stretches are bridged, so a
    single noisy sample does not split a sustained condition.
    """
    mask = np.asarray(mask, bool)
    if max_gap > 0 and mask.size:
        holes = _bounds(~mask)
        inner = holes[(holes["start"] > 0) & (holes["end"] < mask.shape[1])
                      & (holes["end"] - holes["start"] <= max_gap)]
        if len(inner):
            mask = mask.copy()
            length = (inner["end"] - inner["start"]).to_numpy()
            rows = np.repeat(inner["row"].to_numpy(), length)
            cols = np.repeat(inner["start"].to_numpy(), length) + _ramps(length)
            mask[rows, cols] = True
    out = _bounds(mask)
    return out[out["end"] - out["start"] >= min_len].reset_index(drop=True)


def _ramps(length: np.ndarray) -> np.ndarray:
    """0..len-1 for each length, concatenated."""
    total = int(length.sum())
    offsets = np.repeat(np.cumsum(length) - length, length)
    return np.arange(total) - offsets


def _bounds(mask: np.ndarray) -> pd.DataFrame:
    s, n = mask.shape
    padded = np.zeros((s, n + 2), np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    r0, c0 = np.nonzero(edges == 1)
    _, c1 = np.nonzero(edges == -1)
    return pd.DataFrame({"row": r0, "start": c0, "end": c1})


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
    """Lazily built grids of one `Frames`; each is computed at most once."""

    def __init__(self, frames: Frames) -> None:
        self.frames = frames
        self.step = float(frames.step_s)
        self.start = float(frames.window.start)
        self.n = max(int(np.floor((frames.window.end - frames.window.start) / self.step)) + 1, 1)

    def span(self, minutes: float) -> int:
        """Samples that cover `minutes` (at least one): run lengths and windows."""
        return max(int(np.ceil(minutes * 60 / self.step)), 1)

    def gap(self, minutes: float) -> int:
        """Whole samples that fit in `minutes`: the holes a run may have and stay one run."""
        return int(minutes * 60 // self.step)

    @classmethod
    def of(cls, data: Frames | Views) -> Views:
        return data if isinstance(data, Views) else cls(data)

    def time(self, col: int | np.ndarray) -> float | np.ndarray:
        return self.start + np.asarray(col) * self.step

    @cached_property
    def gpu(self) -> Grid:
        """One row per physical GPU (by UUID), labelled with its Hostname, index and model."""
        f = self.frames.gpu
        cols = tuple(c for c in ("gpu_util", "up", "sm_clock_mhz", "throttle_reasons") if c in f.columns)
        return build_grid(f, ("UUID",), cols, self.start, self.step, self.n,
                          labels=("Hostname", "gpu", "modelName"))

    @cached_property
    def alloc(self) -> Grid:
        f = self.frames.alloc
        held = f["share"].to_numpy() > 0
        if not held.all():
            f = f[held]
        # A (GPU, pod) pair names an allocation; the other labels follow from it.
        grid = build_grid(f, ("UUID", "namespace", "pod"), ("share",), self.start, self.step, self.n,
                          labels=("Hostname", "gpu", "training_job"))
        keys = grid.keys
        keys["job"] = job_name(keys["training_job"], keys["pod"])
        row_of = pd.Series(np.arange(self.gpu.size), index=self.gpu.keys["UUID"].to_numpy())
        keys["gpu_row"] = keys["UUID"].map(row_of).fillna(-1).astype(np.int64).to_numpy()
        return grid

    @cached_property
    def held(self) -> np.ndarray:
        """(gpu, time) share of each GPU held by any pod."""
        held = np.zeros((self.gpu.size, self.n), np.float32)
        keys = self.alloc.keys
        ok = keys["gpu_row"].to_numpy() >= 0
        if ok.any():
            np.add.at(held, keys["gpu_row"].to_numpy()[ok], np.nan_to_num(self.alloc.values["share"][ok]))
        return held

    @cached_property
    def rank(self) -> Grid:
        f = self.frames.rank
        cols = tuple(c for c in RANK_COUNTERS + RANK_GAUGES if c in f.columns)
        grid = build_grid(f, RANK_KEY, cols, self.start, self.step, self.n, labels=RANK_LABELS)
        for name in RANK_COUNTERS:
            if name in grid.values:
                grid.values[name] = counter_delta(grid.values[name])
        keys = grid.keys
        keys["job"] = job_name(keys["training_job"], keys["pod"])
        keys["rank_no"] = pd.to_numeric(keys["rank"], errors="coerce")
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
        keys = grid.keys
        if not len(keys):
            return {}
        groups = keys.groupby(["namespace", "job"], sort=True).indices
        return {(str(ns), str(job)): rows for (ns, job), rows in groups.items()}

    @cached_property
    def telemetry_jobs(self) -> set[tuple[str, str]]:
        return set(self.job_rows(self.rank))


def fmean(values: np.ndarray) -> float | None:
    """Mean of the finite values, None when there are none."""
    values = np.asarray(values, np.float64)
    ok = np.isfinite(values)
    return float(values[ok].mean()) if ok.any() else None


def block_sum(arr: np.ndarray, k: int) -> np.ndarray:
    """Sums over consecutive blocks of k bins along time, NaN counted as 0."""
    s, n = arr.shape
    padded = np.zeros((s, -(-n // k) * k), np.float64)
    padded[:, :n] = np.nan_to_num(arr)
    return padded.reshape(s, -1, k).sum(axis=2)


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
