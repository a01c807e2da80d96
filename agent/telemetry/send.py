"""Sending telemetry: fire and forget, so a trainer never waits on the agent."""
from __future__ import annotations

import json
import os
import socket
from typing import Any, Mapping


def send_bytes(path: str | os.PathLike[str], payload: bytes) -> bool:
    """Send one datagram without blocking. False when it could not be delivered: no agent
    listening, its queue full, or the payload too large for a datagram."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        try:
            sock.sendto(payload, os.fspath(path))
        except OSError:
            return False
    return True


def send_datagram(path: str | os.PathLike[str], record: Mapping[str, Any]) -> bool:
    """Send one telemetry message. NaN and Infinity are written as JSON literals, which the
    agent accepts for loss and grad_norm."""
    payload = json.dumps(record, allow_nan=True, separators=(",", ":")).encode("utf-8")
    return send_bytes(path, payload)
