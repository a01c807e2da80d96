"""Who holds each GPU, from the best signal present for that GPU at that time.

Clusters mix agent versions and dcgm-exporter nodes, and federated or relabelled
copies drop series, so allocation is decided per GPU and per time, best first
(docs/analyze.md, "Any mix of exporters"):

1. `burnrate_gpu_allocation_share_ratio`: the share each pod holds (MIG, time-slicing);
2. `burnrate_gpu_allocated` (older agents): each holder gets an equal share;
3. pod labels on the device series (dcgm-exporter's Kubernetes mapping): likewise.

The chosen signal is kept in the `signal` column, so the report can say per node
where its allocation came from.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from burnrate.exporter import labels as L

from ..grid.series import labelled

SHARE_RATIO = "share_ratio"
ALLOCATED = "allocated"
POD_LABELS = "pod_labels"
SIGNALS = (SHARE_RATIO, ALLOCATED, POD_LABELS)      # best first
ALLOC_LABELS = L.DEVICE_LABELS + L.POD_LABELS


def best_allocation(alloc: pd.DataFrame, gpu: pd.DataFrame, first: float, step: float) -> pd.DataFrame:
    """The alloc table: `alloc` holds the share ratio (`share`) and/or the allocated
    flag (`allocated`) per (GPU, pod) row; `gpu` the device rows with pod labels."""
    signals = []        # (table, its rows with the signal, the signal)
    if "share" in alloc:
        signals.append((alloc, np.flatnonzero(alloc["share"].notna().to_numpy()), SHARE_RATIO))
    if "allocated" in alloc:
        signals.append((alloc, np.flatnonzero(alloc["allocated"].to_numpy() > 0), ALLOCATED))
    if len(gpu) and L.POD in gpu:
        signals.append((gpu, np.flatnonzero(~labelled(gpu[L.POD], ("",))), POD_LABELS))
    signals = [s for s in signals if len(s[1])]
    if not signals:
        return empty_alloc()
    # The best signal per (GPU, time) is chosen on arrays first, and only the rows kept are
    # put together: where agents report share ratios, the pod labels of every device row
    # would be taken and merged only to be dropped (half the rows of a day of 1,024 GPUs).
    gpus = [pd.Categorical(table[L.UUID]) for table, _, _ in signals]
    uuids = pd.Index(np.concatenate([g.categories.to_numpy(object) for g in gpus])).unique()
    # Row-long arrays of both tables' rows (twice a table's length): made in place, one at a time.
    point = np.concatenate([table["t"].to_numpy()[rows] for table, rows, _ in signals])
    point -= first
    point /= step
    point = np.rint(point, out=point).astype(np.int64)
    low, span = int(point.min()), int(point.max()) + 1
    cell = np.concatenate([uuids.get_indexer(g.categories)[g.codes[rows]]
                           for g, (_, rows, _) in zip(gpus, signals)]).astype(np.int64)
    cell *= span
    cell += point
    cell -= low
    del point
    rank = np.repeat(np.asarray([SIGNALS.index(signal) for _, _, signal in signals], np.int8),
                     [len(rows) for _, rows, _ in signals])
    best = np.full(int(cell.max()) + 1, len(SIGNALS), np.int8)
    for level in range(len(SIGNALS) - 1, -1, -1):     # best last, so it overwrites
        best[cell[rank == level]] = level
    kept = rank == best[cell]
    del best, rank
    cell = cell[kept]
    bounds = np.cumsum([0] + [len(rows) for _, rows, _ in signals])
    candidates = [_candidate(table, rows[kept[a:b]], signal)
                  for (table, rows, signal), a, b in zip(signals, bounds[:-1], bounds[1:])]
    # Labels stay categorical throughout: their text is made once per distinct value, not per row.
    merged = pd.DataFrame({
        "t": np.concatenate([c["t"].to_numpy() for c in candidates]),
        "share": np.concatenate([c["share"].to_numpy(np.float32) for c in candidates]),
        **{name: union_categoricals([c[name] for c in candidates]) for name in (*ALLOC_LABELS, "signal")}})
    if any("sample_count" in c for c in candidates):
        merged["sample_count"] = np.concatenate([c["sample_count"].to_numpy(np.float32) if "sample_count" in c
                                                 else np.full(len(c), np.nan, np.float32) for c in candidates])
    del candidates
    equal = merged["share"].isna().to_numpy()
    if equal.any():
        # Each holder of a GPU gets an equal share where the signal has no ratio.
        holders = np.bincount(cell[equal], minlength=int(cell.max()) + 1)
        share = merged["share"].to_numpy(np.float32).copy()
        share[equal] = 1.0 / holders[cell[equal]]
        merged["share"] = share
    t = merged["t"].to_numpy()
    # Each signal's rows are by time already: one signal alone (agents everywhere) needs no sort.
    return merged if (t[1:] >= t[:-1]).all() else merged.sort_values("t", kind="stable", ignore_index=True)


def _candidate(table: pd.DataFrame, rows: np.ndarray, signal: str) -> pd.DataFrame:
    """The table's rows (positions) of one signal, in the alloc table's columns."""
    share = table["share"].to_numpy(np.float32)[rows] if signal == SHARE_RATIO else np.full(len(rows), np.nan, np.float32)
    out = pd.DataFrame({"t": table["t"].to_numpy()[rows], "share": share})
    for name in ALLOC_LABELS:
        out[name] = _text_categories(table[name])[rows] if name in table else pd.Categorical.from_codes(
            np.zeros(len(rows), np.int8), [""])
    if "sample_count" in table:
        out["sample_count"] = table["sample_count"].to_numpy()[rows]
    out["signal"] = pd.Categorical.from_codes(np.zeros(len(rows), np.int8), [signal])
    return out


def _text_categories(column: pd.Series) -> pd.Categorical:
    """The column as a categorical of text, converting each distinct value once."""
    values = pd.Categorical(column)
    text = values.categories.astype(str)
    if text.has_duplicates:     # distinct values with one spelling (1 and "1")
        return pd.Categorical(column.astype(str))
    return values.rename_categories(text)


def empty_alloc() -> pd.DataFrame:
    """An alloc table with no rows, in the columns every source gives it."""
    return pd.DataFrame({"t": pd.Series(dtype="f8"), "share": pd.Series(dtype="f4"),
                         **{n: pd.Categorical([]) for n in (*ALLOC_LABELS, "signal")}})
