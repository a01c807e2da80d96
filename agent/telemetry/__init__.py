"""Trainer-to-agent telemetry (docs/telemetry.md): the message schema and the agent's inbox.
The contract itself (fields, socket path, the sender) is exporter.telemetry."""
from .inbox import CARDINALITY, INTERNAL, TelemetryInbox
from .schema import MAX_MESSAGE_BYTES, REASONS, Record, Rejection, validate

__all__ = ["CARDINALITY", "INTERNAL", "MAX_MESSAGE_BYTES", "REASONS", "Record", "Rejection", "TelemetryInbox",
           "validate"]
