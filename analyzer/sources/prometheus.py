"""Frames from Prometheus (or Thanos, Mimir): `/api/v1/query_range`, one query per
metric and time chunk, rebuilt into the recording's tables.

Each query reduces each step in PromQL before anything crosses the network: the
`*_over_time(...[step - 1ms])` functions give one value per step without Prometheus'
5-minute lookback, so a series that stopped (a forgotten rank, a lost GPU) stops in the
frames too. At the scrape interval a step holds exactly one sample, and the frames equal the
recording's; for longer windows gauges are averaged and counters take their last
value per step. The reader keeps only the labels a table needs (dropping Prometheus' own
`instance` and `job`) and merges the series that share them, as `max by` would (HA
duplicates), which costs the store nothing (_grouped).

Clusters that run NVIDIA's dcgm-exporter without the burnrate agent have no
burnrate_* series: allocation then comes from the DCGM series' `pod` labels, the
training job from the pod's name, and `Frames.missing` names what is absent.
"""
from __future__ import annotations

import base64
import copy
import math
import re
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Collection, Mapping, Sequence

import numpy as np
import pandas as pd

from burnrate.exporter import catalog as C
from burnrate.exporter import labels as L

from ..grid.frames import FLOAT32, OWNER_COLUMNS, RANK_COUNTERS, RANK_LATEST, Frames, Window, empty_owners
from ..grid.freed import let_go
from ..grid.holding import hold
from ..grid.resample import MAX_POINTS, reduction, step_for
from .timeparse import parse_duration
from .common import DEFAULT_STEP_S, Progress, within
from .promhttp import Limits, PrometheusError, PrometheusHTTP, Tally
from .promtables import TABLE_ORDER, Assembly, Steps, consecutive, counts_before, empty_frames

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def escape(value: str) -> str:
    """A PromQL double-quoted string's content."""
    return (value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
            .replace("\r", "\\r").replace("\t", "\\t"))


def selector(metric: str = "", **labels: str) -> str:
    """`metric{name="value",...}` with every value escaped, so no label value can
    change the query's meaning."""
    if metric and not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", metric):
        raise ValueError(f"invalid metric name {metric!r}")
    for name in labels:
        if not _LABEL_NAME.fullmatch(name):
            raise ValueError(f"invalid label name {name!r}")
    matchers = ",".join(f'{name}="{escape(str(value))}"' for name, value in labels.items())
    return f"{metric}{{{matchers}}}"


@dataclass(frozen=True)
class _Query:
    table: str
    column: str
    metric: str
    by: tuple[str, ...]
    over_time: str              # PromQL *_over_time function
    extra: Mapping[str, str] | None = None
    outer: str = ""             # a second aggregation, e.g. summing XID codes per GPU
    scale: float = 1.0          # to the catalog's unit (dcgm-exporter 4.9's base units)
    # A better signal of the same thing (allocation.SIGNALS): where a GPU has it at a step,
    # the store leaves this one out, as allocation.best_allocation would.
    unless: str = ""
    span_s: float = 0.0         # what each point's `over_time` reads back over: the step where 0


def _renamed(queries: list[_Query]) -> list[_Query]:
    """The same queries under dcgm-exporter 4.9's names, scaled back to the catalog's units."""
    return [replace(q, metric=C.DCGM_4_9_NAMES[q.metric][0], scale=C.DCGM_4_9_NAMES[q.metric][1])
            for q in queries if q.metric in C.DCGM_4_9_NAMES]


def _queries() -> list[_Query]:
    device, device_pod = C.DEVICE, C.DEVICE_POD
    by = C.BY_NAME
    out = [_Query("gpu", spec.field, spec.name, device_pod, reduction("gpu", spec.field))
           for spec in C.CATALOG if spec.source == C.GPU_FIELD and spec.recorded]
    out += [
        _Query("gpu", "last_xid", "DCGM_FI_DEV_XID_ERRORS", device_pod, "last"),
        _Query("gpu", "up", "burnrate_gpu_up", device, reduction("gpu", "up")),
        _Query("gpu", "nvlink_tx_bytes", by["burnrate_gpu_nvlink_bytes_total"].sample_name, device, "last",
               {"direction": "tx"}),
        _Query("gpu", "nvlink_rx_bytes", by["burnrate_gpu_nvlink_bytes_total"].sample_name, device, "last",
               {"direction": "rx"}),
        _Query("gpu", "xid_total", "burnrate_gpu_xid_errors_total", device + ("xid",), "last", outer=device),
        _Query("alloc", "share", "burnrate_gpu_allocation_share_ratio", device_pod, "last"),
        _Query("alloc", "allocated", "burnrate_gpu_allocated", device_pod, "last",
               unless="burnrate_gpu_allocation_share_ratio"),
        _Query("node", "_info", "burnrate_node_info", L.NODE_INFO_LABELS, "last"),
        _Query("node", "cpu_utilization", "burnrate_node_cpu_utilization_ratio", (L.HOSTNAME,), "avg"),
        _Query("pod_cpu", "cpu_seconds", "burnrate_pod_cpu_seconds_total", (L.NAMESPACE, L.POD, L.HOSTNAME), "last"),
        _Query("xid", "count", "burnrate_gpu_xid_errors_total", device + ("xid",), "last"),
    ]
    # Training gauges are the last reported values, so they are decimated, not averaged.
    out += [_Query("rank", spec.field, spec.sample_name, C.T, "last") for spec in C.CATALOG if spec.source == C.RANK]
    return out


QUERIES = _queries()
QUERIES += _renamed(QUERIES)
COUNTED = [q for q in QUERIES if q.table == "rank" and q.column in RANK_COUNTERS]
# Where a step holds several samples, how many each series had: how much of the step
# it covered (analyzer.grid.holding). Asked only for the holders' time: a GPU's own rows
# hold for its interval, inferred from them.
COUNTS = [_Query("alloc", "sample_count", "burnrate_gpu_allocation_share_ratio", C.DEVICE_POD, "count"),
          _Query("alloc", "sample_count", "burnrate_gpu_allocated", C.DEVICE_POD, "count",
                 unless="burnrate_gpu_allocation_share_ratio")]
COUNTS += [replace(q, scale=1.0) for q in _renamed(COUNTS)]
# dcgm-exporter 4.8.3 renamed `Hostname` to `hostname`: both are asked for and merged.
HOSTNAME_SPELLINGS = (L.HOSTNAME, "hostname")
# The holder's labels where a scrape did not honor the exporter's (_grouped).
EXPORTED = tuple(f"exported_{name}" for name in (L.NAMESPACE, L.POD, L.CONTAINER))
# A GPU exporter's utilization under both of dcgm-exporter's namings; with the agent's own
# per-GPU series, what says a GPU was there.
GPU_UTIL_NAMES = ("DCGM_FI_DEV_GPU_UTIL", C.DCGM_4_9_NAMES["DCGM_FI_DEV_GPU_UTIL"][0])
GPU_SERIES = (*GPU_UTIL_NAMES, "burnrate_gpu_up")
# How long an answer of data_range is reused: within one command's run, and short enough that
# a window still being written (its end ahead of the data) is asked again as data arrives.
RANGE_KEPT_S = 60.0
# How many buckets data_range asks of a window before it asks step by step where the data begins and ends.
EDGE_BUCKETS = 48
_LABELS_OF = {**{s.name: s.labels for s in C.CATALOG}, **{s.sample_name: s.labels for s in C.CATALOG},
              **{new: C.BY_NAME[old].labels for old, (new, _) in C.DCGM_4_9_NAMES.items()}}


class PrometheusSource:
    """Frames from a Prometheus-compatible HTTP API.

    `matchers` restricts every query to series with those label values (for
    metrics that carry the label), e.g. `{"namespace": "ml"}`. `scope` names one
    cluster of a store that holds several (`{"cluster": "eu-1"}`): the GPU exporters'
    series must carry it; kube-state-metrics' and OpenCost's may also lack it, where
    the cluster's name is put on by its agents alone. `min_step_s` is
    the shortest scrape interval of the GPU exporters: no step is shorter (any
    interval reads true, analyzer.grid.holding; this only saves points). None asks the
    server's targets (`scrape_interval_hint`), else takes 15 s. `chunk_points` bounds the steps of
    one request, so that long windows over many GPUs come in pieces Prometheus
    and this process both handle comfortably. `limits` bounds the series and points that
    the answers of one read (`frames`, or any one query) may hold.
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, bearer_token: str | None = None,
                 basic_auth: tuple[str, str] | None = None, ca_file: str | None = None, insecure: bool = False,
                 matchers: Mapping[str, str] | None = None, min_step_s: float | None = 15.0,
                 chunk_points: int = 1000, workers: int = 4, scope: Mapping[str, str] | None = None,
                 limits: Limits = Limits()) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.matchers = dict(matchers or {})
        self.scope = dict(scope or {})
        selector(**self.matchers, **self.scope)   # rejects bad label names now, not mid-query
        self._min_step_s = min_step_s
        self.chunk_points = max(1, min(chunk_points, MAX_POINTS))
        self.workers = workers
        self._lock = threading.Lock()
        self._answered = 0
        self._headers = {"Accept": "application/json"}
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
        elif basic_auth:
            token = base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        context = None
        if self.url.startswith("https:"):
            context = ssl.create_default_context(cafile=ca_file)
            if insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        self._http = PrometheusHTTP(self.url, self._headers, timeout_s, context, limits=limits)
        self.hosts: tuple[str, ...] | None = None
        self.unread_jobs: tuple[tuple[str, str], ...] = ()
        # data_range's answers by (window, step), kept RANGE_KEPT_S: one command asks it of one
        # window several times (the way to read it, the read, the retention check).
        self._ranges: dict[tuple[Window, float], tuple[float, Window | None]] = {}

    def on_hosts(self, hosts: Sequence[str], unread_jobs: Collection[tuple[str, str]] = ()) -> "PrometheusSource":
        """The same store, each node's series read for these nodes only (fleet mode's
        drill-down), less the training telemetry of `unread_jobs` (namespace, training_job).
        Where the data begins and ends is still the whole store's, so a window is read at
        the step a whole-fleet read would take."""
        narrowed = copy.copy(self)
        narrowed.hosts = tuple(sorted(set(hosts)))
        narrowed.unread_jobs = tuple(sorted(set(unread_jobs)))
        narrowed._lock = threading.Lock()
        return narrowed

    # --- HTTP --------------------------------------------------------------------
    def _post(self, path: str, params: Mapping[str, str]) -> dict:
        return self._http.data(path, params)

    def _get(self, path: str, params: Mapping[str, str]) -> dict:
        return self._http.data(path, params, post=False)

    def query_range(self, promql: str, start: float, end: float, step: float, tally: Tally | None = None) -> list[dict]:
        """Each series as `{"metric": labels, "values": (n, 2) float array of times and values}`;
        `tally` counts the answer with the rest of its read against the limits."""
        return self._http.matrix("/api/v1/query_range", {"query": promql, "start": _num(start), "end": _num(end),
                                                         "step": _num(step)}, tally)

    @cached_property
    def min_step_s(self) -> float:
        return self._min_step_s or self.scrape_interval_hint() or DEFAULT_STEP_S

    def scrape_interval_hint(self) -> float | None:
        """The shortest scrape interval among the server's active targets that export
        GPUs (dcgm-exporter's port 9400, or a job named for it); None where the store
        has no targets API (Thanos, Mimir) or scrapes no such target."""
        try:
            data = self._get("/api/v1/targets", {"state": "active"})
        except PrometheusError:
            return None
        intervals = []
        for target in data.get("activeTargets", []):
            try:
                if _gpu_exporter(target):
                    intervals.append(parse_duration(target["scrapeInterval"]))
            except (KeyError, TypeError, ValueError):
                continue    # a target this server describes differently says nothing about the GPUs
        return max(min(intervals), 1.0) if intervals else None

    # --- frames --------------------------------------------------------------------
    def step_for(self, window: Window) -> float:
        return step_for(window, self.min_step_s)

    def promql(self, q: _Query, step: float) -> str:
        inner = self._series(q, q.metric, step)
        if q.unless:
            inner = f"({inner} unless on ({L.UUID}) {self._series(q, q.unless, step)})"
        if not q.outer:
            # Each series as stored: the reader keeps its key labels and makes one of the
            # series that share them (_grouped). A `max by` over every series at every step
            # took the store six times the bare read's time at the scrape's step.
            return inner
        return f"sum by ({', '.join(q.outer)}) (max by ({', '.join(_key_labels(q))}) ({inner}))"

    def _series(self, q: _Query, metric: str, step: float) -> str:
        """`metric`'s series for query `q`, each its `over_time` over the step before each point."""
        labels = {k: v for k, v in self.matchers.items() if k in _LABELS_OF[metric]}
        labels.update(q.extra or {})
        chosen = selector(metric, **self.scope, **labels)
        span = f"[{int(round((q.span_s or step) * 1000)) - 1}ms]"
        ons = self._on_hosts(chosen) if self.hosts is not None and L.HOSTNAME in _LABELS_OF[metric] else [chosen]
        if q.table == "rank" and self.unread_jobs:
            narrowed = [part for on in ons for part in _leaving_out(on, self.unread_jobs)]
            # VictoriaMetrics refuses queries over 16 KiB (-search.maxQueryLen): past a
            # quarter of that, the ranks are read and left out in the analyzer instead.
            ons = narrowed if sum(map(len, narrowed)) <= 4096 else ons
        inner = " or ".join(f"{q.over_time}_over_time({on}{span})" for on in ons)
        return f"({inner})" if len(ons) > 1 else inner

    def _answers(self, job: tuple["PrometheusSource", _Query, np.ndarray, _Query | None], step: float, total: int,
                 progress: Progress | None, tally: Tally) -> list[tuple[_Query, list[dict]]]:
        """One query's answer and, where it has series, its sample counts' (`COUNTS`): a query
        whose series a better signal leaves out (`unless`) mostly answers none, and its counts
        then need not be asked (each such query is as much of the store's work as a plain read)."""
        source, q, points, counts = job
        answer = self._answer(source, q, points, step, total, progress, tally)
        if counts is None:
            return [(q, answer)]
        if answer:
            return [(q, answer), (counts, self._answer(source, counts, points, step, total, progress, tally))]
        self._answer_counted(total, progress)
        return [(q, answer)]

    def _answer(self, source: "PrometheusSource", q: _Query, points: np.ndarray, step: float, total: int,
                progress: Progress | None, tally: Tally) -> list[dict]:
        """One query's series, each one's points in the catalog's unit as a (time, value) float
        array, or as Steps (promtables.consecutive) where they are one a step: a tenth of the
        memory JSON's lists take (as Steps a twentieth), which is what a day of a thousand GPUs needs."""
        answer = source.query_range(source.promql(q, step), points[0], points[-1], step, tally)
        if not q.outer:
            answer = _grouped(answer, _key_labels(q))
        if q.scale != 1.0:
            for series in answer:
                series["values"][:, 1] *= q.scale
        narrow = np.float32 if q.column in FLOAT32.get(q.table, ()) else np.float64
        pairs = [series["values"] for series in answer]
        for series, points in zip(answer, consecutive(pairs, step, narrow)):
            series["values"] = points
        # The decoded pairs of the series kept as Steps go: twice (float32 Steps, four times) what is kept.
        freed = sum(p.nbytes for p, series in zip(pairs, answer) if isinstance(series["values"], Steps))
        del pairs
        let_go(freed)
        self._answer_counted(total, progress)
        return answer

    def _answer_counted(self, total: int, progress: Progress | None) -> None:
        if progress:
            with self._lock:
                self._answered += 1
                progress(self._answered, total)

    def frames(self, window: Window | None = None, columns: Mapping[str, Sequence[str]] | None = None,
               progress: Progress | None = None, reads: Mapping[Window, Sequence[str]] | None = None,
               unread_jobs: Mapping[tuple[str, str], Collection[str]] | None = None,
               step: float | None = None, seen: Window | None = None) -> Frames:
        """The window's tables; the last hour when no window is given. `columns`
        names the value columns to query per table; tables it leaves out come back
        empty, and no query is sent for them. `progress(done, total)` is told of
        every query answered. `reads` narrows the node series read to these nodes over
        these parts of the window (fleet mode's drill-down), on the whole window's grid, and
        leaves out there the training telemetry of `unread_jobs` ((namespace, training_job) ->
        the nodes it ran on). `step` is the grid's step where the window's own is finer than
        wanted (a page drawn at its display's resolution). `seen` is where the store's roll-ups
        say GPUs reported (analyzer.fleet.rollups.RollUpReader.reported): the data's range is
        then read at its edges only (data_range)."""
        if window is None:
            now = time.time()
            window = Window(now - 3600.0, now)
        if reads is None:
            window = within(window, self.data_range(window, seen, step=step), self.min_step_s)
        step = max(step or 0.0, self.step_for(window))
        first, last = math.ceil(window.start / step) * step, math.floor(window.end / step) * step
        counted = step > self.min_step_s
        # Counts of a query with a better signal's `unless` are asked after it, where it has series.
        after = {(c.table, c.metric): c for c in COUNTS if c.unless} if counted else {}
        asked = [(q, after.get((q.table, q.metric)) if q.unless else None) for q in QUERIES]
        asked += [(c, None) for c in COUNTS if counted and not c.unless]
        jobs, before = [], []
        unread = [(job, set(on)) for job, on in (unread_jobs or {}).items()]
        for part, source in ([(window, self)] if reads is None else
                             [(part, self.on_hosts(hosts, [job for job, on in unread if not on.isdisjoint(hosts)]))
                              for part, hosts in reads.items()]):
            a, b = max(first, math.ceil(part.start / step) * step), min(last, math.floor(part.end / step) * step)
            grid = np.arange(a, b + step / 2, step) if b >= a else np.empty(0)
            chunks = [grid[k:k + self.chunk_points] for k in range(0, len(grid), self.chunk_points)]
            jobs += [(source, q, chunk, counts if counts is not None and _wanted(counts, columns) else None)
                     for chunk in chunks for q, counts in asked if _wanted(q, columns) and q.column not in RANK_LATEST]
            # Each series' last value over the part, at its last point (the frame puts it on the
            # series' last row): one value a series, where a range would ask one a step.
            jobs += [(source, replace(q, span_s=len(grid) * step), grid[-1:], None)
                     for q, _ in asked if len(grid) and q.table == "rank" and q.column in RANK_LATEST
                     and _wanted(q, columns)]
            # The point before the part's first: its first point's increase (Frames.rank_before).
            before += [(source, q, grid[:1] - step) for q in COUNTED if len(grid) and _wanted(q, columns)]
        if not jobs:   # a drill-down with nothing to read: the store's prices still price the rest
            return hold(replace(empty_frames(window, step), gpu_hour_prices=self.opencost_prices(window)))
        return self._read(jobs, before, window, step, first, columns, reads, progress)

    def _read(self, jobs: list, before: list, window: Window, step: float, first: float,
              columns: Mapping[str, Sequence[str]] | None, reads: Mapping[Window, Sequence[str]] | None,
              progress: Progress | None) -> Frames:
        """The jobs' answers table by table (the chunks of each in time order), each table put
        together while the next is read (analyzer.sources.promtables); the pods' owners, the
        exporters' pods, OpenCost's prices and the rank counters `before` the read asked beside them."""
        jobs = sorted(jobs, key=lambda job: TABLE_ORDER.index(job[1].table))
        self._answered = 0
        tally = self._http.tally()      # one count for all of the read's range answers
        exporting = self if reads is None else self.on_hosts([h for hosts in reads.values() for h in hosts])
        exporting_window = window if reads is None else Window(min(p.start for p in reads), max(p.end for p in reads))
        with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool, ThreadPoolExecutor(1) as builder:
            owners = pool.submit(self.owners, window)
            exporters = pool.submit(exporting.exporter_pods, exporting_window)
            prices = pool.submit(self.opencost_prices, window)
            apart = self._http.tally()     # a point a series: bounded by the read's own answers
            counted = [(points[0], q.column, pool.submit(self._answer, source, q, points, step, 0, None, apart))
                       for source, q, points in before]
            assembly = Assembly(window, step, first, columns, owners, exporters, builder)
            total = len(jobs) + sum(job[3] is not None for job in jobs)
            answered = pool.map(lambda job: self._answers(job, step, total, progress, tally), jobs)
            table, answers = jobs[0][1].table, []
            for job, pairs in zip(jobs, answered):
                if job[1].table != table:
                    assembly.add(table, answers)
                    table, answers = job[1].table, []
                answers += [(q.column, answer) for q, answer in pairs]
            assembly.add(table, answers)
            frames = assembly.frames()
        return hold(replace(frames, owners=owners.result(), gpu_hour_prices=prices.result(),
                            rank_before=counts_before([(at, c, answer.result()) for at, c, answer in counted], step)))

    def opencost_prices(self, window: Window) -> dict[str, float]:
        """OpenCost's price of one GPU-hour per node, averaged over the window, where
        OpenCost runs in the cluster and this store scrapes it."""
        span = _span(window)
        data = self._post("/api/v1/query", {"query": f"avg by (node) (avg_over_time("
                                                     f"node_gpu_hourly_cost{self._loose()}[{span}]))",
                                            "time": _num(window.end)})
        prices = {}
        for series in data.get("result", []) if data.get("resultType") == "vector" else []:
            price = float(series["value"][1])
            if series["metric"].get("node") and math.isfinite(price) and price > 0:
                prices[series["metric"]["node"]] = price
        return prices

    def owners(self, window: Window) -> pd.DataFrame:
        """Each pod's controller in the window, from kube-state-metrics where the same
        Prometheus scrapes it; a Deployment's pods name the Deployment, not its ReplicaSet."""
        span = _span(window)
        pods = self._instant(f"max by (namespace, pod, owner_kind, owner_name) (last_over_time("
                             f"kube_pod_owner{self._loose(owner_is_controller='true')}[{span}]))", window.end)
        sets = self._instant(f"max by (namespace, replicaset, owner_kind, owner_name) (last_over_time("
                             f"kube_replicaset_owner{self._loose()}[{span}]))", window.end)
        deployment = {(m.get("namespace", ""), m.get("replicaset", "")): (m.get("owner_kind", ""), m.get("owner_name", ""))
                      for m in sets if m.get("owner_kind")}
        rows = []
        for m in pods:
            key = (m.get("namespace", ""), m.get("pod", ""))
            kind, name = m.get("owner_kind", ""), m.get("owner_name", "")
            kind, name = deployment.get((key[0], name), (kind, name)) if kind == "ReplicaSet" else (kind, name)
            rows.append((*key, kind, name))
        return pd.DataFrame(rows, columns=list(OWNER_COLUMNS)) if rows else empty_owners()

    def exporter_pods(self, window: Window) -> set[tuple[str, str]]:
        """The (namespace, pod) of every scrape target that exposes GPU series, where the
        scrape attaches them (`up` carries a target's labels): on that target's series they
        name the exporter, never a pod holding the GPU."""
        span = _span(window)
        exposing = " or ".join(f"last_over_time({on}[{span}])" for m in GPU_UTIL_NAMES
                               for on in self._on_hosts(selector(m, **self.scope)))
        targets = self._instant(f"group by (namespace, pod) (last_over_time(up{self._loose()}[{span}]) * on (instance) "
                                f"group_left () group by (instance) ({exposing}))", window.end)
        return {(m["namespace"], m["pod"]) for m in targets if m.get("namespace") and m.get("pod")}

    def clusters(self, window: Window, label: str) -> list[str]:
        """The values of `label` on GPU exporters' series in the window ("" for series
        without it): more than one means the store holds several clusters."""
        span = _span(window)
        selector(**{label: ""})
        present = " or ".join(f"last_over_time({selector(m)}[{span}])" for m in GPU_SERIES)
        return sorted({m.get(label, "") for m in self._instant(f"group by ({label}) ({present})", window.end)})

    def _on_hosts(self, chosen: str) -> list[str]:
        """A selector on these nodes only where narrowed: once per spelling of the node label
        (dcgm-exporter 4.8.3 writes `hostname`)."""
        if self.hosts is None:
            return [chosen]
        hosts = "|".join(re.escape(h) for h in self.hosts) or "$^"
        return [matching(chosen, name, hosts) for name in HOSTNAME_SPELLINGS]

    def _loose(self, **labels: str) -> str:
        """A selector's braces for series outside the GPU exporters: the scope's labels,
        or none (a cluster's kube-state-metrics need not carry the name its agents add)."""
        matchers = [f'{name}="{escape(value)}"' for name, value in labels.items()]
        matchers += [f'{name}=~"{escape(re.escape(value))}|"' for name, value in self.scope.items()]
        return "{" + ",".join(matchers) + "}"

    def _instant(self, promql: str, at: float) -> list[dict[str, str]]:
        return [series["metric"] for series in self.query(promql, at)]

    def query(self, promql: str, at: float) -> list[dict]:
        """An instant query's series (`metric`, `value`); nothing where it answers no vector."""
        data = self._post("/api/v1/query", {"query": promql, "time": _num(at)})
        return data.get("result", []) if data.get("resultType") == "vector" else []

    def rule_groups(self) -> list[dict]:
        """The store's rule groups (`/api/v1/rules`); none where it has no rules API."""
        try:
            return self._get("/api/v1/rules", {"type": "record"}).get("groups", [])
        except PrometheusError:
            return []

    def gpu_present(self, span: str) -> str:
        """1 for each GPU series with a sample in the `span` (a PromQL duration) before the query's time."""
        return " or ".join(f"present_over_time({selector(m, **self.scope)}[{span}])" for m in GPU_SERIES)

    def runtime_info(self) -> dict:
        """Prometheus' `/api/v1/status/runtimeinfo` (its retention among it); a PrometheusError
        where the store has none (VictoriaMetrics answers 400)."""
        return self._get("/api/v1/status/runtimeinfo", {})

    def data_range(self, window: Window, seen: Window | None = None, step: float | None = None) -> Window | None:
        """Where in the window any GPU has samples, from one query at the window's
        coarsest step: a year's window over a day of data is read at the day's step.
        `seen` (fleet mode's roll-ups): some GPU had samples in the step up to its start and
        in the step from its end, so the stretch between is left unread: the answer is the same.
        `step`, where coarser, is that of a read at a display's resolution: found to its step."""
        step = max(step or 0.0, step_for(window, self.min_step_s))
        kept = self._ranges.get((window, step))
        if kept is not None and time.monotonic() - kept[0] < RANGE_KEPT_S:
            return kept[1]
        found = self._data_range(window, seen, step)
        self._ranges = {key: value for key, value in self._ranges.items()
                        if time.monotonic() - value[0] < RANGE_KEPT_S} | {(window, step): (time.monotonic(), found)}
        return found

    def _data_range(self, window: Window, seen: Window | None, step: float) -> Window | None:
        first, last = math.ceil(window.start / step) * step, math.floor(window.end / step) * step
        if last < first:
            return None
        spans = [(first, last)]
        if seen is not None:
            inner = math.ceil(seen.start / step) * step, math.floor(seen.end / step) * step
            if first < inner[0] < inner[1] < last:
                spans = [(first, inner[0]), (inner[1], last)]
        found = [edge for a, b in spans for edge in self._present_edges(a, b, step)]
        if not found:
            return None
        # A point holds the samples of the step before it; after the last point of
        # the grid, data may run on to the window's end.
        return Window(max(window.start, min(found) - step), window.end if max(found) >= last else max(found))

    def _present_edges(self, first: float, last: float, step: float) -> tuple[float, ...]:
        """The first and last points from `first` to `last` (on the grid of `step`) at which some
        GPU has samples in the step before; none where none has. Asked of buckets of many steps
        first, each point covering its bucket's steps exactly, then step by step in the two
        buckets where the data begins and ends: the same answer for a fraction of the store's
        work (a query's cost is its points times its series)."""
        n = int(round((last - first) / step)) + 1
        width = math.ceil(n / EDGE_BUCKETS)
        if width < 4:
            return self._present_times(first, last, step)
        lead = n % width        # whole buckets end at `last`; the points before them, step by step
        head = self._present_times(first, first + (lead - 1) * step, step) if lead else ()
        ends = self._present_times(first + (lead + width - 1) * step, last, width * step)     # the buckets'
        if not ends:
            return head
        begin = head or self._present_times(ends[0] - (width - 1) * step, ends[0], step)
        end = self._present_times(ends[1] - (width - 1) * step, ends[1], step)
        if not begin or not end:    # a sample in the millisecond between two steps' ranges
            return self._present_times(first, last, step)
        return (min(begin), max(end))

    def _present_times(self, first: float, last: float, step: float) -> tuple[float, ...]:
        """The first and last points from `first` to `last` at which some GPU has samples in the
        step before; none where none has."""
        times = [float(t) for series in self.query_range(f"count({self.gpu_present(f'{int(step * 1000) - 1}ms')})",
                                                         first, last, step) for t, _ in series["values"]]
        return (min(times), max(times)) if times else ()


def matching(chosen: str, name: str, pattern: str, op: str = "=~") -> str:
    """A selector with one more matcher, a regular expression (or `op`'s kind of matcher)."""
    body = chosen[:-1]
    return f'{body}{"" if body.endswith("{") else ","}{name}{op}"{escape(pattern)}"}}'


def _leaving_out(chosen: str, jobs: Sequence[tuple[str, str]]) -> list[str]:
    """Selectors whose union is `chosen`'s series less those of these (namespace,
    training_job) pairs: PromQL matches labels one at a time, so one selector for the
    namespaces left whole and one per namespace with jobs left out. Series whose namespace
    a scrape moved to exported_namespace (_grouped) are all kept: a superset, never less."""
    names: dict[str, list[str]] = {}
    for namespace, job in jobs:
        names.setdefault(namespace, []).append(job)
    own = matching(chosen, "exported_" + L.NAMESPACE, "", "=")
    either = "|".join(re.escape(n) for n in names)
    return ([matching(chosen, "exported_" + L.NAMESPACE, "", "!="), matching(own, L.NAMESPACE, either, "!~")]
            + [matching(matching(own, L.NAMESPACE, namespace, "="), L.TRAINING_JOB,
                        "|".join(re.escape(j) for j in sorted(left)), "!~")
               for namespace, left in sorted(names.items())])


def _span(window: Window) -> str:
    """The whole window as a range selector's duration (at least a second)."""
    return f"{max(int(window.end - window.start), 1)}s"


def _key_labels(q: _Query) -> tuple[str, ...]:
    """The labels a query's series are told apart by: its own, the holder's exported_* ones
    (_grouped) and the node label's other spelling."""
    return q.by + (EXPORTED if L.POD in q.by else ()) + (("hostname",) if L.HOSTNAME in q.by else ())


def _grouped(answer: list[dict], labels: tuple[str, ...]) -> list[dict]:
    """The answer's series by `labels` alone, as PromQL's `max by` would give them: series
    that share them are one, their maximum at each point. Where a scrape does not honor the
    exporter's labels (GPU Operator's profile), the pod holding the GPU arrives as
    exported_namespace, exported_pod and exported_container, and namespace, pod and container
    name the exporter's own pod: the exported ones win."""
    merged: dict[tuple, dict] = {}
    for series in answer:
        metric = {name: series["metric"][name] for name in labels if name in series["metric"]}
        for name in (L.NAMESPACE, L.POD, L.CONTAINER):
            exported = metric.pop(f"exported_{name}", "")
            if exported:
                metric[name] = exported
        series["metric"] = metric
        key = tuple(sorted(metric.items()))
        if key in merged:
            merged[key]["values"] = _pointwise_max(merged[key]["values"], series["values"])
        else:
            merged[key] = series
    return list(merged.values())


def _pointwise_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two series' (time, value) points as one: the larger value where both have a point."""
    both = np.concatenate([a, b])
    # NaN is a value only where no series has another (PromQL's max).
    both = both[np.lexsort((np.nan_to_num(both[:, 1], nan=-np.inf), both[:, 0]))]
    last = np.append(both[1:, 0] != both[:-1, 0], True)
    return both[last]


def _gpu_exporter(target: dict) -> bool:
    job = str(target.get("labels", {}).get("job", ""))
    return ":9400/" in str(target.get("scrapeUrl", "")) or any(w in job for w in ("dcgm", "burnrate", "gpu"))


def _wanted(q: _Query, columns: Mapping[str, Sequence[str]] | None) -> bool:
    # Node info carries the node's labels and `up` tells the agent's series from
    # dcgm-exporter's: both are asked whenever their table is.
    return columns is None or q.table in columns and (
        q.column in columns[q.table] or q.column in ("_info", "up", "sample_count", "allocated"))


def _num(value: float) -> str:
    return repr(float(value))
