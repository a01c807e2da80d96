"""Prometheus's answers put together into the recording's tables (analyzer.sources.prometheus
reads them).

A read asks its queries table by table (`TABLE_ORDER`), and each table is put together on
a thread of its own as soon as its last answer is in, while the next tables are still being
read: most of that work is numpy's, which runs beside the decoding of the answers still
arriving, and each table's answers are let go once its frame is made. On a day of 1,024 GPUs,
put together after the reading, it took 11-12 s more (bench/RESULTS.md).
"""
from __future__ import annotations

import re
from concurrent.futures import Executor, Future
from functools import cached_property
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from burnrate.exporter.recording import TABLES
from burnrate.exporter import catalog as C
from burnrate.exporter import labels as L

from ..grid.frames import RANK_LATEST, Frames, Window, frame_dtypes, on_rows
from ..grid.freed import give_back, let_go
from ..grid.series import distinct_text, labelled, last_of, text
from .allocation import best_allocation, empty_alloc
from .common import column_order, is_simulated, missing_signals
from .recording_tables import empty_table

KEYS = {"gpu": C.DEVICE, "alloc": C.DEVICE_POD, "rank": C.T, "node": L.NODE_INFO_LABELS,
        "pod_cpu": (L.NAMESPACE, L.POD, L.HOSTNAME), "xid": C.DEVICE + ("xid",)}
# The order a read asks for its tables, each put together while the next are read: the GPUs'
# first (the allocation is chosen against their rows), the small tables last, so that little is
# left to do when the reading ends.
TABLE_ORDER = ("gpu", "alloc", "rank", "node", "pod_cpu", "xid")
# The GPU table's columns whose series carry no holder's labels (the agent's own, per device):
# they name no pod on the rows they fill.
_UNHELD = ("up", "nvlink_tx_bytes", "nvlink_rx_bytes", "xid_total")
_POD_SUFFIX = re.compile(r"-(?:worker|master|launcher)-\d+$")


def job_from_pod(pod: str) -> str:
    """A pod's training job where no agent labelled it: PyTorchJob/MPIJob pods are
    `<job>-worker-N`/`-master-N`/`-launcher-N`; any other pod stands for itself."""
    return _POD_SUFFIX.sub("", pod)


class Assembly:
    """The tables of one read, each put together by `builder` once `add` has all of its answers.
    The GPU table waits for `owners` (their controllers name the jobs of pods no agent labelled),
    the allocation for the GPU table and `exporters` (the pods whose labels name no holder)."""

    def __init__(self, window: Window, step: float, first: float, columns: Mapping[str, Sequence[str]] | None,
                 owners: Future, exporters: Future, builder: Executor) -> None:
        self.window, self.step, self.first, self.columns = window, step, first, columns
        self.n_times = max(0, int(round((window.end - first) / step)) + 1) if first <= window.end else 0
        self.owners, self.exporters, self.builder = owners, exporters, builder
        self.built: dict[str, Future] = {}
        self.answered = False

    def add(self, table: str, answers: Sequence[tuple[str, list[dict]]]) -> None:
        """All of `table`'s answers, as (column, series) in the order they were asked."""
        results: dict[str, list[dict]] = {}
        for column, answer in answers:
            results.setdefault(column, []).extend(answer)
            self.answered = self.answered or bool(answer)
        self.built[table] = self.builder.submit(getattr(self, f"_{table}", self._plain), table, results)

    def frames(self) -> Frames:
        for table in TABLE_ORDER:
            if table not in self.built:
                self.add(table, ())
        built = {table: future.result() for table, future in self.built.items()}
        give_back()     # what decoding the answers left: the holding's temporaries come next
        if self.n_times == 0 or not self.answered:
            return empty_frames(self.window, self.step)
        gpu, dcgm_nodes, n_hosts = built.pop("gpu")
        return Frames(window=self.window, step_s=self.step, rows_end_steps=True,
                      missing=missing_signals(gpu, built["rank"], built["node"], dcgm_nodes, n_hosts),
                      simulated=is_simulated(gpu), gpu=gpu, **built)

    @cached_property
    def owned(self) -> dict[tuple[str, str], str]:
        """Each (namespace, pod)'s controller, for the GPU and allocation tables (both built on
        the one builder thread)."""
        return _owner_names(self.owners.result())

    def _points(self, table: str, results: dict[str, list[dict]]) -> _Points:
        """The answers as points, taken out of `results` (left empty): the points alone hold
        them, and let each column's go once it is in the frame (_Points.frame)."""
        points = _Points(KEYS[table], self.first, self.step)
        while results:
            column = next(iter(results))     # in the order asked: the series are numbered as they come
            row_labels = L.POD_LABELS if table == "gpu" and column not in _UNHELD else ()
            for series in results.pop(column):
                points.add(column, series, row_labels)
        return points

    def _chosen(self, table: str) -> list[str] | None:
        """The table's value columns read, or None where the table is not."""
        if self.columns is not None and table not in self.columns:
            return None
        return [c for c in TABLES[table][1] if self.columns is None or c in self.columns[table]]

    def _plain(self, table: str, results: dict[str, list[dict]]) -> pd.DataFrame:
        chosen = self._chosen(table)
        if chosen is None:
            return empty_table(table)
        frame = self._points(table, results).frame(frame_dtypes(table, chosen), self.n_times,
                                                   latest=RANK_LATEST if table == "rank" else ())
        return frame[column_order(table, chosen)]

    def _gpu(self, table: str, results: dict[str, list[dict]]) -> tuple[pd.DataFrame, list[str], int]:
        chosen = self._chosen(table)
        if chosen is None:
            gpu = empty_table(table)
        else:
            dtypes = {c: "<" + TABLES[table][1][c] for c in chosen}
            gpu = self._points(table, results).frame(dtypes, self.n_times, L.POD_LABELS)
            gpu = _label_jobs(gpu[column_order(table, chosen)], self.owned)
        if "xid_total" in gpu.columns:
            # An agent counts XIDs from zero: no series yet means none happened; dcgm-exporter cannot say.
            xid = gpu["xid_total"].to_numpy()
            gpu["xid_total"] = np.where(_agent_rows(gpu) & np.isnan(xid), 0.0, xid).astype(xid.dtype)
        return gpu, dcgm_only(gpu), len(distinct_text(gpu[L.HOSTNAME]))

    def _alloc(self, table: str, results: dict[str, list[dict]]) -> pd.DataFrame:
        if self._chosen(table) is None:
            return empty_alloc()
        counted = ["sample_count"] if results.get("sample_count") else []
        raw = self._points(table, results).frame({c: "<f4" for c in ("share", "allocated", *counted)}, self.n_times)
        gpu = self.built["gpu"].result()[0]
        alloc = best_allocation(raw, _not_exporters(gpu, self.exporters.result()), self.first, self.step)
        alloc = _label_jobs(alloc, self.owned)
        return alloc[column_order(table) + ["signal"] + [c for c in counted if c in alloc]]

    def _node(self, table: str, results: dict[str, list[dict]]) -> pd.DataFrame:
        chosen = self._chosen(table)
        if chosen is None:
            return empty_table(table)
        cpu = results.get("cpu_utilization", [])
        info = self._points(table, results).frame({"_info": "<f8"}, self.n_times)
        node = _node_cpu(info.drop(columns="_info"), cpu, self.first, self.step)
        return node[column_order(table, chosen)]


class Steps:
    """A series' points at consecutive steps of a read's grid: the first one's time and each
    value. Half the memory of (time, value) pairs, and put on a grid as one slice."""

    __slots__ = ("first", "values")

    def __init__(self, first: float, values: np.ndarray) -> None:
        self.first, self.values = first, values

    def __len__(self) -> int:
        return len(self.values)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes


def consecutive(answer: list[np.ndarray], step: float, dtype=np.float64) -> list[np.ndarray | Steps]:
    """A range query's series' (time, value) points, each as Steps where they are one a step
    with none left out, as a store answers a series that did not stop within the query (its
    times are the query's steps), else as they are. For the whole answer at once: a read has
    tens of thousands of series, and a few numpy calls on each would cost seconds. The Steps'
    values are `dtype`: float32 for a column its frame holds so (frames.FLOAT32)."""
    lengths = np.fromiter(map(len, answer), np.int64, len(answer))
    if not lengths.any():
        return list(answer)
    times = np.concatenate([points[:, 0] for points in answer])
    values = np.concatenate([points[:, 1] for points in answer], dtype=dtype)    # one buffer for the answer's Steps
    ends = np.cumsum(lengths)
    starts = ends - lengths
    last = np.maximum(ends - 1, 0)
    # Where a point's time does not rise from the one before: a series has none between its ends.
    falls = np.flatnonzero(times[1:] <= times[:-1])
    rising = np.searchsorted(falls, starts) == np.searchsorted(falls, last)
    spans = np.rint((times[last] - times[np.minimum(starts, len(times) - 1)]) / step)
    steps = (lengths > 0) & rising & (spans == lengths - 1)
    return [Steps(float(times[a]), values[a:b]) if whole else points
            for points, whole, a, b in zip(answer, steps.tolist(), starts.tolist(), ends.tolist())]


Points = np.ndarray | Steps     # a series' points: (time, value) pairs, or Steps


def counts_before(answers: Sequence[tuple[float, str, list[dict]]], step: float) -> pd.DataFrame | None:
    """Frames.rank_before from the rank counters' answers (point time, column, series) at the
    point before each part of a read."""
    parts = {}
    for at, column, answer in answers:
        points = parts.setdefault(at, _Points(KEYS["rank"], at, step))
        for series in answer:
            points.add(column, series)
    frames = [points.frame({c: "f8" for c in points.points}, 1) for points in parts.values() if points.points]
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


class _Points:
    """One table's query answers, kept as points (series, time index, value) until its
    rows are asked for."""

    def __init__(self, key_labels: tuple[str, ...], grid_start: float, step: float) -> None:
        self.key_labels, self.start, self.step = key_labels, grid_start, step
        self.keys: dict[tuple[str, ...], int] = {}
        self.points: dict[str, list[tuple[int, Points]]] = {}
        self.row_labels: list[tuple[int, Points, tuple[str, ...]]] = []

    def add(self, column: str, series: dict, row_labels: tuple[str, ...] = ()) -> None:
        metric = series["metric"]
        if not metric.get(L.HOSTNAME) and metric.get("hostname"):
            metric = {**metric, L.HOSTNAME: metric["hostname"]}
        key = tuple(metric.get(n, "") for n in self.key_labels)
        k = self.keys.setdefault(key, len(self.keys))
        self.points.setdefault(column, []).append((k, series["values"]))
        if row_labels:
            self.row_labels.append((k, series["values"], tuple(metric.get(n, "") for n in row_labels)))

    def frame(self, columns: dict[str, str], n_times: int, row_label_names: tuple[str, ...] = (),
              latest: tuple[str, ...] = ()) -> pd.DataFrame:
        """Rows where any column has a point, by time and then by series, as the points
        came: a later point at the same place wins. Built from the points alone, and as a
        (series × times) grid only where the points fill a good part of one: a fleet's
        allocation table fills under 2% of one. A `latest` column's points make no row: each
        series' last value is put on its last row (RANK_LATEST)."""
        lasts = {column: self.points.pop(column, []) for column in latest if column in columns}
        n_points = sum(len(s) for points in self.points.values() for _, s in points)
        layout = _Layout(n_points, n_times, max(len(self.keys), 1))
        located = {column: self._placed(layout, self.points.get(column, ())) for column in columns
                   if column not in lasts}
        layout.fill(list(located.values()))
        frame = pd.DataFrame({"t": self.start + layout.times * self.step})
        key_table = list(self.keys) or [("",) * len(self.key_labels)]
        for position, name in enumerate(self.key_labels):
            categories = pd.Categorical([key[position] for key in key_table])
            frame[name] = pd.Categorical.from_codes(categories.codes[layout.keys], categories.categories)
        if row_label_names:
            at, row_table = self._row_labels(layout, len(row_label_names))
            for position, name in enumerate(row_label_names):
                categories = pd.Categorical([labels[position] for labels in row_table])
                frame[name] = pd.Categorical.from_codes(categories.codes[at], categories.categories)
        for column, dtype in columns.items():
            if column in lasts:
                frame[column] = self._on_last_rows(lasts.pop(column), layout.keys, dtype)
                continue
            frame[column] = layout.column(located.pop(column), dtype)
            # The column's answer goes as its values are in the frame: a table of a day of a
            # thousand ranks is not held twice over, once as answers and once as columns.
            let_go(sum(s.nbytes for _, s in self.points.pop(column, ())))
        return frame

    def _on_last_rows(self, points: Sequence[tuple[int, Points]], row_keys: np.ndarray,
                      dtype) -> pd.arrays.SparseArray:
        """Each series' latest point's value on the series' last row (rows are in time order),
        NaN on every other row (a sparse column: frames.on_rows); a series with no row has none."""
        last_row = last_of(row_keys, max(len(self.keys), 1))
        latest: dict[int, tuple[float, float]] = {}
        for k, series in points:
            if not len(series):
                continue
            at, value = ((series.first + (len(series) - 1) * self.step, series.values[-1])
                         if isinstance(series, Steps) else (series[-1, 0], series[-1, 1]))
            if k not in latest or at >= latest[k][0]:
                latest[k] = (at, value)
        placed = sorted((last_row[k], value) for k, (_, value) in latest.items() if last_row[k] >= 0)
        return on_rows(len(row_keys), np.array([row for row, _ in placed], np.int64),
                       np.array([value for _, value in placed], dtype))

    def _row_labels(self, layout: _Layout, n_names: int) -> tuple[np.ndarray, list[tuple[str, ...]]]:
        """Each row's entry in the table of label sets, which ends with one of empty labels."""
        row_sets: dict[tuple[str, ...], int] = {}
        points, codes = [], []
        for k, values, labels in self.row_labels:
            points.append((k, values))
            codes.append(row_sets.setdefault(labels, len(row_sets)))
        self.row_labels = []
        # Labels of a point in no chosen column name no row; a row without any, the last entry.
        return (layout.column(self._placed(layout, points, codes), np.int32, len(row_sets)),
                list(row_sets) + [("",) * n_names])

    def _placed(self, layout: _Layout, points: Sequence[tuple[int, Points]],
                codes: Sequence[int] | None = None) -> list[tuple[slice | np.ndarray, np.ndarray | int]]:
        """The series' points within the window as (cells, values), in the order they came:
        their own values, or one code per series (`codes`). On a grid, Steps are a slice of it,
        so that most cells are never computed one by one; the other series between two Steps
        are placed together."""
        if not layout.dense:
            return [self._cells(layout, points, codes)] if points else []
        placed: list = []
        pairs: list[int] = []       # positions in `points` of series of (time, value) pairs not yet placed

        def place_pairs() -> None:
            if pairs:
                placed.append(self._cells(layout, [points[n] for n in pairs],
                                          None if codes is None else [codes[n] for n in pairs]))
                pairs.clear()

        for n, (k, series) in enumerate(points):
            if not isinstance(series, Steps):
                pairs.append(n)
                continue
            place_pairs()
            first = self._step_of(series.first)
            a, b = max(first, 0), min(first + len(series), layout.n_times)
            if a < b:
                placed.append((layout.cells(k, a, b), series.values[a - first:b - first] if codes is None else codes[n]))
        place_pairs()
        return placed

    def _step_of(self, time: float) -> int:
        """The grid step of a time, rounded as _cells rounds (half to even)."""
        return round((time - self.start) * (1.0 / self.step))

    def _cells(self, layout: _Layout, points: Sequence[tuple[int, Points]],
               codes: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
        """The cells of the series' points that fall within the window, and their values (the
        series' own, or its code per point)."""
        keys, series = _unzip(points)
        index = np.concatenate([self._step_of(s.first) + np.arange(len(s)) if isinstance(s, Steps) else
                                np.rint((s[:, 0] - self.start) * (1.0 / self.step)).astype(np.int64)
                                for s in series] or [np.empty(0, np.int64)])
        inside = (index >= 0) & (index < layout.n_times)
        lengths = [len(s) for s in series]
        cells = layout.cell(index, np.repeat(np.asarray(keys, np.int64), lengths))
        values = (np.concatenate([s.values if isinstance(s, Steps) else s[:, 1] for s in series] or [np.empty(0)])
                  if codes is None else np.repeat(np.asarray(codes, np.int32), lengths))
        return (cells, values) if inside.all() else (cells[inside], values[inside])


# A grid of up to this many cells (a few bytes each, per column) is laid out whole however few
# points fill it; a larger one only where it has at least one point in eight cells.
DENSE_CELLS = 2**24


class _Layout:
    """Where a table's points go: the rows (time, series) that any point fills, in that order,
    and each column's values on them. Where the points fill a good part of the (series ×
    times) grid they are put into one laid out series by series, as they come (memory read
    and written in order), and read off it by time once per column; elsewhere the cells are by
    time, sorted, and searched."""

    def __init__(self, n_points: int, n_times: int, n_keys: int) -> None:
        self.n_times, self.n_keys = n_times, n_keys
        self.size = n_times * n_keys
        self.dense = self.size <= 8 * n_points + DENSE_CELLS

    def cell(self, index: np.ndarray, key: np.ndarray) -> np.ndarray:
        if self.dense:
            key *= self.n_times
            key += index
            return key
        index *= self.n_keys
        index += key
        return index

    def cells(self, key: int, first: int, stop: int) -> slice:
        """A series' consecutive steps on the grid."""
        return slice(key * self.n_times + first, key * self.n_times + stop)

    def fill(self, placed: list[list[tuple[slice | np.ndarray, np.ndarray | int]]]) -> None:
        if self.dense:
            present = np.zeros(self.size, dtype=bool)
            for column in placed:
                for cells, _ in column:
                    present[cells] = True
            self.times, self.keys = np.divmod(np.flatnonzero(self._by_time(present)), self.n_keys)
            # Each row's cell on the grid, which is laid out series by series.
            self.on_grid = self.keys * self.n_times + self.times
            return
        # Sorted and thinned: np.unique hashes, and its hash is slow on places a stride apart.
        every = np.sort(np.concatenate([cells for column in placed for cells, _ in column] or [np.empty(0, np.int64)]))
        first = np.ones(len(every), bool)
        first[1:] = every[1:] != every[:-1]
        self.rows = every[first]
        self.times, self.keys = np.divmod(self.rows, self.n_keys)

    def column(self, placed: list[tuple[slice | np.ndarray, np.ndarray | int]], dtype, missing=np.nan) -> np.ndarray:
        """The values at their cells, on the rows; `missing` where a row has none."""
        if self.dense:
            grid = np.full(self.size, missing, dtype)
            for cells, values in placed:
                grid[cells] = values
            return grid[self.on_grid]
        out = np.full(len(self.rows), missing, dtype)
        for place, values in placed:
            if len(place) and len(self.rows):
                at = np.minimum(np.searchsorted(self.rows, place), len(self.rows) - 1)
                found = self.rows[at] == place
                out[at[found]] = values[found]
        return out

    def _by_time(self, grid: np.ndarray) -> np.ndarray:
        return grid.reshape(self.n_keys, self.n_times).T.ravel()


def _unzip(points: Sequence[tuple[int, Points]]) -> tuple[list[int], list[Points]]:
    return [k for k, _ in points], [values for _, values in points]


def _agent_rows(gpu: pd.DataFrame) -> np.ndarray:
    """The device rows an agent wrote: only it exports burnrate_gpu_up."""
    return gpu["up"].notna().to_numpy() if "up" in gpu else np.zeros(len(gpu), bool)


def dcgm_only(gpu: pd.DataFrame) -> list[str]:
    """Nodes whose GPUs have no burnrate_gpu_up: they run dcgm-exporter alone."""
    # On the categories' codes: a week's table is a million rows of a few hundred names.
    hosts = gpu[L.HOSTNAME].astype("category")
    codes, names = hosts.cat.codes.to_numpy(), hosts.cat.categories
    seen = np.bincount(codes[codes >= 0], minlength=len(names)) > 0
    agent = np.bincount(codes[(codes >= 0) & _agent_rows(gpu)], minlength=len(names)) > 0
    return sorted({str(names[i]) for i in np.flatnonzero(seen & ~agent)})


def _not_exporters(gpu: pd.DataFrame, exporter_pods: set[tuple[str, str]]) -> pd.DataFrame:
    """Device rows whose pod labels name a GPU exporter say nothing of who holds the GPU."""
    if not exporter_pods or not len(gpu):
        return gpu
    pairs = pd.MultiIndex.from_arrays([gpu[L.NAMESPACE].astype(str), gpu[L.POD].astype(str)])
    return gpu[~pairs.isin(list(exporter_pods))]


def _node_cpu(node: pd.DataFrame, answer: list[dict], first: float, step: float) -> pd.DataFrame:
    """CPU utilization is per Hostname: joined onto the node-info rows by host and time."""
    cpu = _Points((L.HOSTNAME,), first, step)
    for series in answer:
        cpu.add("cpu_utilization", series)
    n_times = int(round((node["t"].max() - first) / step)) + 1 if len(node) else 0
    by_host = cpu.frame({"cpu_utilization": "<f4"}, n_times) if cpu.keys and n_times else None
    if by_host is None:
        node["cpu_utilization"] = np.float32(np.nan)
        return node
    by_host[L.HOSTNAME] = by_host[L.HOSTNAME].astype(str)
    merged = node.assign(_host=node[L.HOSTNAME].astype(str)).merge(
        by_host.rename(columns={L.HOSTNAME: "_host"}), on=["t", "_host"], how="left")
    return merged.drop(columns="_host")


def _owner_names(owners: pd.DataFrame | None) -> dict[tuple[str, str], str]:
    if owners is None or not len(owners):
        return {}
    return dict(zip(zip(owners["namespace"], owners["pod"]), owners["owner_name"]))


def _label_jobs(frame: pd.DataFrame, owned: dict[tuple[str, str], str]) -> pd.DataFrame:
    """A held GPU whose series name no job (dcgm-exporter labels pods, not jobs) is
    named after its pod's controller, else after the pod (job_from_pod)."""
    if not len(frame):
        return frame
    unnamed = labelled(frame[L.TRAINING_JOB], ("",)) & ~labelled(frame[L.POD], ("",))
    if unnamed.any():
        jobs = text(frame[L.TRAINING_JOB])
        held = pd.MultiIndex.from_arrays([text(frame[L.NAMESPACE])[unnamed], text(frame[L.POD])[unnamed]])
        pairs = held.unique()          # named once per pod, not per row
        names = pd.Series([owned.get(pair) or job_from_pod(pair[1]) for pair in pairs], index=pairs)
        jobs[unnamed] = names.reindex(held).to_numpy()
        frame[L.TRAINING_JOB] = pd.Categorical(jobs)
    elif isinstance(frame[L.TRAINING_JOB].dtype, pd.CategoricalDtype):
        frame[L.TRAINING_JOB] = frame[L.TRAINING_JOB].cat.remove_unused_categories()
    else:
        frame[L.TRAINING_JOB] = pd.Categorical(text(frame[L.TRAINING_JOB]))
    if "up" in frame.columns:
        frame["up"] = frame["up"].astype("<f4")
    return frame


def empty_frames(window: Window, step: float) -> Frames:
    return Frames(window=window, step_s=step, rows_end_steps=True,
                  **{name: empty_table(name) for name in TABLES} | {"alloc": empty_alloc()})
