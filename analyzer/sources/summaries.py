"""Kept job summaries (`burnrate analyze --serve --keep-summaries FILE`): JSON Lines, one
object per finished run of a job, appended once when it ends, so that showback over a
month or a year outlives the store's retention (docs/retention.md).

Each line is written whole and synced before the next; a crash can leave only the last
line torn, and a reader skips it and counts it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .timeparse import parse_time

RunKey = tuple[str, str, str]     # (namespace, training_job, end): a job that ran again ends again later


@dataclass(frozen=True)
class Kept:
    summaries: list[dict] = field(default_factory=list)
    torn: int = 0                  # lines that were not a whole summary, skipped


def run_key(summary: dict) -> RunKey:
    return str(summary["namespace"]), str(summary["training_job"]), str(summary["end"])


def read_summaries(path: str, start: float | None = None, end: float | None = None) -> Kept:
    """The summaries of the runs that ended in [start, end) (all where not given), in the
    order kept; no file is none kept yet."""
    try:
        with open(path, "rb") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return Kept()
    summaries, torn = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            summary = json.loads(line)
            ended = parse_time(summary["end"])
        except (ValueError, KeyError, TypeError):
            torn += 1
            continue
        if (start is None or ended >= start) and (end is None or ended < end):
            summaries.append(summary)
    return Kept(summaries, torn)


def append_summary(path: str, summary: dict) -> None:
    """One line, on disk before this returns; after a torn last line it starts a line of
    its own, so the torn one stays the only one lost."""
    line = json.dumps(summary, allow_nan=False, separators=(",", ":")).encode() + b"\n"
    with open(path, "ab+") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell():
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                line = b"\n" + line
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
