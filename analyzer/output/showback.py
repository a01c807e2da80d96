"""Showback: each team's GPU-hours, dollars, waste and goodput per calendar period
(docs/showback.md), from one analysis per period.

A team is a namespace, or the value of a pod label. The teams' dollars in a period add up,
to the cent, to what `burnrate analyze` reports as the jobs' cost for that period's window:
the fleet's cents are shared among the teams by largest remainder, so no rounding is lost.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np

from ..costing.cost import JobCost, jobs_dollars, wasted_dollars
from ..costing.pricing import SPOT
from ..grid.frames import Window
from ..grid.workloads import TRAINING
from .report import Report, fleet_ledger

PERIODS = ("month", "week", "day")
NAMESPACE = "namespace"
UNLABELLED = "(no label)"
BOUNDARY_S = 0.001     # Prometheus' timestamps are whole milliseconds
STORE = "store"


@dataclass(frozen=True)
class Period:
    name: str                   # 2026-11, 2026-W48, 2026-11-25
    window: Window              # the part of the period inside the asked window
    partial: str | None         # why the period is not whole, or None


def periods(window: Window, unit: str, now: float) -> list[Period]:
    """The calendar periods (UTC; ISO weeks start on Monday) that the window touches, each
    clipped to the window."""
    out = []
    start = _floor(datetime.fromtimestamp(window.start, timezone.utc), unit)
    while start.timestamp() < window.end:
        end = _next(start, unit)
        # A sample stands for the time up to the next one (analyzer/grid/holding.py): one at
        # the boundary is the next period's, so a period's window stops a millisecond short.
        last = end.timestamp() - BOUNDARY_S
        clipped = Window(max(start.timestamp(), window.start), min(last, window.end))
        partial = None
        if clipped.end < last:
            partial = "the period is still running" if end.timestamp() > now else "the window ends within it"
        elif clipped.start > start.timestamp():
            partial = "the window starts within it"
        out.append(Period(_name(start, unit), clipped, partial))
        start = end
    return out


def period_start(t: float, unit: str) -> float:
    """The start of the calendar period (UTC) that holds `t`."""
    return _floor(datetime.fromtimestamp(t, timezone.utc), unit).timestamp()


def _floor(t: datetime, unit: str) -> datetime:
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "month":
        return day.replace(day=1)
    if unit == "week":
        return day - timedelta(days=day.weekday())
    return day


def _next(t: datetime, unit: str) -> datetime:
    if unit == "month":
        return t.replace(year=t.year + t.month // 12, month=t.month % 12 + 1)
    return t + timedelta(days=7 if unit == "week" else 1)


def _name(t: datetime, unit: str) -> str:
    if unit == "month":
        return t.strftime("%Y-%m")
    if unit == "week":
        year, week, _ = t.isocalendar()
        return f"{year}-W{week:02d}"
    return t.strftime("%Y-%m-%d")


def exact(t: float) -> str:
    """ISO-8601 to the millisecond: a period's window as `burnrate analyze --start --end` takes it."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class TeamFigures:
    team: str
    gpu_hours: float = 0.0
    dollars: float = 0.0
    spot_dollars: float = 0.0
    on_demand_dollars: float = 0.0
    waste_dollars: dict[str, float] = field(default_factory=dict)
    goodput: float | None = None
    cost_per_billion_tokens: float | None = None
    jobs: int = 0
    unpriced_jobs: int = 0
    change: dict[str, dict[str, object]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"team": self.team, "jobs": self.jobs, "unpriced_jobs": self.unpriced_jobs,
                "gpu_hours": round(self.gpu_hours, 4), "dollars": self.dollars, "spot_dollars": self.spot_dollars,
                "on_demand_dollars": self.on_demand_dollars,
                "waste_dollars": {k: round(v, 2) for k, v in sorted(self.waste_dollars.items())},
                "goodput": None if self.goodput is None else round(self.goodput, 4),
                "cost_per_billion_tokens": None if self.cost_per_billion_tokens is None
                else round(self.cost_per_billion_tokens, 2),
                "change": self.change}


@dataclass
class PeriodFigures:
    period: Period
    teams: list[TeamFigures]
    dollars: float               # the jobs' cost, as `burnrate analyze` reports it for the window
    beyond_jobs_waste_dollars: float   # waste found outside every job (unallocated GPUs), as `analyze` says
    notes: list[str] = field(default_factory=list)
    parts: list[tuple[str, Window]] = field(default_factory=list)   # where each part's figures came from

    def to_dict(self) -> dict[str, object]:
        parts = self.parts or [(STORE, self.period.window)]
        return {"period": self.period.name, "start": exact(self.period.window.start),
                "end": exact(self.period.window.end), "partial": self.period.partial is not None,
                "partial_reason": self.period.partial, "basis": " and ".join(basis for basis, _ in parts),
                "parts": [{"basis": basis, "start": exact(w.start), "end": exact(w.end)} for basis, w in parts],
                "dollars": self.dollars,
                "beyond_jobs_waste_dollars": round(self.beyond_jobs_waste_dollars, 2),
                "gpu_hours": round(sum(t.gpu_hours for t in self.teams), 4),
                "teams": [t.to_dict() for t in self.teams], "notes": self.notes}


def beyond_jobs_waste_dollars(report: Report | None) -> float:
    """The wasted dollars of the findings that belong to no job (unallocated GPUs): no team's,
    and beside the teams' dollars."""
    return 0.0 if report is None else wasted_dollars([f for f in report.findings if f.job is None])


def team_figures(report: Report | None, team_of: dict[tuple[str, str], str],
                 kept: list[tuple[JobCost, float]] = ()) -> tuple[list[TeamFigures], float]:
    """Each team's figures from one period's analysis and the jobs `kept` from elsewhere (each
    with its spot dollars), and the fleet's dollars (to the cent). `team_of` names each job's
    team; a job it does not name is the namespace's."""
    spot = {} if report is None else spot_dollars(report)
    priced = [] if report is None else [(j, spot.get((j.namespace, j.training_job), 0.0)) for j in report.jobs]
    priced += kept
    if not priced:
        return [], 0.0
    by_team: dict[str, list[tuple[JobCost, float]]] = {}
    for job, on_spot in priced:
        by_team.setdefault(team_of.get((job.namespace, job.training_job), job.namespace), []).append((job, on_spot))
    fleet_cents = round(jobs_dollars([j for j, _ in priced]) * 100)
    names = sorted(by_team)
    cents = apportion([jobs_dollars([j for j, _ in by_team[n]]) * 100 for n in names], fleet_cents)
    spot_cents = apportion([sum(s for _, s in by_team[n]) * 100 for n in names], round(sum(s for _, s in priced) * 100))
    out = []
    for name, c, s in zip(names, cents, spot_cents):
        jobs = [j for j, _ in by_team[name]]
        waste: dict[str, float] = {}
        for j in jobs:
            for kind, dollars in j.waste_dollars.items():
                if dollars:
                    waste[kind] = waste.get(kind, 0.0) + dollars
        training = [j for j in jobs if j.workload_class == TRAINING and j.cost_dollars is not None and j.tokens]
        tokens = sum(j.tokens for j in training)
        s = min(s, c)     # shared on their own, an all-spot team's spot cents may round a cent above its own
        out.append(TeamFigures(
            team=name, gpu_hours=sum(j.gpu_hours for j in jobs), dollars=c / 100, spot_dollars=s / 100,
            on_demand_dollars=(c - s) / 100, waste_dollars=waste, goodput=fleet_ledger(jobs)["goodput"],
            cost_per_billion_tokens=sum(j.cost_dollars for j in training) / (tokens / 1e9) if tokens else None,
            jobs=len(jobs), unpriced_jobs=sum(1 for j in jobs if j.cost_dollars is None)))
    return out, fleet_cents / 100


def spot_dollars(report: Report) -> dict[tuple[str, str], float]:
    """Each priced job's dollars on spot nodes: its GPU-hours on them at their price, as
    analyzer/costing/cost.py prices the job (the rest is on-demand; an unknown capacity
    type is priced on-demand, docs/pricing.md)."""
    views, prices, accounting = report.views, report.prices, report.accounting
    if views is None or prices is None or accounting is None or not views.alloc.size:
        return {}
    gpu_row = views.alloc.keys["gpu_row"].to_numpy()
    hours = accounting.row_gpu_hours
    priced = {(j.namespace, j.training_job) for j in report.jobs if j.cost_dollars is not None}
    out = {}
    for job, rows in views.job_rows(views.alloc).items():
        mine = rows[gpu_row[rows] >= 0]
        on_spot = mine[prices.capacity[gpu_row[mine]] == SPOT]
        if job in priced:
            out[job] = float(np.sum(hours[on_spot] * prices.actual[gpu_row[on_spot]]))
    return out


def apportion(shares: list[float], total: int) -> list[int]:
    """Whole units (cents) for each share, adding up to `total`: each share's floor, and the
    units left over to the largest remainders."""
    floors = [math.floor(s) for s in shares]
    # total is the rounded sum of the shares: between none and one unit per share is left over
    ranked = sorted(range(len(shares)), key=lambda i: shares[i] - floors[i], reverse=True)
    for i in ranked[:total - sum(floors)]:
        floors[i] += 1
    return floors


def add_changes(figures: list[PeriodFigures]) -> None:
    """Each team's dollars and GPU-hours against the period before; null, with why, where
    there is nothing to compare with (never 0)."""
    before: dict[str, TeamFigures] | None = None
    for period in figures:
        for team in period.teams:
            team.change = {name: change(getattr(team, name), None if before is None else
                                        getattr(before.get(team.team), name, 0.0), before is None)
                           for name in ("dollars", "gpu_hours")}
        before = {t.team: t for t in period.teams}


def change(now: float, previous: float | None, first: bool) -> dict[str, object]:
    if first:
        return {"previous": None, "absolute": None, "percent": None,
                "reason": "no previous period in the window"}
    absolute = round(now - previous, 4)
    if previous == 0:
        return {"previous": 0.0, "absolute": absolute, "percent": None,
                "reason": "nothing in the previous period"}
    return {"previous": round(previous, 4), "absolute": absolute, "percent": round(100 * absolute / previous, 2),
            "reason": None}


def team_by_label(report: Report | None, labels: dict[tuple[str, str], str]) -> dict[tuple[str, str], str]:
    """Each job's team by its pods' label (namespace, pod -> value): the value held by most of
    the job's GPU-hours, since a job's pods may disagree; unlabelled pods are UNLABELLED."""
    if report is None or report.views is None or report.accounting is None or not report.views.alloc.size:
        return {}
    pods = report.views.alloc.keys["pod"].astype(str).to_numpy()
    hours = report.accounting.row_gpu_hours
    out = {}
    for (ns, job), rows in report.views.job_rows(report.views.alloc).items():
        held: dict[str, float] = {}
        for r in rows:
            value = labels.get((ns, pods[r]), UNLABELLED)
            held[value] = held.get(value, 0.0) + float(hours[r])
        out[(ns, job)] = max(sorted(held), key=lambda v: held[v])
    for job in report.jobs:   # jobs seen only by their training telemetry hold no GPU row
        out.setdefault((job.namespace, job.training_job), UNLABELLED)
    return out
