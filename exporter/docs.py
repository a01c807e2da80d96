"""docs/metrics.md, written from the catalog (`python -m burnrate.exporter.docs > docs/metrics.md`).

A test checks that the committed file matches, so the doc can never drift.
"""
from __future__ import annotations

from . import catalog as C

HEADER = """# Metrics

Every series the burnrate agent exposes, generated from `exporter/catalog.py`.
Device series use NVIDIA dcgm-exporter 4.8's names, units and labels, so existing
dashboards (NVIDIA's Grafana dashboard 12239 among them) and alert rules work
unchanged. A field the GPU cannot give is absent, never a fake 0.

Device labels: `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`; while
one running pod holds the GPU also `namespace`, `pod`, `container`, `training_job`; on
the DCGM series also `DCGM_FI_DRIVER_VERSION`, as dcgm-exporter adds it.
Training labels (T): `namespace`, `pod`, `training_job`, `rank`, `Hostname`.

Without `--collectors`, the DCGM series exported are dcgm-exporter's default set. A
counters file in dcgm-exporter's format chooses them instead; the ones marked *on
request* are exported only when a counters file names them. burnrate's own series are
always exported.

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
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render(), end="")
