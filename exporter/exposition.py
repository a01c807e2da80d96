"""The Prometheus text format (0.0.4), written from metric families.

prometheus_client's generate_latest appends `_total` to every counter's TYPE line;
dcgm-exporter's counters (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, …) carry no such
suffix, and dashboards query them by their bare names. This encoder names each
family after its samples, so both kinds come out as their consumers expect.
"""
from __future__ import annotations

import math
from typing import Iterable

from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def encode(families: Iterable[Metric]) -> bytes:
    out: list[str] = []
    for family in families:
        if not family.samples:
            continue
        name = family.samples[0].name if family.type == "counter" else family.name
        out.append(f"# HELP {name} {_escape_help(family.documentation)}\n")
        out.append(f"# TYPE {name} {family.type}\n")
        for s in family.samples:
            if s.labels:
                labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(s.labels.items()))
                out.append(f"{s.name}{{{labels}}} {format_value(s.value)}\n")
            else:
                out.append(f"{s.name} {format_value(s.value)}\n")
    return "".join(out).encode("utf-8")
