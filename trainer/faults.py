"""Fault injection for the reference trainer (`train --fault SPEC`, docs/cli.md).

Each fault acts on the real loop or loader, so the measurements show it the way a real
fault would show, not through doctored telemetry:

- `straggler:rank=R,factor=F`  rank R's compute phase lasts F times its measured compute
- `starve:delay=S`             the loader takes S more seconds for every batch
- `diverge:at=STEP`            from STEP on, the learning rate is multiplied by 10^4
- `stall:at=STEP[,rank=R]`     before STEP, every rank (or only R) hangs; processes stay alive
                               until SIGTERM, which stops them as it stops a running job
- `crash:at=STEP[,rank=R]`     before STEP, rank R (default 0) raises and exits non-zero

Steps count from 1: `at=5` acts on the fifth optimizer step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

DIVERGE_LR_FACTOR = 1e4

# kind -> (required keys, optional keys)
_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "straggler": (("rank", "factor"), ()),
    "starve": (("delay",), ()),
    "diverge": (("at",), ()),
    "stall": (("at",), ("rank",)),
    "crash": (("at",), ("rank",)),
}


class InjectedCrash(RuntimeError):
    """Raised by `crash:at=STEP`: the rank dies the way an unhandled error kills it."""


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict

    def get(self, key: str, default: float | None = None) -> float | None:
        return self.params.get(key, default)


def parse_fault(spec: str) -> Fault:
    """Parse one SPEC; raises ValueError with a one-line reason."""
    kind, _, rest = spec.partition(":")
    if kind not in _KEYS:
        raise ValueError(f"unknown fault {kind!r} in {spec!r} (expected one of {', '.join(_KEYS)})")
    required, optional = _KEYS[kind]
    params: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in required + optional:
            raise ValueError(f"bad fault {spec!r}: unexpected {item!r} (takes {', '.join(required + optional)})")
        try:
            params[key] = float(value)
        except ValueError:
            raise ValueError(f"bad fault {spec!r}: {key} must be a number, got {value!r}") from None
    missing = [k for k in required if k not in params]
    if missing:
        raise ValueError(f"bad fault {spec!r}: missing {', '.join(missing)}")
    for key in ("rank", "at"):
        if key in params and (params[key] < (1 if key == "at" else 0) or params[key] != int(params[key])):
            raise ValueError(f"bad fault {spec!r}: {key} must be a whole number >= {1 if key == 'at' else 0}")
    if kind == "straggler" and params["factor"] < 1:
        raise ValueError(f"bad fault {spec!r}: factor must be >= 1")
    if kind == "starve" and params["delay"] < 0:
        raise ValueError(f"bad fault {spec!r}: delay must be >= 0")
    return Fault(kind, params)


def parse_faults(specs: list[str]) -> list[Fault]:
    return [parse_fault(s) for s in specs]


class Faults:
    """The faults that apply to one rank, asked by the loop at the points they act."""

    def __init__(self, specs: list[str], rank: int) -> None:
        self.rank = rank
        self._faults = parse_faults(specs)
        self._injected = 0.0

    def _of(self, kind: str) -> list[Fault]:
        return [f for f in self._faults if f.kind == kind]

    @property
    def data_delay(self) -> float:
        """Extra seconds the loader spends on each batch."""
        return sum(f.params["delay"] for f in self._of("starve"))

    def lr_scale(self, step: int) -> float:
        """Multiplier on the scheduled learning rate at 1-based `step`."""
        scale = 1.0
        for f in self._of("diverge"):
            if step >= f.params["at"]:
                scale *= DIVERGE_LR_FACTOR
        return scale

    def before_step(self, step: int, stopping: Callable[[], bool] = lambda: False) -> bool:
        """Crash or hang before 1-based `step` starts, when a fault says so. False when a hang
        was ended by `stopping()` (SIGTERM): the step must not run."""
        for f in self._of("crash"):
            if step == f.params["at"] and self.rank == int(f.get("rank", 0)):
                raise InjectedCrash(f"injected crash at step {step} on rank {self.rank}")
        for f in self._of("stall"):
            if step == f.params["at"] and f.get("rank") in (None, self.rank):
                # A hang, as in a deadlocked collective: no progress and no exit, until the pod
                # is told to stop. The test fleet's ranks must never outlive their launcher.
                while not stopping():
                    time.sleep(0.1)
                return False
        return True

    def straggle(self, last_compute_s: float) -> None:
        """Inside the compute phase: on the straggling rank, stretch compute to `factor`
        times what it would be, by sleeping for the difference."""
        factor = 1.0
        for f in self._of("straggler"):
            if self.rank == int(f.params["rank"]):
                factor *= f.params["factor"]
        if factor == 1.0:
            return
        # The last measurement includes the previous injection; take it out.
        own = max(last_compute_s - self._injected, 0.0)
        self._injected = (factor - 1.0) * own
        time.sleep(self._injected)
