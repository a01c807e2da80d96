"""The agent's NVML reader against `nvidia-smi --query-gpu` on the same GPUs, field by field.

nvidia-smi reads the same driver through its own code; where both agree within what a
second between the two reads can move, the reader reads what the driver says.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    """A reader field, the nvidia-smi property that reports the same thing, and how far apart
    two reads a moment apart may be: absolute, in the field's unit, and relative."""
    field: str
    smi: str
    absolute: float
    relative: float = 0.0


# Utilization is sampled over different periods by the two (the reader averages NVML's
# samples since its last read), so it may differ by more than anything else.
PAIRS = (
    Pair("gpu_util", "utilization.gpu", 15.0),
    Pair("mem_copy_util", "utilization.memory", 15.0),
    Pair("enc_util", "utilization.encoder", 15.0),
    Pair("dec_util", "utilization.decoder", 15.0),
    Pair("fb_used_mib", "memory.used", 64.0, 0.02),
    Pair("fb_free_mib", "memory.free", 64.0, 0.02),
    Pair("fb_total_mib", "memory.total", 1.0),
    Pair("fb_reserved_mib", "memory.reserved", 1.0),
    Pair("power_w", "power.draw", 5.0, 0.10),
    Pair("sm_clock_mhz", "clocks.sm", 30.0, 0.10),
    Pair("mem_clock_mhz", "clocks.mem", 30.0, 0.02),
    Pair("temp_c", "temperature.gpu", 3.0),
    Pair("memory_temp_c", "temperature.memory", 3.0),
)
QUERY = ("index", "uuid", *(p.smi for p in PAIRS))


def command() -> list[str]:
    return ["nvidia-smi", "--query-gpu=" + ",".join(QUERY), "--format=csv,noheader,nounits"]


def parse(text: str, query: tuple[str, ...] = QUERY) -> list[dict[str, float | str | None]]:
    """`nvidia-smi --query-gpu=... --format=csv,noheader,nounits`: one row per GPU, in the
    query's order; `[N/A]` and `[Not Supported]` (and anything else not a number) are None."""
    rows = []
    for cells in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not cells:
            continue
        if len(cells) != len(query):
            raise ValueError(f"nvidia-smi gave {len(cells)} values where {len(query)} were asked: {cells}")
        row: dict[str, float | str | None] = {}
        for name, cell in zip(query, cells):
            cell = cell.strip()
            row[name] = cell if name == "uuid" else _number(cell)
        rows.append(row)
    return rows


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


@dataclass(frozen=True)
class Check:
    uuid: str
    field: str
    smi: str
    reader: float | None
    nvidia_smi: float | None
    allowed: float

    @property
    def verdict(self) -> str:
        if self.reader is None and self.nvidia_smi is None:
            return "neither"
        if self.reader is None or self.nvidia_smi is None:
            return "reader only" if self.nvidia_smi is None else "nvidia-smi only"
        return "ok" if abs(self.reader - self.nvidia_smi) <= self.allowed else "DIFFERS"


def compare(reader: dict[str, float], smi: dict[str, float | str | None], pairs: tuple[Pair, ...] = PAIRS,
            uuid: str | None = None) -> list[Check]:
    """One GPU's reader fields against its nvidia-smi row (or `-q -x` values: smi_xml.py)."""
    out = []
    for p in pairs:
        theirs = smi.get(p.smi)
        theirs = theirs if isinstance(theirs, float) else None
        allowed = max(p.absolute, p.relative * abs(theirs or 0.0))
        out.append(Check(uuid or str(smi.get("uuid", "")), p.field, p.smi, reader.get(p.field), theirs, allowed))
    return out


def rows(checks: list[Check]) -> list[str]:
    """Markdown rows in bench/RESULTS.md's manner."""
    def show(v: float | None) -> str:
        return "–" if v is None else f"{v:,.1f}"
    return ["| GPU | reader field | nvidia-smi | reader | nvidia-smi | allowed | verdict |",
            "|---|---|---|---:|---:|---:|---|",
            *(f"| {c.uuid[:12]} | {c.field} | {c.smi} | {show(c.reader)} | {show(c.nvidia_smi)} | {c.allowed:g} | "
              f"{c.verdict} |" for c in checks)]
