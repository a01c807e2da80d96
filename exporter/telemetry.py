"""The trainer-to-agent telemetry contract (docs/telemetry.md) that both ends share: the schema
version, the message's fields and their rules, where the socket is, and the one sender.
Standard library only, so that a training image needs nothing more to send.

The agent builds its validating decoder from FIELDS and sums the `delta` fields into its
counters; the monitor fills the same names.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping

SCHEMA_VERSION = 1
DEFAULT_SOCKET_PATH = "/run/burnrate/telemetry.sock"
SOCKET_ENV = "BURNRATE_TELEMETRY_SOCKET"
# The agent forgets a rank silent this long (`--forget-after`): its series go then. A sender
# reports while its process lives (the monitor's keep-alives), so an analyzer without the ranks'
# last-report times dates a process's end this long before its series went.
FORGET_AFTER_S = 300.0
# The monitor's keep-alive: while it has reported nothing this long, it says the process lives.
# Within how long the agent keeps a GPU with a silent rank whose process it cannot see (5 s at
# least, docs/agent.md) and far within --forget-after, so that a hung rank is neither forgotten
# nor let go of; a loop that reports every second never sends one, and a hung one sends half as
# many messages as it did while it stepped. A living process's last report is never older.
KEEPALIVE_S = 2.0

# The rules a field's value must keep (the agent's schema says each in full).
VERSION = "version"        # exactly SCHEMA_VERSION
LABEL = "label"            # a Kubernetes object name: 1-253 printable characters
COUNT = "count"            # an integer, 0 to 2**53
AMOUNT = "amount"          # a finite number >= 0
RATIO = "ratio"            # a number in [0, 1]
WORLD_SIZE = "world_size"  # an integer, 1 to 65536
REAL = "real"              # any float, NaN and ±Inf included (a diverging loss)
FLAG = "flag"              # true or false


@dataclass(frozen=True)
class Field:
    name: str
    rule: str
    nullable: bool = False     # null is a value: "not known this interval"
    required: bool = True      # a message without it is refused
    default: Any = None        # taken when a field that is not required is absent
    delta: bool = False        # an amount since the rank's previous message, which the agent sums


FIELDS: tuple[Field, ...] = (
    Field("v", VERSION),
    Field("training_job", LABEL),
    Field("namespace", LABEL),
    Field("pod", LABEL),
    Field("rank", COUNT),
    Field("world_size", WORLD_SIZE),
    Field("step", COUNT),
    Field("time", AMOUNT),
    Field("steps", COUNT, delta=True),
    Field("step_s", AMOUNT, delta=True),
    Field("data_wait_s", AMOUNT, delta=True),
    Field("compute_s", AMOUNT, delta=True),
    Field("samples", AMOUNT, delta=True),
    Field("tokens", AMOUNT, delta=True),
    Field("flops", AMOUNT, delta=True),
    Field("loss", REAL, nullable=True),
    Field("grad_norm", REAL, nullable=True),
    Field("mfu", RATIO, nullable=True),
    Field("local_rank", COUNT, nullable=True, required=False),
    Field("checkpoint_time", AMOUNT, nullable=True, required=False),
    Field("checkpoint_s", AMOUNT, nullable=True, required=False, default=0.0, delta=True),   # null reads as 0.0
    Field("eval_s", AMOUNT, nullable=True, required=False, default=0.0, delta=True),
    # The ledger's run boundaries: when this process started (before the model loaded) and the
    # step it resumed from (0: a fresh start). Null where the loop cannot know: never a made-up 0.
    Field("start_time", AMOUNT, nullable=True, required=False),
    Field("resumed_from", COUNT, nullable=True, required=False),
    # The process's last message: its monitor closed, so it trains no more whatever its exit
    # takes (the ledger's end of a process that outlives its monitor).
    Field("final", FLAG, required=False, default=False),
)
# Sent for whoever reads the JSON lines (how MFU was computed); the agent ignores them, as it
# ignores any field it does not know, so that a newer trainer's messages are never dropped.
INFORMATIONAL = ("peak_flops", "peak_source")


def socket_path(explicit: str | None = None, environ: Mapping[str, str] = os.environ) -> str:
    """The socket trainers send to: `explicit`, else $BURNRATE_TELEMETRY_SOCKET, else the default hostPath."""
    return explicit or environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH


def encode(record: Mapping[str, Any]) -> bytes:
    # allow_nan: a diverged loss must arrive as NaN, not be dropped (docs/metrics.md keeps NaN).
    return json.dumps(record, allow_nan=True, separators=(",", ":")).encode("utf-8")


class TelemetrySink:
    """Sends records to the agent's datagram socket and, optionally, appends them as JSON
    lines to a file (one record per line, each its own interval's).

    Sending never blocks and never raises: with no agent listening, a full socket buffer or
    a missing socket file, the record is dropped and counted. Training must not slow down
    or fail because observability is absent."""

    def __init__(self, path: str | os.PathLike[str] | None = None, jsonl_path: str | None = None) -> None:
        self.path = socket_path(os.fspath(path) if path is not None else None)
        self.sent = 0
        self.dropped = 0
        self.last_error: OSError | None = None     # why the last datagram was dropped
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        # One os.write per line on an O_APPEND descriptor keeps lines from several ranks
        # whole when they share a file.
        self._jsonl = os.open(jsonl_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if jsonl_path else None

    def send(self, record: Mapping[str, Any], datagram: Mapping[str, Any] | None = None) -> bool:
        """`record` to the file, `datagram` (the record plus what earlier datagrams could not
        deliver, where the caller keeps that) to the agent."""
        data = encode(record)
        if self._jsonl is not None:
            os.write(self._jsonl, data + b"\n")
        return self.send_bytes(data if datagram is None else encode(datagram))

    def send_bytes(self, payload: bytes) -> bool:
        """One datagram as it is. False when it could not be delivered: no agent listening,
        its queue full, or the payload too large for a datagram."""
        try:
            self._sock.sendto(payload, self.path)
        except OSError as exc:
            # ENOENT / ECONNREFUSED: no agent; EAGAIN: its buffer is full. Drop, never wait.
            self.dropped += 1
            # Without its traceback, whose frames would keep the sender's caller alive.
            self.last_error = OSError(exc.errno, exc.strerror)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self._sock.close()
        if self._jsonl is not None:
            os.close(self._jsonl)
            self._jsonl = None

    def __enter__(self) -> TelemetrySink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
