"""Times and durations as users type them on the command line (docs/cli.md):
times are ISO-8601 (`2026-11-21T03:00:00Z`) or unix seconds, durations are
Prometheus-style (`90m`, `2h`, `7d`, `1h30m`). Errors are ValueErrors whose
message is one line a CLI can print as it is.
"""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from ..grid.frames import Window

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_DURATION = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")
LATEST = 253402300799.0     # 9999-12-31T23:59:59Z, the last second datetime can write
LONGEST_S = 1000 * _UNITS["y"]


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as `90m`, `2h` or `1h30m`."""
    text = text.strip()
    if not _DURATION.fullmatch(text):
        raise ValueError(f"invalid duration {text!r} (expected e.g. 90m, 2h, 7d, 1h30m)")
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be longer than zero")
    if seconds > LONGEST_S:
        raise ValueError(f"duration {text!r} is longer than 1000y")
    return seconds


def parse_time(text: str) -> float:
    """Unix seconds from unix seconds or ISO-8601; a time without a zone is UTC. Times
    must lie between 1970 and the end of 9999, where they can be written back."""
    text = text.strip()
    try:
        unix = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            raise ValueError(f"invalid time {text!r} (expected ISO-8601 like 2026-11-21T03:00:00Z, "
                             "or unix seconds)") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        unix = parsed.timestamp()
    if not 0.0 <= unix <= LATEST:     # NaN fails this too
        raise ValueError(f"time {text!r} is outside 1970-01-01 to 9999-12-31")
    return unix


def format_time(unix: float) -> str:
    """ISO-8601 in UTC with a `Z`, to the second, as findings and reports show times."""
    return datetime.fromtimestamp(unix, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_window(since: str | None = None, start: str | None = None, end: str | None = None,
                   now: float | None = None) -> Window | None:
    """The window `--since` or `--start/--end` name; None when neither is given."""
    now = time.time() if now is None else now
    if since is not None and (start is not None or end is not None):
        raise ValueError("give either --since or --start/--end, not both")
    if since is not None:
        return Window(now - parse_duration(since), now)
    if start is None and end is None:
        return None
    if start is None:
        raise ValueError("--end needs --start")
    window = Window(parse_time(start), parse_time(end) if end is not None else now)
    if window.end <= window.start:
        raise ValueError(f"the window ends ({format_time(window.end)}) before it starts "
                         f"({format_time(window.start)})")
    return window
