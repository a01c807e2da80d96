"""Fleet mode: the store's roll-ups for the whole fleet, per-GPU series only where a
roll-up flags something.

1. The roll-ups (analyzer.sources.rollups) give every job's and node's GPU-seconds and
   the flags: the jobs and nodes where some detector could fire.
2. The nodes to read per GPU are the flagged ones, those of flagged jobs, and those with
   GPUs the roll-ups do not cover; then every node of any job on them, until no job is
   split between the two sides. Those nodes are analysed exactly as the per-GPU path does.
3. Every other job (one with trainer telemetry that no flag names) and node is costed
   from its roll-ups at its node's price; it has no finding, by the flags' construction.

The report says which nodes were read which way and why.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from burnrate.exporter.labels import SIMULATED

from .accounting import Accounting
from .cost import AdviceConfig, JobCost, capacity_advice, checkpoint_advice, node_price
from .detectors import DetectorConfig
from .findings import KINDS
from .frames import Window
from .pricing import Catalog
from .report import Report, analyze
from .sources.common import NODE_PRICING_LABELS, TRAINING_TELEMETRY, Progress, missing_signals, within
from .sources.prometheus import PrometheusSource, dcgm_only
from .sources.rollups import RATE_WINDOW_S, RollUpReader, RollUps
from .views import ANALYSIS_COLUMNS
from .workloads import TRAINING

Job = tuple[str, str]


def drill_nodes(rollups: RollUps, extra: set[str] = frozenset()) -> set[str]:
    """The nodes to read per GPU: flagged, holding a flagged job, or named in `extra`;
    closed so that each job is read whole or not at all."""
    nodes = set(rollups.flagged_nodes) | set(extra)
    for job in rollups.flagged_jobs:
        nodes |= rollups.nodes_of(job)
    while True:
        more = set().union(*(rollups.nodes_of(job) for job in rollups.jobs_on(nodes))) - nodes
        if not more:
            return nodes
        nodes |= more


def analyze_fleet(source: PrometheusSource, window: Window, catalog: Catalog,
                  config: DetectorConfig = DetectorConfig(), advice: AdviceConfig = AdviceConfig(),
                  class_overrides: Mapping[str, str] | None = None, interval_s: float | None = None,
                  progress: Progress | None = None) -> Report:
    window = within(window, source.data_range(window), source.min_step_s)
    reader = RollUpReader(source, config, interval_s)
    interval, _ = reader.interval()
    # Coverage is checked per bucket: at least the roll-ups' 5-minute window, at most 500 a window.
    bucket = max(source.step_for(window), RATE_WINDOW_S, 5 * interval, (window.end - window.start) / 500)
    rollups = reader.read(window, bucket)
    overridden = set(class_overrides or ())
    for job, _, _ in rollups.allocated:
        if job[0] in overridden:
            rollups.flagged_jobs.setdefault(job, set()).add("workload class set for its namespace")
    unplaced = {job for job, why in rollups.flagged_jobs.items() if "telemetry without GPU roll-ups" in why}
    drilled = drill_nodes(rollups, reader.telemetry_nodes(unplaced))
    frames = source.on_hosts(drilled).frames(window, ANALYSIS_COLUMNS, progress)
    report = analyze(frames, catalog, config, advice, class_overrides)
    read = {(j.namespace, j.training_job) for j in report.jobs} | rollups.jobs_on(drilled)
    cleared = sorted({job for job, _, _ in rollups.allocated} - read - set(rollups.flagged_jobs))
    cleared_nodes = sorted(rollups.hosts - drilled)
    prices = {host: _price(rollups, catalog, host, frames.gpu_hour_prices.get(host)) for host in
              rollups.hosts | {h for _, h, _ in rollups.allocated}}
    jobs = [_job_cost(rollups, job, prices, advice) for job in cleared]
    unpriced = [{"namespace": j.namespace, "training_job": j.training_job,
                 "reason": "; ".join(f"{h}: {why}" for h in sorted(rollups.nodes_of((j.namespace, j.training_job)))
                                     if (why := _why_unpriced(rollups, catalog, h, prices)))}
                for j in jobs if j.cost_dollars is None]
    accounting = _accounting(report.accounting, rollups, cleared_nodes, prices)
    everyone = rollups.hosts | drilled
    missing = list(missing_signals(frames.gpu, frames.rank, frames.node, dcgm_only(frames.gpu), len(everyone))
                   if len(frames.gpu) else report.missing)
    if cleared:
        missing = [m for m in missing if m != TRAINING_TELEMETRY]
    if rollups.node_info:
        missing = [m for m in missing if m != NODE_PRICING_LABELS]
    notes = [_basis(rollups, drilled, everyone)] + report.notes
    unpriced_hosts = sorted(h for h in cleared_nodes if _why_unpriced(rollups, catalog, h, prices))
    if unpriced_hosts:
        notes.append(f"no price for nodes {', '.join(unpriced_hosts[:5])}{' …' if len(unpriced_hosts) > 5 else ''}"
                     " (read from roll-ups): their dollars are null (add them to a --pricing file)")
    if jobs:
        notes.append(f"{len(jobs)} jobs costed from roll-ups: their checkpoint interval is the mean between "
                     "checkpoints seen each minute (per GPU, the median of every one)")
    simulated = report.simulated or any(SIMULATED in model for _, model in rollups.observed)
    return replace(report, jobs=sorted(report.jobs + jobs, key=lambda j: (j.namespace, j.training_job)),
                   missing=tuple(missing), notes=notes, accounting=accounting,
                   unpriced_jobs=report.unpriced_jobs + unpriced, simulated=simulated)


def _basis(rollups: RollUps, drilled: set[str], everyone: set[str]) -> str:
    reasons: dict[str, int] = {}
    for why in list(rollups.flagged_nodes.values()) + list(rollups.flagged_jobs.values()):
        for reason in why:
            reasons[reason] = reasons.get(reason, 0) + 1
    named = ", ".join(f"{reason} ({n})" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
    return (f"fleet mode: {len(drilled)} of {len(everyone)} nodes read per GPU"
            + (f" for {named}" if named else "") + f"; the rest from roll-ups evaluated every "
            f"{rollups.interval_s:g} s ({rollups.interval_basis})")


def _price(rollups: RollUps, catalog: Catalog, host: str, observed: float | None) -> tuple:
    info = rollups.node_info.get(host, {})
    models = sorted({model for h, model in rollups.observed if h == host}
                    | {model for _, h, model in rollups.allocated if h == host})
    return node_price(catalog, host, models[0] if models else "", info.get("instance_type", ""),
                      info.get("capacity_type", "") or "unknown", info.get("gpu_model", ""), observed)


def _why_unpriced(rollups: RollUps, catalog: Catalog, host: str, prices: dict[str, tuple]) -> str | None:
    if prices[host][0] == prices[host][0]:      # not NaN
        return None
    info = rollups.node_info.get(host, {})
    models = sorted({model for h, model in rollups.observed if h == host}) or [info.get("gpu_model", "")]
    return catalog.why_unpriced(host, info.get("instance_type", ""), models[0] or info.get("gpu_model", ""))


def _job_cost(rollups: RollUps, job: Job, prices: dict[str, tuple], advice: AdviceConfig) -> JobCost:
    held = {}
    for (j, host, _), seconds in rollups.allocated.items():
        if j == job:
            held[host] = held.get(host, 0.0) + seconds
    hours = sum(held.values()) / 3600

    def dollars(column: int) -> float | None:
        used = [(s / 3600, prices[h][column]) for h, s in held.items() if s > 0]
        return None if any(rate != rate for _, rate in used) else sum(h * rate for h, rate in used)

    cost, on_demand = dollars(0), dollars(1)
    caps = {str(prices[h][3]) for h, s in held.items() if s > 0}
    steps, tokens = rollups.steps.get(job), rollups.tokens.get(job) or None
    gpus = round(rollups.gpus.get(job, 0.0), 4)
    waste = {kind: 0.0 for kind in KINDS if kind != "unallocated_gpu"}
    return JobCost(
        namespace=job[0], training_job=job[1], gpus=gpus, gpu_hours=hours,
        capacity_type=next(iter(caps)) if len(caps) == 1 else ("mixed" if caps else "unknown"),
        cost_dollars=cost, on_demand_cost_dollars=on_demand, steps=steps, tokens=tokens,
        cost_per_step=cost / steps if cost is not None and steps else None,
        cost_per_billion_tokens=cost / (tokens / 1e9) if cost is not None and tokens else None,
        mfu=rollups.mfu.get(job), waste_dollars=waste,
        advice=_advice(rollups, job, gpus, {h: s for h, s in held.items() if s > 0}, prices, caps, advice),
        workload_class=TRAINING, class_basis="trainer telemetry")


def _advice(rollups: RollUps, job: Job, gpus: float, held: dict[str, float], prices: dict[str, tuple],
            caps: set[str], config: AdviceConfig) -> dict[str, object]:
    """As the per-GPU path advises (analyzer.cost), from the job's roll-ups: its hours are its
    GPU-hours over its GPUs (a roll-up over 5 minutes runs on past the job's end), and prices
    are averaged over its nodes by the GPU-time it spent on each."""
    out = checkpoint_advice(gpus, len(held), rollups.checkpoint_interval_s.get(job), config)
    total = sum(held.values())
    hours = total / 3600 / gpus if gpus > 0 else 0.0
    if not held or hours <= 0:
        return out

    def mean(column: int) -> float | None:
        rates = [(s, prices[h][column]) for h, s in held.items()]
        return None if any(r != r for _, r in rates) else sum(s * r for s, r in rates) / total

    return capacity_advice(out, hours, gpus, len(held), mean(1), mean(2), caps, TRAINING, config)


def _accounting(drilled: Accounting | None, rollups: RollUps, hosts: list[str],
                prices: dict[str, tuple]) -> Accounting | None:
    per_node = dict(drilled.per_node) if drilled else {}
    observed = allocated = idle = life = 0.0
    for host in hosts:
        o = sum(s for (h, _), s in rollups.observed.items() if h == host)
        a = sum(s for (_, h, _), s in rollups.allocated.items() if h == host)
        i = sum(s for (_, h, _), s in rollups.idle.items() if h == host)
        lifetime = rollups.lifetime_s.get(host, 0.0)
        coverage = min(rollups.evaluations.get(host, 0.0) * rollups.interval_s / lifetime, 1.0) if lifetime else None
        rate = prices[host]
        per_node[host] = {"observed_gpu_hours": o / 3600, "allocated_gpu_hours": a / 3600,
                          "unallocated_gpu_hours": (o - a) / 3600, "busy_gpu_hours": (a - i) / 3600,
                          "idle_gpu_hours": i / 3600, "coverage": coverage,
                          "gpu_hour_dollars": None if rate[0] != rate[0] else float(rate[0]),
                          "price_basis": rate[4] or None}
        observed, allocated, idle = observed + o, allocated + a, idle + i
        life += o / coverage if coverage else 0.0
    if drilled is None:
        return None
    drilled_life = drilled.observed_gpu_hours / drilled.coverage if drilled.coverage else 0.0
    total_observed = drilled.observed_gpu_hours + observed / 3600
    total_life = drilled_life + life / 3600
    return replace(drilled, observed_gpu_hours=total_observed,
                   allocated_gpu_hours=drilled.allocated_gpu_hours + allocated / 3600,
                   unallocated_gpu_hours=drilled.unallocated_gpu_hours + (observed - allocated) / 3600,
                   busy_gpu_hours=drilled.busy_gpu_hours + (allocated - idle) / 3600,
                   idle_gpu_hours=drilled.idle_gpu_hours + idle / 3600,
                   coverage=min(total_observed / total_life, 1.0) if total_life > 0 else drilled.coverage,
                   per_node=per_node)
