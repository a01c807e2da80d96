"""Showback past the store's retention (docs/showback.md): a period, or the part of one,
before the store's data begins is counted from the job summaries that `burnrate analyze
--serve --keep-summaries` kept (docs/retention.md).

Each run is counted once. A kept run that ended before the store's data begins is not in the
store, so it is counted from its summary; one that ended later is in the store's span, and the
store counts it (its summary is left out). Among the summaries counted, a run key kept twice
is one run, and a run lying within a later summary of the same job (the keeper sums a job that
ran twice in its window into the second summary) is counted in that later one.
"""
from __future__ import annotations

from dataclasses import dataclass

from burnrate.exporter.errors import UserError
from burnrate.exporter.ledger import NAMES

from ..costing.cost import JobCost
from ..costing.ledger import Ledger
from ..costing.pricing import SPOT
from ..grid.frames import Window
from ..grid.workloads import BATCH
from ..sources.summaries import read_summaries, run_key
from ..sources.timeparse import format_time, parse_time
from .showback import BOUNDARY_S, STORE

SUMMARIES = "kept job summaries"


@dataclass(frozen=True)
class KeptRuns:
    path: str
    begins: float              # where the store's data begins (the window's start where it holds it)
    runs: list[dict]           # the summaries counted: runs that ended before `begins`, each once
    in_store: list[dict]       # kept runs that ended in the store's span: the store counts them
    torn: int

    def split(self, window: Window) -> tuple[Window | None, Window | None]:
        """The window's part before the store's data (from the summaries) and its part in the
        store; None for a part it does not have."""
        if window.end < self.begins:
            return window, None
        if window.start >= self.begins:
            return None, window
        return Window(window.start, self.begins - BOUNDARY_S), Window(self.begins, window.end)

    def ended_in(self, window: Window) -> list[dict]:
        """The runs counted that ended in the window (its end stops a millisecond short of the next)."""
        return [s for s in self.runs if window.start <= parse_time(s["end"]) < window.end + BOUNDARY_S]

    def from_store_in(self, window: Window) -> int:
        """How many kept runs that ended in the window are counted from the store."""
        return sum(1 for s in self.in_store if window.start <= parse_time(s["end"]) < window.end + BOUNDARY_S)

    def none_note(self, part: Window) -> str:
        return (f"no kept job summaries in {self.path} end between {format_time(part.start)} and "
                f"{format_time(part.end + BOUNDARY_S)}, before the store's data begins at {format_time(self.begins)}: "
                "this part is not counted")


def store_begins(options, source, window: Window) -> float:
    """Where the store's (or the recording's) GPU data begins: the window's start where the
    store holds it, the window's end where it holds nothing from the window's start on."""
    from ..sources.recording import time_range
    from ..sources.retention import data_begins, first_data_after

    if options.recording is not None:
        held = time_range(options.recording)
        return window.end if held.end <= 0 or held.start >= window.end else max(held.start, window.start)
    if source.data_range(window) is None:
        after = first_data_after(source, window)
        return window.end if after is None else min(after, window.end)
    begins = data_begins(source, window)
    return window.start if begins is None else begins


def kept_runs(path: str, begins: float, window: Window) -> KeptRuns:
    kept = read_summaries(path, window.start, window.end + BOUNDARY_S)
    unique = list({run_key(s): s for s in kept.summaries}.values())
    before = [s for s in unique if parse_time(s["end"]) < begins]
    return KeptRuns(path, begins, _outermost(before), [s for s in unique if parse_time(s["end"]) >= begins], kept.torn)


def _outermost(runs: list[dict]) -> list[dict]:
    """The runs not lying within a later run of the same job."""
    by_job: dict[tuple[str, str], list[dict]] = {}
    for s in runs:
        by_job.setdefault((s["namespace"], s["training_job"]), []).append(s)
    return [s for s in runs if not any(parse_time(o["start"]) <= parse_time(s["start"])
                                       and parse_time(o["end"]) > parse_time(s["end"])
                                       for o in by_job[(s["namespace"], s["training_job"])])]


def kept_jobs(path: str, runs: list[dict]) -> list[tuple[JobCost, float]]:
    """Each run's figures as a job's, with its dollars on spot: all of them on spot capacity,
    none otherwise (a summary holds no split of a job on mixed capacity)."""
    out = []
    for s in runs:
        try:
            job = _job_of(s)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"{path}: the summary of {s.get('namespace')}/{s.get('training_job')} ending "
                            f"{s.get('end')} is not one `burnrate analyze --keep-summaries` writes "
                            f"({type(exc).__name__}: {exc})") from None
        out.append((job, job.cost_dollars if job.capacity_type == SPOT and job.cost_dollars is not None else 0.0))
    return out


def _job_of(s: dict) -> JobCost:
    ledger = s.get("ledger")
    return JobCost(
        namespace=str(s["namespace"]), training_job=str(s["training_job"]), gpus=float(s.get("gpus") or 0),
        gpu_hours=float(s.get("gpu_hours") or 0.0), capacity_type=str(s.get("capacity_type") or "unknown"),
        cost_dollars=_number(s.get("cost_dollars")), on_demand_cost_dollars=_number(s.get("on_demand_cost_dollars")),
        steps=_number(s.get("steps")), tokens=_number(s.get("tokens")), cost_per_step=None,
        cost_per_billion_tokens=_number(s.get("cost_per_billion_tokens")), mfu=_number(s.get("mfu")),
        waste_dollars={str(k): float(v) for k, v in (s.get("waste_dollars") or {}).items() if v is not None},
        workload_class=str(s.get("class") or BATCH), cost_basis=SUMMARIES,
        ledger=None if not ledger else Ledger({k: None if ledger.get(k) is None else float(ledger[k]["gpu_hours"])
                                               for k in NAMES}))


def _number(value) -> float | None:
    return None if value is None else float(value)


def parts_of(before: Window | None, held: Window | None) -> list[tuple[str, Window]]:
    return [(basis, w) for basis, w in ((SUMMARIES, before), (STORE, held)) if w is not None]
