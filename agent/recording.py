"""`--record DIR`: the local store the analyzer reads when there is no Prometheus.

Layout (documented in docs/recording.md):

    DIR/burnrate.json                      format marker and version
    DIR/<table>/<segment>/keys.jsonl       {"key": n, "labels": {...}} per series
    DIR/<table>/<segment>/<column>.<dtype> one little-endian array per column

Each column is its own append-only file (`t.f8`, `key.u4`, `gpu_util.f4`, …), so
pandas/numpy load a column with one `fromfile` and only the columns asked for.
Rows are written in batches, all or nothing: a write the disk refuses part-way (full,
failing) is cut back from every file, its rows stay in memory (the newest
MAX_PENDING_ROWS per table) and go out whole with the next batch. Within a batch the
time column is written last, so its length is the count of whole rows: a crash leaves
other columns longer, never shorter, and readers stop at the time column. Each agent
start opens a new segment, so a torn tail is never appended to.
The agent writes with the standard library only (no numpy, no pandas).
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from array import array
from typing import Callable, Iterable, Mapping

from burnrate.exporter.recording import FORMAT, TABLES

from burnrate.exporter.snapshot import Snapshot

log = logging.getLogger(__name__)
_TYPECODES = {"f8": "d", "f4": "f", "u4": "I"}
NAN = math.nan
# Rows a table holds while the disk refuses them; beyond it the oldest go. A gpu row is
# 144 bytes: 32,768 rows are ~5 MB, over an hour of an 8-GPU node sampled every second.
MAX_PENDING_ROWS = 1 << 15


class _AppendFile:
    """A file appended to whose length on disk is known, so that a failed append is cut back."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self.size = os.fstat(self._fd).st_size
        self._uncut = False  # a cut failed: the file may hold more than `size`

    def append(self, data: bytes) -> int:
        """Writes all of `data` (or raises OSError); the caller adds it to `size` once its batch is whole."""
        if self._uncut:
            os.ftruncate(self._fd, self.size)
            self._uncut = False
        written = 0
        while written < len(data):
            written += os.write(self._fd, data[written:] if written else data)
        return written

    def cut(self) -> None:
        try:
            os.ftruncate(self._fd, self.size)
        except OSError:
            self._uncut = True  # append() cuts again first

    def close(self) -> None:
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)


class TableWriter:
    """One table's segment: a key dictionary and one append-only file per column."""

    def __init__(self, directory: str, label_names: tuple[str, ...], columns: Mapping[str, str],
                 max_pending_rows: int = MAX_PENDING_ROWS) -> None:
        os.makedirs(directory, exist_ok=True)
        self.label_names = label_names
        self.max_pending_rows = max_pending_rows
        self.dropped = 0  # rows lost because the disk refused them for too long
        # Values first, then key, then t: t's length counts the rows written whole.
        self._columns = {**columns, "key": "u4", "t": "f8"}
        self._files = {c: _AppendFile(os.path.join(directory, f"{c}.{d}")) for c, d in self._columns.items()}
        self._keys_file = _AppendFile(os.path.join(directory, "keys.jsonl"))
        self._keys: dict[tuple[str, ...], int] = {}
        self._new_keys = bytearray()
        self._rows = {c: array(_TYPECODES[d]) for c, d in self._columns.items()}

    @property
    def pending(self) -> int:
        """Rows not yet written."""
        return len(self._rows["t"])

    def key(self, labels: tuple[str, ...]) -> int:
        key = self._keys.get(labels)
        if key is None:
            key = self._keys[labels] = len(self._keys)
            line = json.dumps({"key": key, "labels": dict(zip(self.label_names, labels))})
            self._new_keys += (line + "\n").encode()
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
        if len({len(arr) for arr in self._rows.values()}) != 1:
            raise ValueError("extend() needs every column of the table, each as long as t")

    def flush(self) -> None:
        """Writes the pending rows as one batch, or nothing: on OSError every file is cut
        back to where it was and the rows stay pending (the oldest dropped beyond
        max_pending_rows, counted in `dropped`); the next flush writes them again."""
        if not self.pending and not self._new_keys:
            return
        # Keys first: a row must never reach disk before the key that names it.
        batch = [(self._keys_file, self._new_keys), *((self._files[c], self._rows[c]) for c in self._columns)]
        written = []
        try:
            for file, rows in batch:
                written.append(file.append(bytes(rows)))  # a copy: the array stays resizable
        except OSError:
            for file, _ in batch:
                file.cut()
            self._bound()
            raise
        for (file, _), size in zip(batch, written):
            file.size += size
        del self._new_keys[:]
        for arr in self._rows.values():
            del arr[:]

    def _bound(self) -> None:
        excess = self.pending - self.max_pending_rows
        if excess > 0:
            for arr in self._rows.values():
                del arr[:excess]
            self.dropped += excess

    def close(self) -> None:
        """Flushes and closes every file, all of them even when one fails; raises the first OSError."""
        errors = []
        for step in (self.flush, *(file.close for file in (*self._files.values(), self._keys_file))):
            try:
                step()
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


def open_recording(root: str, segment: str | None = None,
                   max_pending_rows: int = MAX_PENDING_ROWS) -> dict[str, TableWriter]:
    os.makedirs(root, exist_ok=True)
    marker = os.path.join(root, "burnrate.json")
    if not os.path.exists(marker):
        tmp = marker + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(FORMAT, fh)
        os.replace(tmp, marker)
    segment = segment or f"{time.time_ns()}-{os.getpid()}"
    return {name: TableWriter(os.path.join(root, name, segment), labels, cols, max_pending_rows)
            for name, (labels, cols) in TABLES.items()}


class Recorder:
    """Appends every snapshot to a recording. While the disk refuses rows, write() raises
    (the sampler counts it in burnrate_agent_collection_errors_total{collector="record"})
    and the log says when rows start to be dropped and what was lost once writing resumes."""

    def __init__(self, root: str, max_pending_rows: int = MAX_PENDING_ROWS) -> None:
        self.root = root
        self._tables = open_recording(root, max_pending_rows=max_pending_rows)
        self._max_pending = max_pending_rows
        self._failing: int | None = None  # while failing: the rows dropped before it began
        self._dropping = False

    @property
    def dropped(self) -> int:
        """Rows lost because the disk refused them for too long."""
        return sum(table.dropped for table in self._tables.values())

    @property
    def pending(self) -> int:
        return sum(table.pending for table in self._tables.values())

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
        self._flush(TableWriter.flush)

    def close(self) -> None:
        try:
            self._flush(TableWriter.close)
        except OSError as exc:
            log.error("recording to %s: %s rows never written (%s)", self.root, f"{self.pending:,}",
                      exc.strerror or exc)

    def _flush(self, step: Callable[[TableWriter], None]) -> None:
        """`step` on every table, each tried whatever the others did; raises the first OSError."""
        held, dropped, failures = self.pending, self.dropped, []
        for table in self._tables.values():
            try:
                step(table)
            except OSError as exc:
                failures.append(exc)
        if failures:
            if self._failing is None:
                self._failing = dropped
                log.warning("recording to %s failing (%s): rows are held in memory, the newest %s per table, "
                            "until the disk takes them", self.root, failures[0].strerror or failures[0],
                            f"{self._max_pending:,}")
            if self.dropped > self._failing and not self._dropping:
                log.warning("recording to %s still failing: rows beyond %s per table are dropped, the oldest first",
                            self.root, f"{self._max_pending:,}")
            self._dropping = self.dropped > self._failing
            raise failures[0]
        if self._failing is not None:
            log.warning("recording to %s resumed: %s held rows written, %s dropped while it failed", self.root,
                        f"{held:,}", f"{self.dropped - self._failing:,}")
            self._failing, self._dropping = None, False


def _nan(value: float | None) -> float:
    return NAN if value is None else value
