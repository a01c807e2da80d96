"""The GPU-second counters an agent would have exposed beside a recording's samples.

A recording keeps gauges, not the agent's GPU-second counters (they are exposition only).
To put a recorded or simulated fleet into a TSDB with its roll-ups, its GPU and allocation
rows are replayed, collection by collection, through the agent's own counting
(agent.gpu_time.GpuClock), one clock per node, and written as OpenMetrics families."""
from __future__ import annotations

import shutil
import tempfile
from typing import IO

import numpy as np

from burnrate.agent.gpu_time import GpuClock
from burnrate.analyzer.sources.recording_tables import load_table
from burnrate.exporter import catalog as C
from burnrate.exporter.snapshot import Allocation, GpuIdentity, GpuReading, PodRef

FAMILIES = ("burnrate_gpu_observed_seconds_total", "burnrate_gpu_allocated_seconds_total",
            "burnrate_gpu_idle_seconds_total", "burnrate_gpu_busy_seconds_total")


def _labels(names: tuple[str, ...], values: dict[str, str]) -> str:
    return "{" + ",".join(f'{n}="{values[n]}"' for n in names) + "}"


def _runs(keys: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal keys in a sorted array."""
    edges = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True])
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def write_gpu_time(root: str, out: IO[str], interval_s: float, keep_s: float = 300.0) -> int:
    """The four counter families, as `# TYPE` blocks of OpenMetrics text (no `# EOF`);
    returns the number of samples written."""
    gpu = load_table(root, "gpu").drop_duplicates(["t", "UUID"])
    alloc = load_table(root, "alloc")
    alloc = alloc[alloc["share"] > 0]
    device, holder = C.BY_NAME[FAMILIES[0]].labels, C.BY_NAME[FAMILIES[1]].labels
    # A family's samples must come together: each is written to a file of its own, node by node.
    with tempfile.TemporaryDirectory(prefix="burnrate-counters-") as tmp:
        files = {name: open(f"{tmp}/{name}", "w+", encoding="utf-8") for name in FAMILIES}
        try:
            held = {str(host): rows for host, rows in alloc.groupby("Hostname", observed=True)}
            written = sum(_node(rows, held.get(str(host), alloc.iloc[:0]), files, device, holder, interval_s, keep_s)
                          for host, rows in gpu.groupby("Hostname", observed=True))
            for name, fh in files.items():
                out.write(f"# TYPE {name[:-len('_total')]} counter\n")
                fh.seek(0)
                shutil.copyfileobj(fh, out)
        finally:
            for fh in files.values():
                fh.close()
    return written


def _node(mine, held, files: dict[str, IO[str]], device: tuple[str, ...], holder: tuple[str, ...],
          interval_s: float, keep_s: float) -> int:
    """One node's collections through its own clock."""
    lines: dict[str, list[str]] = {name: [] for name in FAMILIES}
    mine, held = mine.sort_values("t", kind="stable"), held.sort_values("t", kind="stable")
    labels = {u: {n: str(v) for n, v in zip(device, row)}
              for u, row in zip(mine["UUID"].astype(str), mine[list(device)].astype(str).itertuples(index=False))}
    t, uuid, index = mine["t"].to_numpy(), mine["UUID"].astype(str).to_numpy(), mine["gpu"].astype(int).to_numpy()
    pci, model = mine["pci_bus_id"].astype(str).to_numpy(), mine["modelName"].astype(str).to_numpy()
    util, up = mine["gpu_util"].to_numpy(np.float64), mine["up"].to_numpy(np.float64)
    ht, hu, hs = held["t"].to_numpy(), held["UUID"].astype(str).to_numpy(), held["share"].to_numpy(np.float64)
    pods = list(zip(*(held[c].astype(str).to_numpy() for c in ("namespace", "pod", "container", "training_job"))))
    spans = dict(zip(ht[[a for a, _ in _runs(ht)]].tolist(), _runs(ht))) if len(ht) else {}
    clock = GpuClock(interval_s, keep_s)
    for a, b in _runs(t):
        now = float(t[a])
        readings = [GpuReading(GpuIdentity(int(index[i]), uuid[i], pci[i], model[i]), up[i] > 0.5,
                               {"gpu_util": float(util[i])} if util[i] == util[i] else {}) for i in range(a, b)]
        ha, hb = spans.get(now, (0, 0))
        allocations = [Allocation(hu[i], hu[i], PodRef(*pods[i]), float(hs[i])) for i in range(ha, hb)]
        stamp = f"{now:.3f}"
        for entry in clock.advance(now, readings, allocations):
            where = labels[entry.gpu.identity.uuid]
            lines[FAMILIES[0]].append(f"{FAMILIES[0]}{_labels(device, where)} {entry.observed!r} {stamp}")
            for h in entry.holders:
                pod = {**where, "namespace": h.pod.namespace, "pod": h.pod.pod, "container": h.pod.container,
                       "training_job": h.pod.training_job}
                for name, value in zip(FAMILIES[1:], (h.allocated, h.idle, h.busy)):
                    lines[name].append(f"{name}{_labels(holder, pod)} {value!r} {stamp}")
    for name, fh in files.items():
        fh.write("".join(line + "\n" for line in lines[name]))
    return sum(len(v) for v in lines.values())
