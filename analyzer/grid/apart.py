"""Saves and evaluations: the time a training job spends apart from its steps.

One rule, which the ledger (docs/ledger.md, item 6), the `stalled` detector and the `straggler`
detector read from here: a save or an evaluation blocks the whole job for as long as its
slowest rank reports it. Ranks
that take no part in it (a loop that saves from rank 0 alone, as nanoGPT's `if master_process:`
does) or finish theirs first wait for it in their next collective, and report that wait in the
time to their next step, not as a save of their own.

Each rank reports a save's seconds as it ends (or as it goes, from a monitor that tells of one
under way), each node at its own scrape, and a sample's increase may be spread over two bins
of the grid: the ranks' reports of one save lie within a few bins of each other. So the bins
that report one kind of it, up to `JOIN_BINS` apart, are one stretch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from burnrate.exporter.ledger import BLOCKING

from .views import runs

# The ledger's categories of time apart from the steps, and the rank counter each is read from.
CATEGORIES = tuple(c.name for c in BLOCKING)
FIELDS = {c.name: field for c in BLOCKING for field, _ in c.counters}

JOIN_BINS = 3
"""Reports of one save this many bins apart or fewer are one: a node's scrape a sample later
than another's, each spread over two bins."""


@dataclass(frozen=True)
class Stretch:
    first: int          # the bins of its first and last report
    last: int
    seconds: float      # how long the job was blocked: the most any rank reported
    waited: float       # rank-seconds the other ranks waited for it, reported as no save of theirs


def stretches(reported: np.ndarray, present: np.ndarray) -> list[Stretch]:
    """The stretches of one kind (saves, or evaluations) in `reported`: (rows, bins) the seconds
    each of a job's rank rows reported of it in each bin (NaN or 0: none). `present`: (rows,
    bins) where each row reports at all: the ranks the job had then, which all waited."""
    with np.errstate(invalid="ignore"):
        reporting = (reported > 0).any(axis=0)
    out: list[Stretch] = []
    if not reporting.any():
        return out
    for r in runs(reporting[None, :], max_gap=JOIN_BINS - 1):
        per_row = np.nansum(reported[:, r.start:r.end], axis=1, dtype=np.float64)
        seconds = float(per_row.max())
        waiting = present[:, r.start:r.end].any(axis=1) | (per_row > 0)
        out.append(Stretch(r.start, r.end - 1, seconds, float((seconds - per_row[waiting]).sum())))
    return out


def reach(stretch: Stretch, stepped: np.ndarray, n: int) -> slice:
    """The bins where the ranks that waited for `stretch` report that wait, as their next step's
    time: from JOIN_BINS before its first report (their nodes' scrapes may come first) to JOIN_BINS
    after the job's next step after it (after any save or evaluation that follows it). `stepped`:
    the bins, sorted, where any of the job's ranks reported steps; `n`: the grid's bins."""
    i = np.searchsorted(stepped, stretch.last, side="right")
    after = int(stepped[i]) if i < len(stepped) else stretch.last
    return slice(max(stretch.first - JOIN_BINS, 0), min(after + JOIN_BINS + 1, n))
