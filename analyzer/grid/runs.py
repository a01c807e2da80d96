"""A job is a run, not a name: one training job name can cover several runs.

A PyTorchJob deleted and submitted again under the same name, or one script started
twice in a dev pod, is two runs with two costs. A new run starts where the job's
trainer telemetry comes back after a silence longer than the staleness bound (its
ranks were gone, not late), or where its world size changes (a new world), unless it
comes back resumed from a checkpoint (`resumed_from` above 0): that is the same job
restarted, whose restart and lost progress the ledger counts (analyzer.costing.ledger). Where a
job has more than one run in the window, each run is named `<job>@<start>` (its
start in ISO-8601), and the job's allocations follow the runs in time: GPUs held
after a run's last report, until the next run, are that run's.

Jobs without telemetry keep their names: nothing says where one run ends.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .frames import Frames, iso
from .holding import STALENESS_S
from .series import series_numbers

RENAMED = ("rank", "alloc", "gpu")


def label_runs(frames: Frames, staleness_s: float = STALENESS_S, in_place: bool = False) -> Frames:
    """The frames with every multi-run job's rows named after their run; `in_place` renames
    them in the frames' own tables, which then share no column with a copy."""
    starts = run_starts(frames.rank, staleness_s)
    if not starts:
        return frames
    tables = {name: _relabel(getattr(frames, name), starts, in_place) for name in RENAMED}
    before = frames.rank_before
    return replace(frames, **tables, rank_before=None if before is None else _relabel(before, starts, False))


def run_starts(rank: pd.DataFrame, staleness_s: float = STALENESS_S) -> dict[tuple[str, str], np.ndarray]:
    """(namespace, training_job) -> the start of each run, for jobs with more than one."""
    if not len(rank) or "world_size" not in rank:
        return {}
    job = series_numbers(rank, ("namespace", "training_job"))
    order = np.argsort(job, kind="stable")          # rows are time-sorted: (job, t) order
    job, t, world = job[order], rank["t"].to_numpy()[order], rank["world_size"].to_numpy()[order]
    same = job[1:] == job[:-1]
    # A run ends where every rank fell silent for longer than the staleness bound, or
    # the world changed size between two reports.
    changed = (world[1:] != world[:-1]) & np.isfinite(world[1:]) & np.isfinite(world[:-1])
    resumed = (rank["resumed_from"].to_numpy()[order][1:] > 0) if "resumed_from" in rank else np.zeros(len(t) - 1, bool)
    new = np.flatnonzero(same & (((np.diff(t) > staleness_s) & ~resumed) | changed)) + 1
    if not len(new):
        return {}
    first = np.flatnonzero(np.concatenate([[True], ~same]))          # each job's first row
    names = rank[["namespace", "training_job"]].iloc[order[first]].astype(str).to_numpy()
    out = {}
    for k in np.unique(job[new]):
        begins = np.concatenate([t[first[k]:first[k] + 1], t[new[job[new] == k]]])
        out[(names[k][0], names[k][1])] = begins
    return out


def _relabel(frame: pd.DataFrame, starts: dict[tuple[str, str], np.ndarray], in_place: bool) -> pd.DataFrame:
    if not len(frame) or "training_job" not in frame:
        return frame
    names = frame["training_job"].astype(str).to_numpy().copy()
    namespaces = frame["namespace"].astype(str).to_numpy()
    t = frame["t"].to_numpy()
    for (namespace, name), begins in starts.items():
        mine = np.flatnonzero((names == name) & (namespaces == namespace))
        if not len(mine):
            continue
        # Before the first run's first report, the GPUs are the first run's; after a run, until the next.
        run = np.maximum(np.searchsorted(begins, t[mine], side="right") - 1, 0)
        labels = np.array([f"{name}@{iso(b)}" for b in begins], dtype=object)
        names[mine] = labels[run]
    if not in_place:
        return frame.assign(training_job=pd.Categorical(names))
    frame["training_job"] = pd.Categorical(names)
    return frame
