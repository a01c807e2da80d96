"""Rule groups written into a Prometheus rules file by the code that owns their figures, as
YAML that reads back as the same data, each between two markers by which a test finds it to
check it is current and a regeneration finds it to replace it. Used for the ledger's group
(exporter/ledger_rules.py) and the detectors' alerts (analyzer/output/alert_rules.py).

No third-party imports: the YAML is written here.
"""
from __future__ import annotations

import json
import re

INTERVAL = "1m"

# Plain scalars YAML reads back as the same text: a word first (or a duration), then no comment
# and no mapping; YAML 1.1's booleans and null aside.
_PLAIN = re.compile(r"(?!(?:true|false|yes|no|on|off|null|y|n)$)(?:[A-Za-z]|\d+[smhdwy]$)(?:(?! #|: )[^\n])*(?<![: ])",
                    re.IGNORECASE)
_UNITS = (("h", 3600, "hour"), ("m", 60, "minute"), ("s", 1, "second"))


class MarkerError(ValueError):
    """A rules file without (or with more than one of) the markers of a rendered group."""


def duration(seconds: float) -> str:
    """A Prometheus duration in the largest unit that holds it whole: 1800 -> 30m, 14400 -> 4h."""
    whole = round(seconds)
    for suffix, size, _ in _UNITS:
        if whole and whole % size == 0:
            return f"{whole // size}{suffix}"
    return "0s"


def spelled(text: str) -> str:
    """A duration for people: 30m -> 30 minutes, 1h -> 1 hour."""
    number, suffix = re.fullmatch(r"(\d+)([hms])", text).groups()
    [word] = [word for s, _, word in _UNITS if s == suffix]
    return f"{number} {word}{'' if number == '1' else 's'}"


def read_back(rule: dict) -> dict:
    """The rule as YAML reads it back: a block scalar ends in a newline."""
    expr = rule["expr"]
    return {**rule, "expr": expr + "\n"} if "\n" in expr and not expr.endswith("\n") else rule


def group(name: str, rules: list[tuple[str, dict]]) -> dict:
    return {"name": name, "interval": INTERVAL, "rules": [rule for _, rule in rules]}


def comment(text: str, indent: str) -> list[str]:
    """`text` as comment lines of at most 100 characters."""
    lines, line = [], ""
    for word in text.split():
        if line and len(indent) + 2 + len(line) + 1 + len(word) > 100:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [f"{indent}# {line}" for line in lines + [line]]


def _scalar(value: str, indent: str) -> str:
    if "\n" in value:
        return "|\n" + "\n".join(f"{indent}  {line}" for line in value.rstrip("\n").split("\n"))
    return value if _PLAIN.fullmatch(value) else json.dumps(value)


def _mapping(value: dict, indent: str, first: str) -> list[str]:
    out = []
    for i, (key, v) in enumerate(value.items()):
        lead = first if i == 0 else indent
        if isinstance(v, dict):
            out.append(f"{lead}{key}:")
            out.extend(_mapping(v, indent + "  ", indent + "  "))
        else:
            out.append(f"{lead}{key}: {_scalar(v, indent)}")
    return out


def begin(name: str, source: str) -> str:
    return f"  # BEGIN {name}: rendered by {source}; edit that, not this."


def end(name: str) -> str:
    return f"  # END {name}"


def render(name: str, source: str, about: str, rules: list[tuple[str, dict]]) -> str:
    """The group as an item of a rules file's `groups:`, between its markers; `about` (if
    any) and each rule's why (if any) as comments above them."""
    lines = [begin(name, source), *(comment(about, "  ") if about else []),
             f"  - name: {name}", f"    interval: {INTERVAL}", "    rules:"]
    for why, rule in rules:
        if why:
            lines.extend(comment(why, "      "))
        lines.extend(_mapping(rule, "        ", "      - "))
    lines.append(end(name))
    return "\n".join(lines) + "\n"


def _block(name: str) -> re.Pattern:
    return re.compile(rf"^  # BEGIN {re.escape(name)}\b.*?^  # END {re.escape(name)}\n", re.M | re.S)


def blocks(text: str, name: str) -> list[str]:
    """The rendered blocks of group `name` in a rules file's text, markers included."""
    return [m.group() for m in _block(name).finditer(text)]


def splice(text: str, name: str, rendered: str) -> str:
    """The rules file's text with group `name`'s block replaced by `rendered`."""
    out, n = _block(name).subn(lambda _: rendered, text)
    if n != 1:
        raise MarkerError(f"expected one '# BEGIN {name}' ... '# END {name}' block, found {n}")
    return out
