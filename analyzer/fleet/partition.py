"""Fleet mode's drill-down analysed in independent parts, each over its own stretch of time.

What fleet mode reads per GPU is a few nodes here and there over a week: a flagged node
around its flags, a flagged job's nodes over its life. On one week-wide grid those reads
are a few per cent of the cells (a week's allocation rows were 1.6% full), and the
analysis pays for the rest. Nothing a detector computes relates two nodes unless one job
ran on both, nor two stretches of one node further apart than the longest time any
detector or episode looks across, so the reads fall into groups: a node over one part
of the window (a piece), joined with every other piece that a job on it ran on (but for
jobs whose own figures fleet mode does not keep) and with the same node's pieces that
lie within that reach. Each group is analysed on a grid over its
own stretch (the window's steps, so every sample falls in the bin it would have), and
the reports are put together (report.combine).

One figure is fleet-wide: the thermal detector's usual peak clock of each GPU model,
the median over the GPUs analysed. It is taken from all the groups' samples first and
given to each, so a group of a few nodes judges its clocks by the same yardstick.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Collection, Mapping, Sequence

import numpy as np
import pandas as pd

from ..costing.cost import AdviceConfig
from ..detectors import DetectorConfig
from ..detectors.thermal_throttle import usual_peaks
from ..grid.frames import Frames, Window
from ..costing.pricing import Catalog
from ..output.report import Report, analyze, combine
from ..grid.views import job_name

Job = tuple[str, str]
Piece = tuple[str, Window]        # a node over a part of the window
TABLES = ("gpu", "alloc", "rank", "node", "xid", "pod_cpu")


def reach_s(config: DetectorConfig) -> float:
    """The longest time over which the analysis relates two samples of one series: the
    longest of the detectors' and the episodes' durations in minutes (gaps, runs, merge,
    block and history windows). Their hours are severity and size thresholds, which
    relate no two samples of a node: a job's size is the job's, whose pieces are joined."""
    return 60.0 * max((value for part in dataclasses.fields(config)
                       for name, value in vars(getattr(config, part.name)).items()
                       if name.endswith("_minutes") and isinstance(value, (int, float))), default=0.0)


def analyze_apart(frames: Frames, plan: Mapping[str, Sequence[Window]], catalog: Catalog,
                  config: DetectorConfig = DetectorConfig(), advice: AdviceConfig = AdviceConfig(),
                  class_overrides: Mapping[str, str] | None = None, unjoined: Collection[Job] = ()) -> Report:
    """The analysis of `frames`, read per node over the plan's parts, group by group, as one
    report. Jobs in `unjoined` (read over part of their life: fleet mode keeps none of their
    own figures) do not join the pieces they ran on."""
    frames = dataclasses.replace(frames, usual_peak_sm_clock_mhz=usual_peaks(frames.gpu))
    parts = split(frames, plan, reach_s(config), set(unjoined))
    return combine(frames, [analyze(part, catalog, config, advice, class_overrides) for part in parts])


def split(frames: Frames, plan: Mapping[str, Sequence[Window]], reach: float, unjoined: set[Job]) -> list[Frames]:
    """The frames of each group of pieces, on a window from the group's first piece's start to
    its last's end in the frames' own steps. A row belongs to the piece of its node whose part
    holds its time (a step's slack either side: a sample stands for the step before it).
    Frames with a row outside every piece (a rank without a node label) stay whole."""
    pieces = [(host, part) for host, parts in sorted(plan.items()) for part in parts]
    piece_of = {name: _piece_of(getattr(frames, name), pieces, frames.step_s) for name in TABLES}
    if len(pieces) < 2 or any((rows < 0).any() for rows in piece_of.values()):
        return [frames]
    parent = np.arange(len(pieces))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in zip(range(len(pieces)), range(1, len(pieces))):
        if pieces[a][0] == pieces[b][0] and pieces[b][1].start - pieces[a][1].end < reach:
            parent[root(b)] = root(a)
    for name in ("alloc", "rank"):
        table = getattr(frames, name)
        if not len(table):
            continue
        # Distinct (holder, piece) first, as categories: a few hundred strings, not a row's each.
        held = pd.DataFrame({c: table[c] for c in ("namespace", "training_job", "pod")}
                            | {"piece": piece_of[name]}).drop_duplicates()
        jobs = pd.DataFrame({"namespace": held["namespace"].astype(str).to_numpy(),
                             "job": job_name(held["training_job"].astype(str), held["pod"].astype(str)).to_numpy(),
                             "piece": held["piece"].to_numpy()})
        for job, on in jobs.groupby(["namespace", "job"], sort=False)["piece"]:
            if job not in unjoined:
                for i in on.to_numpy()[1:]:
                    parent[root(i)] = root(on.iloc[0])
    groups, group = np.unique([root(i) for i in range(len(pieces))], return_inverse=True)
    # Each table's rows by group, in their order: one sort rather than a mask per group.
    rows_of = {}
    for name in TABLES:
        of_row = group[piece_of[name]]
        order = np.argsort(of_row, kind="stable")
        rows_of[name] = np.split(order, np.searchsorted(of_row[order], np.arange(1, len(groups))))
    step, first = frames.step_s, frames.window.start
    out = []
    for g in range(len(groups)):
        mine = [pieces[i][1] for i in np.flatnonzero(group == g)]
        a = first + math.floor((min(p.start for p in mine) - first) / step) * step
        b = first + math.ceil((max(p.end for p in mine) - first) / step) * step
        out.append(dataclasses.replace(
            frames, window=Window(max(a, frames.window.start), min(b, frames.window.end)),
            **{name: getattr(frames, name).take(rows_of[name][g]) for name in TABLES}))
    return out


def _piece_of(frame: pd.DataFrame, pieces: list[Piece], step: float) -> np.ndarray:
    """Each row's piece (-1: none)."""
    out = np.full(len(frame), -1, np.int64)
    if not len(frame) or "Hostname" not in frame.columns:
        return out
    hosts = frame["Hostname"].astype("category")
    codes, t = hosts.cat.codes.to_numpy(), frame["t"].to_numpy()
    code_of = {str(host): code for code, host in enumerate(hosts.cat.categories)}
    rows_of: dict[int, np.ndarray] = {}
    for i, (host, part) in enumerate(pieces):
        code = code_of.get(host)
        if code is None:
            continue
        if code not in rows_of:
            rows_of[code] = np.flatnonzero(codes == code)
        rows = rows_of[code]
        out[rows[(t[rows] >= part.start - step) & (t[rows] <= part.end + step)]] = i
    return out
