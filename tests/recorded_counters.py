"""The GPU-second counters an agent would have exposed beside a recording's samples.

A recording keeps gauges, not the agent's GPU-second counters (they are exposition only).
To put a recorded or simulated fleet into a TSDB with its roll-ups, its GPU and allocation
rows are replayed, collection by collection, through the agent's own counting
(agent.gpu_time.GpuClock), one clock per node, and written as OpenMetrics families."""
from __future__ import annotations

from burnrate.agent.gpu_time import GpuClock
from burnrate.analyzer.recording import load_table
from burnrate.exporter import catalog as C
from burnrate.exporter.snapshot import Allocation, GpuIdentity, GpuReading, PodRef

FAMILIES = ("burnrate_gpu_observed_seconds_total", "burnrate_gpu_allocated_seconds_total",
            "burnrate_gpu_idle_seconds_total", "burnrate_gpu_busy_seconds_total")


def _labels(names: tuple[str, ...], row) -> str:
    return "{" + ",".join(f'{n}="{row[n]}"' for n in names) + "}"


def gpu_time_openmetrics(root: str, interval_s: float, keep_s: float = 300.0) -> str:
    """The four counter families, as `# TYPE` blocks of OpenMetrics text (no `# EOF`)."""
    gpu = load_table(root, "gpu")
    alloc = load_table(root, "alloc")
    device, holder = C.BY_NAME[FAMILIES[0]].labels, C.BY_NAME[FAMILIES[1]].labels
    lines: dict[str, list[str]] = {name: [] for name in FAMILIES}
    for host, rows in gpu.groupby("Hostname", observed=True):
        clock = GpuClock(interval_s, keep_s)
        held = alloc[alloc["Hostname"] == host]
        held_at = {t: part for t, part in held[held["share"] > 0].groupby("t")}
        for t, now in rows.groupby("t"):
            readings, labels_of = [], {}
            for row in now.drop_duplicates("UUID").to_dict("records"):
                fields = {"gpu_util": float(row["gpu_util"])} if row["gpu_util"] == row["gpu_util"] else {}
                identity = GpuIdentity(int(row["gpu"]), row["UUID"], row["pci_bus_id"], row["modelName"])
                readings.append(GpuReading(identity, row["up"] > 0.5, fields))
                labels_of[row["UUID"]] = row
            allocations = [Allocation(a["UUID"], a["UUID"], PodRef(a["namespace"], a["pod"], a["container"],
                                                                   a["training_job"]), float(a["share"]))
                           for a in held_at[t].to_dict("records")] if t in held_at else []
            stamp = f"{t:.3f}"
            for entry in clock.advance(float(t), readings, allocations):
                row = labels_of.get(entry.gpu.identity.uuid)
                if row is None:
                    continue
                lines[FAMILIES[0]].append(f"{FAMILIES[0]}{_labels(device, row)} {entry.observed!r} {stamp}")
                for h in entry.holders:
                    pod = {**row, "namespace": h.pod.namespace, "pod": h.pod.pod, "container": h.pod.container,
                           "training_job": h.pod.training_job}
                    for name, value in zip(FAMILIES[1:], (h.allocated, h.idle, h.busy)):
                        lines[name].append(f"{name}{_labels(holder, pod)} {value!r} {stamp}")
    out = []
    for name in FAMILIES:
        out.append(f"# TYPE {name[:-len('_total')]} counter")
        out.extend(lines[name])
    return "\n".join(out) + "\n"
