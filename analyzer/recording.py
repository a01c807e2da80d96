"""Load a recording written by `burnrate agent --record` or `burnrate simulate`
into tidy pandas frames: one row per (time, series), label columns as categoricals.

Columns are read with one `numpy.fromfile` each and only those asked for; a segment
whose columns differ in length (a crash mid-write) is cut to its shortest
complete column, and rows whose key never reached keys.jsonl are dropped.
"""
from __future__ import annotations

import json
import os
from typing import Iterable

import numpy as np
import pandas as pd

from agent.recording import FORMAT, TABLES


class RecordingError(ValueError):
    """Not a recording, or a table that does not exist."""


def check(root: str) -> None:
    try:
        with open(os.path.join(root, "burnrate.json"), encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{root} is not a burnrate recording (no readable burnrate.json)") from exc
    if meta.get("format") != FORMAT["format"] or meta.get("version") != FORMAT["version"]:
        raise RecordingError(f"{root}: unsupported recording format {meta}")


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


def _segment(segment: str, label_names: tuple[str, ...], dtypes: dict[str, str]) -> pd.DataFrame | None:
    paths = {c: os.path.join(segment, f"{c}.{d}") for c, d in dtypes.items()}
    sizes = {c: os.path.getsize(p) if os.path.exists(p) else 0 for c, p in paths.items()}
    rows = min(sizes[c] // np.dtype(dtypes[c]).itemsize for c in dtypes)
    if rows == 0:
        return None
    data = {c: np.fromfile(paths[c], dtype="<" + dtypes[c], count=rows) for c in dtypes}
    keys = _keys(segment)
    known = np.isin(data["key"], np.fromiter(keys, dtype=np.uint32, count=len(keys)))
    if not known.all():
        data = {c: v[known] for c, v in data.items()}
    frame = pd.DataFrame({c: v for c, v in data.items() if c != "key"})
    # Labels via the small key table, not per row: one take per label column.
    codes = data["key"].astype(np.int64)
    order = np.array(sorted(keys), dtype=np.int64)
    position = np.searchsorted(order, codes)
    for name in label_names:
        values = pd.Categorical([keys[k].get(name, "") for k in order])
        frame[name] = pd.Categorical.from_codes(values.codes[position], values.categories)
    return frame


def load_table(root: str, table: str, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """All segments of one table: `t` (unix seconds), the label columns, the values."""
    check(root)
    if table not in TABLES:
        raise RecordingError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    label_names, all_columns = TABLES[table]
    wanted = list(all_columns) if columns is None else list(columns)
    missing = set(wanted) - set(all_columns)
    if missing:
        raise RecordingError(f"table {table} has no columns {sorted(missing)}")
    dtypes = {"t": "f8", "key": "u4", **{c: all_columns[c] for c in wanted}}
    directory = os.path.join(root, table)
    segments = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    frames = [f for s in segments if (f := _segment(os.path.join(directory, s), label_names, dtypes)) is not None]
    if not frames:
        empty = {"t": pd.Series(dtype="f8"), **{n: pd.Categorical([]) for n in label_names}}
        empty.update({c: pd.Series(dtype=all_columns[c]) for c in wanted})
        return pd.DataFrame(empty)
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    for name in label_names:  # concat of differing categories falls back to object
        if frame[name].dtype != "category":
            frame[name] = frame[name].astype("category")
    return frame.sort_values("t", kind="stable", ignore_index=True)
