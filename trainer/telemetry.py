"""Trainer → agent telemetry (CONTRACT §3): one JSON object per Unix datagram.

Sending never blocks and never raises: with no agent listening, a full socket buffer
or a missing socket file, the record is dropped and counted. Training must not slow
down or fail because observability is absent.
"""
from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass

from exporter.telemetry import DEFAULT_SOCKET_PATH, SCHEMA_VERSION, SOCKET_ENV

# PyTorchJob pods are named <job>-master-<i> / <job>-worker-<i>.
_PYTORCHJOB_POD = re.compile(r"^(?P<job>.+)-(master|worker)-\d+$")


@dataclass(frozen=True)
class Identity:
    """Who is sending: the labels the agent files this rank's series under."""

    training_job: str
    namespace: str
    pod: str
    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_env(cls, default_job: str = "local", env: dict[str, str] | None = None) -> Identity:
        """Read the identity a pod's downward API and torchrun provide.

        BURNRATE_TRAINING_JOB names the job; failing that, a PyTorchJob pod name gives
        it away; failing that, `default_job`. POD_NAME / POD_NAMESPACE come from the
        downward API, with the hostname and "default" outside Kubernetes.
        """
        env = os.environ if env is None else env
        pod = env.get("POD_NAME") or socket.gethostname()
        job = env.get("BURNRATE_TRAINING_JOB")
        if not job:
            match = _PYTORCHJOB_POD.match(env.get("POD_NAME", ""))
            job = match.group("job") if match else default_job
        return cls(
            training_job=job,
            namespace=env.get("POD_NAMESPACE", "default"),
            pod=pod,
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
        )


def socket_path(explicit: str | None = None) -> str:
    return explicit or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH


class TelemetrySink:
    """Sends records to the agent's datagram socket and, optionally, appends them as
    JSON lines to a file (the same bytes, one record per line)."""

    def __init__(self, path: str | None = None, jsonl_path: str | None = None) -> None:
        self.path = socket_path(path)
        self.sent = 0
        self.dropped = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        # One os.write per line on an O_APPEND descriptor keeps lines from several ranks
        # whole when they share a file.
        self._jsonl = os.open(jsonl_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if jsonl_path else None

    def send(self, record: dict) -> None:
        # allow_nan: a diverged loss must arrive as NaN, not be dropped (CONTRACT §2 keeps NaN).
        data = json.dumps(record, allow_nan=True, separators=(",", ":")).encode()
        if self._jsonl is not None:
            os.write(self._jsonl, data + b"\n")
        try:
            self._sock.sendto(data, self.path)
            self.sent += 1
        except OSError:
            # ENOENT / ECONNREFUSED: no agent; EAGAIN: its buffer is full. Drop, never wait.
            self.dropped += 1

    def close(self) -> None:
        self._sock.close()
        if self._jsonl is not None:
            os.close(self._jsonl)
            self._jsonl = None
