"""The series an agent exports against dcgm-exporter's default counters.

The default set is dcgm-exporter 4.8's etc/default-counters.csv, kept in the repository
(tests/data/dcgm-exporter-default-counters.csv); `label` rows put a label on every series
rather than making one, so they are not series to look for.
"""
from __future__ import annotations

import os
import re

DEFAULT_COUNTERS = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data",
                                "dcgm-exporter-default-counters.csv")


def default_series(path: str = DEFAULT_COUNTERS) -> set[str]:
    """The DCGM fields of a counters file in dcgm-exporter's format that are series."""
    names = set()
    with open(path) as fh:
        for line in fh:
            if line.strip() and not line.lstrip().startswith("#"):
                field, type_ = (part.strip() for part in line.split(",", 2)[:2])
                if type_ != "label":
                    names.add(field)
    return names


def exported(exposition: str) -> set[str]:
    """The series names in a Prometheus text exposition."""
    return {m[1] for line in exposition.splitlines()
            if not line.startswith("#") and (m := re.match(r"([A-Za-z_:][\w:]*)[{ ]", line))}


def compare(defaults: set[str], names: set[str]) -> dict[str, list[str]]:
    """What of the default set is exported and missing, and which DCGM series beyond it are."""
    dcgm = {n for n in names if n.startswith("DCGM_FI_")}
    return {"exported": sorted(defaults & dcgm), "missing": sorted(defaults - dcgm), "beyond": sorted(dcgm - defaults)}


def rows(result: dict[str, list[str]], gpus: int) -> list[str]:
    total = len(result["exported"]) + len(result["missing"])
    return ["| measure | value |", "|---|---|",
            f"| dcgm-exporter default series exported, on {gpus} GPU(s) | {len(result['exported'])} of {total} |",
            f"| missing | {', '.join(result['missing']) or 'none'} |",
            f"| DCGM series beyond the default set | {', '.join(result['beyond']) or 'none'} |"]
