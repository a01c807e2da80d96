"""Which device fields are exported: dcgm-exporter's default counters, or a counters file
in dcgm-exporter's own format (`--collectors FILE`), so that a cluster's existing counters
ConfigMap works unchanged.

The format, as dcgm-exporter reads it: one field per line, `DCGM field, Prometheus type,
help`; `#` starts a comment; blank lines are skipped. Type `label` puts a static value on
the other series as a label (burnrate knows DCGM_FI_DRIVER_VERSION). burnrate's own
series (burnrate_*) are exported whatever the file says.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from . import catalog as C
from . import labels as L

TYPES = {"gauge", "counter", "histogram", "summary"}
# Every label an agent series may carry: a label added to all of them must be none of these.
LABELS_IN_USE = frozenset(name for m in C.CATALOG for name in m.labels) | {L.DRIVER_VERSION}
LABEL_FIELDS = {L.DRIVER_VERSION}
_DEVICE = {m.name: m for m in C.CATALOG if m.dcgm}


class CountersError(ValueError):
    """A counters file burnrate cannot follow; the message names the file and line."""


@dataclass(frozen=True)
class Counters:
    fields: frozenset[str]                 # catalog names of the device series exported
    labels: frozenset[str] = frozenset()   # label fields put on them

    def exports(self, spec: C.MetricSpec) -> bool:
        return not spec.dcgm or spec.name in self.fields


DEFAULT = Counters(frozenset(m.name for m in _DEVICE.values() if m.default), frozenset(LABEL_FIELDS))


def parse(text: str, source: str = "counters") -> Counters:
    fields: set[str] = set()
    labels: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 3:
            raise CountersError(f"{where}: expected `field, type, help` (two commas): {line!r}")
        name, type_ = parts[0], parts[1].lower()
        if type_ == "label":
            if name not in LABEL_FIELDS:
                raise CountersError(f"{where}: {name} is not a label burnrate can add "
                                    f"(it knows {', '.join(sorted(LABEL_FIELDS))})")
            labels.add(name)
        elif type_ not in TYPES:
            raise CountersError(f"{where}: {type_!r} is not a Prometheus type (gauge, counter, label)")
        elif name not in _DEVICE:
            raise CountersError(f"{where}: {name} is not a field burnrate reads "
                                f"(docs/metrics.md lists the DCGM fields it exports)")
        else:
            fields.add(name)
    return Counters(frozenset(fields), frozenset(labels))


# dcgm-exporter's own files are a few KiB: a file far larger is a mistake, not read into memory.
MAX_BYTES = 1 << 20
# (open() itself refuses a directory.)
_NOT_FILES = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISSOCK, "a socket"))


def _without_blocking(path: str, flags: int) -> int:
    # A FIFO's open() waits for a writer, forever where none comes; regular files ignore the flag.
    return os.open(path, flags | os.O_NONBLOCK)


def read(path: str) -> Counters:
    try:
        with open(path, "rb", opener=_without_blocking) as fh:
            mode = os.fstat(fh.fileno()).st_mode
            kind = next((name for test, name in _NOT_FILES if test(mode)), None)
            if kind:
                raise CountersError(f"{path}: --collectors takes a counters file, not {kind}")
            data = fh.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise CountersError(f"{path}: over {MAX_BYTES >> 20} MiB, too large for a counters file")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CountersError(f"{path}: cannot read the counters file ({exc})") from None
    return parse(text, path)


def left_out(counters: Counters) -> list[str]:
    """The analysed device fields a counters file leaves out: findings that read them say so."""
    return sorted(m.name for m in _DEVICE.values() if m.recorded and m.name not in counters.fields)
