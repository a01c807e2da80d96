"""The tidy frames every detector and the cost model work on, whatever the source.

Each frame has the columns of the recording table of the same name
(`exporter.recording.TABLES`): `t` (unix seconds, float), the label columns
(categoricals) and the value columns. Counters stay cumulative, as the agent
exposes them; detectors take differences. A source that cannot provide a table
(a dcgm-exporter-only cluster has no `rank` telemetry) leaves it empty and names
it in `missing`.

Columns come beyond the recording's: `held_s` on the gpu and alloc tables, the
seconds each row stands for (analyzer.grid.holding: what GPU-time is made of, true at
any scrape interval), `signal` on the alloc table, the allocation signal the
row was read from (analyzer.sources.allocation); `repeated` on the rank table, True
on the rows analyzer.grid.holding filled in, a sample held over rather than a new one; and,
where a window's end falls past a raw sample's point, `also_next_point` on any table, True on
each series' last row that stands for the grid's last point too (views.build_grid holds it
over into that point).
The rank table's gauges and step numbers (`FLOAT32`) come as float32, not as the recording's
float64. Its `RANK_LATEST` columns count on each series' last row only: a store's frames hold
them there alone (a recording's on every row).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable

import numpy as np
import pandas as pd

from burnrate.exporter.recording import TABLES

# Value columns a frame holds in float32 where the recording holds float64: every reader takes
# them as float32 (analyzer.grid.views' grids), and in float64 a week of a thousand ranks holds
# 0.22 GB more. Never a time, nor a counter: those need float64's precision.
FLOAT32 = {"rank": ("mfu", "loss", "grad_norm", "global_step", "resumed_from")}
# The rank table's cumulative counters: each bin's increase is read from them.
RANK_COUNTERS = ("steps", "step_s", "data_wait_s", "compute_s", "tokens", "checkpoint_s", "eval_s")
# When the agent last heard each rank, and when it heard the rank's process close its monitor:
# read at each series' last row only (Grid.latest), so a store is asked for each series' last
# value once, not a value a step, and the frame holds it on that row alone.
RANK_LATEST = ("last_report_time", "closed_time")


@dataclass(frozen=True)
class Window:
    start: float   # unix seconds
    end: float


def grid_size(window: Window, step: float) -> int:
    """The points of a window's grid, one every `step` from its start. Samples fall into the
    nearest point, so a window not on the step's multiples needs the point its last samples
    round up to, which may lie up to half a step past its end."""
    return max(int(np.rint((window.end - window.start) / step)) + 1, 1)


@dataclass(frozen=True)
class Frames:
    window: Window
    step_s: float                # sample resolution of the frames
    gpu: pd.DataFrame
    alloc: pd.DataFrame
    rank: pd.DataFrame
    node: pd.DataFrame
    xid: pd.DataFrame
    pod_cpu: pd.DataFrame
    missing: tuple[str, ...] = field(default=())   # signals the source could not provide
    simulated: bool = False                        # data came from simulated GPUs or `burnrate simulate`
    owners: pd.DataFrame = field(default_factory=lambda: empty_owners())   # each pod's controller
    # $ per GPU-hour per node where the store knows the price itself (OpenCost's
    # node_gpu_hourly_cost: negotiated and spot rates included).
    gpu_hour_prices: dict[str, float] = field(default_factory=dict)
    # Each GPU model's usual peak SM clock where it is known from more GPUs than these frames
    # hold (fleet mode's parts: analyzer.fleet.partition); otherwise the thermal detector takes it
    # from the GPUs here.
    usual_peak_sm_clock_mhz: dict[str, float] = field(default_factory=dict)
    # Each row is a step's point (a store's `*_over_time` answer, a recording reduced to steps):
    # it stands for the step that ends at its time, where a raw sample stands from its time on.
    rows_end_steps: bool = False
    # Each rank series' counters as last read before the window's first point (`t`: when, the
    # rank table's labels, the counters it has): the first point's increase is then known, as
    # a store's increase over the step before a point is, wherever the window opens. None
    # where the source gives none; a series it lacks has no increase in its first point.
    rank_before: pd.DataFrame | None = None


def frame_dtypes(table: str, columns: Iterable[str]) -> dict[str, str]:
    """The dtype of each of a table's value columns in a frame."""
    stored = TABLES[table][1]
    return {c: "f4" if c in FLOAT32.get(table, ()) else stored[c] for c in columns}


def on_rows(length: int, rows: np.ndarray, values: np.ndarray) -> pd.arrays.SparseArray:
    """A column of `length` rows holding `values` on `rows` (increasing) and NaN on every other,
    in the memory of those values alone: a RANK_LATEST column, one value a series."""
    values, rows = np.asarray(values, np.float64), np.asarray(rows, np.int32)
    if hasattr(pd.arrays.SparseArray, "from_indices"):      # pandas 3.1 on
        return pd.arrays.SparseArray.from_indices(values, rows, length, fill_value=np.nan)
    from pandas._libs.sparse import IntIndex                # before it, the positions' only spelling
    return pd.arrays.SparseArray(values, sparse_index=IntIndex(length, rows), fill_value=np.nan)


def values_at(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """`column`'s values on `rows` (positions), a sparse column's without making it whole."""
    array = column.array
    if not isinstance(array, pd.arrays.SparseArray):
        return column.to_numpy()[rows]
    index, values = array.sp_index.indices, array.sp_values
    if not len(index):
        return np.full(len(rows), np.nan)
    at = np.minimum(np.searchsorted(index, rows), len(index) - 1)
    return np.where(index[at] == rows, values[at], np.nan)


OWNER_COLUMNS = ("namespace", "pod", "owner_kind", "owner_name")


def empty_owners() -> pd.DataFrame:
    """Pod -> the controller that owns it (kube-state-metrics' kube_pod_owner), where known."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in OWNER_COLUMNS})


def iso(t: float) -> str:
    """A time as the report writes it: ISO-8601 in UTC to the second, `Z` for the zone."""
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
