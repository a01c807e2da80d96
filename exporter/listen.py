"""`--listen HOST:PORT`, read the same way by every command that serves."""
from __future__ import annotations

from .errors import UserError


def listen_address(text: str, default_host: str | None = "0.0.0.0") -> tuple[str, int]:
    """(host, port) from `HOST:PORT`, `[::1]:PORT` or `:PORT` (all interfaces, where a
    default host is given). Port 0 asks the system for a free port."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") or default_host or ""
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"--listen wants HOST:PORT, got {text!r}")
    return host, int(port)
