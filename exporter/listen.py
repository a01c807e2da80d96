"""`--listen HOST:PORT`, read the same way by every command that serves."""
from __future__ import annotations

import socket

from .errors import UserError


def listen_address(text: str, default_host: str | None = "0.0.0.0") -> tuple[str, int]:
    """(host, port) from `HOST:PORT`, `[::1]:PORT` or `:PORT` (all interfaces, where a
    default host is given). Port 0 asks the system for a free port."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") or default_host or ""
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"--listen wants HOST:PORT, got {text!r}")
    return host, int(port)


def ensure_free(host: str, port: int, flag: str) -> None:
    """Say which flag to change, before anything starts, when another process holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        # As the servers do: a port left in TIME_WAIT by an earlier run is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another burnrate, or "
                            f"dcgm-exporter?): pass {flag} with another port") from None
