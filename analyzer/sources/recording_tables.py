"""Load a recording written by `burnrate agent --record` or `burnrate simulate`
into tidy pandas frames: one row per (time, series), label columns as categoricals.

Only the columns asked for are read, and only the rows of the window asked for
(rows are time-sorted within a segment: two binary searches find them). Long
windows are read in chunks and reduced to the window's step as they go
(analyzer.grid.resample), so memory follows the frames, not the recording.
A segment whose columns differ in length (a crash mid-write) is cut to its
shortest complete column, and rows whose key never reached keys.jsonl are dropped.
A value column that is lost altogether (no file, or an empty one) reads as no value
rather than taking its table's rows with it; `damage` says what is lost, and where.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from burnrate.exporter.recording import FORMAT, TABLES

from ..grid.resample import reduce_rows
from .timeparse import format_time

# Rows read at once: small enough that a chunk's arrays are reused from the heap
# instead of faulted in afresh, and that a long window never sits in memory whole.
CHUNK_ROWS = 1 << 19


class RecordingError(ValueError):
    """Not a recording, or a table that does not exist."""


@dataclass(frozen=True)
class Span:
    """The rows to read: t in [start, end]; with `step`, reduced to the points
    first, first + step, … (each holding the samples of (point - step, point])."""
    start: float
    end: float
    first: float | None = None
    step: float | None = None


def check(root: str) -> None:
    try:
        with open(os.path.join(root, "burnrate.json"), encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{root} is not a burnrate recording (no readable burnrate.json)") from exc
    if meta.get("format") != FORMAT["format"] or meta.get("version") != FORMAT["version"]:
        raise RecordingError(f"{root}: unsupported recording format {meta}")


def segments(root: str, table: str) -> list[str]:
    directory = os.path.join(root, table)
    return [os.path.join(directory, s) for s in sorted(os.listdir(directory))] if os.path.isdir(directory) else []


def _keys(segment: str) -> dict[int, dict[str, str]]:
    keys = {}
    try:
        with open(os.path.join(segment, "keys.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # torn last line: its rows are dropped below
                entry = json.loads(line)
                keys[entry["key"]] = entry["labels"]
    except FileNotFoundError:
        pass
    return keys


def _read(path: str, dtype: str, lo: int, hi: int) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    return np.fromfile(path, dtype="<" + dtype, count=hi - lo, offset=lo * size)


def _column_rows(segment: str, column: str, dtype: str) -> int:
    path = os.path.join(segment, f"{column}.{dtype}")
    return os.path.getsize(path) // np.dtype(dtype).itemsize if os.path.exists(path) else 0


def complete_rows(segment: str, dtypes: dict[str, str]) -> int:
    """Rows every column of a segment has in full."""
    return min(_column_rows(segment, c, d) for c, d in dtypes.items())


def _lost(segment: str, columns: dict[str, str]) -> set[str]:
    """Value columns with no rows where the time column has some: lost, not in flight."""
    if not _column_rows(segment, "t", "f8"):
        return set()
    return {c for c, d in columns.items() if not _column_rows(segment, c, d)}


def damage(root: str, start: float, end: float) -> list[str]:
    """One line per part of a recording that cannot be read in [start, end]: a value
    column lost (its rows read as no value) or a time column lost (its rows cannot be
    placed in time), with the rows and the time it covers."""
    notes = []
    for table, (_labels, columns) in TABLES.items():
        for segment in segments(root, table):
            where = f"recording {table}/{os.path.basename(segment)}"
            rows = complete_rows(segment, {"t": "f8", "key": "u4"})
            if not rows:
                stranded = max(_column_rows(segment, c, d) for c, d in columns.items())
                if stranded:
                    notes.append(f"{where}: no readable time or key column, {stranded:,} rows cannot be placed in time")
                continue
            lost = sorted(_lost(segment, columns))
            t = np.memmap(os.path.join(segment, "t.f8"), dtype="<f8", mode="r", shape=(rows,))
            lo, hi = int(np.searchsorted(t, start, "left")), int(np.searchsorted(t, end, "right"))
            if lost and hi > lo:
                notes.append(f"{where}: {', '.join(lost)} lost, {hi - lo:,} rows from {format_time(t[lo])} "
                             f"to {format_time(t[hi - 1])} read as no value")
    return notes


def _chunks(t: np.ndarray, span: Span | None) -> Iterator[tuple[int, int]]:
    """Row ranges of the span (t is the memory-mapped time column); when reducing,
    each ends on a point boundary, so that no point is split between chunks."""
    if span is None:
        lo, hi = 0, len(t)
    elif span.step is None:
        lo, hi = int(np.searchsorted(t, span.start, "left")), int(np.searchsorted(t, span.end, "right"))
    else:
        lo, hi = int(np.searchsorted(t, span.first - span.step, "right")), int(np.searchsorted(t, span.end, "right"))
    while lo < hi:
        end = min(lo + CHUNK_ROWS, hi)
        if span is not None and span.step is not None and end < hi:
            point = np.ceil((t[end] - span.first) / span.step)
            end = max(int(np.searchsorted(t, span.first + (point - 1) * span.step, "right")), lo + 1)
        yield lo, end
        lo = end


def _segment(segment: str, label_names: tuple[str, ...], columns: dict[str, str], table: str,
             span: Span | None) -> pd.DataFrame | None:
    lost = _lost(segment, columns)
    dtypes = {"t": "f8", "key": "u4", **columns}
    rows = complete_rows(segment, {c: d for c, d in dtypes.items() if c not in lost})
    if rows == 0:
        return None
    path = {c: os.path.join(segment, f"{c}.{d}") for c, d in dtypes.items()}
    keys = _keys(segment)
    order = np.array(sorted(keys), dtype=np.int64)
    # Row key -> position in `order`, -1 for a key that never reached keys.jsonl.
    position = np.full(int(order[-1]) + 2 if len(order) else 1, -1, np.int64)
    position[order] = np.arange(len(order))
    chunks = list(_chunks(np.memmap(path["t"], dtype="<f8", mode="r", shape=(rows,)), span))
    # Each chunk's rows are written straight into arrays sized for the whole span:
    # no copy to join the chunks, and pages a reduction leaves unwritten are never touched.
    capacity = sum(hi - lo for lo, hi in chunks)
    reducing = span is not None and span.step is not None
    out = {"t": np.empty(capacity), "series": np.empty(capacity, np.int64),
           **{c: np.empty(capacity, "<" + d) for c, d in columns.items()},
           **({"sample_count": np.empty(capacity, np.float32)} if reducing else {})}
    filled = 0
    for lo, hi in chunks:
        times, key = _read(path["t"], "f8", lo, hi), _read(path["key"], "u4", lo, hi)
        values = {c: np.full(hi - lo, np.nan, "<" + d) if c in lost else _read(path[c], d, lo, hi)
                  for c, d in columns.items()}
        series = position[np.minimum(key, len(position) - 1)]
        known = series >= 0
        if not known.all():
            times, series, values = times[known], series[known], {c: v[known] for c, v in values.items()}
        if reducing:
            times, series, values = reduce_rows(times, series, len(order), values, table, span.first, span.step)
        for name, part in (("t", times), ("series", series), *values.items()):
            out[name][filled:filled + len(times)] = part
        filled += len(times)
    if not filled:
        return None
    values = [*columns, *(["sample_count"] if reducing else [])]
    frame = pd.DataFrame({"t": out["t"][:filled], **{c: out[c][:filled] for c in values}}, copy=False)
    # Labels via the small key table, not per row: one take per label column.
    at = out["series"][:filled]
    for name in label_names:
        values = pd.Categorical([keys[k].get(name, "") for k in order])
        frame[name] = pd.Categorical.from_codes(values.codes[at], values.categories)
    return frame


def empty_table(table: str, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """A table with no rows and the columns (in order) load_table gives it."""
    label_names, all_columns = TABLES[table]
    wanted = list(all_columns) if columns is None else list(columns)
    empty = {"t": pd.Series(dtype="f8"), **{c: pd.Series(dtype=all_columns[c]) for c in wanted},
             **{n: pd.Categorical([]) for n in label_names}}
    return pd.DataFrame(empty)


def load_table(root: str, table: str, columns: Iterable[str] | None = None, span: Span | None = None) -> pd.DataFrame:
    """All segments of one table: `t` (unix seconds), the label columns, the values."""
    check(root)
    if table not in TABLES:
        raise RecordingError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    label_names, all_columns = TABLES[table]
    wanted = list(all_columns) if columns is None else list(columns)
    missing = set(wanted) - set(all_columns)
    if missing:
        raise RecordingError(f"table {table} has no columns {sorted(missing)}")
    dtypes = {c: all_columns[c] for c in wanted}
    frames = [f for s in segments(root, table)
              if (f := _segment(s, label_names, dtypes, table, span)) is not None]
    if not frames:
        return empty_table(table, wanted)
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    for name in label_names:  # concat of differing categories falls back to object
        if frame[name].dtype != "category":
            frame[name] = frame[name].astype("category")
    if len(frames) > 1:
        frame = frame.sort_values("t", kind="stable", ignore_index=True)
    return frame
