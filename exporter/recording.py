"""The recording format (docs/recording.md): its marker and its tables, plain data that
the agent writes (`burnrate agent --record`), the simulator writes and the analyzer
reads, so that none of them imports another to agree on it.

Each table is (key label names, value columns with their dtypes); every column is one
little-endian array file per segment, `t.f8` and `key.u4` besides the values.
"""
from __future__ import annotations

from . import catalog as C
from . import labels as L

FORMAT = {"format": "burnrate-recording", "version": 1}


def _gpu_columns() -> dict[str, str]:
    cols = {"up": "f4"}
    for spec in C.CATALOG:
        if spec.source == C.GPU_FIELD and spec.recorded:
            cols[spec.field] = "f8" if spec.type == C.COUNTER else "f4"
    cols.update({"nvlink_tx_bytes": "f8", "nvlink_rx_bytes": "f8", "last_xid": "f4", "xid_total": "f8"})
    return cols


# table -> (key label names, value columns with dtypes)
TABLES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "gpu": (L.DEVICE_LABELS + L.POD_LABELS, _gpu_columns()),
    "alloc": (L.DEVICE_LABELS + L.POD_LABELS, {"share": "f4"}),
    "rank": (L.RANK_LABELS, {f: "f8" for f in C.RANK_FIELDS}),
    "node": (L.NODE_INFO_LABELS, {"cpu_utilization": "f4"}),
    "pod_cpu": ((L.NAMESPACE, L.POD, L.HOSTNAME), {"cpu_seconds": "f8"}),
    "xid": (L.DEVICE_LABELS + ("xid",), {"count": "f8"}),
}
