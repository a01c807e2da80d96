"""The roll-ups a store's ruler keeps (the `burnrate-rollups` group of the shipped
rules), read for a whole window in a handful of instant queries, whatever the fleet's size.

A roll-up `x:rate5m` is evaluated every `interval` seconds over the 5 minutes before, so
its samples summed over a window and multiplied by the interval are the seconds of the
window (each second is in five evaluations, each weighing a fifth). Sums are taken at the
window's end plus half of those 5 minutes, so the window's edges lose and gain alike.

Flags are necessary conditions: a job or node no flag names can have no finding, so its
figures may come from the roll-ups alone. Each is written from its detector's thresholds
with a margin, and a stretch "at least L long" is looked for as a window of L/2 at steps of
L/2 (any run of L holds one), which keeps each query to about one evaluation per stored
point.

Node flags say when they held, to the bucket (`RollUps.node_spans`), and each job's life is
known to the bucket (`RollUps.job_spans`): fleet mode reads a node per GPU only over the
stretch that needs it.
"""
from __future__ import annotations

import math
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np

from burnrate.exporter import labels as L
from burnrate.exporter.catalog import IDLE_UTIL_PCT

from ..detectors import DetectorConfig
from ..grid.frames import Window
from ..grid.resample import MAX_POINTS
from ..grid.views import invalid_mfu, invalid_mfu_note
from ..sources.prometheus import GPU_SERIES, HOSTNAME_SPELLINGS, PrometheusSource, matching, selector

GROUP = "burnrate-rollups"
DEFAULT_INTERVAL_S = 60.0
RATE_WINDOW_S = 300.0
JOB_ALLOCATED = "cluster_hostname_namespace_training_job:burnrate_gpu_allocated_seconds:rate5m"
JOB_IDLE = "cluster_hostname_namespace_training_job:burnrate_gpu_idle_seconds:rate5m"
NODE_OBSERVED = "cluster_hostname:burnrate_gpu_observed_seconds:rate5m"
REPORTING = "cluster_hostname:burnrate_gpus_reporting:count"
JOB_SHARE = "cluster_namespace_training_job:burnrate_gpu_allocation_share:sum"
STEPS = "cluster_namespace_training_job:burnrate_train_steps:max_rate5m"
STEP_SECONDS = "cluster_namespace_training_job:burnrate_train_step_seconds:rate5m"
DATA_WAIT = "cluster_namespace_training_job:burnrate_train_data_wait_seconds:rate5m"
TOKENS = "cluster_namespace_training_job:burnrate_train_tokens:rate5m"
MFU = "cluster_namespace_training_job:burnrate_train_mfu_ratio:avg"
CHECKPOINT = "cluster_namespace_training_job:burnrate_train_last_checkpoint_timestamp_seconds:max"
LOSS = "cluster_namespace_training_job:burnrate_train_loss:median"
GRAD_NORM = "cluster_namespace_training_job:burnrate_train_grad_norm:median"
NONFINITE = "cluster_namespace_training_job:burnrate_train_nonfinite_ranks:count"
STRAGGLE = "cluster_namespace_training_job:burnrate_train_compute_per_step_seconds:max_over_median5m"
XID = "cluster_hostname:burnrate_gpu_xid_errors:increase5m"
DOWN = "cluster_hostname:burnrate_gpu_down:count"
THERMAL = "cluster_hostname:dcgm_fi_dev_clock_throttle_reasons_thermal:count"
READ = (JOB_ALLOCATED, JOB_IDLE, NODE_OBSERVED, JOB_SHARE, STEPS, STEP_SECONDS, DATA_WAIT, TOKENS, MFU, CHECKPOINT, LOSS, GRAD_NORM,
        NONFINITE, STRAGGLE, XID, DOWN, THERMAL)
# Thresholds are met by the roll-ups with this much to spare: they average over 5 minutes
# and their ranks' median is a mean where the detector takes a median, so a finding near
# its threshold is looked at per GPU rather than missed.
MARGIN = 0.8
FREE = "unallocated GPUs"
BARE = "GPUs without roll-ups"
# Stretches with missed evaluations are filled one query each, up to this many (closest joined).
MAX_FILL_QUERIES = 8
JOB = ("cluster", L.NAMESPACE, L.TRAINING_JOB)
NODE = ("cluster", L.HOSTNAME)
Job = tuple[str, str]


@dataclass
class RollUps:
    """One window's roll-ups: seconds per job × node, per node, training totals per job,
    and what each flag named (job -> reasons, node -> reasons)."""

    interval_s: float
    interval_basis: str
    allocated: dict[tuple[Job, str, str], float] = field(default_factory=dict)   # (job, host, model) -> s
    idle: dict[tuple[Job, str, str], float] = field(default_factory=dict)
    observed: dict[tuple[str, str], float] = field(default_factory=dict)          # (host, model) -> s
    evaluations: dict[str, float] = field(default_factory=dict)                    # host -> evaluations seen
    steps: dict[Job, float] = field(default_factory=dict)
    tokens: dict[Job, float] = field(default_factory=dict)
    mfu: dict[Job, float] = field(default_factory=dict)
    gpus: dict[Job, float] = field(default_factory=dict)                           # most held at once
    checkpoint_interval_s: dict[Job, float] = field(default_factory=dict)
    node_info: dict[str, dict[str, str]] = field(default_factory=dict)
    flagged_jobs: dict[Job, set[str]] = field(default_factory=dict)
    flagged_nodes: dict[str, set[str]] = field(default_factory=dict)
    lifetime_s: dict[str, float] = field(default_factory=dict)                     # host -> seconds its GPUs were there
    bucket_s: float = 0.0                                                          # what spans are known to
    node_spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # host -> where its flags held
    job_spans: dict[Job, tuple[float, float]] = field(default_factory=dict)         # job -> its allocation roll-ups' span
    filled: dict[str, float] = field(default_factory=dict)                         # host -> missed evaluations filled
    notes: list[str] = field(default_factory=list)                                 # what the report must say of them

    @property
    def hosts(self) -> set[str]:
        return {host for host, _ in self.observed}

    def nodes_of(self, job: Job) -> set[str]:
        return self._held[0].get(job, set())

    def jobs_on(self, hosts: set[str]) -> set[Job]:
        by_host = self._held[1]
        return set().union(*(by_host.get(h, ()) for h in hosts))

    def held_by(self, job: Job) -> dict[str, float]:
        """The job's GPU-seconds on each node where it held any."""
        return self._held[2].get(job, {})

    def models_on(self, host: str) -> list[str]:
        """The GPU models the node's roll-ups name."""
        return sorted(self._models.get(host, ()))

    @cached_property
    def _held(self) -> tuple[dict[Job, set[str]], dict[str, set[Job]], dict[Job, dict[str, float]]]:
        """Who held GPUs where, indexed both ways (built once the window is read)."""
        nodes: dict[Job, set[str]] = {}
        jobs: dict[str, set[Job]] = {}
        seconds: dict[Job, dict[str, float]] = {}
        for (job, host, _), s in self.allocated.items():
            nodes.setdefault(job, set()).add(host)
            jobs.setdefault(host, set()).add(job)
            if s > 0:
                seconds.setdefault(job, {})[host] = seconds.get(job, {}).get(host, 0.0) + s
        return nodes, jobs, seconds

    @cached_property
    def _models(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for host, model in self.observed:
            out.setdefault(host, set()).add(model)
        for _, host, model in self.allocated:
            out.setdefault(host, set()).add(model)
        return out

    def per_host(self, seconds: dict) -> dict[str, float]:
        """`observed`, `allocated` or `idle` summed per node."""
        out: dict[str, float] = {}
        for key, s in seconds.items():
            out[key[-2]] = out.get(key[-2], 0.0) + s    # (…, host, model)
        return out


def idle_threshold_note(util_max_pct: float) -> str:
    """The idle roll-ups are the agent's idle counter, split at the contract's threshold when
    it was counted: a config that moves the idle threshold cannot move theirs."""
    return (f"idle GPU-hours read from roll-ups, and the roll-ups' idle flag, count utilization at or below "
            f"{IDLE_UTIL_PCT:g}% (the agent's burnrate_gpu_idle_seconds_total), not this config's "
            f"{util_max_pct:g}%: only the nodes read per GPU follow it (docs/thresholds.md)")


@dataclass
class _Flags:
    """The flags' queries as asked (RollUpReader._ask_flags): (reason, answer) per flag, and
    the answers the flags are judged with."""
    stretch: float                       # minutes free GPUs must stay free (unallocated_gpu)
    jobs: list[tuple[str, Future]] = field(default_factory=list)
    nodes: list[tuple[str, Future]] = field(default_factory=list)
    straggle: Future | None = None
    spans: Future | None = None
    trained: Future | None = None


class RollUpReader:
    """`interval_s` is the roll-up group's evaluation interval where the store has no rules
    API to ask (VictoriaMetrics without vmalert's proxy): None asks it, else takes 60 s."""

    def __init__(self, source: PrometheusSource, config: DetectorConfig = DetectorConfig(),
                 interval_s: float | None = None) -> None:
        self.source = source
        self.config = config
        self._interval = interval_s

    @cached_property
    def interval(self) -> tuple[float, str]:
        """The roll-ups' evaluation interval and where it came from."""
        if self._interval is not None:
            return self._interval, "given"
        for group in self.source.rule_groups():
            if group.get("name") == GROUP and isinstance(group.get("interval"), (int, float)):
                return float(group["interval"]), "the store's rules API"
        return DEFAULT_INTERVAL_S, f"not found in the store's rules API: {DEFAULT_INTERVAL_S:g} s, the shipped rules', assumed"

    def reported(self, window: Window) -> Window | None:
        """For `PrometheusSource.data_range`: at the window's step, from the first point where
        the ruler counted reporting GPUs to the last less a step and the count's 5-minute
        lookback, some GPU had samples in the step before."""
        step = self.source.step_for(window)
        first, last = math.ceil(window.start / step) * step, math.floor(window.end / step) * step
        if last < first:
            return None
        times = [float(t) for series in self.source.query_range(
                     f"count(present_over_time({self._sel(REPORTING)}[{int(step * 1000) - 1}ms]))", first, last, step)
                 for t, _ in series["values"]]
        return Window(min(times), max(times) - step - RATE_WINDOW_S) if times else None

    def read(self, window: Window, bucket_s: float) -> RollUps:
        interval, basis = self.interval
        out = RollUps(interval, basis, bucket_s=bucket_s)
        self._window, self._interval_s = window, interval
        self._at = window.end + RATE_WINDOW_S / 2
        self._range = f"{max(int(round(window.end - window.start)), 1)}s"
        # Every query below is independent of the others' answers: asked side by side on the
        # source's workers, the sums and the flags' subqueries, then taken in order. One after
        # the other, the sums alone took a day of 1,024 GPUs 1.1 s before the flags began.
        with ThreadPoolExecutor(max_workers=max(1, self.source.workers)) as pool:
            ask = pool.submit
            held = {target: ask(self._sums, metric, JOB + (L.HOSTNAME, L.MODEL_NAME))
                    for target, metric in (("allocated", JOB_ALLOCATED), ("idle", JOB_IDLE))}
            observed = ask(self._sums, NODE_OBSERVED, NODE + (L.MODEL_NAME,))
            evaluations = ask(self._values, f"sum by (cluster, Hostname) (count_over_time({self._sel(NODE_OBSERVED)}"
                                            f"[{self._range}]))", NODE)
            steps, tokens = ask(self._sums, STEPS, JOB), ask(self._sums, TOKENS, JOB)
            mfu = ask(self._values, f"avg_over_time(({self._sel(MFU)} and on (cluster, namespace, training_job) "
                                    f"{self._sel(STEPS)} > 0)[{self._range}:{self._step(interval)}])", JOB)
            gpus = ask(self._values, f"max_over_time({self._sel(JOB_SHARE)}[{self._range}])", JOB)
            checkpoints = self._checkpoints(pool, interval)
            node_info = ask(self._node_info)
            flags = self._ask_flags(pool, bucket_s)
            for target, sums in held.items():
                for (_, namespace, name, host, model), s in sums.result().items():
                    getattr(out, target)[((namespace, name), host, model)] = s
            for (_, host, model), s in observed.result().items():
                out.observed[(host, model)] = out.observed.get((host, model), 0.0) + s
            for key, n in evaluations.result().items():
                out.evaluations[key[1]] = out.evaluations.get(key[1], 0.0) + n
            out.steps, out.tokens = _jobs(steps.result()), _jobs(tokens.result())
            mfu = _jobs(mfu.result())
            bad = invalid_mfu(np.fromiter(mfu.values(), np.float64, len(mfu)))
            out.mfu = {job: value for (job, value), no in zip(mfu.items(), bad) if not no}
            out.notes += invalid_mfu_note({job: 1 for job, no in zip(mfu, bad) if no})
            out.gpus = _jobs(gpus.result())
            out.checkpoint_interval_s = checkpoints()
            out.node_info = node_info.result()
            self._flag(out, flags, bucket_s)
        self._fill(out, bucket_s)
        if self.config.idle_gpu.util_max_pct != IDLE_UTIL_PCT:
            out.notes.append(idle_threshold_note(self.config.idle_gpu.util_max_pct))
        return out

    # --- queries ---------------------------------------------------------------------
    def _sel(self, metric: str) -> str:
        return selector(metric, **self.source.scope)

    def _step(self, seconds: float) -> str:
        return f"{max(int(round(seconds)), 1)}s"

    def _values(self, promql: str, by: tuple[str, ...], at: float | None = None) -> dict[tuple[str, ...], float]:
        out = {}
        for series in self.source.query(promql, self._at if at is None else at):
            value = float(series["value"][1])
            if math.isfinite(value):
                out[tuple(series["metric"].get(n, "") for n in by)] = value
        return out

    def _sums(self, metric: str, by: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        """Seconds (or counts) in the window: each evaluation stands for `interval` of them."""
        return self._values(f"sum by ({', '.join(by)}) (sum_over_time({self._sel(metric)}[{self._range}]))"
                            f" * {self._interval_s:g}", by)

    def _names(self, promql: str, by: tuple[str, ...]) -> set[tuple[str, ...]]:
        return {tuple(series["metric"].get(n, "") for n in by) for series in self.source.query(promql, self._at)}

    def _checkpoints(self, pool: ThreadPoolExecutor, interval: float) -> Callable[[], dict[Job, float]]:
        """Each job's time between checkpoints: from the first checkpoint seen in the window to
        the last over the checkpoints in between (its mean, where the per-rank path takes the
        median; the same for a job that checkpoints on a schedule), where three were seen.
        Asked on `pool`; the answer once called."""
        saved = f"({self._sel(CHECKPOINT)} > 0)[{self._range}:{self._step(interval)}]"
        first, last, count = (pool.submit(self._values, promql, JOB) for promql in
                              (f"min_over_time({saved})", f"max_over_time({saved})", f"changes({saved}) + 1"))

        def answer() -> dict[Job, float]:
            a, b = _jobs(first.result()), _jobs(last.result())
            return {job: (b[job] - a[job]) / (n - 1) for job, n in _jobs(count.result()).items()
                    if n > 2 and job in a and job in b}
        return answer

    def _node_info(self) -> dict[str, dict[str, str]]:
        info = {}
        for series in self.source.query(f"last_over_time({self._sel('burnrate_node_info')}[{self._range}:5m])",
                                        self._at):
            labels = series["metric"]
            if labels.get(L.HOSTNAME):
                info[labels[L.HOSTNAME]] = {n: labels.get(n, "") for n in L.NODE_INFO_LABELS}
        return info

    def _stretch(self, condition: str, minutes: float, over: str | None = None) -> str:
        """`condition` held at every evaluation of some stretch of `minutes` (a subquery's
        points are counted: a series that is absent for a while did not hold), anywhere in
        the window or in the `over` seconds before each point of a range query."""
        half = max(minutes * 60 / 2, self._interval_s)
        need = max(int(half // self._interval_s), 1)
        return (f"max_over_time((count_over_time(({condition})[{self._step(half)}:{self._step(self._interval_s)}]) "
                f">= {need})[{over or self._range}:{self._step(half)}])")

    def _ask_flags(self, pool: ThreadPoolExecutor, bucket_s: float) -> _Flags:
        """The flags' queries, independent subqueries over the whole window, each a few tenths
        of a second of the store's time: asked on `pool`, taken by _flag."""
        c, m = self.config, MARGIN
        rate = RATE_WINDOW_S / 60
        bucket = self._step(bucket_s)
        flags = _Flags(stretch=c.unallocated_gpu.min_minutes - rate - 1)

        def job(reason: str, promql: str) -> None:
            flags.jobs.append((reason, pool.submit(self._names, promql, JOB)))

        def node(reason: str, promql: str) -> None:
            """`promql` holds for a node in the bucket that ends at each of its points."""
            flags.nodes.append((reason, pool.submit(self._buckets, promql, (L.HOSTNAME,), bucket_s)))

        stretch = flags.stretch
        node(FREE, self._stretch(f"{self._free()} > 0.5", stretch, self._step(max(bucket_s, stretch * 30))))
        node("XID errors", f"max_over_time({self._sel(XID)}[{bucket}]) > 0")
        node("GPUs down", f"max_over_time({self._sel(DOWN)}[{bucket}]) > 0")
        node("thermal throttling", f"max_over_time({self._sel(THERMAL)}[{bucket}]) > 0")
        job("idle GPUs", self._stretch(f"{self._sel(JOB_IDLE)} > 0", c.idle_gpu.min_minutes - rate - 1))
        job("holds GPUs without stepping", self._stretch(
            f"(sum by (cluster, namespace, training_job) ({self._sel(JOB_ALLOCATED)}) > 0) "
            f"unless on (cluster, namespace, training_job) ({self._sel(STEPS)} > 0)",
            c.stalled.floor_minutes - rate - 1))
        job("non-finite loss or gradient", f"max_over_time({self._sel(NONFINITE)}[{self._range}])")
        history = f"{int(c.diverging.history_minutes)}m"
        for reason, metric, ratio in (("loss spike", LOSS, c.diverging.loss_ratio),
                                      ("gradient norm spike", GRAD_NORM, c.diverging.grad_ratio)):
            job(reason, f"max_over_time(({self._sel(metric)} / avg_over_time({self._sel(metric)}[{history}] "
                        f"offset {self._step(self._interval_s)}))[{self._range}:{self._step(self._interval_s)}]) "
                        f">= {ratio * m:g}")
        job("data wait", f"max_over_time(({self._sel(DATA_WAIT)} / {self._sel(STEP_SECONDS)})"
                         f"[{self._range}:{self._step(self._interval_s)}]) >= "
                         f"{c.dataloader_starvation.warning_share * m:g}")
        flags.straggle = pool.submit(self._values, f"max_over_time({self._sel(STRAGGLE)}[{self._range}])", JOB)
        flags.spans = pool.submit(self._buckets, f"group by (namespace, training_job) (present_over_time("
                                  f"{self._sel(JOB_ALLOCATED)}[{bucket}]))", (L.NAMESPACE, L.TRAINING_JOB), bucket_s)
        # Only a training loop's telemetry clears a job: serving and notebooks (underused_gpu)
        # and jobs read from their GPUs alone (sawtooth, busier GPU) are looked at per GPU.
        flags.trained = pool.submit(self._names, f"group by (cluster, namespace, training_job) "
                                                 f"(count_over_time({self._sel(STEPS)}[{self._range}]))", JOB)
        return flags

    def _flag(self, out: RollUps, flags: _Flags, bucket_s: float) -> None:
        c, m = self.config, MARGIN
        jobs, nodes = out.flagged_jobs, out.flagged_nodes
        for reason, asked in flags.jobs:
            for key in asked.result():
                jobs.setdefault((key[1], key[2]), set()).add(reason)
        for reason, asked in flags.nodes:
            for (host,), times in asked.result().items():
                nodes.setdefault(host, set()).add(reason)
                out.node_spans.setdefault(host, []).extend((t - bucket_s, t) for t in times)
            if reason == FREE:      # before the other flags add their spans to its nodes'
                self._confirm_free(out, flags.stretch, bucket_s)
        # With two ranks the detector compares with the faster one, the roll-up with their mean:
        # jobs of up to two GPUs (a rank each, as torchrun starts them) meet a lower bar.
        slowdown = c.straggler.slowdown
        for key, ratio in _jobs(flags.straggle.result()).items():
            bar = slowdown if out.gpus.get(key, 0.0) > 2 else 2 * slowdown / (1 + slowdown)
            if ratio >= 1 + (bar - 1) * m:
                jobs.setdefault(key, set()).add("slow rank")
        for job_key, times in flags.spans.result().items():
            out.job_spans[(job_key[0], job_key[1])] = (min(times) - bucket_s, max(times))
        training = {(k[1], k[2]) for k in flags.trained.result()}
        floor = c.low_mfu.floor / m
        for key, value in out.mfu.items():
            if value < floor:
                jobs.setdefault(key, set()).add("low MFU")
        for (j, host, _) in out.allocated:
            if j not in training:
                jobs.setdefault(j, set()).add("no trainer telemetry")
        for j in training - {j for (j, _, _) in out.allocated}:
            jobs.setdefault(j, set()).add("telemetry without GPU roll-ups")
        self._coverage(out, bucket_s)

    def _free(self, hosts: set[str] | None = None) -> str:
        """GPUs a node's GPUs were observed for and no job held, at each evaluation (of these
        nodes alone, where given)."""
        def sel(metric: str) -> str:
            chosen = self._sel(metric)
            return chosen if hosts is None else matching(chosen, L.HOSTNAME, "|".join(sorted(map(re.escape, hosts))))
        observed = f"sum by (cluster, Hostname) ({sel(NODE_OBSERVED)})"
        return f"{observed} - (sum by (cluster, Hostname) ({sel(JOB_ALLOCATED)}) or 0 * {observed})"

    def _confirm_free(self, out: RollUps, minutes: float, bucket_s: float) -> None:
        """The free-GPU flag looks for half its stretch at steps of half (cheap over a whole
        fleet, but a gap of half an hour between jobs meets it). The nodes it names are looked
        at again evaluation by evaluation near where it held, and keep the flag only where
        more than half a GPU was free for the whole stretch, and only there."""
        hosts = {host for host, why in out.flagged_nodes.items() if FREE in why}
        if not hosts:
            return
        interval, w = self._interval_s, self._window
        reach = bucket_s + 2 * minutes * 60
        spans = [span for host in hosts for span in out.node_spans[host]]
        a = math.ceil(max(w.start, min(a for a, _ in spans) - reach) / interval) * interval
        b = min(w.end, max(b for _, b in spans) + minutes * 60)
        chunk = (MAX_POINTS - 1) * interval
        held: dict[str, list[np.ndarray]] = {}
        for start in np.arange(a, b, chunk):
            for series in self.source.query_range(f"({self._free(hosts)}) > 0.5", start,
                                                  min(start + chunk - interval, b), interval):
                held.setdefault(series["metric"].get(L.HOSTNAME, ""), []).append(series["values"][:, 0])
        need = max(int(minutes * 60 // interval), 1)
        for host in hosts:
            times = np.unique(np.concatenate(held.get(host, []) + [np.empty(0)]))
            cuts = np.flatnonzero(np.diff(times) > 1.5 * interval)
            firsts, lasts = np.r_[0, cuts + 1], np.r_[cuts, len(times) - 1]
            runs = [(times[i] - interval, times[j]) for i, j in zip(firsts, lasts) if len(times) and j - i + 1 >= need]
            if runs:
                out.node_spans[host] = runs
            else:
                del out.node_spans[host]
                out.flagged_nodes[host].discard(FREE)
                if not out.flagged_nodes[host]:
                    del out.flagged_nodes[host]

    def _coverage(self, out: RollUps, bucket_s: float) -> None:
        """Nodes whose GPUs report in stretches their roll-ups do not cover (dcgm-exporter
        alone, an older agent, a ruler that stopped) are read per GPU there. The ruler counts
        each node's reporting GPUs; where it wrote nothing (rules older than that count,
        before it ran, while it was down) the per-GPU series themselves are looked at."""
        w = self._window
        step = self._step(bucket_s)
        by = (L.HOSTNAME,)
        evaluations = self._buckets(f"max by (Hostname) (count_over_time({self._sel(NODE_OBSERVED)}[{step}]))",
                                    by, bucket_s)
        gpus = {key: set(seen) for key, seen in self._buckets(
            f"count by (Hostname) (present_over_time({self._sel(REPORTING)}[{step}]))", by, bucket_s).items()}
        counted = set().union(*gpus.values())
        grid = self._grid(w, bucket_s)
        present = " or ".join(f"present_over_time({selector(m, **self.source.scope)}[{step}])" for m in GPU_SERIES)
        for run in _runs([t for t in grid if t not in counted], bucket_s):
            for key, seen in self._buckets(f"count by (Hostname, hostname) ({present})", by, bucket_s, run).items():
                gpus.setdefault(key, set()).update(seen)
        # A node's lifetime, to the evaluation: from its first evaluation (its first bucket's
        # end less the evaluations in it) to its last, as the per-GPU path counts from a GPU's
        # first sample to its last.
        for (host,), counts in evaluations.items():
            first, last = min(counts), max(counts)
            span = counts[first] * self._interval_s if first == last else \
                last - first - bucket_s + (counts[first] + counts[last]) * self._interval_s
            out.lifetime_s[host] = min(span, w.end - w.start)
        self._short = self._short_buckets(evaluations, bucket_s)
        rolled = {key: set(counts) for key, counts in evaluations.items()}
        for key, seen in gpus.items():
            uncovered = sorted(seen - rolled.get(key, set()))
            # A bucket at each edge may hold GPU samples before the first evaluation or after the last.
            if len(uncovered) > 2 or key not in rolled:
                out.flagged_nodes.setdefault(key[0], set()).add(BARE)
                # read whole: nothing else accounts for its GPUs where the roll-ups miss them
                out.node_spans.setdefault(key[0], []).append((w.start, w.end))

    def _short_buckets(self, evaluations: dict[tuple[str, ...], dict[float, float]], bucket_s: float) -> list[float]:
        """The ends of buckets inside some node's life (a bucket of it either side) with fewer
        evaluations than the interval fits: where the ruler missed some."""
        fits = math.floor(bucket_s / self._interval_s + 1e-9)
        return sorted({t for counts in evaluations.values() for t, n in counts.items()
                       if n < fits and round(t - bucket_s, 3) in counts and round(t + bucket_s, 3) in counts})

    def _fill(self, out: RollUps, bucket_s: float) -> None:
        """A missed evaluation (an iteration the ruler skipped, a short restart) would lose an
        interval's seconds from every sum: each is filled with the evaluation before it,
        where one came within the 5-minute rate window before and another within it after
        (a series that ended, or a node that stopped reporting, has none after). Only the
        buckets that lack evaluations are queried."""
        every = self._step(self._interval_s)
        for run in _fewest(_runs(self._short, bucket_s), MAX_FILL_QUERIES):
            at, span = run.end, f"{int(round(run.end - run.start + bucket_s))}s"

            def filled(metric: str, by: tuple[str, ...], how: str = "sum") -> dict[tuple[str, ...], float]:
                sel, rate = self._sel(metric), self._step(RATE_WINDOW_S)
                missed = (f"((last_over_time({sel}[{rate}]) unless present_over_time({sel}[{every}])) "
                          f"and present_over_time({sel}[{rate}] offset -{rate}))")
                scale = f" * {self._interval_s:g}" if how == "sum" else ""
                return self._values(f"sum by ({', '.join(by)}) ({how}_over_time({missed}[{span}:{every}])){scale}",
                                    by, at)

            for target, metric in ((out.allocated, JOB_ALLOCATED), (out.idle, JOB_IDLE)):
                for (_, namespace, name, host, model), s in filled(metric, JOB + (L.HOSTNAME, L.MODEL_NAME)).items():
                    key = ((namespace, name), host, model)
                    target[key] = target.get(key, 0.0) + s
            for (_, host, model), s in filled(NODE_OBSERVED, NODE + (L.MODEL_NAME,)).items():
                out.observed[(host, model)] = out.observed.get((host, model), 0.0) + s
            for target, metric in ((out.steps, STEPS), (out.tokens, TOKENS)):
                for job, n in _jobs(filled(metric, JOB)).items():
                    target[job] = target.get(job, 0.0) + n
            for (_, host), n in filled(NODE_OBSERVED, NODE, "count").items():
                out.evaluations[host] = out.evaluations.get(host, 0.0) + n
                out.filled[host] = out.filled.get(host, 0.0) + n

    @staticmethod
    def _grid(w: Window, bucket_s: float) -> list[float]:
        first = math.ceil(w.start / bucket_s) * bucket_s
        last = max(math.ceil(w.end / bucket_s) * bucket_s, first)
        # to the millisecond, as the store's answers name them
        return [round(first + k * bucket_s, 3) for k in range(int(round((last - first) / bucket_s)) + 1)]

    def _buckets(self, promql: str, by: tuple[str, ...], bucket_s: float,
                 within: Window | None = None) -> dict[tuple[str, ...], dict[float, float]]:
        """Per `by` (the node label in either spelling), the ends of the buckets where `promql`
        has a value, and the value."""
        grid = self._grid(within or self._window, bucket_s)
        out: dict[tuple[str, ...], dict[float, float]] = {}
        for series in self.source.query_range(promql, grid[0], grid[-1], bucket_s):
            labels = series["metric"]
            key = tuple(next((labels[n] for n in HOSTNAME_SPELLINGS if labels.get(n)), "") if n == L.HOSTNAME
                        else labels.get(n, "") for n in by)
            if all(k for n, k in zip(by, key) if n == L.HOSTNAME):
                times, values = series["values"].T.tolist()
                out.setdefault(key, {}).update((round(t, 3), v) for t, v in zip(times, values))
        return out

    def telemetry_nodes(self, jobs: set[Job]) -> set[str]:
        """The nodes whose ranks report for jobs the GPU roll-ups do not name."""
        if not jobs:
            return set()
        names = "|".join(sorted(re.escape(j[1]) for j in jobs))
        ranks = matching(selector("burnrate_train_steps_total", **self.source.scope), L.TRAINING_JOB, names)
        promql = f"group by (Hostname) (last_over_time({ranks}[{self._range}:5m]))"
        return {s["metric"].get(L.HOSTNAME, "") for s in self.source.query(promql, self._at)} - {""}


def _runs(times: list[float], bucket_s: float) -> list[Window]:
    """Consecutive bucket ends, as (first end, last end) windows."""
    runs: list[Window] = []
    for t in times:
        if runs and t - runs[-1].end <= bucket_s * 1.5:
            runs[-1] = Window(runs[-1].start, t)
        else:
            runs.append(Window(t, t))
    return runs


def _fewest(runs: list[Window], most: int) -> list[Window]:
    """`runs` joined across their shortest gaps until `most` are left."""
    runs = list(runs)
    while len(runs) > most:
        i = min(range(len(runs) - 1), key=lambda k: runs[k + 1].start - runs[k].end)
        runs[i:i + 2] = [Window(runs[i].start, runs[i + 1].end)]
    return runs


def _jobs(values: dict[tuple[str, ...], float]) -> dict[Job, float]:
    out: dict[Job, float] = {}
    for key, value in values.items():
        out[(key[1], key[2])] = out.get((key[1], key[2]), 0.0) + value
    return out
