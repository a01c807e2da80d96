"""Server-side aggregation: the analyzer's (series × time) grids reduced to what a
page draws. Nothing here sends per-sample data to the browser: time is cut into
at most `MAX_BUCKETS` buckets, so a day of a thousand GPUs is a 1,024 × 300 heatmap.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from burnrate.analyzer.costing.cost import GpuPrices, JobCost
from burnrate.analyzer.detectors import idle_gpu
from burnrate.analyzer.detectors.diverging import non_finite
from burnrate.analyzer.grid.views import RankSteps, Views, build_grid
from burnrate.analyzer.detectors.findings import Finding
from burnrate.analyzer.costing.ledger import Ledger
from burnrate.analyzer.fleet.mode import costed_from_rollups
from burnrate.analyzer.output.report import Report, headline, where
from burnrate.exporter.ledger import BADPUT, PRODUCTIVE

MAX_BUCKETS = 300


def bins_per_bucket(n: int, max_buckets: int = MAX_BUCKETS) -> int:
    return max(1, -(-n // max_buckets))


def bucket_mean(values: np.ndarray, k: int) -> np.ndarray:
    """Mean of the finite values in each run of k time bins; NaN where there are none."""
    values = np.atleast_2d(values)
    s, n = values.shape
    padded = np.full((s, -(-n // k) * k), np.nan, np.float64)
    padded[:, :n] = values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # an all-NaN bucket is NaN, as intended
        return np.nanmean(padded.reshape(s, -1, k), axis=2)


def bucket_sum(values: np.ndarray, k: int) -> np.ndarray:
    values = np.atleast_2d(values)
    s, n = values.shape
    padded = np.zeros((s, -(-n // k) * k), np.float64)
    padded[:, :n] = np.nan_to_num(values)
    return padded.reshape(s, -1, k).sum(axis=2)


def bucket_times(views: Views, k: int) -> np.ndarray:
    """The start of each bucket, as UTC datetimes Plotly puts on a date axis."""
    starts = views.begins(np.arange(0, views.n, k))
    return pd.to_datetime(starts, unit="s").to_numpy()


def _natural(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


@dataclass(frozen=True)
class Fleet:
    times: np.ndarray               # bucket starts
    gpu_labels: list[str]           # heatmap rows, "node/gpu", in node then index order
    util: np.ndarray                # (GPU, bucket) mean utilization %, NaN where no sample
    busy: np.ndarray                # GPUs allocated and working, per bucket
    idle: np.ndarray                # allocated, at or below the idle_gpu finding's threshold
    util_unknown: np.ndarray        # allocated, reporting no utilization (a lost column, an old exporter)
    unallocated: np.ndarray         # reporting, held by no pod
    burn: np.ndarray                # $/h of every reporting GPU, per bucket
    burn_unallocated: np.ndarray    # the part of `burn` nobody holds
    burn_now: float | None          # $/h at the last sample
    window_dollars: float           # the fleet's cost over the window
    unpriced_gpus: int              # GPUs no catalog price covers (left out of the dollars)
    # busy, idle, util_unknown and unallocated GPUs at the last time any GPU reported
    now: dict[str, float] = field(default_factory=dict)
    reporting_now: int = 0          # GPUs reporting at the last sample: the basis of every "now"
    silent: int = 0                 # GPUs seen in the window that no longer report
    silent_since: float | None = None   # when the last of them stopped


def fleet(views: Views, prices: GpuPrices, idle_config: idle_gpu.Config = idle_gpu.Config(),
          max_buckets: int = MAX_BUCKETS) -> Fleet:
    """`idle_config` is the config in effect: a GPU is idle where the idle_gpu finding and the
    accounting call it so."""
    gpu = views.gpu
    k = bins_per_bucket(views.n, max_buckets)
    order = sorted(range(gpu.size), key=lambda i: (_natural(gpu.keys["Hostname"].iloc[i]),
                                                  _natural(gpu.keys["gpu"].iloc[i])))
    labels = [f"{gpu.keys['Hostname'].iloc[i]}/{gpu.keys['gpu'].iloc[i]}" for i in order]
    util = gpu.values.get("gpu_util", np.full((gpu.size, views.n), np.nan))
    reporting = gpu.present
    held = views.held > 0
    allocated = held & reporting
    # NaN compares false both ways: a GPU whose utilization is not known is neither.
    idle = allocated & (util <= idle_config.util_max_pct)
    busy = allocated & (util > idle_config.util_max_pct)
    rate = np.nan_to_num(prices.actual, nan=0.0)[:, None]
    burn = (reporting * rate).sum(axis=0)
    burn_free = ((reporting & ~held) * rate).sum(axis=0)
    # The seconds the samples stand for (analyzer.grid.holding), where the read kept them: at a
    # step coarser than the scrape interval, a GPU seen for part of a step costs that part.
    held_s = gpu.values.get("held_s")
    window_dollars = float((np.nan_to_num(held_s) * rate).sum() / 3600 if held_s is not None
                           else burn.sum() * views.step / 3600)
    any_reporting = reporting.any(axis=0)
    seen = np.nonzero(any_reporting)[0]
    # A GPU that stopped reporting (a node gone, an agent down, a recording that ended
    # for part of the fleet) is not in "now": say how many, or "now" reads as a lost fleet.
    gone = reporting.any(axis=1) & ~reporting[:, seen[-1]] if len(seen) else np.zeros(gpu.size, bool)
    last_seen = [int(np.flatnonzero(row).max()) for row in reporting[gone]]

    def counted(per_gpu: np.ndarray) -> np.ndarray:
        """GPUs per time bin; unknown (NaN), not 0, where no GPU reported at all: a window
        that ends after the last sample (a live "last hour"), a gap in the store."""
        return np.where(any_reporting, per_gpu.sum(axis=0), np.nan)

    counts = {"busy": counted(busy), "idle": counted(idle), "util_unknown": counted(allocated & ~busy & ~idle),
              "unallocated": counted(reporting & ~held)}
    return Fleet(
        times=bucket_times(views, k), gpu_labels=labels,
        util=bucket_mean(util[order], k).astype(np.float32) if gpu.size else np.zeros((0, -(-views.n // k))),
        busy=bucket_mean(counts["busy"], k)[0], idle=bucket_mean(counts["idle"], k)[0],
        util_unknown=bucket_mean(counts["util_unknown"], k)[0], unallocated=bucket_mean(counts["unallocated"], k)[0],
        burn=bucket_mean(np.where(any_reporting, burn, np.nan), k)[0],
        burn_unallocated=bucket_mean(np.where(any_reporting, burn_free, np.nan), k)[0],
        burn_now=float(burn[seen[-1]]) if len(seen) else None,
        now={name: float(values[seen[-1]]) for name, values in counts.items()} if len(seen) else {},
        window_dollars=window_dollars,
        unpriced_gpus=int(np.isnan(prices.actual).sum()),
        reporting_now=int(reporting[:, seen[-1]].sum()) if len(seen) else 0,
        silent=int(gone.sum()), silent_since=float(views.begins(max(last_seen) + 1)) if last_seen else None)


def job_table(report: Report, views: Views) -> pd.DataFrame:
    """One row per job: what the Jobs page lists and sorts."""
    counts: dict[tuple[str, str], int] = {}
    for f in report.findings:
        if f.job is not None:
            counts[f.job] = counts.get(f.job, 0) + 1
    rank = views.rank
    rows_of = views.job_rows(rank)
    rows = []
    for j in report.jobs:
        key = (j.namespace, j.training_job)
        ranks = rows_of.get(key)
        tokens_per_s = None
        wall_h = j.gpu_hours / j.gpus if j.gpus else 0.0
        if ranks is not None and j.tokens:
            active_s = rank.present[ranks].any(axis=0).sum() * views.step
            tokens_per_s = j.tokens / active_s if active_s else None
        elif j.tokens and wall_h:   # costed from roll-ups (fleet mode): no rank series read, its held hours
            tokens_per_s = j.tokens / (wall_h * 3600)
        rows.append({
            "namespace": j.namespace, "training_job": j.training_job, "gpus": j.gpus,
            "capacity_type": j.capacity_type, "gpu_hours": j.gpu_hours, "cost_dollars": j.cost_dollars,
            "dollars_per_hour": j.cost_dollars / wall_h if j.cost_dollars is not None and wall_h else None,
            "mfu": j.mfu, "tokens_per_s": tokens_per_s, "findings": counts.get(key, 0),
            "waste_dollars": sum(j.waste_dollars.values()) if j.waste_dollars else 0.0,
        })
    columns = ["namespace", "training_job", "gpus", "capacity_type", "gpu_hours", "cost_dollars", "dollars_per_hour",
               "mfu", "tokens_per_s", "findings", "waste_dollars"]
    return pd.DataFrame(rows, columns=columns)


def finding_rows(findings: list[Finding]) -> list[dict[str, object]]:
    """The Findings page's table rows: what, where, what it cost, the evidence and the advice."""
    out = []
    for f in findings:
        evidence = f.to_dict()["evidence"]
        out.append({
            "severity": f.severity, "kind": f.kind, "namespace": f.namespace or "",
            "training_job": f.training_job or "", "where": where(f),
            "start": pd.to_datetime(f.start, unit="s").strftime("%Y-%m-%d %H:%M"),
            "hours": round((f.end - f.start) / 3600, 2),
            "wasted_gpu_hours": None if f.wasted_gpu_hours is None else round(f.wasted_gpu_hours, 2),
            "wasted_dollars": None if f.wasted_dollars is None else round(f.wasted_dollars, 2),
            "headline": headline(f),
            "evidence": "; ".join(f"{evidence_label(k)}: {evidence_value(k, v)}" for k, v in evidence.items()),
            "recommendation": f.recommendation,
        })
    return out


# An evidence key's ending says its unit; shares and ratios read as percentages.
_UNITS = (("gpu_hours", " GPU-h"), ("hours", " h"), ("minutes", " min"), ("seconds", " s"),
          ("seconds_per_step", " s"), ("_pct", "%"), ("_mhz", " MHz"), ("_mbps", " MB/s"), ("_mib", " MiB"),
          ("_w", " W"))
_SHARES = ("share", "mfu", "floor", "clock_ratio")
# Unit abbreviations the value's unit says again: "sm clock: 1,380 MHz", not "sm clock mhz: 1,380 MHz".
_UNIT_SUFFIX = re.compile(r"_(pct|mhz|mbps|mib|w)$")


# Keys whose plain reading misleads: an episode's `gpus` are the GPUs' indices on their node
# (analyzer.detectors.episodes), and "gpus: 0" read as no GPU at all.
_LABELS = {"gpus": "GPU index"}


def evidence_label(key: str) -> str:
    return _LABELS.get(key) or _UNIT_SUFFIX.sub("", key).replace("_", " ")


def evidence_value(key: str, value: object) -> str:
    """An evidence value as a person reads it: `data_wait_seconds` 66460.2 is "66,460 s",
    `data_wait_share` 0.7693 is "76.9%", `slowdown` 1.361 is "1.36×"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _plain_value(value)
    if key.endswith(_SHARES):
        return number(value * 100) + "%"
    if key == "slowdown":
        return number(value) + "×"
    unit = next((u for suffix, u in _UNITS if key.endswith(suffix)), "")
    return number(value) + unit


def number(value: float) -> str:
    """Three significant digits, thousands separated, never in exponent notation."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value):
        return f"{int(value):,}"
    digits = min(6, max(0, 2 - math.floor(math.log10(abs(value)))))
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _plain_value(value: object) -> str:
    if isinstance(value, float):
        return number(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_plain_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return ", ".join(_plain_value(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class JobDetail:
    namespace: str
    training_job: str
    times: np.ndarray
    gpu_labels: list[str]
    gpu_series: dict[str, np.ndarray]   # util %, memory MiB, power W, NVLink MB/s: (GPU, bucket)
    mfu: np.ndarray                     # mean over ranks, per bucket; NaN where no rank stepped
    throughput: np.ndarray              # tokens/s (samples/s for jobs that count no tokens)
    throughput_unit: str
    loss: np.ndarray
    grad_norm: np.ndarray
    checkpoints: list[float]            # unix times
    steps: RankSteps
    findings: list[Finding] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)   # from the job's ledger's runs
    # Per bucket, whether a rank reported a loss or gradient norm that was not finite: the model
    # had blown up there, and the ledger's `diverged` holds its steps (diverging.non_finite).
    blown: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def empty(self) -> bool:
        return not self.gpu_labels and not self.steps.ranks


def _held_by(views: Views, alloc_rows: np.ndarray) -> dict[str, np.ndarray]:
    """UUID -> (time,) bool: when the allocations `alloc_rows` (one job's) held that GPU."""
    held: dict[str, np.ndarray] = {}
    uuids = views.alloc.keys["UUID"].to_numpy()
    for row in alloc_rows:
        held[uuids[row]] = held.get(uuids[row], np.zeros(views.n, bool)) | views.alloc.present[row]
    return held


GPU_SERIES = {"util": "gpu_util", "memory": "fb_used_mib", "power": "power_w", "nvlink": "nvlink_bandwidth_mbps"}


def job_detail(views: Views, report: Report, namespace: str, training_job: str,
               max_buckets: int = MAX_BUCKETS) -> JobDetail:
    k = bins_per_bucket(views.n, max_buckets)
    times = bucket_times(views, k)
    job = (namespace, training_job)
    alloc_rows = views.job_rows(views.alloc).get(job, np.zeros(0, np.int64))
    uuids = sorted(set(views.alloc.keys["UUID"].iloc[alloc_rows])) if len(alloc_rows) else []
    gpu_frame = views.frames.gpu
    mine = gpu_frame[gpu_frame["UUID"].isin(uuids)] if uuids else gpu_frame.iloc[:0]
    columns = tuple(c for c in GPU_SERIES.values() if c in mine.columns)
    grid = build_grid(mine, ("UUID",), columns, views.start, views.step, views.n, labels=("Hostname", "gpu"))
    order = sorted(range(grid.size), key=lambda i: (_natural(grid.keys["Hostname"].iloc[i]),
                                                   _natural(grid.keys["gpu"].iloc[i])))
    labels = [f"{grid.keys['Hostname'].iloc[i]}/{grid.keys['gpu'].iloc[i]}" for i in order]
    # Only while this job held the GPU: before and after, another job's work is on it.
    held = _held_by(views, alloc_rows)
    mask = np.array([held[grid.keys["UUID"].iloc[i]] for i in order]).reshape(len(order), views.n)
    series = {name: bucket_mean(np.where(mask, grid.values[col][order], np.nan), k) for name, col in GPU_SERIES.items()
              if col in grid.values and grid.size}

    rank = views.rank
    rows = views.job_rows(rank).get(job, np.zeros(0, np.int64))
    nb = -(-views.n // k)
    nothing = np.full(nb, np.nan)

    def stepping(name: str) -> np.ndarray:
        """Each rank's `name` where it made a step: the agent keeps a rank's last MFU while it
        steps no more (a restart, a hang), which is no rate of anything then."""
        values = rank.values[name][rows]
        return np.where(rank.values["steps"][rows] > 0, values, np.nan) if "steps" in rank.values else values

    def over_ranks(name: str) -> np.ndarray:
        if not len(rows) or name not in rank.values:
            return nothing
        return bucket_mean(stepping(name), k).mean(axis=0)

    def rate(name: str) -> np.ndarray:
        # NaN, not 0, where no rank counted: outside the job's life (and at its first sample,
        # which has no increment yet) there is no rate to draw.
        values = rank.values[name][rows]
        counted = bucket_sum(np.isfinite(values), k).sum(axis=0) > 0
        return np.where(counted, bucket_sum(values, k).sum(axis=0) / (k * views.step), np.nan)

    unit, throughput = "tokens/s", nothing
    if len(rows) and "tokens" in rank.values and np.nansum(rank.values["tokens"][rows]) > 0:
        throughput = rate("tokens")
    elif len(rows) and "samples" in rank.values:
        unit, throughput = "samples/s", rate("samples")
    first = rows[np.argsort(rank.keys["rank_no"].to_numpy()[rows], kind="stable")][:1] if len(rows) else rows

    def first_rank(name: str) -> np.ndarray:
        return bucket_mean(rank.values[name][first], k)[0] if len(first) and name in rank.values else nothing

    checkpoints: list[float] = []
    if len(rows) and "last_checkpoint_time" in views.frames.rank.columns:
        f = views.frames.rank
        saved = f.loc[(f["namespace"] == namespace) & (f["training_job"] == training_job), "last_checkpoint_time"]
        saved = np.unique(saved.to_numpy()[np.isfinite(saved.to_numpy())])
        checkpoints = [float(t) for t in saved if views.start <= t <= views.frames.window.end]
    blown = (bucket_sum(non_finite(views, rows).astype(np.float64), k).sum(axis=0) > 0 if len(rows)
             else np.zeros(nb, dtype=bool))
    return JobDetail(namespace, training_job, times, labels, series, over_ranks("mfu"), throughput, unit,
                     first_rank("loss"), first_rank("grad_norm"), checkpoints, views.rank_steps(rows),
                     [f for f in report.findings if f.job == job],
                     restarts(next((j.ledger for j in report.jobs if (j.namespace, j.training_job) == job), None)),
                     blown)


@dataclass(frozen=True)
class CostSummary:
    by_namespace: pd.DataFrame      # namespace, capacity_type, cost_dollars
    by_job: pd.DataFrame            # namespace, training_job, job ("ns/name"), cost_dollars,
                                    # on_demand_cost_dollars, cost_per_billion_tokens, tokens, gpu_hours
    waste_by_cause: pd.Series       # kind -> dollars
    spot_dollars: float
    spot_on_demand_dollars: float   # what the spot hours would have cost on-demand
    total_dollars: float
    unpriced_jobs: int

    @property
    def spot_saved(self) -> float:
        return self.spot_on_demand_dollars - self.spot_dollars


def cost_summary(report: Report) -> CostSummary:
    jobs = pd.DataFrame([{
        "namespace": j.namespace, "training_job": j.training_job, "job": f"{j.namespace}/{j.training_job}",
        "capacity_type": j.capacity_type, "cost_dollars": j.cost_dollars,
        "on_demand_cost_dollars": j.on_demand_cost_dollars, "cost_per_billion_tokens": j.cost_per_billion_tokens,
        "tokens": j.tokens, "gpu_hours": j.gpu_hours}
        for j in report.jobs],
        columns=["namespace", "training_job", "job", "capacity_type", "cost_dollars", "on_demand_cost_dollars",
                 "cost_per_billion_tokens", "tokens", "gpu_hours"])
    priced = jobs.dropna(subset=["cost_dollars"])
    by_ns = (priced.groupby(["namespace", "capacity_type"], as_index=False)["cost_dollars"].sum()
             .sort_values("cost_dollars", ascending=False))
    spot = priced[priced["capacity_type"] == "spot"].dropna(subset=["on_demand_cost_dollars"])
    waste: dict[str, float] = {}
    for f in report.findings:
        if f.wasted_dollars:
            waste[f.kind] = waste.get(f.kind, 0.0) + f.wasted_dollars
    return CostSummary(
        by_namespace=by_ns.reset_index(drop=True),
        by_job=priced.sort_values("cost_dollars", ascending=False).reset_index(drop=True),
        waste_by_cause=pd.Series(waste, dtype=float).sort_values(ascending=False),
        spot_dollars=float(spot["cost_dollars"].sum()),
        spot_on_demand_dollars=float(spot["on_demand_cost_dollars"].sum()),
        total_dollars=float(priced["cost_dollars"].sum()),
        unpriced_jobs=int(jobs["cost_dollars"].isna().sum()))


# --- the ledger: where each GPU-hour a training job held went ------------------------------
@dataclass(frozen=True)
class Restart:
    """The gap between one run's last step (its start, if it never stepped) and the next
    run's process start; `resumed_from` is the step the next run said it resumed from."""
    start: float                # unix seconds
    end: float
    resumed_from: int | None

    @property
    def label(self) -> str:
        if self.resumed_from is None:
            return "restart, resume step not reported"
        return f"restart, resumed from step {self.resumed_from:,}"


def restarts(ledger: Ledger | None) -> list[Restart]:
    """A marker per restart of a job, from its ledger's runs."""
    out = []
    runs = ledger.runs if ledger is not None else []
    for before, after in zip(runs, runs[1:]):
        start = before.last_step if before.last_step is not None else before.process_start
        if start is None or after.process_start is None:
            continue
        out.append(Restart(float(start), float(max(after.process_start, start)), after.resumed_from))
    return out


def unmeasured(job: JobCost) -> list[tuple[str, str]]:
    """The ledger's categories that cannot be measured for `job`, each with why."""
    if job.ledger is None:
        return []
    return [(name, job.ledger_basis.get(name) or job.ledger.basis.get(name, "not measured"))
            for name, hours in job.ledger.gpu_hours.items() if hours is None]


def caveats(job: JobCost) -> list[tuple[str, str]]:
    """The ledger's measured categories that come with a word on what they leave out (start-up
    no one held, where GPUs are attributed without a kubelet)."""
    if job.ledger is None:
        return []
    basis = {**job.ledger.basis, **job.ledger_basis}
    return [(name, basis[name]) for name, hours in job.ledger.gpu_hours.items() if hours is not None and name in basis]


def _priced(jobs: list[JobCost]) -> bool:
    return all(j.cost_dollars is not None for j in jobs)


def from_rollups(report: Report) -> list[JobCost]:
    """The jobs fleet mode costed from roll-ups (analyzer.fleet.mode): no ledger, no rank series read."""
    return [j for j in report.jobs if costed_from_rollups(j)]


def namespace_goodput(report: Report) -> pd.DataFrame:
    """One row per namespace with a training job's ledger: its jobs, their GPU-hours, the
    GPU-hours-weighted goodput (productive over held), and the badput per cause in GPU-hours
    (`<cause>_gpu_hours`) and dollars (`<cause>_dollars`, None where a job is unpriced)."""
    by_ns: dict[str, list[JobCost]] = {}
    for j in report.jobs:
        if j.ledger is not None and j.gpu_hours > 0:
            by_ns.setdefault(j.namespace, []).append(j)
    rows = []
    for namespace, jobs in by_ns.items():
        held = sum(j.gpu_hours for j in jobs)
        productive = sum(j.ledger.gpu_hours.get(PRODUCTIVE) or 0.0 for j in jobs)
        row: dict[str, object] = {"namespace": namespace, "jobs": len(jobs), "gpu_hours": held,
                                  "goodput": productive / held if held else None,
                                  "priced": _priced(jobs)}
        for cause in BADPUT:
            hours = [j.ledger.gpu_hours.get(cause) or 0.0 for j in jobs]
            row[f"{cause}_gpu_hours"] = sum(hours)
            row[f"{cause}_dollars"] = (sum(j.ledger_dollars(h) for j, h in zip(jobs, hours))
                                       if row["priced"] else None)
        rows.append(row)
    columns = ["namespace", "jobs", "gpu_hours", "goodput", "priced"] + \
        [f"{c}_{unit}" for c in BADPUT for unit in ("gpu_hours", "dollars")]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("gpu_hours", ascending=False, kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class BadputTimeline:
    """The fleet's badput by cause over time, summed over the training jobs' ledgers."""
    times: np.ndarray                   # bucket starts
    hours: np.ndarray                   # each bucket's length in hours (the last may be short)
    rate: dict[str, np.ndarray]         # cause -> $ per hour (or GPU-hours per hour), per bucket
    dollars: bool                       # whether `rate` is $/h; GPU-hours per hour where a job is unpriced
    jobs: int                           # the jobs with a ledger it sums

    def total(self, cause: str) -> float:
        """The cause's $ (or GPU-hours) over the window: the area under its band."""
        return float((self.rate[cause] * self.hours).sum())


def badput_timeline(report: Report, views: Views, max_buckets: int = MAX_BUCKETS) -> BadputTimeline:
    k = bins_per_bucket(views.n, max_buckets)
    jobs = [j for j in report.jobs if j.ledger is not None and j.ledger.timeline]
    dollars = _priced(jobs)
    nb = -(-views.n // k)
    hours = np.minimum(k, views.n - np.arange(nb) * k) * views.step / 3600
    rate = {}
    for cause in BADPUT:
        total = np.zeros(nb)
        for j in jobs:
            if cause not in j.ledger.timeline:
                continue
            seconds = j.ledger.binned(cause, float(views.time(0) - views.lag), views.step, views.n)
            # GPU-seconds per bucket; at the job's own rate when every job has one
            scale = (j.ledger_dollars(1.0) if dollars else 1.0) / 3600
            total += bucket_sum(seconds, k)[0] * scale
        rate[cause] = total / hours
    return BadputTimeline(bucket_times(views, k), hours, rate, dollars, len(jobs))
