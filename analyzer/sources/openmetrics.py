"""A recording as OpenMetrics text with timestamps, for back-filling Prometheus:

    promtool tsdb create-blocks-from openmetrics FILE DATA_DIR

Series carry the names and labels the agent exposes (exporter.catalog), so that a
back-filled recording answers the same PromQL as a scraped fleet. As in the
exposition, a device field the GPU did not give (NaN in the recording) is left
out, while NaN losses and gradient norms are kept as NaN.
"""
from __future__ import annotations

from typing import IO, Mapping, Sequence

import numpy as np
import pandas as pd

from burnrate.exporter import catalog as C
from burnrate.exporter import labels as L

from ..grid.frames import Window
from .recording_tables import load_table

# (table, metric, value column or a constant, label columns, extra labels, keep NaN)
_Family = tuple[str, C.MetricSpec, "str | float", tuple[str, ...], dict[str, str], bool]


def _families() -> list[_Family]:
    by = C.BY_NAME
    out: list[_Family] = []
    for spec in C.CATALOG:
        if spec.source == C.GPU_FIELD and spec.recorded:
            out.append(("gpu", spec, spec.field, C.DEVICE_POD, {}, False))
    out += [
        ("gpu", by["DCGM_FI_DEV_XID_ERRORS"], "last_xid", C.DEVICE_POD, {}, False),
        ("gpu", by["burnrate_gpu_up"], "up", C.DEVICE, {}, False),
        ("gpu", by["burnrate_gpu_nvlink_bytes_total"], "nvlink_tx_bytes", C.DEVICE, {"direction": "tx"}, False),
        ("gpu", by["burnrate_gpu_nvlink_bytes_total"], "nvlink_rx_bytes", C.DEVICE, {"direction": "rx"}, False),
        ("alloc", by["burnrate_gpu_allocated"], 1.0, C.DEVICE_POD, {}, False),
        ("alloc", by["burnrate_gpu_allocation_share_ratio"], "share", C.DEVICE_POD, {}, False),
        ("node", by["burnrate_node_info"], 1.0, L.NODE_INFO_LABELS, {}, False),
        ("node", by["burnrate_node_cpu_utilization_ratio"], "cpu_utilization", (L.HOSTNAME,), {}, False),
        ("pod_cpu", by["burnrate_pod_cpu_seconds_total"], "cpu_seconds", (L.NAMESPACE, L.POD, L.HOSTNAME), {}, False),
        ("xid", by["burnrate_gpu_xid_errors_total"], "count", C.DEVICE + ("xid",), {}, False),
    ]
    out += [("rank", spec, spec.field, C.T, {}, True) for spec in C.CATALOG if spec.source == C.RANK]
    return out


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _label_text(frame: pd.DataFrame, names: tuple[str, ...], extra: dict[str, str]) -> np.ndarray:
    """`{a="x",b="y"}` per row, built once per distinct label set; empty values left out
    (Prometheus treats an empty label as no label)."""
    groups = frame.groupby(list(names), observed=True, sort=False).ngroup().to_numpy()
    firsts = frame[list(names)].iloc[np.unique(groups, return_index=True)[1]]
    texts = []
    for row in firsts.itertuples(index=False):
        pairs = [f'{n}="{escape_label_value(str(v))}"' for n, v in zip(names, row) if str(v) != ""]
        pairs += [f'{n}="{escape_label_value(v)}"' for n, v in extra.items()]
        texts.append("{" + ",".join(pairs) + "}")
    return np.array(texts, dtype=object)[groups]


def _number(values: np.ndarray) -> np.ndarray:
    """Shortest text that reads back as the same float64 (numpy's str is repr), in OpenMetrics spelling."""
    values = values.astype(np.float64)
    text = values.astype(str).astype(object)
    text[np.isnan(values)] = "NaN"
    text[np.isposinf(values)] = "+Inf"
    text[np.isneginf(values)] = "-Inf"
    return text


def _family_type(spec: C.MetricSpec) -> tuple[str, str]:
    """(family name, OpenMetrics type). dcgm-exporter's counters lack `_total`, which
    OpenMetrics requires of counters, so they go in as `unknown`; the stored series are the same."""
    if spec.type == C.COUNTER and not spec.sample_name.endswith("_total"):
        return spec.sample_name, "unknown"
    if spec.type == C.COUNTER:
        return spec.sample_name[: -len("_total")], "counter"
    return spec.name, "gauge"


def write_openmetrics(root: str, out: IO[str], window: Window | None = None,
                      columns: Mapping[str, Sequence[str]] | None = None, end: bool = True) -> int:
    """Writes the recording at `root` to `out`; returns the number of samples written.
    `columns` keeps only those value columns per table (and the series that stand for a
    constant: allocation, node info), e.g. the analysis' own (analyzer.grid.views.ANALYSIS_COLUMNS);
    `end=False` leaves out `# EOF`, for more families to follow."""
    written = 0
    tables: dict[str, pd.DataFrame] = {}
    families: dict[str, list[_Family]] = {}
    for family in _families():
        table, _, column = family[:3]
        if columns is None or table in columns and (isinstance(column, float) or column in columns[table]):
            families.setdefault(family[1].name, []).append(family)
    for name, parts in families.items():
        spec = parts[0][1]
        family_name, kind = _family_type(spec)
        out.write(f"# TYPE {family_name} {kind}\n# HELP {family_name} {spec.help}\n")
        for table, _, column, names, extra, keep_nan in parts:
            if table not in tables:
                frame = load_table(root, table)
                if window is not None:
                    frame = frame[(frame["t"] >= window.start) & (frame["t"] <= window.end)]
                tables[table] = frame
            frame = tables[table]
            values = np.full(len(frame), column) if isinstance(column, float) else frame[column].to_numpy()
            keep = np.ones(len(frame), dtype=bool) if keep_nan else ~np.isnan(values.astype(np.float64))
            if not keep.any():
                continue
            part = frame[keep]
            lines = (spec.sample_name + _label_text(part, names, extra) + " " + _number(values[keep]) + " "
                     + part["t"].to_numpy().astype(str).astype(object))
            out.write("\n".join(lines.tolist()))
            out.write("\n")
            written += len(lines)
    if end:
        out.write("# EOF\n")
    return written

