"""The Prometheus text format (0.0.4), written from metric families.

prometheus_client's generate_latest appends `_total` to every counter's TYPE line;
dcgm-exporter's counters (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, …) carry no such
suffix, and dashboards query them by their bare names. This encoder names each
family after its samples, so both kinds come out as their consumers expect.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable

from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    if "\\" not in text and "\n" not in text and '"' not in text:
        return text
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# The same label sets come back every snapshot (GPUs and ranks change rarely), so
# their rendered form is kept; the agent bounds label cardinality, so is this.
@lru_cache(maxsize=16384)
def _labels(items: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in items) + "}"


def format_value(value: float) -> str:
    value = float(value)  # other collectors (ProcessCollector) give ints too
    if value.is_integer():  # false for NaN and the infinities
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    if math.isfinite(value):
        return repr(value)
    if value != value:
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def encode(families: Iterable[Metric]) -> bytes:
    out: list[str] = []
    # A collector that shares one labels dict among many samples (collector._View) has it
    # rendered once: keyed by id(), holding the dict so that its id cannot be reused.
    rendered: dict[int, tuple[dict[str, str], str]] = {}
    for family in families:
        if not family.samples:
            continue
        name = family.samples[0].name if family.type == "counter" else family.name
        out.append(f"# HELP {name} {_escape_help(family.documentation)}\n")
        out.append(f"# TYPE {name} {family.type}\n")
        for s in family.samples:
            labels = s.labels
            if labels:
                known = rendered.get(id(labels))
                if known is None:
                    known = rendered[id(labels)] = (labels, _labels(tuple(sorted(labels.items()))))
                text = known[1]
            else:
                text = ""
            out.append(f"{s.name}{text} {format_value(s.value)}\n")
    return "".join(out).encode("utf-8")
