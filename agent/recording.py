"""`--record DIR`: the local store the analyzer reads when there is no Prometheus.

Layout (documented in docs/recording.md):

    DIR/burnrate.json                      format marker and version
    DIR/<table>/<segment>/keys.jsonl       {"key": n, "labels": {...}} per series
    DIR/<table>/<segment>/<column>.<dtype> one little-endian array per column

Each column is its own append-only file (`t.f8`, `key.u4`, `gpu_util.f4`, …), so
pandas/numpy load a column with one `fromfile` and only the columns asked for.
A crash mid-write leaves some columns a few bytes longer than others; readers take
the shortest complete length, so every row written before the crash stays
readable. Each agent start opens a new segment, so a torn tail is never appended to.
The agent writes with the standard library only (no numpy, no pandas).
"""
from __future__ import annotations

import json
import math
import os
import time
from array import array
from typing import Iterable, Mapping

from burnrate.exporter.recording import FORMAT, TABLES

from burnrate.exporter.snapshot import Snapshot

_TYPECODES = {"f8": "d", "f4": "f", "u4": "I"}
NAN = math.nan


class TableWriter:
    """One table's segment: a key dictionary and one append-only file per column."""

    def __init__(self, directory: str, label_names: tuple[str, ...], columns: Mapping[str, str]) -> None:
        os.makedirs(directory, exist_ok=True)
        self.label_names = label_names
        self._columns = {"t": "f8", "key": "u4", **columns}
        self._files = {c: open(os.path.join(directory, f"{c}.{d}"), "ab") for c, d in self._columns.items()}
        self._keys_file = open(os.path.join(directory, "keys.jsonl"), "a", encoding="utf-8")
        self._keys: dict[tuple[str, ...], int] = {}
        self._rows = {c: array(_TYPECODES[d]) for c, d in self._columns.items()}

    def key(self, labels: tuple[str, ...]) -> int:
        key = self._keys.get(labels)
        if key is None:
            key = self._keys[labels] = len(self._keys)
            line = json.dumps({"key": key, "labels": dict(zip(self.label_names, labels))})
            self._keys_file.write(line + "\n")
        return key

    def append(self, t: float, labels: tuple[str, ...], values: Mapping[str, float]) -> None:
        self._rows["t"].append(t)
        self._rows["key"].append(self.key(labels))
        for column, arr in self._rows.items():
            if column not in ("t", "key"):
                arr.append(float(values.get(column, NAN)))

    def extend(self, t: Iterable[float], keys: Iterable[int], columns: Mapping[str, Iterable[float]]) -> None:
        """Bulk rows for writers that build whole columns at once (the simulator)."""
        self._rows["t"].extend(t)
        self._rows["key"].extend(keys)
        for column, values in columns.items():
            self._rows[column].extend(values)

    def flush(self) -> None:
        # Keys first: a row must never reach disk before the key that names it.
        self._keys_file.flush()
        for column, arr in self._rows.items():
            arr.tofile(self._files[column])
            self._files[column].flush()
            del arr[:]

    def close(self) -> None:
        self.flush()
        for fh in (*self._files.values(), self._keys_file):
            os.fsync(fh.fileno())
            fh.close()


def open_recording(root: str, segment: str | None = None) -> dict[str, TableWriter]:
    os.makedirs(root, exist_ok=True)
    marker = os.path.join(root, "burnrate.json")
    if not os.path.exists(marker):
        tmp = marker + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(FORMAT, fh)
        os.replace(tmp, marker)
    segment = segment or f"{time.time_ns()}-{os.getpid()}"
    return {name: TableWriter(os.path.join(root, name, segment), labels, cols)
            for name, (labels, cols) in TABLES.items()}


class Recorder:
    """Appends every snapshot to a recording."""

    def __init__(self, root: str) -> None:
        self._tables = open_recording(root)

    def write(self, snap: Snapshot) -> None:
        t, host, tables = snap.time, snap.node.hostname, self._tables
        allocs: dict[str, list] = {}
        for a in snap.allocations:
            allocs.setdefault(a.gpu_uuid, []).append(a)
        for gpu in snap.gpus:
            i = gpu.identity
            device = (str(i.index), i.uuid, i.pci_bus_id, i.device, i.model_name, host)
            held = allocs.get(i.uuid, [])
            pod = held[0].pod if len(held) == 1 else None
            pod_labels = (pod.namespace, pod.pod, pod.container, pod.training_job) if pod else ("", "", "", "")
            values = dict(gpu.fields)
            values.update(up=1.0 if gpu.up else 0.0, last_xid=float(gpu.last_xid or 0),
                          xid_total=float(sum(gpu.xid_counts.values())),
                          nvlink_tx_bytes=gpu.nvlink_bytes.get("tx", NAN),
                          nvlink_rx_bytes=gpu.nvlink_bytes.get("rx", NAN))
            tables["gpu"].append(t, device + pod_labels, values)
            for a in held:
                p = a.pod
                tables["alloc"].append(t, device + (p.namespace, p.pod, p.container, p.training_job),
                                       {"share": a.share})
            for code, count in gpu.xid_counts.items():
                tables["xid"].append(t, device + (str(code),), {"count": count})
        for state in snap.ranks:
            k = state.key
            tables["rank"].append(t, (k.namespace, k.pod, k.training_job, str(k.rank), host), state.values)
        n = snap.node
        tables["node"].append(t, (host, n.instance_type, n.capacity_type, n.zone, snap.gpu_model,
                                  str(len(snap.gpus))), {"cpu_utilization": _nan(snap.host.cpu_utilization)})
        for (namespace, pod), seconds in snap.host.pod_cpu_seconds.items():
            tables["pod_cpu"].append(t, (namespace, pod, host), {"cpu_seconds": seconds})
        for table in tables.values():
            table.flush()

    def close(self) -> None:
        for table in self._tables.values():
            table.close()


def _nan(value: float | None) -> float:
    return NAN if value is None else value
