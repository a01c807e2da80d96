"""Synthetic fleets shaped like real clusters' Prometheus data, with exact ground truth.

Written from the documented interfaces (docs/metrics.md, docs/telemetry.md and docs/report.md), the
definition of the GPU-second counters in docs/metrics.md, and the public documentation of dcgm-exporter and
kube-state-metrics ALONE: nothing here reads or imports the
analyzer, the agent, the exporter or the simulator, so that a test of the analyzer against these
fleets does not share the analyzer's assumptions.

`generate` samples each node as its exporter would be scraped (interval, jitter, phase, missed
scrapes, exporter restarts) and computes the truth from the exact intervals, never from samples.
`openmetrics`, `backfill_prometheus` and `import_victoria` put a fleet into a real TSDB, and
`fleets()` is a hypothesis strategy drawing whole mixed fleets.
"""
from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from tests.processes import promtool_backfill

# dcgm-exporter 4.9.0 exports the default fields under their DCGM 4.7 names and in base units:
# 4.8 name -> (4.9 name, factor from the 4.8 unit to the 4.9 unit).
# Sources: DCGM 4.7's deprecated-alias table in its Python bindings (dcgm_fields.py,
# _DEPRECATED_ALIASES: GPU_TEMP -> GPU_TEMP_CELSIUS, POWER_USAGE -> BOARD_POWER_WATTS,
# GPU_UTIL -> GPU_UTIL_RATIO, XID_ERRORS -> XID_ERROR; CLOCK_THROTTLE_REASONS is deprecated for
# CLOCKS_EVENT_REASONS), go-dcgm's base-unit field table (pkg/dcgm/base_unit_fields_test.go:
# SM_CLOCK -> SM_CLOCK_HERTZ (field 1603), TOTAL_ENERGY_CONSUMPTION -> GPU_ENERGY_JOULES_TOTAL
# (1611, whole joules)) and DCGM 4.7's field-identifier catalogue as quoted second-hand
# (FB_USED -> FB_USED_BYTES, 1627). dcgm-exporter 4.9.0's own release notes and
# etc/default-counters.csv were not reachable, so these names are not confirmed against it.
DCGM_49_NAMES: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", 0.01),
    "DCGM_FI_DEV_FB_USED": ("DCGM_FI_DEV_FB_USED_BYTES", 2.0 ** 20),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e6),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1e-3),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", 1.0),
}
# Counters among the device fields, in both namings: they restart from 0 with the exporter.
DCGM_COUNTERS = frozenset({"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"})

EXPORTERS = ("agent", "agent-old", "dcgm-4.8", "dcgm-4.8.3", "dcgm-4.9")
# How Prometheus stores what an exporter exposed, by the scrape's honor_labels (Prometheus's
# configuration docs): "own" keeps the exporter's labels and attaches none of the target's
# namespace, pod and container (burnrate's manifests); "exported" attaches the target's and
# renames the exporter's conflicting labels to exported_<name>, as GPU Operator's
# ServiceMonitor for dcgm-exporter does. Prometheus's `up` carries the target's labels.
SCRAPE_PROFILES = ("own", "exported")
AGENT_EXPORTERS = ("agent", "agent-old")
KINDS = ("training", "serving", "interactive", "batch")
# Allocated time splits into busy and idle (docs/report.md, `accounting`): a holder whose mean GPU
# utilization is at or below this counts as idle.
IDLE_UTIL_PCT = 2.0
# 2025-06-02T00:00:00Z: fixed, in the past, so back-filled data is neither "future" nor retention-expired.
BASE_TIME = 1748822400.0
KSM_SCRAPE_S = 30.0
SERVING_PERIOD_S = 3600.0
SAMPLES_PER_RANK_STEP = 8
# dcgm-exporter's recent default counters carry the driver version as a label row.
DRIVER_VERSION = "570.124.06"
# Kubernetes' generated-name alphabet (apimachinery rand.SafeEncodeString): no vowels, no 0/1/3.
_K8S_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int
    exporter: str  # one of EXPORTERS
    scrape_interval_s: float  # 10..120
    jitter_s: float = 0.0  # each scrape lands within +-jitter of its slot
    phase_s: float = 0.0  # offset of this target's scrapes from the window start
    instance_type: str = "p4d.24xlarge"
    capacity_type: str = "on-demand"
    zone: str = "us-east-1a"
    gpu_model: str = "NVIDIA A100-SXM4-40GB"
    missed: tuple[float, ...] = ()  # times of single missed scrapes (the nearest scrape is dropped)
    restarts: tuple[float, ...] = ()  # exporter restarts: counters start again from 0 after each
    scrape_profile: str = "own"  # one of SCRAPE_PROFILES

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ValueError(f"{self.name}: unknown exporter {self.exporter!r}")
        if self.scrape_profile not in SCRAPE_PROFILES:
            raise ValueError(f"{self.name}: unknown scrape profile {self.scrape_profile!r}")
        if self.gpus < 1 or self.scrape_interval_s <= 0:
            raise ValueError(f"{self.name}: needs gpus >= 1 and a positive scrape interval")
        # beyond half an interval two scrapes could swap places
        if not 0 <= self.jitter_s < self.scrape_interval_s / 2:
            raise ValueError(f"{self.name}: jitter must be in [0, interval/2)")

    @property
    def hostname_label(self) -> str:
        # dcgm-exporter 4.8.3 renamed its `Hostname` label to `hostname`
        return "hostname" if self.exporter in ("dcgm-4.8.3", "dcgm-4.9") else "Hostname"

    @property
    def scrape_job(self) -> str:
        return "burnrate-agent" if self.exporter in AGENT_EXPORTERS else "dcgm-exporter"

    @property
    def target_labels(self) -> dict[str, str]:
        """The exporter pod's own labels, as Kubernetes service discovery attaches them."""
        agent = self.exporter in AGENT_EXPORTERS
        suffix = _suffix(_name_rng(0, self.name), 5)
        return {"namespace": "burnrate-node" if agent else "gpu-operator",
                "pod": f"{'burnrate-agent' if agent else 'nvidia-dcgm-exporter'}-{suffix}",
                "container": "agent" if agent else "nvidia-dcgm-exporter"}


@dataclass(frozen=True)
class Workload:
    namespace: str
    name: str  # the training job's / workload's name
    kind: str  # one of KINDS
    owner_kind: str  # PyTorchJob, Deployment, Notebook, Job, StatefulSet, ...
    placements: tuple[tuple[str, tuple[int, ...]], ...]  # (node name, GPU indices), one pod per node
    start: float
    end: float
    share: float = 1.0  # 1, 1/7 (MIG), 1/N time-sliced
    util_pct: float = 90.0  # mean GPU utilization while held (0 = idle)
    telemetry: bool = False  # training ranks report burnrate_train_* (docs/metrics.md, docs/telemetry.md)
    tokens_per_step: float = 0  # the whole job's tokens per optimizer step
    step_s: float = 1.0
    data_wait: float = 0.05  # share of each step the ranks wait for data

    @property
    def busy(self) -> bool:
        return self.util_pct > IDLE_UTIL_PCT

    @property
    def world_size(self) -> int:
        return sum(len(gpus) for _, gpus in self.placements)


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    t: np.ndarray  # unix seconds, millisecond resolution, strictly increasing
    v: np.ndarray


@dataclass
class Truth:
    job_gpu_hours: dict[tuple[str, str], float]  # (namespace, name) -> share x held hours in the window
    job_class: dict[tuple[str, str], str]
    observed_gpu_hours: float
    allocated_gpu_hours: float
    unallocated_gpu_hours: float
    busy_gpu_hours: float
    idle_gpu_hours: float
    per_node: dict[str, dict[str, float]]  # node -> the five figures above, by their field names


@dataclass
class Fleet:
    start: float
    end: float
    nodes: tuple[Node, ...]
    workloads: tuple[Workload, ...]
    series: list[Series]
    truth: Truth
    seed: int  # pod_names(workload, seed) gives the pods the series name


@dataclass(frozen=True)
class _Hold:
    """One pod's hold on one GPU."""
    workload: Workload
    pod: str
    container: str
    rank: int


# ---------------------------------------------------------------------------------------------
# pods as Kubernetes names them

def _name_rng(seed: int, *parts: str) -> np.random.Generator:
    # independent of everything else drawn, so names do not move when the sampling changes
    return np.random.default_rng([seed, zlib.crc32("/".join(parts).encode())])


def _suffix(rng: np.random.Generator, n: int) -> str:
    return "".join(rng.choice(list(_K8S_ALPHABET), n))


def pod_names(w: Workload, seed: int) -> list[str]:
    """One pod name per placement, as the workload's controller would name it."""
    rng = _name_rng(seed, w.namespace, w.name)
    n = len(w.placements)
    if w.owner_kind == "PyTorchJob":
        return [f"{w.name}-master-0"] + [f"{w.name}-worker-{i}" for i in range(n - 1)]
    if w.owner_kind == "Deployment":
        template_hash = _suffix(rng, 10)
        return [f"{w.name}-{template_hash}-{_suffix(rng, 5)}" for _ in range(n)]
    if w.owner_kind == "Job":
        return [f"{w.name}-{_suffix(rng, 5)}" for _ in range(n)]
    if w.owner_kind in ("Notebook", "StatefulSet"):
        return [f"{w.name}-{i}" for i in range(n)]
    return [f"{w.name}-worker-{i}" for i in range(n)]


def _container(w: Workload) -> str:
    # the Kubeflow training operator requires the container to be called "pytorch"
    return {"PyTorchJob": "pytorch", "Job": "main"}.get(w.owner_kind, w.name)


def _pod_owner(w: Workload, pod: str) -> tuple[str, str]:
    """The pod's controller as kube-state-metrics reports it: Deployments own pods through a
    ReplicaSet, and Kubeflow's notebook controller runs a Notebook as a StatefulSet."""
    if w.owner_kind == "Deployment":
        return "ReplicaSet", pod.rsplit("-", 1)[0]
    if w.owner_kind == "Notebook":
        return "StatefulSet", w.name
    return w.owner_kind, w.name


# ---------------------------------------------------------------------------------------------
# truth, from the exact intervals

def _held_s(w: Workload, start: float, end: float) -> float:
    return max(0.0, min(w.end, end) - max(w.start, start))


def compute_truth(nodes: tuple[Node, ...], workloads: tuple[Workload, ...], start: float, end: float) -> Truth:
    hours = (end - start) / 3600.0
    per_node = {n.name: {"observed_gpu_hours": n.gpus * hours, "allocated_gpu_hours": 0.0,
                         "busy_gpu_hours": 0.0, "idle_gpu_hours": 0.0} for n in nodes}
    jobs: dict[tuple[str, str], float] = {}
    for w in workloads:
        held_h = _held_s(w, start, end) / 3600.0
        for node, gpus in w.placements:
            gpu_h = w.share * len(gpus) * held_h
            per_node[node]["allocated_gpu_hours"] += gpu_h
            per_node[node]["busy_gpu_hours" if w.busy else "idle_gpu_hours"] += gpu_h
            jobs[(w.namespace, w.name)] = jobs.get((w.namespace, w.name), 0.0) + gpu_h
    for figures in per_node.values():
        figures["unallocated_gpu_hours"] = figures["observed_gpu_hours"] - figures["allocated_gpu_hours"]

    def total(key: str) -> float:
        return sum(f[key] for f in per_node.values())

    return Truth(job_gpu_hours=jobs, job_class={(w.namespace, w.name): w.kind for w in workloads},
                 observed_gpu_hours=total("observed_gpu_hours"),
                 allocated_gpu_hours=total("allocated_gpu_hours"),
                 unallocated_gpu_hours=total("unallocated_gpu_hours"),
                 busy_gpu_hours=total("busy_gpu_hours"), idle_gpu_hours=total("idle_gpu_hours"),
                 per_node=per_node)


def peak_share(holds: list[tuple[float, float, float]], t0: float, t1: float) -> float:
    """The largest sum of shares held at any instant of [t0, t1) among (start, end, share) holds."""
    points = [t0] + [a for a, _, _ in holds if t0 < a < t1]
    return max(sum(s for a, b, s in holds if a <= p < b) for p in points)


def _validate(nodes: tuple[Node, ...], workloads: tuple[Workload, ...]) -> None:
    by_name = {n.name: n for n in nodes}
    if len(by_name) != len(nodes):
        raise ValueError("node names must be unique")
    if len({(w.namespace, w.name) for w in workloads}) != len(workloads):
        raise ValueError("workloads must be unique by (namespace, name)")
    load: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for w in workloads:
        if w.kind not in KINDS or not 0 < w.share <= 1 or w.end <= w.start:
            raise ValueError(f"{w.name}: bad kind, share or interval")
        if len({node for node, _ in w.placements}) != len(w.placements):
            raise ValueError(f"{w.name}: one pod per node")
        for node, gpus in w.placements:
            if node not in by_name or any(not 0 <= g < by_name[node].gpus for g in gpus):
                raise ValueError(f"{w.name}: placement on missing node or GPU {node} {gpus}")
            for g in gpus:
                load.setdefault((node, g), []).append((w.start, w.end, w.share))
    for (node, g), holds in load.items():
        for a, b, _ in holds:
            if peak_share(holds, a, b) > 1 + 1e-9:
                raise ValueError(f"GPU {g} of {node} is over-committed at {a}")


# ---------------------------------------------------------------------------------------------
# sampling

class _Sink:
    """Collects sample chunks per (name, label set); chunks arrive in time order per key."""

    def __init__(self) -> None:
        self._chunks: dict[tuple, tuple[str, dict[str, str], list, list]] = {}

    def add(self, name: str, labels: dict[str, str], t: np.ndarray, v: np.ndarray | float) -> None:
        if t.size == 0:
            return
        key = (name, tuple(sorted(labels.items())))
        entry = self._chunks.setdefault(key, (name, dict(labels), [], []))
        entry[2].append(t)
        entry[3].append(np.broadcast_to(np.asarray(v, dtype=float), t.shape))

    def series(self) -> list[Series]:
        return [Series(name, labels, np.concatenate(ts), np.concatenate(vs))
                for name, labels, ts, vs in self._chunks.values()]


class _Scraped:
    """One node's series as its scrape profile stores them."""

    def __init__(self, sink: _Sink, node: Node) -> None:
        self._sink = sink
        self._target = node.target_labels if node.scrape_profile == "exported" else {}

    def add(self, name: str, labels: dict[str, str], t: np.ndarray, v: np.ndarray | float) -> None:
        if self._target:
            labels = {**{f"exported_{k}" if k in self._target else k: value for k, value in labels.items()},
                      **self._target}
        self._sink.add(name, labels, t, v)


def _scrape_times(node: Node, start: float, end: float, rng: np.random.Generator) -> np.ndarray:
    slots = start + node.phase_s + node.scrape_interval_s * np.arange(
        math.ceil((end - start) / node.scrape_interval_s) + 1)
    t = np.round(slots + rng.uniform(-node.jitter_s, node.jitter_s, slots.size), 3)
    t = t[(t >= start) & (t < end)]
    for m in node.missed:
        if t.size:
            t = np.delete(t, np.argmin(np.abs(t - m)))
    return t


def _last_restart(node: Node, t: np.ndarray) -> np.ndarray:
    """For each time, the latest restart at or before it (-inf when none)."""
    r = np.array([-np.inf, *sorted(node.restarts)])
    return r[np.searchsorted(r, t, side="right") - 1]


def _integrate(t: np.ndarray, rate: np.ndarray, node: Node, offset: float) -> np.ndarray:
    """A counter of rate x time as the exporter would read it at `t`: from `offset` at the window
    start, and from 0 again after each restart."""
    prev = np.concatenate([[t[0] - node.scrape_interval_s], t[:-1]])
    inc = rate * (t - np.maximum(prev, _last_restart(node, t)))
    total = np.cumsum(inc)
    epoch = np.searchsorted(np.array(sorted(node.restarts), dtype=float), t, side="right")
    # index of the first sample of each sample's epoch
    first = np.maximum.accumulate(np.where(np.r_[True, epoch[1:] != epoch[:-1]], np.arange(t.size), 0))
    return total - np.where(epoch == 0, -offset, (total - inc)[first])


def _holder_util(h: _Hold, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What one holder alone would drive the GPU's utilization to (%)."""
    w = h.workload
    if not w.busy:
        return rng.uniform(0.0, 1.0, t.size)
    if w.kind == "serving":
        phase = ((t - w.start) % SERVING_PERIOD_S) / SERVING_PERIOD_S
        return np.clip(10.0 + 80.0 * phase + rng.normal(0.0, 2.0, t.size), 10.0, 90.0)
    # never far below the mean, so a busy holder stays distinguishable from an idle one
    return np.clip(w.util_pct + rng.normal(0.0, 4.0, t.size), 0.6 * w.util_pct, 100.0)


def _model_figures(model: str) -> tuple[float, float, float]:
    """(framebuffer MiB, board power limit W, boost SM clock MHz) for a GPU model name."""
    gb = re.search(r"(\d+)GB", model)
    mib = int(gb.group(1)) * 1024 if gb else 24 * 1024
    for key, watts, mhz in (("H100", 700.0, 1980.0), ("A10G", 300.0, 1710.0), ("L4", 72.0, 2040.0)):
        if key in model:
            return mib, watts, mhz
    return mib, 400.0, 1410.0


def _segments(holds: list[tuple[_Hold, float, float]], start: float,
              end: float) -> list[tuple[float, float, list[_Hold]]]:
    """Cut [start, end) where the set of holders changes; each piece with its holders."""
    cuts = sorted({start, end} | {x for _, a, b in holds for x in (a, b) if start < x < end})
    return [(a, b, [h for h, s, e in holds if s <= a < e]) for a, b in zip(cuts, cuts[1:])]


def _device_labels(node: Node, gpu: int) -> dict[str, str]:
    labels = {"gpu": str(gpu), "UUID": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node.name}/{gpu}')}",
              "pci_bus_id": f"00000000:{0x10 + 0x10 * gpu:02X}:00.0", "device": f"nvidia{gpu}",
              "modelName": node.gpu_model, node.hostname_label: node.name}
    if node.exporter.startswith("dcgm"):
        labels["DCGM_FI_DRIVER_VERSION"] = DRIVER_VERSION
    return labels


def _pod_labels(node: Node, h: _Hold) -> dict[str, str]:
    labels = {"namespace": h.workload.namespace, "pod": h.pod, "container": h.container}
    if node.exporter in AGENT_EXPORTERS:
        labels["training_job"] = h.workload.name
    return labels


def _sample_gpu(node: Node, gpu: int, holds: list[_Hold], t: np.ndarray, start: float, end: float,
                rng: np.random.Generator, sink: _Scraped) -> None:
    scrape = {"instance": f"{node.name}:9400", "job": node.scrape_job}
    device = {**_device_labels(node, gpu), **scrape}
    fb_mib, watts, mhz = _model_figures(node.gpu_model)
    pieces = []  # (mask, holders) per segment
    util = np.zeros(t.size)
    fb = np.zeros(t.size)
    for a, b, holders in _segments([(h, h.workload.start, h.workload.end) for h in holds], start, end):
        mask = (t >= a) & (t < b)
        pieces.append((mask, holders))
        for h in holders:
            # time-sliced and MIG holders each drive their share of the GPU
            util[mask] += h.workload.share * _holder_util(h, t[mask], rng)
            fb[mask] += h.workload.share * fb_mib * (0.8 if h.workload.busy else 0.3)
    util = np.round(np.clip(util, 0.0, 100.0))  # DCGM reports whole percents
    power = np.round(0.15 * watts + 0.85 * watts * util / 100.0 + rng.normal(0.0, 2.0, t.size), 3)
    values = {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_FB_USED": np.round(fb),
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_SM_CLOCK": np.where(util > 0, mhz, 210.0),
        "DCGM_FI_DEV_GPU_TEMP": np.round(32.0 + 0.45 * util + rng.normal(0.0, 1.0, t.size)),
        # mJ since the driver loaded: a large offset before the first restart
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": np.round(_integrate(t, power * 1e3, node, rng.uniform(1e9, 1e11))),
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": np.zeros(t.size),
        "DCGM_FI_DEV_XID_ERRORS": np.zeros(t.size),
    }
    if node.exporter == "dcgm-4.9":
        values = {DCGM_49_NAMES[k][0]: v * DCGM_49_NAMES[k][1] for k, v in values.items()}
        values["DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"] = np.floor(values["DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"])
    for mask, holders in pieces:
        whole = holders[0] if len(holders) == 1 and holders[0].workload.share == 1 else None
        labels = {**device, **_pod_labels(node, whole)} if whole else device
        for name, v in values.items():
            sink.add(name, labels, t[mask], v[mask])
        if node.exporter in AGENT_EXPORTERS:
            for h in holders:
                held = {**device, **_pod_labels(node, h)}
                sink.add("burnrate_gpu_allocated", held, t[mask], 1.0)
                if node.exporter == "agent":
                    sink.add("burnrate_gpu_allocation_share_ratio", held, t[mask], h.workload.share)
    if node.exporter in AGENT_EXPORTERS:
        sink.add("burnrate_gpu_up", device, t, 1.0)
    if node.exporter == "agent":
        _sample_gpu_time(node, device, holds, t, start, rng, sink)


# The agent keeps a gone holder's GPU-second counters this long, so their last value is scraped
# (its --forget-after default).
KEEP_GONE_S = 300.0


def _sample_gpu_time(node: Node, device: dict[str, str], holds: list[_Hold], t: np.ndarray, start: float,
                     rng: np.random.Generator, sink: _Scraped) -> None:
    """The GPU-second counters (docs/metrics.md, "GPU-time"): the seconds the GPU was there since the agent
    started, and each holder's share-weighted seconds, all idle or all busy as its workload is
    (docs/report.md, `accounting`). Each counts from 0 again after an agent restart. A holder is its
    labels: one that comes back under the same labels (a pod re-created under its name) before the
    agent forgot it counts on from where it was; after, from 0."""
    restart = _last_restart(node, t)
    agent_start = start - rng.uniform(0.0, 1e6)
    sink.add("burnrate_gpu_observed_seconds_total", device, t, t - np.maximum(agent_start, restart))
    holders: dict[tuple, list[_Hold]] = {}
    for h in sorted(holds, key=lambda h: h.workload.start):
        holders.setdefault(tuple(sorted(_pod_labels(node, h).items())), []).append(h)
    for key, same in holders.items():
        # runs of holds the agent saw as one holder: each next one back within KEEP_GONE_S
        kept = [[same[0]]]
        for h in same[1:]:
            if h.workload.start - kept[-1][-1].workload.end < KEEP_GONE_S:
                kept[-1].append(h)
            else:
                kept.append([h])
        for run in kept:
            first, last = run[0].workload, run[-1].workload
            at = t[(t >= first.start) & (t < last.end + KEEP_GONE_S)]
            at = at[_last_restart(node, at) < last.end]  # an agent restarted after the holder left never saw it
            since = _last_restart(node, at)
            held, idle = np.zeros(at.size), np.zeros(at.size)
            for h in run:
                w = h.workload
                # the holder's seconds so far, from its start or the agent's last restart after it
                part = np.maximum(w.share * (np.minimum(at, w.end) - np.maximum(w.start, since)), 0.0)
                held += part
                idle += 0.0 if w.busy else part
            labels = {**device, **dict(key)}
            sink.add("burnrate_gpu_allocated_seconds_total", labels, at, held)
            sink.add("burnrate_gpu_idle_seconds_total", labels, at, idle)
            sink.add("burnrate_gpu_busy_seconds_total", labels, at, held - idle)


def _sample_training(node: Node, h: _Hold, t: np.ndarray, rng: np.random.Generator, sink: _Scraped) -> None:
    """One rank's burnrate_train_* series as the agent on its node reports them."""
    w = h.workload
    t = t[(t >= w.start) & (t < w.end)]
    if t.size == 0:
        return
    labels = {"namespace": w.namespace, "pod": h.pod, "training_job": w.name, "rank": str(h.rank),
              "Hostname": node.name, "instance": f"{node.name}:9400", "job": node.scrape_job}
    steps = np.floor((t - w.start) / w.step_s)
    # the agent sums telemetry deltas, so after its restart it counts from 0 again
    ref = np.maximum(_last_restart(node, t), w.start)
    since = steps - np.floor((ref - w.start) / w.step_s)
    counters = {
        "burnrate_train_steps_total": since,
        "burnrate_train_step_seconds_total": since * w.step_s,
        "burnrate_train_data_wait_seconds_total": since * w.step_s * w.data_wait,
        "burnrate_train_compute_seconds_total": since * w.step_s * 0.85,
        "burnrate_train_samples_total": since * SAMPLES_PER_RANK_STEP,
        "burnrate_train_tokens_total": since * w.tokens_per_step / w.world_size,
    }
    gauges = {
        "burnrate_train_loss": 1.5 + 2.5 * np.exp(-steps / 2000.0) + rng.normal(0.0, 0.02, t.size),
        "burnrate_train_mfu_ratio": np.clip(0.45 * w.util_pct / 100.0 + rng.normal(0.0, 0.01, t.size), 0.0, 1.0),
        "burnrate_train_last_step_timestamp_seconds": w.start + steps * w.step_s,
        "burnrate_train_world_size": np.full(t.size, float(w.world_size)),
    }
    for name, v in {**counters, **gauges}.items():
        sink.add(name, labels, t, v)


def _sample_pod_owners(workloads: tuple[Workload, ...], pods: dict[Workload, list[str]], start: float,
                       end: float, seed: int, sink: _Sink) -> None:
    """kube-state-metrics' kube_pod_owner (and kube_replicaset_owner behind Deployments)."""
    grid = start + KSM_SCRAPE_S * np.arange(math.ceil((end - start) / KSM_SCRAPE_S))
    scrape = {"instance": "10.0.0.2:8080", "job": "kube-state-metrics"}
    for w in workloads:
        t = grid[(grid >= w.start) & (grid < w.end)]
        for pod in pods[w]:
            kind, owner = _pod_owner(w, pod)
            uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}/{w.namespace}/{pod}"))
            sink.add("kube_pod_owner", {"namespace": w.namespace, "pod": pod, "uid": uid, "owner_kind": kind,
                                        "owner_name": owner, "owner_is_controller": "true", **scrape}, t, 1.0)
        kind, owner = _pod_owner(w, pods[w][0])
        if kind == "ReplicaSet":  # one ReplicaSet behind all of a Deployment's pods
            sink.add("kube_replicaset_owner", {"namespace": w.namespace, "replicaset": owner,
                                               "owner_kind": "Deployment", "owner_name": w.name,
                                               "owner_is_controller": "true", **scrape}, t, 1.0)


def generate(nodes: tuple[Node, ...] | list[Node], workloads: tuple[Workload, ...] | list[Workload],
             start: float, end: float, seed: int) -> Fleet:
    """Sample every node's exporter over [start, end) and compute the exact truth."""
    nodes, workloads = tuple(nodes), tuple(workloads)
    _validate(nodes, workloads)
    rng = np.random.default_rng(seed)
    sink = _Sink()
    pods = {w: pod_names(w, seed) for w in workloads}
    holds: dict[tuple[str, int], list[_Hold]] = {}
    for w in workloads:
        rank = 0
        for (node, gpus), pod in zip(w.placements, pods[w]):
            for g in gpus:
                holds.setdefault((node, g), []).append(_Hold(w, pod, _container(w), rank))
                rank += 1
    for node in nodes:
        t = _scrape_times(node, start, end, rng)
        if t.size == 0:
            continue
        scraped = _Scraped(sink, node)
        scraped.add("up", {"instance": f"{node.name}:9400", "job": node.scrape_job}, t, 1.0)
        for g in range(node.gpus):
            _sample_gpu(node, g, holds.get((node.name, g), []), t, start, end, rng, scraped)
        if node.exporter in AGENT_EXPORTERS:
            scraped.add("burnrate_node_info", {
                "Hostname": node.name, "instance_type": node.instance_type, "capacity_type": node.capacity_type,
                "zone": node.zone, "gpu_model": node.gpu_model, "gpu_count": str(node.gpus),
                "instance": f"{node.name}:9400", "job": node.scrape_job}, t, 1.0)
            for g in range(node.gpus):
                for h in holds.get((node.name, g), []):
                    if h.workload.telemetry and h.workload.kind == "training":
                        _sample_training(node, h, t, rng, scraped)
    _sample_pod_owners(workloads, pods, start, end, seed, sink)
    return Fleet(start, end, nodes, workloads, sink.series(), compute_truth(nodes, workloads, start, end), seed)


# ---------------------------------------------------------------------------------------------
# writers

def _family(name: str) -> tuple[str, str]:
    """(OpenMetrics family name, type). DCGM's counters have no _total suffix, which OpenMetrics
    requires of a counter's samples (promtool 2.42 lets it pass, stricter parsers need not), so
    they are declared `unknown`; burnrate's are true counters."""
    if name.startswith("burnrate_") and name.endswith("_total"):
        return name[: -len("_total")], "counter"
    return name, "unknown" if name in DCGM_COUNTERS else "gauge"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _om_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def openmetrics(fleet: Fleet) -> str:
    """The fleet as OpenMetrics text with timestamps, as `promtool tsdb create-blocks-from
    openmetrics` reads it: one TYPE line per family, each family's samples together, `# EOF` last."""
    families: dict[str, list[Series]] = {}
    for s in fleet.series:
        families.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name in sorted(families):
        family, kind = _family(name)
        lines.append(f"# TYPE {family} {kind}")
        for s in families[name]:
            head = name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items()) + "}"
            lines.extend(f"{head} {_om_value(v)} {t:.3f}" for t, v in zip(s.t.tolist(), s.v.tolist()))
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill_prometheus(fleet: Fleet, tmp_path: Path) -> str:
    """Write the fleet into TSDB blocks with promtool; returns the directory to start Prometheus on."""
    source = Path(tmp_path) / "fleet.om"
    source.write_text(openmetrics(fleet))
    blocks = Path(tmp_path) / "blocks"
    promtool_backfill(source, blocks)
    return str(blocks)


def import_lines(series: list[Series]) -> bytes:
    """VictoriaMetrics' JSON lines, each value spelt as its parser reads it: it drops a line with
    JSON's own `Infinity` without a word, and reads `+Inf` (as its export writes it)."""
    return "".join(json.dumps({"metric": {"__name__": s.name, **s.labels}})[:-1]
                   + ', "values": [' + ", ".join(map(_om_value, s.v.tolist())) + "]"
                   + ', "timestamps": ' + json.dumps(np.round(s.t * 1000).astype(np.int64).tolist()) + "}\n"
                   for s in series).encode()


def import_victoria(fleet: Fleet, url: str, batch: int = 500) -> None:
    """POST the fleet to VictoriaMetrics' JSON-lines import, then flush so queries see it at once."""
    for i in range(0, len(fleet.series), batch):
        request = urllib.request.Request(f"{url}/api/v1/import", data=import_lines(fleet.series[i:i + batch]),
                                         method="POST")
        with urllib.request.urlopen(request, timeout=60) as resp:
            resp.read()
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=60) as resp:
        resp.read()
    _await_series(fleet, url)


def _await_series(fleet: Fleet, url: str, timeout_s: float = 30.0) -> None:
    """Until VictoriaMetrics finds every imported series: a flush makes the samples searchable,
    but the index entries of series it has never seen may follow a moment later, on a busy
    machine later still."""
    expected = len({(s.name, tuple(sorted(s.labels.items()))) for s in fleet.series if s.t.size})
    query = urllib.parse.urlencode({"query": f'count(last_over_time({{__name__=~".+"}}[{int(fleet.end - fleet.start) + 60}s]))',
                                    "time": f"{fleet.end + 30:.3f}"})
    deadline = time.monotonic() + timeout_s
    found = 0
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=60) as resp:
            result = json.loads(resp.read())["data"]["result"]
        found = int(float(result[0]["value"][1])) if result else 0
        if found >= expected:
            return
        time.sleep(0.2)
    raise AssertionError(f"VictoriaMetrics holds {found} of the {expected} series imported after {timeout_s:.0f} s")


# ---------------------------------------------------------------------------------------------
# hypothesis strategies

# (instance type, GPU model, GPUs): what EKS GPU nodes commonly are
_INSTANCES = (("p4d.24xlarge", "NVIDIA A100-SXM4-40GB", 8), ("p5.48xlarge", "NVIDIA H100 80GB HBM3", 8),
              ("g5.12xlarge", "NVIDIA A10G", 4), ("g5.2xlarge", "NVIDIA A10G", 1), ("g6.xlarge", "NVIDIA L4", 1))
_OWNERS = {"training": ("PyTorchJob",), "serving": ("Deployment", "StatefulSet"),
           "interactive": ("Notebook",), "batch": ("Job",)}
_NAMES = {"training": "llm", "serving": "chat-api", "interactive": "nb", "batch": "embed"}
MIN_JOB_S = 2 * 3600.0


@st.composite
def _node(draw: st.DrawFn, i: int, start: float, end: float) -> Node:
    instance_type, model, gpus = draw(st.sampled_from(_INSTANCES))
    interval = float(draw(st.integers(10, 120)))
    return Node(
        name=f"ip-10-0-{i}-{draw(st.integers(2, 254))}.ec2.internal", gpus=gpus,
        exporter=draw(st.sampled_from(EXPORTERS)), scrape_interval_s=interval,
        jitter_s=draw(st.floats(0.0, 0.2 * interval)), phase_s=draw(st.floats(0.0, interval, exclude_max=True)),
        instance_type=instance_type, capacity_type=draw(st.sampled_from(("on-demand", "spot"))),
        zone=draw(st.sampled_from(("us-east-1a", "us-east-1b", "us-west-2c"))), gpu_model=model,
        missed=tuple(draw(st.lists(st.floats(start, end), max_size=3))),
        restarts=tuple(draw(st.lists(st.floats(start + 600.0, end - 600.0), max_size=1))),
        scrape_profile=draw(st.sampled_from(SCRAPE_PROFILES)))


def _free_gpus(node: Node, load: dict, share: float, t0: float, t1: float) -> list[int]:
    return [g for g in range(node.gpus) if peak_share(load.get((node.name, g), []), t0, t1) + share <= 1 + 1e-9]


@st.composite
def _workload(draw: st.DrawFn, i: int, nodes: list[Node], start: float, end: float,
              load: dict[tuple[str, int], list[tuple[float, float, float]]]) -> Workload | None:
    """A workload that fits beside those already in `load`, or None when none fits."""
    kind = draw(st.sampled_from(KINDS))
    # at least MIN_JOB_S inside the window, so one scrape interval at each end stays under 1 %
    t0 = draw(st.floats(start - MIN_JOB_S, end - MIN_JOB_S))
    t1 = draw(st.floats(max(t0, start) + MIN_JOB_S, end + MIN_JOB_S))
    # Only the current agent reports a GPU's share; elsewhere a fractional holder is invisible
    # or would read as a whole GPU, so fractions go to "agent" nodes only, on a single GPU. They
    # are always busy, and never serving (whose saw-tooth trough x 1/7 reads as idle), because a
    # shared GPU's utilization cannot be split between its holders.
    shared_nodes = [n for n in nodes if n.exporter == "agent"]
    share = 1.0
    if kind in ("interactive", "batch") and shared_nodes and draw(st.booleans()):
        share = 1.0 / draw(st.sampled_from((7, 2, 3, 4)))
    idle = share == 1.0 and draw(st.integers(0, 3)) == 0
    util = 0.0 if idle else draw(st.floats(30.0, 100.0))
    if share < 1:
        options = [(n, g) for n in shared_nodes for g in _free_gpus(n, load, share, t0, t1)]
        if not options:
            return None
        node, g = draw(st.sampled_from(options))
        placements = ((node.name, (g,)),)
    else:
        pods = draw(st.integers(1, len(nodes))) if kind == "training" else 1
        per_pod = draw(st.integers(1, 8 if kind == "training" else 2))
        placements = []
        for node in draw(st.permutations(nodes)):
            free = _free_gpus(node, load, 1.0, t0, t1)
            if free and len(placements) < pods:
                placements.append((node.name, tuple(free[:per_pod])))
        if not placements:
            return None
        placements = tuple(placements)
    telemetry = kind == "training" and draw(st.booleans())
    return Workload(namespace=draw(st.sampled_from(("ml", "research", "inference", "team-a"))),
                    name=f"{_NAMES[kind]}-{i}", kind=kind, owner_kind=draw(st.sampled_from(_OWNERS[kind])),
                    placements=placements, start=t0, end=t1, share=share, util_pct=util, telemetry=telemetry,
                    tokens_per_step=draw(st.floats(1e4, 4e6)) if telemetry else 0.0,
                    step_s=draw(st.floats(0.2, 5.0)))


@st.composite
def fleets(draw: st.DrawFn, max_nodes: int = 4, max_workloads: int = 6) -> Fleet:
    """1..max_nodes nodes with mixed exporters and scrape settings, 1..max_workloads workloads over
    a 6..24 h window, never over-committing a GPU."""
    start = BASE_TIME + 3600.0 * draw(st.integers(0, 24 * 30))
    end = start + 3600.0 * draw(st.integers(6, 24))
    nodes = [draw(_node(i, start, end)) for i in range(draw(st.integers(1, max_nodes)))]
    load: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    workloads = []
    for i in range(draw(st.integers(1, max_workloads))):
        w = draw(_workload(i, nodes, start, end, load))
        if w is None:
            continue
        workloads.append(w)
        for node, gpus in w.placements:
            for g in gpus:
                load.setdefault((node, g), []).append((w.start, w.end, w.share))
    return generate(tuple(nodes), tuple(workloads), start, end, seed=draw(st.integers(0, 2 ** 32 - 1)))
