"""The time range a page shows, as it lives in the URL's query string.

`?range=6h` is the last six hours of data (for a recording: up to its last sample,
for Prometheus: up to now); `?range=all` is a whole recording; `?start=T&end=T`
(ISO-8601 or unix seconds) is a fixed window. Keeping the range in the URL makes
every view shareable.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from burnrate.analyzer.sources.timeparse import format_time, parse_duration, parse_time

ALL = "all"
PRESETS = ("1h", "6h", "24h", "7d")
CUSTOM = "custom"


@dataclass(frozen=True)
class TimeRange:
    """Either `last` seconds up to the latest data, a fixed `start`..`end`, or the
    whole recording (all three None)."""

    last: float | None = None
    start: float | None = None
    end: float | None = None

    @property
    def is_all(self) -> bool:
        return self.last is None and self.start is None

    def label(self) -> str:
        if self.start is not None and self.end is not None:
            return f"{format_time(self.start)} → {format_time(self.end)}"
        return "whole recording" if self.is_all else f"last {_duration_text(self.last)}"


def _duration_text(seconds: float | None) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds is not None and seconds >= size and seconds % size == 0:
            return f"{seconds // size:g}{unit}"
    return f"{seconds:g}s"


def query(search: str | None) -> dict[str, str]:
    """The query string as a dict (last value wins)."""
    return dict(parse_qsl((search or "").lstrip("?"), keep_blank_values=False))


def from_query(search: str | None, default: str) -> TimeRange:
    """The range a query string names; ValueError with a one-line message when it is malformed."""
    params = query(search)
    if "start" in params or "end" in params:
        if "start" not in params:
            raise ValueError("the URL has end= without start=")
        start = parse_time(params["start"])
        end = parse_time(params["end"]) if "end" in params else None
        if end is not None and end <= start:
            raise ValueError("the URL's end= is not after its start=")
        return TimeRange(start=start, end=end)
    value = params.get("range", default)
    if value == ALL:
        return TimeRange()
    return TimeRange(last=parse_duration(value))


def names_range(search: str | None) -> bool:
    """Whether the query string picks a range itself, rather than leaving the page its default."""
    return not query(search).keys().isdisjoint(("range", "start", "end"))


def picker_value(search: str | None, default: str) -> str:
    """What the range dropdown shows for a query string: a range it has no option
    for (`?range=30m`) shows as custom, as a value outside its options would be
    cleared, and the range with it."""
    params = query(search)
    value = params.get("range", default)
    if "start" in params or (value not in PRESETS and value != default):
        return CUSTOM
    return value


def with_params(search: str | None, **changes: str | None) -> str:
    """The query string with `changes` applied (None removes a parameter)."""
    params = query(search)
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = value
    # Commas stay readable: the Findings filters list values with them.
    return "?" + urlencode(params, safe=",") if params else ""
