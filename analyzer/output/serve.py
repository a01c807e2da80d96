"""`burnrate analyze --serve`: re-evaluate on an interval and export the latest
findings and job costs as Prometheus metrics, for alert rules and Grafana; with
`--budgets`, each team's budget, spend and forecast in the current period too.

The collector renders the last finished report; scrapes never run an analysis. The
HTTP server is the agent's, with the same `--web-config` (TLS, basic auth).
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Iterator

import numpy as np

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from burnrate.exporter.errors import UserError, printable
from burnrate.exporter.listen import listen_address
from burnrate.exporter.render import Exposition
from burnrate.exporter.server import MetricsServer
from burnrate.exporter.webconfig import WebConfig

from ..costing import budgets as B
from ..detectors.findings import iso
from ..grid.freed import give_back
from ..sources.summaries import RunKey, append_summary, read_summaries, run_key
from .report import Report

FINDING_LABELS = ("kind", "severity", "namespace", "training_job", "Hostname", "gpu", "pod", "rank")


class ReportCollector:
    """Renders the latest report; series of jobs and findings that went away vanish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report: Report | None = None
        self._finished = 0.0
        self._duration = 0.0
        self._errors = 0
        self._budgets: list[dict] | None = None
        # A new object at each change: the exposition is rendered again only then.
        self._version = object()

    def version(self) -> object:
        return self._version

    def update(self, report: Report, duration: float, finished: float) -> None:
        with self._lock:
            self._report, self._duration, self._finished = report, duration, finished
            self._version = object()

    def update_budgets(self, blocks: list[dict]) -> None:
        with self._lock:
            self._budgets = blocks
            self._version = object()

    def failed(self) -> None:
        with self._lock:
            self._errors += 1
            self._version = object()

    def health(self) -> tuple[bool, str]:
        """Serving is healthy; the body says how the analyses go (a store that is down is
        counted in burnrate_analyze_errors, not a reason to restart the server)."""
        with self._lock:
            finished, errors = self._finished, self._errors
        if not finished:
            return True, f"no analysis finished yet ({errors} failed)"
        return True, f"last analysis finished {time.time() - finished:.0f}s ago ({errors} failed so far)"

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            report, duration, finished, errors = self._report, self._duration, self._finished, self._errors
            blocks = self._budgets
        cost = GaugeMetricFamily("burnrate_job_cost_dollars", "Cost of the job's GPUs over the analysis window.",
                                 labels=["namespace", "training_job", "capacity_type"])
        waste = GaugeMetricFamily("burnrate_job_waste_dollars", "Dollars the job wasted over the window, by cause.",
                                  labels=["namespace", "training_job", "cause"])
        finding = GaugeMetricFamily("burnrate_finding", "1 for each finding of the last analysis.",
                                    labels=list(FINDING_LABELS))
        wasted = GaugeMetricFamily("burnrate_finding_wasted_dollars", "Dollars a finding wasted.",
                                   labels=list(FINDING_LABELS))
        if report is not None:
            for job in report.jobs:
                if job.cost_dollars is not None:
                    cost.add_metric([job.namespace, job.training_job, job.capacity_type], job.cost_dollars)
                for cause, dollars in job.waste_dollars.items():
                    waste.add_metric([job.namespace, job.training_job, cause], dollars)
            for f in report.findings:
                labels = [f.kind, f.severity, f.namespace or "", f.training_job or "", f.hostname or "",
                          f.gpu or "", f.pod or "", "" if f.rank is None else str(f.rank)]
                finding.add_metric(labels, 1.0)
                if f.wasted_dollars is not None:
                    wasted.add_metric(labels, f.wasted_dollars)
        yield from (cost, waste, finding, wasted)
        if blocks is not None:
            yield from budget_gauges(blocks)
        if finished:
            yield GaugeMetricFamily("burnrate_analyze_last_run_timestamp_seconds",
                                    "Unix time the last analysis finished.", value=finished)
            yield GaugeMetricFamily("burnrate_analyze_duration_seconds",
                                    "Duration of the last analysis.", value=duration)
        yield CounterMetricFamily("burnrate_analyze_errors", "Analyses that failed.", value=errors)


BUDGET_GAUGES = ((B.BUDGET, "The team's budget for the period.", lambda t: t["budget_dollars"]),
                 (B.SPENT, "The team's spend from the period's start.", lambda t: t["spent_dollars"]),
                 (B.FORECAST, "The team's expected spend to the period's end, at the burn rate so far.",
                  lambda t: t["forecast"]["expected"]),
                 (B.FORECAST_LOW, "The low end of the forecast's 95% interval.", lambda t: t["forecast"]["low"]),
                 (B.FORECAST_HIGH, "The high end of the forecast's 95% interval.", lambda t: t["forecast"]["high"]))


def budget_gauges(blocks: list[dict]) -> Iterator[Metric]:
    """Each budgeted team's figures in the current period (docs/budgets.md); the forecast's
    interval is absent while fewer than 2 whole days have elapsed."""
    families = [(GaugeMetricFamily(name, text, labels=list(B.GAUGE_LABELS)), value)
                for name, text, value in BUDGET_GAUGES]
    for block in blocks:
        for team in block["teams"]:
            for family, value in families:
                if value(team) is not None:
                    family.add_metric([block["by"], team["team"], block["unit"]], value(team))
    yield from (family for family, _ in families)


class SummaryKeeper:
    """Appends each finished run's summary to a JSON Lines file once. A run has ended when
    its job has held no GPU for longer than `ended_after_s` before the window's end (the
    stalled detector's floor: a shorter pause may be a checkpoint or a slow collective);
    it is keyed by its last sample, so a job that runs again is kept again when it ends."""

    def __init__(self, path: str, ended_after_s: float) -> None:
        self.path, self.ended_after_s = path, ended_after_s
        kept = read_summaries(path)
        if kept.torn:
            print(f"burnrate analyze: {path}: skipped {kept.torn} torn line(s)", file=sys.stderr)
        self.kept: set[RunKey] = {run_key(s) for s in kept.summaries}

    def keep_ended(self, report: Report) -> int:
        """Keeps the runs that ended by the report's window end; how many were new."""
        new = 0
        for summary in ended_runs(report, self.ended_after_s):
            if run_key(summary) not in self.kept:
                append_summary(self.path, summary)
                self.kept.add(run_key(summary))
                new += 1
        return new


def ended_runs(report: Report, ended_after_s: float) -> list[dict]:
    """A summary of each job whose GPUs were last held more than `ended_after_s` before the
    window's end: its figures over the window (`start_in_window` false where it began before)."""
    if report.views is None:
        return []
    views = report.views
    alloc = views.alloc
    keys = alloc.keys[["namespace", "job"]].astype(str)
    held_at = {}
    for (namespace, job), rows in keys.groupby(["namespace", "job"]).groups.items():
        bins = np.flatnonzero(alloc.present[np.asarray(rows)].any(axis=0))
        if len(bins):
            held_at[(namespace, job)] = (views.start + float(bins[0]) * views.step,
                                         views.start + float(bins[-1]) * views.step)
    out = []
    for job in report.jobs:
        span = held_at.get((job.namespace, job.training_job))
        if span is None or report.window.end - span[1] <= max(ended_after_s, 2 * views.step):
            continue
        mine = [f for f in report.findings if (f.namespace, f.training_job) == (job.namespace, job.training_job)]
        figures = job.to_dict()
        out.append({"namespace": job.namespace, "training_job": job.training_job, "start": iso(span[0]),
                    "end": iso(span[1]), "start_in_window": bool(span[0] > report.window.start + views.step),
                    **{name: figures[name] for name in SUMMARY_FIGURES}, "findings": [f.to_dict() for f in mine],
                    "wasted_dollars": round(sum(f.wasted_dollars or 0.0 for f in mine), 4)})
    return out


SUMMARY_FIGURES = ("class", "gpus", "gpu_hours", "capacity_type", "cost_dollars", "on_demand_cost_dollars",
                   "steps", "tokens", "cost_per_billion_tokens", "mfu", "waste_dollars", "ledger", "goodput", "runs")


def evaluate(analysis: Callable[[], Report], collector: ReportCollector, keeper: SummaryKeeper | None = None,
             budgets: Callable[[float], list[dict]] | None = None) -> None:
    """One evaluation; `budgets(now)`: the budget blocks of the periods holding `now`."""
    began = time.monotonic()
    try:
        report = analysis()
        blocks = None if budgets is None else budgets(time.time())
    except UserError as exc:
        collector.failed()
        print(f"burnrate analyze: {printable(str(exc))}", file=sys.stderr)
        return
    collector.update(report, time.monotonic() - began, time.time())
    if blocks is not None:
        collector.update_budgets(blocks)
    if keeper is not None:
        try:
            keeper.keep_ended(report)
        except OSError as exc:
            print(f"burnrate analyze: cannot keep summaries in {keeper.path}: {exc.strerror or exc}",
                  file=sys.stderr)


def serve(analysis: Callable[[], Report], listen: str, interval_s: float,
          stop: threading.Event | None = None, web: WebConfig | None = None,
          keeper: SummaryKeeper | None = None, budgets: Callable[[float], list[dict]] | None = None) -> int:
    """Run `analysis` every `interval_s` and export its latest report on `listen` (HOST:PORT),
    behind `web`'s TLS and basic auth where given."""
    host, port = listen_address(listen)
    registry = CollectorRegistry()
    collector = ReportCollector()
    registry.register(collector)
    try:
        server = MetricsServer(host, port, Exposition(registry, version=collector.version), collector.health, web,
                               title="burnrate analyze")
    except OSError as exc:
        raise UserError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    server.start()
    scheme = "https" if web is not None and web.tls is not None else "http"
    print(f"burnrate analyze: serving metrics on {scheme}://{listen}/metrics", file=sys.stderr)
    stop = stop or threading.Event()
    try:
        while not stop.is_set():
            evaluate(analysis, collector, keeper, budgets)
            give_back()     # between evaluations the process holds its last report, not the busiest moment's memory
            stop.wait(interval_s)
    finally:
        server.stop()
    return 0
