"""Who a rank is, as the agent files its telemetry (docs/telemetry.md); the sending itself is the
contract's own (exporter.telemetry.TelemetrySink)."""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

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
