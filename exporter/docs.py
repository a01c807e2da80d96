"""docs/metrics.md, written from the catalog (`python -m burnrate.exporter.docs > docs/metrics.md`).

A test checks that the committed file matches, so the doc can never drift.
"""
from __future__ import annotations

from . import catalog as C

HEADER = """# Metrics

Every series the burnrate agent exposes, generated from `exporter/catalog.py`.
Device series use NVIDIA dcgm-exporter 4.8's names, units and labels, so existing
dashboards (NVIDIA's Grafana dashboard 12239 among them) and alert rules work
unchanged (a test runs all of that dashboard's queries against a real Prometheus scraping
the agent). A field the GPU cannot give is absent, never a fake 0. burnrate's own series
follow Prometheus naming (`_total`, base units, `_timestamp_seconds`) and never use a
label called `job`.

Device labels: `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`; while
one running pod holds the GPU also `namespace`, `pod`, `container`, `training_job`; on
the DCGM series also `DCGM_FI_DRIVER_VERSION`, as dcgm-exporter adds it.
Training labels (T): `namespace`, `pod`, `training_job`, `rank`, `Hostname`.

Without `--collectors`, the DCGM series exported are dcgm-exporter's default set. A
counters file in dcgm-exporter's format chooses them instead; the ones marked *on
request* are exported only when a counters file names them. burnrate's own series are
always exported.

"""

FOOTER = """
## GPU-time

GPU-time is also counted, so that cost and waste are an `increase()` over any window,
whatever the scrape interval and however many scrapes were missed:
`burnrate_gpu_observed_seconds_total` per GPU, and per GPU and holder
`burnrate_gpu_allocated_seconds_total` (times the holder's share; shares adding up to more
than a GPU split it), split into `burnrate_gpu_idle_seconds_total` (utilization at or below
2%, the analyzer's idle threshold) and `burnrate_gpu_busy_seconds_total` (above it, or
unknown). `sum by (namespace, training_job) (increase(burnrate_gpu_allocated_seconds_total[7d])) / 3600`
is each job's GPU-hours for the week. Each collection adds the time since the previous one
to what that one saw; a gap past Prometheus' 5-minute staleness counts one interval, not
the gap; every series starts at 0 and stays `--forget-after` after its GPU or pod is gone,
so its first and last seconds are both scraped. `tests/test_gpu_time.py` checks
observed ≥ allocated = idle + busy and every second against the definitions, with
hypothesis varying cadence, gaps, shares and holders.
"""


def _labels(spec: C.MetricSpec) -> str:
    if spec.labels == C.DEVICE_POD:
        return "device + pod"
    if spec.labels[: len(C.DEVICE)] == C.DEVICE:
        extra = spec.labels[len(C.DEVICE):]
        return "device" + "".join(f", `{name}`" for name in extra)
    if spec.labels == C.T:
        return "T"
    return ", ".join(f"`{name}`" for name in spec.labels)


def render() -> str:
    rows = ["| name | type | unit | labels | meaning |", "|---|---|---|---|---|"]
    for spec in C.CATALOG:
        note = "" if spec.default else " *On request.*"
        rows.append(f"| `{spec.sample_name}` | {spec.type} | {spec.unit} | {_labels(spec)} | "
                    f"{spec.help.replace('|', '/')}{note} |")
    return HEADER + "\n".join(rows) + "\n" + FOOTER


if __name__ == "__main__":
    print(render(), end="")
