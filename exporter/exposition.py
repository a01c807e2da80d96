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
    if "\\" not in text and "\n" not in text and '"' not in text:
        return text
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(items: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in items) + "}"


class LabelTexts:
    """The text of each label set one render used, for the next: the same GPUs and ranks
    come back every snapshot. Only the last render's sets are kept, so the text of jobs and
    pods that went away goes with them: job names change with every run, and an agent runs
    for months (a cache of every set ever seen, up to 16,384 of about 900 bytes each, grew
    the agent by 0.25 MiB a minute with job names changing every 20 s: bench/soak.py)."""

    def __init__(self) -> None:
        self.last: dict[tuple[tuple[str, str], ...], str] = {}


def format_value(value: float) -> str:
    value = float(value)  # other collectors (ProcessCollector) give ints too
    if value.is_integer():  # false for NaN and the infinities
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    if math.isfinite(value):
        return repr(value)
    if value != value:
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def encode(families: Iterable[Metric], texts: LabelTexts | None = None) -> bytes:
    out: list[str] = []
    # A collector that shares one labels dict among many samples (collector._View) has it
    # rendered once: keyed by id(), holding the dict so that its id cannot be reused.
    rendered: dict[int, tuple[dict[str, str], str]] = {}
    last = texts.last if texts is not None else {}
    used: dict[tuple[tuple[str, str], ...], str] = {}
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
                    items = tuple(sorted(labels.items()))
                    text = used[items] = last.get(items) or used.get(items) or _labels(items)
                    known = rendered[id(labels)] = (labels, text)
                text = known[1]
            else:
                text = ""
            out.append(f"{s.name}{text} {format_value(s.value)}\n")
    if texts is not None:
        texts.last = used
    return "".join(out).encode("utf-8")
