"""Where the pages get their numbers: one analysis per time range, shared.

Every page callback asks the `DataService` for the `Analysis` of its range. An
analysis (frames, findings, job costs, and the fleet aggregates built from them)
is cached for a short time, so the pages and the header that render together
share one read and one detector run. After the TTL the cached analysis is still
served while a background thread recomputes it: at fleet scale a fresh analysis
takes seconds, a page render must not.

A store is read the way `burnrate analyze` reads it (analyzer.fleet.choice): where its
ruler keeps burnrate's roll-ups over the range, in fleet mode. The report is then fleet
mode's; the fleet is drawn from the overview's read of every GPU at the display's step
(dashboard/overview.py), and a job's page reads that job's nodes per GPU over its life.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np
import pandas as pd

from burnrate.analyzer.costing.cost import GpuPrices
from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.fleet.choice import Choice, choose
from burnrate.analyzer.fleet.mode import analyze_fleet
from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS, Views
from burnrate.analyzer.grid.frames import Frames, Window
from burnrate.analyzer.grid.freed import give_back
from burnrate.analyzer.costing.pricing import Catalog
from burnrate.analyzer.sources.recording_tables import RecordingError
from burnrate.analyzer.output.report import Report, analyze
from burnrate.analyzer.sources import PrometheusError, PrometheusSource, RecordingSource, missing_signals
from burnrate.analyzer.sources.timeparse import format_time

from . import aggregate, overview
from .timerange import ALL, TimeRange, from_query

# What the pages read of a window: what `burnrate analyze` reads (the detectors, the cost, the
# ledger), plus the GPU series a job's page draws; not every GPU field the agent exports, each
# of which is one more query over every GPU of the window.
PAGE_COLUMNS = {**ANALYSIS_COLUMNS,
                "gpu": tuple(dict.fromkeys(ANALYSIS_COLUMNS["gpu"] + tuple(aggregate.GPU_SERIES.values())))}


# The most calendar periods the Cost page's showback analyses for one range: a month of days.
PERIOD_ANALYSES = 32
# Job pages read in fleet mode that are kept at once.
JOB_READS = 8

Job = tuple[str, str]


class Source(Protocol):
    def frames(self, window: Window | None = None, columns: Mapping[str, Sequence[str]] | None = None) -> Frames: ...


class Unavailable(Exception):
    """The data cannot be read (Prometheus unreachable, a broken recording, a bad
    range); the message is one line a page shows instead of its figures."""


@dataclass
class Analysis:
    """One window's frames and report, with the aggregates pages draw built at most once."""

    frames: Frames
    report: Report
    catalog: Catalog
    config: DetectorConfig = DetectorConfig()
    # Fleet mode: the overview whose read the fleet is drawn from (`frames` are its), how the
    # store was read, and a job's own analysis, read on its nodes over its life.
    overview: overview.Overview | None = None
    way: str | None = None
    of_job: Callable[[Job], Analysis] | None = field(default=None, repr=False)

    @property
    def empty(self) -> bool:
        return self.frames.gpu.empty and self.frames.rank.empty

    @property
    def simulated(self) -> bool:
        return self.frames.simulated

    @property
    def views(self) -> Views:
        return self.overview.views if self.overview is not None else self.report.views

    @property
    def prices(self) -> GpuPrices:
        return self.report.prices

    @cached_property
    def fleet(self) -> aggregate.Fleet:
        if self.overview is not None:
            return self.overview.fleet
        return aggregate.fleet(self.views, self.prices, self.config.idle_gpu)

    def job(self, job: Job) -> Analysis:
        """The analysis a job's page draws: this one, or in fleet mode the job's own."""
        return self if self.of_job is None else self.of_job(job)

    @cached_property
    def jobs(self) -> pd.DataFrame:
        return aggregate.job_table(self.report, self.views)

    def warm(self) -> Analysis:
        """Build what the landing page needs, so the first render after a refresh is fast."""
        if not self.empty:
            _ = self.fleet, self.jobs
        return self


def cut(frames: Frames, window: Window) -> Frames:
    """The frames within `window`; rows are sorted by time, so two binary searches per table."""
    def part(frame: pd.DataFrame) -> pd.DataFrame:
        t = frame["t"].to_numpy()
        lo, hi = np.searchsorted(t, window.start, "left"), np.searchsorted(t, window.end, "right")
        return frame.iloc[lo:hi].reset_index(drop=True)

    tables = {name: part(getattr(frames, name)) for name in ("gpu", "alloc", "rank", "node", "xid", "pod_cpu")}
    return replace(frames, window=window, missing=missing_signals(tables["gpu"], tables["rank"], tables["node"]),
                   **tables)


class DataService:
    """Analyses of one source, cached per time range for `ttl_s` seconds."""

    def __init__(self, source: Source, catalog: Catalog, ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.time, config: DetectorConfig = DetectorConfig(),
                 forced_by: str | None = None, rollup_interval_s: float | None = None) -> None:
        """`forced_by` is the flag that sets how a store is read (--fleet, --per-gpu), None for
        the store to decide as `burnrate analyze` lets it; `rollup_interval_s` is the roll-ups'."""
        self.source = source
        self.catalog = catalog
        self.config = config
        self.forced_by = forced_by
        self.rollup_interval_s = rollup_interval_s
        self.where = describe_source(source)
        self.clock = clock
        # A recording's ranges end at its last sample; Prometheus' end now.
        self.default_range = ALL if isinstance(source, RecordingSource) else "6h"
        self.cache = TtlCache(self._compute, ttl_s)
        self.overviews = TtlCache(self._overview, ttl_s)
        # The Cost page's showback analyses each calendar period of a range apart: kept beside
        # the pages' ranges, so that a week of days does not push those out.
        self.periods = TtlCache(lambda key: self._compute(*key), ttl_s, max_entries=PERIOD_ANALYSES)
        self.jobs = TtlCache(lambda key: self._job(*key), ttl_s, max_entries=JOB_READS)
        # How the store is read for each range (analyzer.fleet.choice), asked once per range.
        self.choices = TtlCache(self._choice, ttl_s, max_entries=PERIOD_ANALYSES + 4)

    def analysis(self, time_range: TimeRange) -> Analysis:
        return self.cache.get(time_range)

    def ready(self, time_range: TimeRange) -> Analysis | None:
        """The range's analysis where one is kept (a stale one is refreshed behind it), else None
        while a background thread computes it; Unavailable where that failed."""
        return self.cache.peek(time_range)

    def kept(self, time_range: TimeRange) -> bool:
        """Whether the range's analysis (or its error) is cached, fresh or stale."""
        return self.cache.has(time_range)

    def analysing_for(self, time_range: TimeRange) -> float:
        """Seconds the range's analysis has been running (0 where it is not)."""
        return self.cache.running_for(time_range)

    def overview(self, time_range: TimeRange) -> overview.Overview | None:
        """The range read at its display's resolution (dashboard/overview.py), for a page to
        draw while the analysis runs; None where the source has no such read (a recording
        is read whole either way)."""
        return self.overviews.get(time_range) if isinstance(self.source, PrometheusSource) else None

    def start_overview(self, time_range: TimeRange) -> None:
        """Start the range's overview read in the background, where the source has one and it is
        neither kept nor under way: a page's first callback then finds it started."""
        if isinstance(self.source, PrometheusSource):
            self.overviews.start(time_range)

    def period_analysis(self, window: Window, per_gpu: str | None = None) -> Analysis:
        """The analysis of one showback period's window (dashboard/showback.py); `per_gpu` names
        what needs every GPU's series (teams by a pod label), where the store would be read in
        fleet mode."""
        time_range = TimeRange(start=window.start, end=window.end)
        if per_gpu is not None and not self.way(time_range).fleet:
            per_gpu = None      # read per GPU either way: one analysis for every grouping
        return self.periods.get((time_range, per_gpu))

    def way(self, time_range: TimeRange) -> Choice:
        """How the range is read: fleet mode or every GPU's series."""
        if not isinstance(self.source, PrometheusSource):
            return Choice(False, "")
        return self.choices.get(time_range)

    def warm_up(self) -> threading.Thread:
        """Start the default range's analysis now, so the first visitor does not
        wait for a fleet-sized read (an error is cached and shown to them instead)."""
        def run() -> None:
            try:
                self.analysis(from_query("", self.default_range))
            except Unavailable:
                pass
        thread = threading.Thread(target=run, name="burnrate-dashboard-warm-up", daemon=True)
        thread.start()
        return thread

    def _compute(self, time_range: TimeRange, per_gpu: str | None = None) -> Analysis:
        with self._reading():
            if isinstance(self.source, PrometheusSource):
                window = self._window(time_range)
                choice = (choose(self.source, window, per_gpu) if per_gpu is not None
                          else self.way(time_range))
                if choice.fleet:
                    return self._fleet(time_range, window, choice.note)
                frames = self.source.frames(window, PAGE_COLUMNS)
                way = choice.note
            else:
                frames, way = self._frames(time_range), None
        return Analysis(frames, analyze(frames, self.catalog, self.config), self.catalog, self.config,
                        way=way).warm()

    def _choice(self, time_range: TimeRange) -> Choice:
        with self._reading():
            return choose(self.source, self._window(time_range), self.forced_by, self.rollup_interval_s)

    def _fleet(self, time_range: TimeRange, window: Window, way: str) -> Analysis:
        """Fleet mode's report (analyzer.fleet.mode), the fleet drawn from the overview's read."""
        early = self.overviews.get(time_range)
        report = analyze_fleet(self.source, window, self.catalog, self.config, interval_s=self.rollup_interval_s)
        return Analysis(early.frames, report, self.catalog, self.config, overview=early, way=way,
                        of_job=lambda job: self.jobs.get((time_range, job))).warm()

    def _job(self, time_range: TimeRange, job: Job) -> Analysis:
        """A job's own analysis in fleet mode: its nodes read per GPU over its life (as fleet
        mode reads a job it flags), a display step wider either side, from the overview's
        allocations; other jobs on those nodes are read too, the page draws this one."""
        early = self.overviews.get(time_range)
        views = early.views
        rows = views.job_rows(views.alloc).get(job, np.zeros(0, np.int64))
        held = np.flatnonzero(views.alloc.present[rows].any(axis=0))
        if not held.size:     # the page says the job held no GPUs in the range
            return Analysis(early.frames, early.report, self.catalog, self.config)
        window = early.frames.window
        life = Window(max(float(views.time(held[0])) - 2 * views.step, window.start),
                      min(float(views.time(held[-1])) + views.step, window.end))
        hosts = sorted(set(views.alloc.keys["Hostname"].iloc[rows].astype(str)))
        with self._reading():
            frames = self.source.frames(life, PAGE_COLUMNS, reads={life: hosts})
        return Analysis(frames, analyze(frames, self.catalog, self.config), self.catalog, self.config,
                        way=f"the job's {len(hosts)} nodes read per GPU over its life").warm()

    def _overview(self, time_range: TimeRange) -> overview.Overview:
        with self._reading():
            return overview.read(self.source, self._window(time_range), self.catalog, self.config)

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """A failed read as Unavailable: the store's own line, or what could not be read and why."""
        try:
            yield
        except PrometheusError as exc:
            raise Unavailable(str(exc).splitlines()[0]) from None
        except (RecordingError, OSError, ValueError) as exc:
            raise Unavailable(f"cannot read {self.where}: {exc}") from None

    def _window(self, r: TimeRange) -> Window:
        """A range of a store that ends now: a recording's ranges are cut in `_frames`."""
        now = self.clock()
        if r.start is not None:
            return Window(r.start, r.end if r.end is not None else now)
        if r.is_all:
            raise ValueError("range=all needs a recording; pick a duration such as 6h")
        return Window(now - r.last, now)

    def _frames(self, r: TimeRange) -> Frames:
        if isinstance(self.source, RecordingSource) and r.start is None:
            # One read: the whole recording, then the range cut from its end in memory.
            whole = self.source.frames(None, PAGE_COLUMNS)
            if r.is_all:
                return whole
            # No earlier than the recording: a range of centuries is the whole of it, at its own
            # resolution, not a grid of points reaching back to before it began.
            end = whole.window.end
            return cut(whole, Window(max(end - r.last, whole.window.start), end))
        return self.source.frames(self._window(r), PAGE_COLUMNS)


class Services:
    """One DataService per cluster of the store, chosen by the URL's `cluster=`; a single
    service (a recording, a store of one cluster) under the name ""."""

    def __init__(self, services: dict[str, DataService]) -> None:
        self.by_name = services
        self.default = next(iter(services))

    @property
    def clusters(self) -> list[str]:
        """The cluster names to pick from; none where there is one service."""
        return list(self.by_name) if len(self.by_name) > 1 else []

    def of(self, cluster: str | None) -> DataService:
        """The service of `cluster` (the first where none is named); KeyError for one the store lacks."""
        return self.by_name[self.default if cluster is None else cluster]

    def warm_up(self) -> threading.Thread:
        return self.of(None).warm_up()


def describe_source(source: Source) -> str:
    """The source's kind and a name that reads the same on every machine: a
    recording's directory name, not its path."""
    if isinstance(source, RecordingSource):
        return f"recording {os.path.basename(os.path.normpath(source.root))}"
    if isinstance(source, PrometheusSource):
        return f"Prometheus {source.url}"
    return type(source).__name__


def describe_window(window: Window) -> str:
    return f"{format_time(window.start)} → {format_time(window.end)}"


class TtlCache:
    """Results of `compute` per key. A fresh entry is returned as is; a stale
    successful one is returned while one background thread recomputes it; an
    error is cached like a result, so an unreachable server is not asked again by
    every callback of a page, but it is never served stale."""

    def __init__(self, compute: Callable, ttl_s: float, max_entries: int = 4,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.compute = compute
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[object, tuple[float, object]] = {}
        self._lock = threading.Lock()
        self._computing: dict[object, threading.Lock] = {}
        self._refreshing: set[object] = set()
        self._started: dict[object, float] = {}

    def peek(self, key: object):
        """What `get` returns where an entry is kept, without waiting: None while the first
        computation runs, in a background thread that this starts where none has."""
        with self._lock:
            kept = key in self._entries
        if kept:
            return self.get(key)
        self.start(key)
        return None

    def start(self, key: object) -> None:
        """Compute `key` in a background thread where it is neither kept nor being computed."""
        with self._lock:
            if key in self._entries or key in self._refreshing:
                return
            self._refreshing.add(key)

        def first() -> None:
            try:
                self._compute_once(key)
            finally:
                with self._lock:
                    self._refreshing.discard(key)

        threading.Thread(target=first, name="burnrate-dashboard-analysis", daemon=True).start()

    def has(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def running_for(self, key: object) -> float:
        with self._lock:
            started = self._started.get(key)
        return 0.0 if started is None else max(self.clock() - started, 0.0)

    def get(self, key: object):
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None:
            at, value = entry
            if self.clock() - at < self.ttl_s:
                return _unwrap(value)
            if not isinstance(value, Exception):
                self._refresh_in_background(key)
                return value
        return _unwrap(self._compute_once(key))

    def _compute_once(self, key: object) -> object:
        # Callbacks of one page arrive together: only the first computes.
        with self._lock:
            gate = self._computing.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                entry = self._entries.get(key)
            if entry is not None and self.clock() - entry[0] < self.ttl_s:
                return entry[1]
            with self._lock:
                self._started[key] = self.clock()
            try:
                value = self.compute(key)
            except Unavailable as exc:
                value = exc
            finally:
                with self._lock:
                    self._started.pop(key, None)
            self._store(key, value)
            # What the computation freed goes back to the system: the dashboard lives for weeks and
            # analyses each range anew every refresh (a day of 1,024 GPUs: 0.47 → 0.26 GiB after one).
            give_back()
            return value

    def _refresh_in_background(self, key: object) -> None:
        with self._lock:
            if key in self._refreshing:
                return
            self._refreshing.add(key)

        def refresh() -> None:
            try:
                self._store(key, self.compute(key))
            except Unavailable as exc:
                self._store(key, exc)
            finally:
                with self._lock:
                    self._refreshing.discard(key)

        threading.Thread(target=refresh, name="burnrate-dashboard-refresh", daemon=True).start()

    def _store(self, key: object, value: object) -> None:
        with self._lock:
            self._entries[key] = (self.clock(), value)
            while len(self._entries) > self.max_entries:
                oldest = min(self._entries, key=lambda k: self._entries[k][0])
                del self._entries[oldest]


def _unwrap(value: object):
    if isinstance(value, Exception):
        raise value
    return value
