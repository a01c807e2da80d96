"""Dollars per job: allocation × duration × the node's real price, the on-demand
equivalent, unit costs, waste by cause, and capacity and checkpoint advice.

A GPU-hour is weighted by the allocation's share, so a MIG slice costs its
fraction of the GPU and a time-sliced replica its share of it. Whatever cannot be
known (no price for a node, no telemetry for steps or tokens) is None.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from .accounting import Accounting, account, holder_seconds
from ..grid.views import Views
from . import ledger_findings
from .ledger_findings import advised_interval
from ..detectors.findings import KINDS, Finding, iso
from .ledger import Ledger
from ..grid.frames import Frames
from .pricing import ON_DEMAND, SPOT, Catalog
from ..grid.workloads import BATCH, TRAINING, WorkloadClass

# Meta's Llama 3 paper ("The Llama 3 Herd of Models", 2024, §3.3.4): 419 unexpected
# interruptions in 54 days on 16,384 H100 GPUs, i.e. one per ~50,700 GPU-hours.
HARDWARE_FAILURES_PER_GPU_HOUR = 419 / (16384 * 54 * 24)


@dataclass(frozen=True)
class AdviceConfig:
    spot_interruptions_per_node_month: float = 0.05
    """Share of spot instances interrupted per month. AWS's Spot Instance Advisor
    puts most instance types in its lowest band (under 5% a month); GPU types in
    tight regions run higher, so set your own from the advisor."""
    restart_seconds: float = 600.0
    """Time to get a replacement node, reschedule the pods and load the checkpoint."""
    checkpoint_seconds: float | None = None
    """Time to write one checkpoint; when known, Daly's interval is given (the job's ledger
    measures it where the job reports its saves)."""
    mtbf_seconds: float | None = None
    """Time between the job's interruptions; unset, the expected rate of hardware failures and
    spot interruptions gives it (`mtbf_hours_on_spot`). The job's ledger measures it where the
    job restarted."""


@dataclass(frozen=True)
class JobCost:
    namespace: str
    training_job: str
    gpus: float
    gpu_hours: float
    capacity_type: str
    cost_dollars: float | None
    on_demand_cost_dollars: float | None
    steps: float | None
    tokens: float | None
    cost_per_step: float | None
    cost_per_billion_tokens: float | None
    mfu: float | None
    waste_dollars: dict[str, float] = field(default_factory=dict)
    advice: dict[str, object] = field(default_factory=dict)
    workload_class: str = BATCH
    class_basis: str = ""
    cost_basis: str = "per-GPU series"   # or the roll-ups that fleet mode costed it from
    ledger: Ledger | None = None
    ledger_basis: dict[str, str] = field(default_factory=dict)

    @property
    def goodput(self) -> float | None:
        return self.ledger.goodput(self.gpu_hours) if self.ledger is not None else None

    def ledger_dollars(self, hours: float | None) -> float | None:
        """A ledger figure's dollars, at the job's own rate."""
        if hours is None or self.cost_dollars is None or self.gpu_hours <= 0:
            return None
        return hours * self.cost_dollars / self.gpu_hours

    def ledger_dict(self) -> dict[str, dict[str, float | None] | None] | None:
        if self.ledger is None:
            return None
        return {name: None if hours is None else {"gpu_hours": _round(hours), "dollars": _round(self.ledger_dollars(hours))}
                for name, hours in self.ledger.gpu_hours.items()}

    def runs_list(self) -> list[dict[str, object]]:
        return [{"process_start": _iso(r.process_start), "first_step": _iso(r.first_step), "last_step": _iso(r.last_step),
                 "resumed_from": r.resumed_from, "last_step_number": r.last_step_number,
                 "ledger": {name: _round(hours) for name, hours in r.gpu_hours.items()}}
                for r in (self.ledger.runs if self.ledger is not None else ())]

    def to_dict(self) -> dict[str, object]:
        gpus = int(self.gpus) if float(self.gpus).is_integer() else round(self.gpus, 4)
        return {
            "namespace": self.namespace, "training_job": self.training_job, "gpus": gpus,
            "gpu_hours": _round(self.gpu_hours), "capacity_type": self.capacity_type,
            "cost_dollars": _round(self.cost_dollars), "steps": _round(self.steps, 0),
            "tokens": _round(self.tokens, 0), "cost_per_step": _round(self.cost_per_step, 6),
            "cost_per_billion_tokens": _round(self.cost_per_billion_tokens), "mfu": _round(self.mfu),
            "waste_dollars": {k: _round(v) for k, v in self.waste_dollars.items()},
            "on_demand_cost_dollars": _round(self.on_demand_cost_dollars),
            "advice": self.advice, "class": self.workload_class, "class_basis": self.class_basis,
            "cost_basis": self.cost_basis,
            "ledger": self.ledger_dict(), "ledger_basis": self.ledger_basis, "goodput": _round(self.goodput),
            "runs": self.runs_list(),
        }


def _iso(t: float | None) -> str | None:
    return None if t is None else iso(t)


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits) if digits else float(round(value))


@dataclass(frozen=True)
class GpuPrices:
    """Per gpu-grid row: $ per GPU-hour at the node's capacity type and on-demand."""

    actual: np.ndarray
    on_demand: np.ndarray
    spot: np.ndarray
    capacity: np.ndarray        # capacity type of each GPU's node
    basis: np.ndarray           # where each price came from: node, opencost, instance_type, gpu_model or ""


def gpu_prices(views: Views, catalog: Catalog) -> GpuPrices:
    labels = views.gpu.keys
    nodes = views.nodes
    facts = dict(zip(nodes.index, zip(nodes["instance_type"], nodes["capacity_type"], nodes["gpu_model"])))
    rows = [node_price(catalog, host, model, *facts.get(host, ("", "unknown", "")),
                       views.frames.gpu_hour_prices.get(host))
            for host, model in zip(labels["Hostname"], labels["modelName"])]
    columns = list(zip(*rows)) or [()] * 5
    return GpuPrices(*(np.array(c, dtype=float) for c in columns[:3]), *(np.array(c, dtype=object) for c in columns[3:]))


class NodePrice(NamedTuple):
    """One GPU-hour on a node, NaN where unknown."""

    actual: float           # at the node's capacity type
    on_demand: float
    spot: float
    capacity: str
    basis: str              # node, opencost, instance_type, gpu_model or ""


def node_price(catalog: Catalog, host: str, model: str, instance_type: str, capacity: str, node_model: str,
               observed: float | None) -> NodePrice:
    """What one GPU-hour on the node costs: `observed` is OpenCost's price for it, if any."""
    actual = on_demand = spot = np.nan
    basis = ""
    rate = catalog.rate(host, instance_type, model) or catalog.rate(host, instance_type, node_model)
    if rate is not None:
        actual, on_demand, spot, basis = _nan(rate.at(capacity)), _nan(rate.at(ON_DEMAND)), _nan(rate.at(SPOT)), rate.basis
    # OpenCost's price is what the node really costs (negotiated, spot); only a
    # user's own per-node price outranks it. The list prices stay the comparison.
    if observed is not None and basis != "node":
        actual, basis = observed, "opencost"
        if capacity == ON_DEMAND:
            on_demand = observed
        elif capacity == SPOT:
            spot = observed
    return NodePrice(actual, on_demand, spot, capacity, basis)


def _nan(value: float | None) -> float:
    return np.nan if value is None else value


def price_findings(findings: list[Finding], views: Views, prices: GpuPrices,
                   job_rates: dict[tuple[str, str], float]) -> list[Finding]:
    """Wasted dollars: the rate of the finding's GPUs when it names them on one node
    (an episode may cover several: evidence `gpus`), else its job's mean rate. A job's
    findings are priced again by `held_within_jobs` wherever the job's GPUs are known."""
    row_of = {(h, g): i for i, (h, g) in enumerate(zip(views.gpu.keys["Hostname"], views.gpu.keys["gpu"]))}
    out = []
    for f in findings:
        rate = np.nan
        rows = [row_of[(f.hostname, str(g))] for g in f.evidence.get("gpus", ()) if (f.hostname, str(g)) in row_of]
        if rows:
            rate = float(np.mean(prices.actual[rows]))
        elif f.job is not None:
            rate = job_rates.get(f.job, np.nan)
        dollars = None if f.wasted_gpu_hours is None or not np.isfinite(rate) else f.wasted_gpu_hours * rate
        out.append(replace(f, wasted_dollars=dollars))
    return out


# Whose waste GPU-time that several findings of one job claim counts under: what left the GPUs
# doing nothing useful first (a GPU down, held with no process, the job hung or diverged, a GPU
# idle), then what only slowed them. A GPU down while its job stalls is the same GPU-seconds
# twice, not two wastes. The time held after a process ended comes before the stall up to it:
# they share the bin where the process ended, and the stall's waste is the bins before it.
CLAIM_ORDER = ("gpu_error", "held_after_exit", "stalled", "diverging", "idle_gpu", "unallocated_gpu",
               "oversized_serving", "underused_gpu", "straggler", "dataloader_starvation", "thermal_throttle", "low_mfu", "lost_progress",
               "checkpoint_overhead", "slow_startup")


def held_within_jobs(findings: list[Finding], v: Views, accounting: Accounting,
                     rows_of: dict[tuple[str, str], np.ndarray], row_rates: np.ndarray) -> list[Finding]:
    """The findings with each job's waste held within what the job held: a finding claims
    GPU-time of its job within its span that no finding of an earlier kind in CLAIM_ORDER
    claimed, and no more than there is. Dollars are at the job's own rate in each time bin,
    so that a job's waste, added over its findings, is never more than its cost. Findings
    of no job, or of a job that held no GPU in the allocation data, are left as they are."""
    by_job: dict[tuple[str, str], list[int]] = {}
    for i, f in enumerate(findings):
        if f.job in rows_of and len(rows_of[f.job]) and f.wasted_gpu_hours is not None:
            by_job.setdefault(f.job, []).append(i)
    out = list(findings)
    for job, members in by_job.items():
        held, dollars = _job_bins(v, accounting, rows_of[job], row_rates)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(held > 0, dollars / held, 0.0)
        free = held.copy()
        claimed: list[tuple[Finding, slice]] = []
        for i in sorted(members, key=lambda i: CLAIM_ORDER.index(findings[i].kind)):
            f = findings[i]
            span = _span(v, f)
            room = free[span].sum()
            # Its claim where the job's GPU-time in its span is still free, wherever that is:
            # the detectors say how much a finding wasted over its span, not when within it.
            got = free[span] * (min(f.wasted_gpu_hours / room, 1.0) if room > 0 else 0.0)
            free[span] -= got
            used = got > 0
            price = float(got[used] @ rate[span][used]) if np.isfinite(rate[span][used]).all() else None
            if f.wasted_gpu_hours - room <= 1e-9 * max(f.wasted_gpu_hours, 1.0):
                out[i] = replace(f, wasted_dollars=price)
            else:
                before = {o.kind for o, s in claimed if s.start < span.stop and span.start < s.stop}
                out[i] = replace(f, wasted_gpu_hours=float(got.sum()), wasted_dollars=price, evidence={
                    **f.evidence,
                    "waste_counted_under": sorted(before | set(f.evidence.get("waste_counted_under", ()))),
                    "gross_wasted_gpu_hours": f.evidence.get("gross_wasted_gpu_hours", f.wasted_gpu_hours)})
            claimed.append((f, span))
    return out


def _span(v: Views, f: Finding) -> slice:
    """The time bins from the one holding a finding's start to the one holding its end."""
    lo = min(max(v.bin_of(f.start), 0), v.n - 1)
    return slice(lo, min(max(v.bin_of(f.end) + 1, lo + 1), v.n))


def _job_bins(v: Views, accounting: Accounting, rows: np.ndarray, row_rates: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """A job's GPU-hours and dollars in each time bin (the bins of its `job_costs` figures):
    dollars NaN in a bin where a GPU it held has no price."""
    held = holder_seconds(v, accounting, rows) / 3600
    rates = row_rates[rows]
    dollars = np.zeros(v.n)
    for price in np.unique(rates[np.isfinite(rates)]):
        dollars += price * holder_seconds(v, accounting, rows[rates == price]) / 3600
    unpriced = rows[~np.isfinite(rates)]
    if len(unpriced):
        dollars[holder_seconds(v, accounting, unpriced) > 0] = np.nan
    return held, dollars


def wasted_dollars(findings: list[Finding]) -> float:
    """The dollars the findings name wasted, together (the unpriced add nothing)."""
    return sum(f.wasted_dollars or 0.0 for f in findings)


def jobs_dollars(jobs: list[JobCost]) -> float:
    """What the jobs cost together (the unpriced add nothing)."""
    return sum(j.cost_dollars or 0.0 for j in jobs)


def job_costs(data: Frames | Views, catalog: Catalog, findings: list[Finding] = (),
              advice: AdviceConfig = AdviceConfig(), accounting: Accounting | None = None,
              prices: GpuPrices | None = None, ledgers: dict[tuple[str, str], Ledger] | None = None,
              ) -> tuple[list[JobCost], list[Finding]]:
    """Per-job costs, and the findings with their wasted dollars filled in."""
    v = Views.of(data)
    prices = prices or gpu_prices(v, catalog)
    alloc = v.alloc
    rows_of = v.job_rows(alloc)
    rank_rows = v.job_rows(v.rank)
    gpu_row = alloc.keys["gpu_row"].to_numpy() if alloc.size else np.zeros(0, np.int64)
    share = np.nan_to_num(alloc.values["share"]) if alloc.size else np.zeros((0, v.n))
    accounting = accounting or account(v)
    hours_by_row = accounting.row_gpu_hours

    def per_row(table: np.ndarray) -> np.ndarray:
        out = np.full(len(gpu_row), np.nan)
        ok = gpu_row >= 0
        out[ok] = table[gpu_row[ok]]
        return out

    actual, on_demand = per_row(prices.actual), per_row(prices.on_demand)
    jobs: dict[tuple[str, str], dict] = {}
    for job, rows in rows_of.items():
        hours = float(hours_by_row[rows].sum())
        cost = sum_known(hours_by_row[rows] * actual[rows], hours_by_row[rows])
        od = sum_known(hours_by_row[rows] * on_demand[rows], hours_by_row[rows])
        caps = {prices.capacity[g] for g in gpu_row[rows] if g >= 0}
        jobs[job] = {"rows": rows, "gpu_hours": hours, "cost": cost, "on_demand": od,
                     "gpus": float(share[rows].sum(axis=0).max()) if len(rows) else 0.0,
                     "capacity": caps.pop() if len(caps) == 1 else ("mixed" if caps else "unknown")}
    rates = {job: j["cost"] / j["gpu_hours"] for job, j in jobs.items()
             if j["cost"] is not None and j["gpu_hours"] > 0}
    priced = held_within_jobs(price_findings(list(findings), v, prices, rates), v, accounting, rows_of, actual)
    out = []
    for job in sorted(set(jobs) | set(rank_rows)):
        j = jobs.get(job, {"rows": np.zeros(0, np.int64), "gpu_hours": 0.0, "cost": None, "on_demand": None,
                           "gpus": 0.0, "capacity": "unknown"})
        steps, tokens, mfu = _training(v, rank_rows.get(job))
        kind = v.classes.get(job) or WorkloadClass(BATCH, "no pod of the job was seen")
        cost = j["cost"]
        waste = {k: 0.0 for k in KINDS if k != "unallocated_gpu"}
        for f in priced:
            if f.job == job and f.wasted_dollars is not None:
                waste[f.kind] = waste.get(f.kind, 0.0) + f.wasted_dollars
        out.append(JobCost(
            namespace=job[0], training_job=job[1], gpus=round(j["gpus"], 4), gpu_hours=j["gpu_hours"],
            capacity_type=j["capacity"], cost_dollars=cost, on_demand_cost_dollars=j["on_demand"],
            steps=steps, tokens=tokens,
            cost_per_step=cost / steps if cost is not None and steps else None,
            cost_per_billion_tokens=cost / (tokens / 1e9) if cost is not None and tokens else None,
            mfu=mfu, waste_dollars=waste,
            advice=_advice(v, j, prices, gpu_row, rank_rows.get(job), measured(advice, (ledgers or {}).get(job)),
                           kind.name) | {"basis": advice_basis((ledgers or {}).get(job))},
            workload_class=kind.name, class_basis=kind.basis,
            ledger=(ledgers or {}).get(job) if kind.name == TRAINING else None,
            ledger_basis=_ledger_basis(job, kind.name, ledgers, j["gpu_hours"]),
        ))
    return out, priced


def _ledger_basis(job: tuple[str, str], workload_class: str, ledgers: dict | None, gpu_hours: float) -> dict[str, str]:
    """What the job's ledger is computed from, or why it has none."""
    if workload_class != TRAINING:
        return {"ledger": f"a ledger is kept for training jobs; this is {workload_class}"}
    ledger = (ledgers or {}).get(job)
    if ledger is None:
        return {"ledger": "no training telemetry from the job while it held GPUs" if gpu_hours > 0
                else "the job held no GPU in this window"}
    return ledger.basis


def sum_known(dollars: np.ndarray, hours: np.ndarray) -> float | None:
    """Total dollars, or None when any GPU-hour of the job has no price."""
    used = hours > 0
    if not used.any():
        return 0.0
    if not np.isfinite(dollars[used]).all():
        return None
    return float(dollars[used].sum())


def _training(v: Views, rows: np.ndarray | None) -> tuple[float | None, float | None, float | None]:
    """Steps (each rank counts every step: the most any rank number made), tokens
    (summed over ranks, each processes its own), and MFU while steps were made."""
    rank = v.rank
    if rows is None or not len(rows):
        return None, None, None
    steps = None
    if "steps" in rank.values:
        per_series = np.nansum(rank.values["steps"][rows], axis=1, dtype=np.float64)
        by_rank: dict[str, float] = {}
        for name, made in zip(rank.keys["rank"].to_numpy()[rows], per_series):
            by_rank[name] = by_rank.get(name, 0.0) + float(made)
        steps = max(by_rank.values())
    tokens = float(np.nansum(rank.values["tokens"][rows], dtype=np.float64)) if "tokens" in rank.values else None
    mfu = None
    if "mfu" in rank.values and "steps" in rank.values:
        values = rank.values["mfu"][rows]
        working = (np.nan_to_num(rank.values["steps"][rows]) > 0) & np.isfinite(values)
        mfu = float(values[working].mean()) if working.any() else None
    return steps, tokens or None, mfu


def spot_or_on_demand(hours: float, gpus: float, nodes: int, spot_rate: float, on_demand_rate: float,
                      lost_seconds: float, config: AdviceConfig) -> dict[str, object]:
    """On-demand when the expected cost of interruptions (work lost since the last
    checkpoint plus the restart, paid again at the spot rate) exceeds what spot saves."""
    per_hour = nodes * config.spot_interruptions_per_node_month / 730.0
    interruptions = per_hour * hours
    retry_hours = interruptions * (lost_seconds + config.restart_seconds) / 3600
    spot_total = spot_rate * gpus * (hours + retry_hours)
    on_demand_total = on_demand_rate * gpus * hours
    return {"capacity": "spot" if spot_total < on_demand_total else "on-demand",
            "expected_spot_interruptions": round(interruptions, 4),
            "expected_spot_dollars": round(spot_total, 2), "on_demand_dollars": round(on_demand_total, 2)}


def _checkpoint_interval(v: Views, rows: np.ndarray | None) -> float | None:
    """Median time between successive checkpoints the job reported."""
    rank = v.rank
    if rows is None or "last_checkpoint_time" not in rank.values:
        return None
    values = rank.values["last_checkpoint_time"][rows]
    # A checkpoint's time repeats in every report until the next one: only changes are new.
    new = np.isfinite(values) & (values > 0)
    new[:, 1:] &= values[:, 1:] != values[:, :-1]
    seen = np.unique(values[new])
    return float(np.median(np.diff(seen))) if len(seen) > 2 else None


def prior_mtbf_s(gpus: float, nodes: int, config: AdviceConfig, on_spot: bool = True) -> float | None:
    """Expected seconds between interruptions of a job on `gpus` GPUs over `nodes` nodes:
    hardware failures at Llama 3's rate, plus spot interruptions where it runs on spot."""
    if gpus <= 0:
        return None
    spot = nodes * config.spot_interruptions_per_node_month / 730.0 if on_spot else 0.0
    return 3600 / (gpus * HARDWARE_FAILURES_PER_GPU_HOUR + spot)


def job_prior_mtbf(v: Views, ledgers: dict[tuple[str, str], Ledger], config: AdviceConfig,
                   prices: GpuPrices) -> dict[tuple[str, str], float | None]:
    """Each ledgered job's prior time between interruptions, on the nodes and capacity it held."""
    alloc_rows = v.job_rows(v.alloc)
    gpu_row = v.alloc.keys["gpu_row"].to_numpy() if v.alloc.size else np.zeros(0, np.int64)
    out = {}
    for job, ledger in ledgers.items():
        g = gpu_row[alloc_rows.get(job, np.zeros(0, np.int64))]
        g = g[g >= 0]
        hosts = {v.gpu.keys["Hostname"].iloc[i] for i in g}
        out[job] = prior_mtbf_s(ledger.gpus, len(hosts), config, any(prices.capacity[i] == SPOT for i in g))
    return out


def checkpoint_advice(gpus: float, nodes: int, observed: float | None, config: AdviceConfig) -> dict[str, object]:
    """The job's expected time between interruptions on spot and the checkpoint interval to use
    (the `lost_progress` finding's, from the measured time between interruptions where there is
    one); capacity advice, where the job allows it, is added by the caller."""
    mtbf_s = prior_mtbf_s(gpus, nodes, config)
    between = config.mtbf_seconds or mtbf_s
    return {
        "observed_checkpoint_interval_s": observed,
        "mtbf_hours_on_spot": round(mtbf_s / 3600, 1) if mtbf_s else None,
        "checkpoint_interval_s": (round(advised_interval(config.checkpoint_seconds, between))
                                  if config.checkpoint_seconds and between else None),
        "capacity": None,
    }


def measured(config: AdviceConfig, ledger: Ledger | None) -> AdviceConfig:
    """The advice's save and restart times from the job's own ledger where it measured them."""
    if ledger is None:
        return config
    if ledger.save_seconds is not None:
        config = replace(config, checkpoint_seconds=ledger.save_seconds)
    if ledger.restarts and ledger.gpus > 0:
        # A restart costs its gap and the next run's start-up, per GPU.
        later = sum(r.gpu_hours["startup"] for r in ledger.runs[1:])
        gap = (ledger.gpu_hours["restart"] or 0.0) + later
        config = replace(config, restart_seconds=gap * 3600 / ledger.gpus / ledger.restarts,
                         mtbf_seconds=ledger_findings.mtbf(ledger, None)[0])
    return config


def advice_basis(ledger: Ledger | None) -> dict[str, str]:
    """Where the advice's save and restart times came from."""
    saves = ledger is not None and ledger.save_seconds is not None
    restarts = ledger is not None and ledger.restarts > 0
    return {"checkpoint_seconds": f"measured: {ledger.saves} saves" if saves else "AdviceConfig (not measured)",
            "restart_seconds": f"measured: {ledger.restarts} restarts" if restarts else "AdviceConfig (not measured)",
            "mtbf_seconds": f"measured: {ledger.restarts} restarts" if restarts
            else "hardware failures and spot interruptions at their expected rates"}


def _advice(v: Views, job: dict, prices: GpuPrices, gpu_row: np.ndarray, rank_rows: np.ndarray | None,
            config: AdviceConfig, workload_class: str) -> dict[str, object]:
    rows = job["rows"]
    gpus = job["gpus"]
    share = np.nan_to_num(v.alloc.values["share"][rows]) if len(rows) else np.zeros((0, v.n))
    hours = float((share.sum(axis=0) > 0).sum() * v.step / 3600)
    g = gpu_row[rows]
    g = g[g >= 0]
    hosts = {v.gpu.keys["Hostname"].iloc[i] for i in g}
    observed = _checkpoint_interval(v, rank_rows)
    out = checkpoint_advice(gpus, len(hosts), observed, config)
    if not len(g) or hours <= 0:
        return out
    od = float(np.mean(prices.on_demand[g])) if np.isfinite(prices.on_demand[g]).all() else None
    spot = float(np.mean(prices.spot[g])) if np.isfinite(prices.spot[g]).all() else None
    return capacity_advice(out, hours, gpus, len(hosts), od, spot, {prices.capacity[i] for i in g},
                           workload_class, config)


def capacity_advice(out: dict[str, object], hours: float, gpus: float, nodes: int, on_demand: float | None,
                    spot: float | None, capacities: set[str], workload_class: str,
                    config: AdviceConfig) -> dict[str, object]:
    """Spot or on-demand for a job that held `gpus` on `nodes` for `hours`, added to its
    checkpoint advice (`checkpoint_advice`) where its class, checkpoints and prices allow."""
    observed = out["observed_checkpoint_interval_s"]
    # An interruption costs a job without checkpoints all its work, and a server or a
    # notebook its users: spot is advised only to a training job seen checkpointing.
    if workload_class != TRAINING or observed is None:
        out["capacity_basis"] = ("a training job that checkpoints can take spot interruptions; "
                                 + (f"this is {workload_class}" if workload_class != TRAINING
                                    else "no checkpoint of this job was seen"))
        return out
    if on_demand is None or spot is None or not capacities <= {SPOT, ON_DEMAND}:
        return out
    # Work lost per interruption: half a checkpoint interval; with none seen, half the run.
    interval = observed or out["checkpoint_interval_s"] or hours * 3600
    out.update(spot_or_on_demand(hours, gpus, nodes, spot, on_demand, float(interval) / 2, config))
    return out
