"""Trainer-to-agent telemetry (CONTRACT §3): the message schema, the agent's inbox and a sender."""
from .inbox import CARDINALITY, INTERNAL, TelemetryInbox
from .schema import (DEFAULT_SOCKET_PATH, MAX_MESSAGE_BYTES, REASONS, SCHEMA_VERSION, SOCKET_ENV, Record,
                     Rejection, socket_path, validate)
from .send import send_bytes, send_datagram

__all__ = [
    "CARDINALITY", "DEFAULT_SOCKET_PATH", "INTERNAL", "MAX_MESSAGE_BYTES", "REASONS", "SCHEMA_VERSION",
    "SOCKET_ENV", "Record", "Rejection", "TelemetryInbox", "socket_path", "send_bytes", "send_datagram",
    "validate",
]
