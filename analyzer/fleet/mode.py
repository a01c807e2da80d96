"""Fleet mode: the store's roll-ups for the whole fleet, per-GPU series only where a
roll-up flags something.

1. The roll-ups (analyzer.fleet.rollups) give every job's and node's GPU-seconds and
   the flags: the jobs and nodes where some detector could fire.
2. The nodes to read per GPU, and over which part of the window: a flagged node around
   where its flags held, the nodes of a flagged job over that job's whole life, and nodes
   with GPUs the roll-ups miss over all of it. What is read is analysed as the per-GPU
   path does, in groups that no detector relates, each over its own stretch
   (analyzer.fleet.partition).
3. Every other job (one with trainer telemetry that no flag names) is costed from its
   roll-ups at its node's price; it has no finding of its own, by the flags' construction,
   even where part of its life was read beside a flagged node (whose findings it keeps, and
   whose queries and analysis leave that job's ranks out).
   Nodes read over part of the window are accounted from their roll-ups, as are the rest.

The report says which nodes were read which way and why.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

import numpy as np
import pandas as pd

from burnrate.exporter import labels as L

from ..detectors import episodes
from ..costing.accounting import Accounting, covered, lifetime, node_figures, node_lifetime
from ..costing.cost import (AdviceConfig, JobCost, NodePrice, advice_basis, capacity_advice,
                            checkpoint_advice, node_price, sum_known)
from ..detectors import DetectorConfig
from ..detectors.findings import KINDS
from ..grid.frames import Frames, Window
from ..costing.pricing import Catalog
from .partition import analyze_apart
from ..output.report import Report, report_notes
from ..grid.series import labelled, series_codes, text
from ..sources.common import NODE_PRICING_LABELS, TRAINING_TELEMETRY, Progress, missing_signals, within
from ..sources.prometheus import PrometheusSource
from ..sources.promtables import dcgm_only
from .rollups import BARE, RATE_WINDOW_S, RollUpReader, RollUps
from ..grid.views import ANALYSIS_COLUMNS, job_name
from ..grid.workloads import TRAINING

Job = tuple[str, str]
# How a job costed from roll-ups says so (JobCost.cost_basis), followed by their interval.
ROLLUP_COST = "roll-ups every"
# Findings about a node or its GPUs rather than a job's own run (episodes tells them by what
# names one problem of each kind): kept wherever the node is read.
NODE_KINDS = frozenset(kind for kind, key in episodes.KEYS.items() if key[:len(episodes.JOB)] != episodes.JOB)


def drill_plan(rollups: RollUps, window: Window, context_s: float,
               extra: set[str] = frozenset()) -> dict[str, list[Window]]:
    """Each node to read per GPU and the parts of the window to read it over: where its flags
    held with `context_s` either side (all of it for a node whose GPUs the roll-ups miss, and
    for `extra` nodes), and the nodes of each flagged job over its whole life. Spans are known
    to a roll-up bucket, so each reaches a bucket further; parts that meet are one."""
    spans: dict[str, list[tuple[float, float]]] = {}
    bucket = rollups.bucket_s

    def grow(host: str, a: float, b: float) -> None:
        spans.setdefault(host, []).append((max(a, window.start), min(b, window.end)))

    for host in rollups.flagged_nodes:
        for a, b in rollups.node_spans.get(host) or [(window.start, window.end)]:
            grow(host, a - bucket - context_s, b + bucket + context_s)
    for host in extra:
        grow(host, window.start, window.end)
    for job in rollups.flagged_jobs:
        for host in rollups.nodes_of(job):
            grow(host, *life(rollups, job, window))
    plan: dict[str, list[Window]] = {}
    for host, parts in spans.items():
        merged: list[Window] = []
        for a, b in sorted(parts):
            if merged and a <= merged[-1].end + bucket:
                merged[-1] = Window(merged[-1].start, max(merged[-1].end, b))
            else:
                merged.append(Window(a, b))
        plan[host] = merged
    return plan


def life(rollups: RollUps, job: Job, window: Window) -> tuple[float, float]:
    """A job's life in the window, from its allocation roll-ups, a bucket wider either side."""
    a, b = rollups.job_spans.get(job, (window.start, window.end))
    return max(a - rollups.bucket_s, window.start), min(b + rollups.bucket_s, window.end)


def read_whole(rollups: RollUps, plan: dict[str, list[Window]], window: Window) -> set[Job]:
    """The jobs the roll-ups know that the plan reads on all their nodes over all their life."""
    whole = set()
    for job in rollups.jobs_on(set(plan)):
        a, b = life(rollups, job, window)
        if all(any(p.start <= a and p.end >= b for p in plan.get(h, ())) for h in rollups.nodes_of(job)):
            whole.add(job)
    return whole


def bucket_for(source: PrometheusSource, window: Window, interval_s: float) -> int:
    """The stretch the roll-ups' coverage is checked by: at least their 5-minute window, at
    most 500 a window."""
    return math.ceil(max(source.step_for(window), RATE_WINDOW_S, 5 * interval_s, (window.end - window.start) / 500))


def analyze_fleet(source: PrometheusSource, window: Window, catalog: Catalog,
                  config: DetectorConfig = DetectorConfig(), advice: AdviceConfig = AdviceConfig(),
                  class_overrides: Mapping[str, str] | None = None, interval_s: float | None = None,
                  progress: Progress | None = None) -> Report:
    reader = RollUpReader(source, config, interval_s)
    window = within(window, source.data_range(window, reader.reported(window)), source.min_step_s)
    rollups = reader.read(window, bucket_for(source, window, reader.interval[0]))
    overridden = set(class_overrides or ())
    for job, _, _ in rollups.allocated:
        if job[0] in overridden:
            rollups.flagged_jobs.setdefault(job, set()).add("workload class set for its namespace")
    unplaced = {job for job, why in rollups.flagged_jobs.items() if "telemetry without GPU roll-ups" in why}
    context_s = 60 * (config.unallocated_gpu.min_minutes + config.episodes.gap_minutes)
    extra = reader.telemetry_nodes(unplaced)
    known = {job for job, _, _ in rollups.allocated}

    def read() -> tuple[dict[str, list[Window]], Frames, set[Job], Report]:
        plan = drill_plan(rollups, window, context_s, extra)
        parts: dict[Window, list[str]] = {}
        for host, windows in plan.items():
            for part in windows:
                parts.setdefault(part, []).append(host)
        whole = read_whole(rollups, plan, window)
        partly = known - whole
        # Their ranks are left out by the store where it can tell them, and here exactly.
        unread = {job: rollups.nodes_of(job) for job in partly & rollups.jobs_on(set(plan))}
        frames = source.frames(window, ANALYSIS_COLUMNS, progress, reads=parts, unread_jobs=unread)
        return plan, frames, whole, analyze_apart(_without_ranks_of(frames, partly), plan, catalog, config, advice,
                                                  class_overrides, unjoined=partly)

    plan, frames, whole, report = read()
    # A job that also held GPUs on a node the roll-ups miss (dcgm-exporter alone, an older
    # agent) is in them only in part; seen there, it is read on all its nodes over its life,
    # as a flagged job is (a second read, only where such a job exists).
    bare = {host for host, why in rollups.flagged_nodes.items() if BARE in why}
    beside = _jobs_on(frames, bare) & known - whole
    if beside:
        for job in beside:
            rollups.flagged_jobs.setdefault(job, set()).add("also on nodes without roll-ups")
        plan, frames, whole, report = read()
    drilled = set(plan)
    # A job read over part of its life (beside a flagged node) is named by no flag, so it has
    # no finding of its own: what its part shows gives way to its roll-ups, and only the
    # findings of its node stay.
    partly_read = {(j.namespace, j.training_job) for j in report.jobs} & known - whole
    findings = [f for f in report.findings if f.kind in NODE_KINDS or f.job not in partly_read]
    per_gpu = [j for j in report.jobs if (j.namespace, j.training_job) not in partly_read]
    cleared = sorted(known - {(j.namespace, j.training_job) for j in per_gpu} - set(rollups.flagged_jobs))
    # A node read over part of the window is accounted from its roll-ups, like one not read at all.
    partly = {h for h, windows in plan.items() if windows != [window]}
    cleared_nodes = sorted(rollups.hosts - drilled | partly)
    prices = {host: _price(rollups, catalog, host, frames.gpu_hour_prices.get(host)) for host in
              rollups.hosts | {h for _, h, _ in rollups.allocated}}
    waste: dict[Job, dict[str, float]] = {}
    for f in findings:
        if f.job in partly_read and f.wasted_dollars is not None:
            waste.setdefault(f.job, {})[f.kind] = waste.get(f.job, {}).get(f.kind, 0.0) + f.wasted_dollars
    jobs = [_job_cost(rollups, job, prices, advice, waste.get(job, {})) for job in cleared]
    unpriced = [{"namespace": j.namespace, "training_job": j.training_job,
                 "reason": "; ".join(f"{h}: {why}" for h in sorted(rollups.nodes_of((j.namespace, j.training_job)))
                                     if (why := _why_unpriced(rollups, catalog, h, prices)))}
                for j in jobs if j.cost_dollars is None]
    accounting = _accounting(report.accounting, rollups, cleared_nodes, prices, partly)
    everyone = rollups.hosts | drilled
    missing = list(missing_signals(frames.gpu, frames.rank, frames.node, dcgm_only(frames.gpu), len(everyone))
                   if len(frames.gpu) else report.missing)
    if cleared:
        missing = [m for m in missing if m != TRAINING_TELEMETRY]
    if rollups.node_info:
        missing = [m for m in missing if m != NODE_PRICING_LABELS]
    # Coverage is said of the whole fleet's accounting, not of the nodes read per GPU alone.
    notes = [_basis(rollups, plan, everyone, window)] + rollups.notes + report_notes(report.unpriced_nodes, accounting,
                                                                                  report.dropped_mfu)
    if rollups.filled:
        notes.append(f"the ruler missed {sum(rollups.filled.values()):.0f} evaluations of the roll-ups on "
                     f"{len(rollups.filled)} nodes: each was filled with the evaluation before it")
    unpriced_hosts = sorted(h for h in cleared_nodes if _why_unpriced(rollups, catalog, h, prices))
    if unpriced_hosts:
        notes.append(f"no price for nodes {', '.join(unpriced_hosts[:5])}{' …' if len(unpriced_hosts) > 5 else ''}"
                     " (read from roll-ups): their dollars are null (add them to a --pricing file)")
    if jobs:
        notes.append(f"{len(jobs)} jobs costed from roll-ups: their checkpoint interval is the mean between "
                     "checkpoints seen each minute (per GPU, the median of every one)")
    simulated = report.simulated or any(L.SIMULATED in model for _, model in rollups.observed)
    return replace(report, jobs=sorted(per_gpu + jobs, key=lambda j: (j.namespace, j.training_job)),
                   findings=findings, missing=tuple(missing), notes=notes, accounting=accounting,
                   unpriced_jobs=[u for u in report.unpriced_jobs if (u["namespace"], u["training_job"]) not in partly_read]
                   + unpriced, simulated=simulated)


def costed_from_rollups(job: JobCost) -> bool:
    """Whether fleet mode costed the job from its roll-ups: no ledger, no rank series read."""
    return job.cost_basis.startswith(ROLLUP_COST)


def _without_ranks_of(frames: Frames, jobs: set[Job]) -> Frames:
    """The frames less these jobs' ranks. A job read over part of its life is costed from its
    roll-ups and keeps no finding of its own (analyze_fleet); the findings it keeps, its
    nodes', come from the GPUs alone. Its ranks would only widen the analysis's grids: the
    nodes of a week's flagged jobs ran twice as many other jobs' ranks as their own."""
    rank = frames.rank
    if not jobs or not len(rank):
        return frames
    # Per distinct holder, not per row: a week's ranks are half a million rows of a few thousand.
    holder, keys = series_codes(rank, (L.NAMESPACE, L.TRAINING_JOB, L.POD))
    names = job_name(keys[L.TRAINING_JOB], keys[L.POD])
    held = pd.MultiIndex.from_arrays([keys[L.NAMESPACE], names]).isin(list(jobs))[holder]
    return replace(frames, rank=rank[~held]) if held.any() else frames


def _jobs_on(frames: Frames, hosts: set[str]) -> set[Job]:
    """The jobs the frames show holding GPUs on these nodes."""
    alloc = frames.alloc
    if not hosts or not len(alloc):
        return set()
    held = alloc[labelled(alloc[L.HOSTNAME], hosts) & ~labelled(alloc[L.TRAINING_JOB], ("",))]
    return set(zip(text(held[L.NAMESPACE]), text(held[L.TRAINING_JOB])))


def _basis(rollups: RollUps, plan: dict[str, list[Window]], everyone: set[str], window: Window) -> str:
    reasons: dict[str, int] = {}
    for why in list(rollups.flagged_nodes.values()) + list(rollups.flagged_jobs.values()):
        for reason in why:
            reasons[reason] = reasons.get(reason, 0) + 1
    named = ", ".join(f"{reason} ({n})" for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    read = (sum(p.end - p.start for parts in plan.values() for p in parts)
            / max(len(everyone) * (window.end - window.start), 1))
    return (f"fleet mode: {len(plan)} of {len(everyone)} nodes read per GPU"
            + (f", over {100 * read:.2g}% of the fleet's node-hours" if plan else "")
            + (f" for {named}" if named else "") + f"; the rest from roll-ups evaluated every "
            f"{rollups.interval_s:g} s ({rollups.interval_basis})")


def _price(rollups: RollUps, catalog: Catalog, host: str, observed: float | None) -> NodePrice:
    info = rollups.node_info.get(host, {})
    return node_price(catalog, host, _model(rollups, host), info.get("instance_type", ""),
                      info.get("capacity_type", "") or "unknown", info.get("gpu_model", ""), observed)


def _model(rollups: RollUps, host: str) -> str:
    models = rollups.models_on(host)
    return models[0] if models else ""


def _why_unpriced(rollups: RollUps, catalog: Catalog, host: str, prices: dict[str, NodePrice]) -> str | None:
    if math.isfinite(prices[host].actual):
        return None
    info = rollups.node_info.get(host, {})
    return catalog.why_unpriced(host, info.get("instance_type", ""), _model(rollups, host) or info.get("gpu_model", ""))


def _job_cost(rollups: RollUps, job: Job, prices: dict[str, NodePrice], advice: AdviceConfig,
              waste: dict[str, float]) -> JobCost:
    held = rollups.held_by(job)
    hours = np.array([held[h] / 3600 for h in held])
    cost = sum_known(hours * np.array([prices[h].actual for h in held]), hours)
    on_demand = sum_known(hours * np.array([prices[h].on_demand for h in held]), hours)
    caps = {prices[h].capacity for h in held}
    steps, tokens = rollups.steps.get(job), rollups.tokens.get(job) or None
    gpus = round(rollups.gpus.get(job, 0.0), 4)
    return JobCost(
        namespace=job[0], training_job=job[1], gpus=gpus, gpu_hours=float(hours.sum()),
        capacity_type=next(iter(caps)) if len(caps) == 1 else ("mixed" if caps else "unknown"),
        cost_dollars=cost, on_demand_cost_dollars=on_demand, steps=steps, tokens=tokens,
        cost_per_step=cost / steps if cost is not None and steps else None,
        cost_per_billion_tokens=cost / (tokens / 1e9) if cost is not None and tokens else None,
        mfu=rollups.mfu.get(job),
        waste_dollars={kind: waste.get(kind, 0.0) for kind in KINDS if kind != "unallocated_gpu"},
        advice=_advice(rollups, job, gpus, held, prices, caps, advice) | {"basis": advice_basis(None)},
        workload_class=TRAINING, class_basis="trainer telemetry",
        cost_basis=f"{ROLLUP_COST} {rollups.interval_s:g} s",
        ledger_basis={"ledger": "costed from the roll-ups, which do not keep each run's steps: analyse the job "
                                "over its own window (or with --per-gpu) for its ledger"})


def _advice(rollups: RollUps, job: Job, gpus: float, held: dict[str, float], prices: dict[str, NodePrice],
            caps: set[str], config: AdviceConfig) -> dict[str, object]:
    """As the per-GPU path advises (analyzer.costing.cost), from the job's roll-ups: its hours are its
    GPU-hours over its GPUs (a roll-up over 5 minutes runs on past the job's end), and prices
    are averaged over its nodes by the GPU-time it spent on each."""
    out = checkpoint_advice(gpus, len(held), rollups.checkpoint_interval_s.get(job), config)
    total = sum(held.values())
    hours = total / 3600 / gpus if gpus > 0 else 0.0
    if not held or hours <= 0:
        return out

    def mean(rate: str) -> float | None:
        rates = [(s, getattr(prices[h], rate)) for h, s in held.items()]
        return None if not all(math.isfinite(r) for _, r in rates) else sum(s * r for s, r in rates) / total

    return capacity_advice(out, hours, gpus, len(held), mean("on_demand"), mean("spot"), caps, TRAINING, config)


def _accounting(drilled: Accounting | None, rollups: RollUps, hosts: list[str],
                prices: dict[str, NodePrice], partly: set[str] = frozenset()) -> Accounting | None:
    """The per-GPU path's accounting with the nodes read from roll-ups added (those read per
    GPU over `partly` part of the window taken out first); a node's coverage is the
    evaluations seen over the time its GPUs were there."""
    if drilled is None:
        return None
    drilled = _without(drilled, partly)
    per_node = dict(drilled.per_node)
    observed, allocated, idle = (rollups.per_host(x) for x in (rollups.observed, rollups.allocated, rollups.idle))
    seen = {host: rollups.evaluations.get(host, 0.0) * rollups.interval_s for host in hosts}
    # In GPU-seconds, as analyzer.costing.accounting counts a lifetime: observed over coverage.
    life = {host: observed.get(host, 0.0) * rollups.lifetime_s.get(host, 0.0) / seen[host] if seen[host] else 0.0
            for host in hosts}
    for host in hosts:
        price = prices[host]
        per_node[host] = {**node_figures(observed.get(host, 0.0), allocated.get(host, 0.0), idle.get(host, 0.0),
                                         life[host]),
                          "gpu_hour_dollars": float(price.actual) if math.isfinite(price.actual) else None,
                          "price_basis": price.basis or None}

    def total(seconds: dict[str, float]) -> float:
        return sum(seconds.get(host, 0.0) for host in hosts) / 3600

    drilled_life = lifetime(drilled.observed_gpu_hours, drilled.coverage)
    all_observed = drilled.observed_gpu_hours + total(observed)
    all_life = drilled_life + sum(life.values()) / 3600
    return replace(drilled, observed_gpu_hours=all_observed,
                   allocated_gpu_hours=drilled.allocated_gpu_hours + total(allocated),
                   unallocated_gpu_hours=drilled.unallocated_gpu_hours + total(observed) - total(allocated),
                   busy_gpu_hours=drilled.busy_gpu_hours + total(allocated) - total(idle),
                   idle_gpu_hours=drilled.idle_gpu_hours + total(idle),
                   coverage=covered(all_observed, all_life) if all_life > 0 else drilled.coverage,
                   per_node=per_node)


def _without(accounting: Accounting, hosts: set[str]) -> Accounting:
    """`accounting` less these nodes' figures."""
    gone = [accounting.per_node[h] for h in hosts if h in accounting.per_node]
    if not gone:
        return accounting

    def less(name: str) -> float:
        return getattr(accounting, name) - sum(float(f.get(name) or 0.0) for f in gone)

    life = lifetime(accounting.observed_gpu_hours, accounting.coverage)
    life -= sum(node_lifetime(f) for f in gone)
    observed = less("observed_gpu_hours")
    return replace(accounting, observed_gpu_hours=observed, allocated_gpu_hours=less("allocated_gpu_hours"),
                   unallocated_gpu_hours=less("unallocated_gpu_hours"), busy_gpu_hours=less("busy_gpu_hours"),
                   idle_gpu_hours=less("idle_gpu_hours"),
                   coverage=covered(observed, life),
                   per_node={h: f for h, f in accounting.per_node.items() if h not in hosts})
