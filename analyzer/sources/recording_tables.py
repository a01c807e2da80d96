"""Load a recording written by `burnrate agent --record` or `burnrate simulate`
into tidy pandas frames: one row per (time, series), label columns as categoricals.

Only the columns asked for are read, and only the rows of the window asked for
(rows are time-sorted within a segment: two binary searches find them). Long
windows are read in chunks and reduced to the window's step as they go
(analyzer.grid.resample), so memory follows the frames, not the recording.
A segment's rows are those its time and key columns both hold (the writer appends
the time column last, so a crash leaves the others longer, never shorter); a value
column shorter than that, or lost altogether, reads as no value past its end rather
than taking its table's rows with it. Rows whose time is impossible or out of order,
and series whose line in keys.jsonl is unreadable, are dropped. Nothing of this is
silent: `damage` says what was lost or dropped, and where.
"""
from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from burnrate.exporter.recording import FORMAT, TABLES

from ..grid.frames import frame_dtypes, on_rows
from ..grid.resample import reduce_rows
from ..grid.series import last_of
from .timeparse import format_time

# Rows read at once: small enough that a chunk's arrays are reused from the heap
# instead of faulted in afresh, and that a long window never sits in memory whole.
CHUNK_ROWS = 1 << 19
# Times outside this range are damage, not samples. The upper bound is fixed rather than
# now + a margin: a simulated fleet may be dated ahead on purpose (`simulate --end`).
EARLIEST, LATEST = 946_684_800.0, 4_102_444_800.0   # 2000-01-01, 2100-01-01 UTC


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


def _keys(segment: str) -> tuple[dict[int, dict[str, str]], int]:
    """The series of a segment, and the count of lines of keys.jsonl that are unreadable.
    The writer numbers series 0, 1, … in line order, so a key must be a whole number
    below the count of lines; anything else is damage (and could not be held in an
    array indexed by key)."""
    try:
        with open(os.path.join(segment, "keys.jsonl"), encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return {}, 0
    if lines and not lines[-1].endswith("\n"):
        lines.pop()  # torn last line, a write in flight: its rows were not written
    keys, unreadable = {}, 0
    for line in lines:
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        key, labels = (entry.get("key"), entry.get("labels")) if isinstance(entry, dict) else (None, None)
        if (type(key) is int and 0 <= key < len(lines) and key not in keys and isinstance(labels, dict)
                and all(isinstance(v, str) for v in labels.values())):
            keys[key] = labels
        else:
            unreadable += 1
    return keys, unreadable


def _read(path: str, dtype: str, lo: int, hi: int, available: int | None = None) -> np.ndarray:
    """Rows [lo, hi) of a column, read-only; past `available` rows, NaN (a column cut short)."""
    have = hi - lo if available is None else max(0, min(hi, available) - lo)
    values = _mapped_rows(path, "<" + dtype, lo, have) if have else np.empty(0, "<" + dtype)
    return values if have == hi - lo else np.concatenate([values, np.full(hi - lo - have, np.nan, "<" + dtype)])


def _mapped_rows(path: str, dtype: str, lo: int, count: int) -> np.ndarray:
    """`count` rows of a column from row `lo`, mapped rather than read: the reduction takes
    what it keeps straight from the page cache. A read copied every byte of every column
    into fresh memory first, and on a week of a thousand GPUs that copy and the faults of
    the memory it went into were most of the read's time. The mapping lives as long as the
    array, a chunk's worth, so the process holds no more of the files than a read would."""
    size = np.dtype(dtype).itemsize
    start = lo * size
    aligned = start - start % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), start - aligned + count * size, access=mmap.ACCESS_READ, offset=aligned)
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=start - aligned)


def _column_rows(segment: str, column: str, dtype: str) -> int:
    path = os.path.join(segment, f"{column}.{dtype}")
    return os.path.getsize(path) // np.dtype(dtype).itemsize if os.path.exists(path) else 0


def complete_rows(segment: str, dtypes: dict[str, str]) -> int:
    """Rows every column of a segment has in full."""
    return min(_column_rows(segment, c, d) for c, d in dtypes.items())


def placed_rows(segment: str) -> int:
    """Rows with a time and a key: the segment's rows."""
    return complete_rows(segment, {"t": "f8", "key": "u4"})


@dataclass(frozen=True)
class Times:
    """A segment's time column, checked: `t` is sorted for binary searches (a dropped row
    holds the time of the last good one before it, -inf before the first), `dropped`
    marks the rows to drop (None when none)."""
    t: np.ndarray
    dropped: np.ndarray | None
    impossible: int      # rows before EARLIEST or after LATEST (or NaN)
    out_of_order: int    # rows earlier than a row before them
    first: float
    last: float


def read_times(segment: str, rows: int) -> Times:
    """The first `rows` times of a segment, checked once per version of the file."""
    path = os.path.join(segment, "t.f8")
    stat = os.stat(path)
    checked = _checked_times(path, rows, stat.st_ino, stat.st_mtime_ns)
    # A clean column is mapped afresh, so that the cache keeps no pages of it resident.
    return checked if checked.dropped is not None else replace(checked, t=_mapped(path, rows))


def _mapped(path: str, rows: int) -> np.ndarray:
    return _mapped_rows(path, "<f8", 0, rows) if rows else np.empty(0)


@lru_cache(maxsize=32)
def _checked_times(path: str, rows: int, *_version: int) -> Times:
    t = _mapped(path, rows)
    dropped, impossible, out_of_order, top = [], 0, 0, -np.inf
    for lo in range(0, rows, CHUNK_ROWS):
        chunk = np.asarray(t[lo:lo + CHUNK_ROWS])
        possible = (chunk >= EARLIEST) & (chunk < LATEST)
        if possible.all() and chunk[0] >= top and (chunk[1:] >= chunk[:-1]).all():
            top = chunk[-1]
            continue
        # The latest possible time before each row: a row earlier than it is out of order.
        latest = np.maximum.accumulate(np.where(possible, chunk, -np.inf))
        before = np.maximum(np.concatenate(([top], latest[:-1])), top)
        late = possible & (chunk < before)
        impossible, out_of_order = impossible + int((~possible).sum()), out_of_order + int(late.sum())
        dropped.append((lo, ~possible | late))
        top = max(top, latest[-1])
    if not dropped:
        return Times(np.empty(0), None, 0, 0, float(t[0]) if rows else 0.0, float(top) if rows else 0.0)
    mask = np.zeros(rows, bool)
    for lo, part in dropped:
        mask[lo:lo + len(part)] = part
    repaired = np.maximum.accumulate(np.where(mask, -np.inf, t))
    good = np.flatnonzero(~mask)
    first, last = (float(t[good[0]]), float(top)) if len(good) else (0.0, 0.0)
    return Times(repaired, mask, impossible, out_of_order, first, last)


def damage(root: str, start: float, end: float) -> list[str]:
    """One line per part of a recording that cannot be read as written: rows that cannot
    be placed in time (no time or key for them), value columns lost or cut short (their
    rows in [start, end] read as no value), rows with impossible or out-of-order times,
    unreadable series in keys.jsonl (those three dropped)."""
    notes = []
    for table, (_labels, columns) in TABLES.items():
        for segment in segments(root, table):
            where = f"recording {table}/{os.path.basename(segment)}"
            rows = placed_rows(segment)
            lengths = {c: _column_rows(segment, c, d) for c, d in columns.items()}
            longest = max([*lengths.values(), _column_rows(segment, "t", "f8"), _column_rows(segment, "key", "u4")])
            if not rows:
                if longest:
                    notes.append(f"{where}: no readable time or key column, {longest:,} rows cannot be placed in time")
                continue
            if longest > rows:
                notes.append(f"{where}: {longest - rows:,} rows past the end of its time or key column "
                             "cannot be placed in time")
            checked = read_times(segment, rows)
            notes += _short_columns(where, checked, lengths, rows, start, end)
            dropped = _dropped_times(checked)
            if dropped:
                notes.append(f"{where}: {dropped}")
            unreadable = _keys(segment)[1]
            if unreadable:
                notes.append(f"{where}: {unreadable:,} unreadable lines in keys.jsonl, the rows of their series dropped")
    return notes


def _rows(n: int) -> str:
    return f"{n:,} row{'' if n == 1 else 's'}"


def _dropped_times(checked: Times) -> str | None:
    parts = []
    if checked.impossible:
        times = "an impossible time" if checked.impossible == 1 else "impossible times"
        parts.append(f"{_rows(checked.impossible)} with {times} (before 2000 or after 2100)")
    if checked.out_of_order:
        parts.append(f"{_rows(checked.out_of_order)} out of time order")
    return " and ".join(parts) + " dropped" if parts else None


def _short_columns(where: str, checked: Times, lengths: dict[str, int], rows: int,
                   start: float, end: float) -> list[str]:
    """Value columns that end before the segment's rows do, by where they end: their rows
    within [start, end] past that end read as no value."""
    lo, hi = int(np.searchsorted(checked.t, start, "left")), int(np.searchsorted(checked.t, end, "right"))
    notes = []
    for length in sorted({n for n in lengths.values() if n < rows}):
        begin = max(lo, length)
        if hi > begin:
            names = ", ".join(sorted(c for c, n in lengths.items() if n == length))
            notes.append(f"{where}: {names} {'lost' if not length else 'cut short'}, {hi - begin:,} rows from "
                         f"{format_time(checked.t[begin])} to {format_time(checked.t[hi - 1])} read as no value")
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
            cut = int(np.searchsorted(t, span.first + (point - 1) * span.step, "right"))
            # A point of more rows than a chunk is read whole: split, it would give two rows.
            end = cut if cut > lo else int(np.searchsorted(t, span.first + point * span.step, "right"))
        yield lo, end
        lo = end


def _segment(segment: str, label_names: tuple[str, ...], columns: dict[str, str], table: str,
             span: Span | None, only_last: Iterable[str] = ()) -> pd.DataFrame | None:
    rows = placed_rows(segment)
    if rows == 0:
        return None
    path = {c: os.path.join(segment, f"{c}.{d}") for c, d in {"t": "f8", "key": "u4", **columns}.items()}
    available = {c: _column_rows(segment, c, d) for c, d in columns.items()}
    keys = _keys(segment)[0]
    checked = read_times(segment, rows)
    order = np.array(sorted(keys), dtype=np.int64)
    # Row key -> position in `order`, -1 for a key that never reached keys.jsonl.
    position = np.full(int(order[-1]) + 2 if len(order) else 1, -1, np.int64)
    position[order] = np.arange(len(order))
    chunks = list(_chunks(checked.t, span))
    # Each chunk's rows are written straight into arrays sized for the whole span:
    # no copy to join the chunks, and pages a reduction leaves unwritten are never touched.
    capacity = sum(hi - lo for lo, hi in chunks)
    reducing = span is not None and span.step is not None
    # `only_last` columns are kept on each series' last row alone: its latest value so far.
    latest = {c: np.full(len(order), np.nan) for c in columns if c in only_last}
    out = {"t": np.empty(capacity), "series": np.empty(capacity, np.int64),
           **{c: np.empty(capacity, d) for c, d in frame_dtypes(table, columns).items() if c not in latest},
           **({"sample_count": np.empty(capacity, np.float32)} if reducing else {})}
    filled = 0
    for lo, hi in chunks:
        times, key = _read(path["t"], "f8", lo, hi), _read(path["key"], "u4", lo, hi)
        values = {c: _read(path[c], d, lo, hi, available[c]) for c, d in columns.items()}
        series = position[np.minimum(key, len(position) - 1)]
        known = series >= 0
        if checked.dropped is not None:
            known &= ~checked.dropped[lo:hi]
        if not known.all():
            times, series, values = times[known], series[known], {c: v[known] for c, v in values.items()}
        if reducing:
            times, series, values = reduce_rows(times, series, len(order), values, table, span.first, span.step)
        if latest:
            last = last_of(series, len(order))
            now = np.flatnonzero(last >= 0)
            for name in latest:
                latest[name][now] = values.pop(name)[last[now]]
        for name, part in (("t", times), ("series", series), *values.items()):
            out[name][filled:filled + len(times)] = part
        filled += len(times)
    if not filled:
        return None
    if latest:
        last = last_of(out["series"][:filled], len(order))
        rows = np.sort(last[last >= 0])
        for name in latest:
            out[name] = on_rows(filled, rows, latest[name][out["series"][rows]])
    values = [*columns, *(["sample_count"] if reducing else [])]
    # Labels via the small key table, not per row: one take per label column. Handed to the
    # frame as it is made, which keeps them (assigned afterwards, each would be copied).
    at = out["series"][:filled]
    labels = {}
    for name in label_names:
        each = pd.Categorical([keys[k].get(name, "") for k in order])
        labels[name] = pd.Categorical.from_codes(each.codes[at], each.categories)
    return pd.DataFrame({"t": out["t"][:filled], **{c: out[c] if c in latest else out[c][:filled] for c in values},
                         **labels}, copy=False)


def empty_table(table: str, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """A table with no rows and the columns (in order) load_table gives it."""
    label_names, all_columns = TABLES[table]
    wanted = list(all_columns) if columns is None else list(columns)
    empty = {"t": pd.Series(dtype="f8"), **{c: pd.Series(dtype=d) for c, d in frame_dtypes(table, wanted).items()},
             **{n: pd.Categorical([]) for n in label_names}}
    return pd.DataFrame(empty)


def load_table(root: str, table: str, columns: Iterable[str] | None = None, span: Span | None = None,
               only_last: Iterable[str] = ()) -> pd.DataFrame:
    """All segments of one table: `t` (unix seconds), the label columns, the values; the
    `only_last` columns hold each series' value on its last row alone, NaN on every other (a
    sparse column: frames.on_rows), as an analysis reads them (Grid.latest)."""
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
              if (f := _segment(s, label_names, dtypes, table, span, only_last)) is not None]
    if not frames:
        return empty_table(table, wanted)
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    for name in label_names:  # concat of differing categories falls back to object
        if frame[name].dtype != "category":
            frame[name] = frame[name].astype("category")
    if len(frames) > 1:
        frame = frame.sort_values("t", kind="stable", ignore_index=True)
    return frame
