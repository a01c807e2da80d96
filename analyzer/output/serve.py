"""`burnrate analyze --serve`: re-evaluate on an interval and export the latest
findings and job costs as Prometheus metrics, for alert rules and Grafana.

The collector renders the last finished report; scrapes never run an analysis. The
HTTP server is the agent's, with the same `--web-config` (TLS, basic auth).
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from burnrate.exporter.errors import UserError, printable
from burnrate.exporter.listen import listen_address
from burnrate.exporter.render import Exposition
from burnrate.exporter.server import MetricsServer
from burnrate.exporter.webconfig import WebConfig

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
        # A new object at each change: the exposition is rendered again only then.
        self._version = object()

    def version(self) -> object:
        return self._version

    def update(self, report: Report, duration: float, finished: float) -> None:
        with self._lock:
            self._report, self._duration, self._finished = report, duration, finished
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
        if finished:
            yield GaugeMetricFamily("burnrate_analyze_last_run_timestamp_seconds",
                                    "Unix time the last analysis finished.", value=finished)
            yield GaugeMetricFamily("burnrate_analyze_duration_seconds",
                                    "Duration of the last analysis.", value=duration)
        yield CounterMetricFamily("burnrate_analyze_errors", "Analyses that failed.", value=errors)


def evaluate(analysis: Callable[[], Report], collector: ReportCollector) -> None:
    began = time.monotonic()
    try:
        report = analysis()
    except UserError as exc:
        collector.failed()
        print(f"burnrate analyze: {printable(str(exc))}", file=sys.stderr)
        return
    collector.update(report, time.monotonic() - began, time.time())


def serve(analysis: Callable[[], Report], listen: str, interval_s: float,
          stop: threading.Event | None = None, web: WebConfig | None = None) -> int:
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
            evaluate(analysis, collector)
            stop.wait(interval_s)
    finally:
        server.stop()
    return 0
