"""Simulated fleets for the benchmarks, generated once into a cache directory, under a name
that carries a digest of the code that wrote them: a fleet the simulator would now write
differently (a new series, another catalog) is written again, never read stale."""
from __future__ import annotations

import glob
import hashlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a simulated recording is made of: the simulator, the agent's simulated GPUs and the
# exporter's catalog and record formats.
WRITERS = ("simulator/*.py", "agent/gpu/*.py", "agent/telemetry/*.py", "exporter/*.py")


GPUS_PER_NODE = 8
END = 1_800_000_000.0  # a fixed end, so that a cached fleet is the same fleet


def digest(*patterns: str) -> str:
    """A short digest of the files the patterns (relative to the repository) match."""
    h = hashlib.sha256()
    for path in sorted({p for pattern in patterns for p in glob.glob(os.path.join(ROOT, pattern))}):
        h.update(os.path.relpath(path, ROOT).encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:10]


def cached_fleet(cache: str, gpus: int, hours: float) -> str:
    from burnrate.simulator.simulate import Spec, simulate

    root = os.path.join(cache, f"fleet-{gpus}gpus-{hours:g}h-{digest(*WRITERS)}")
    if not os.path.exists(os.path.join(root, "ground_truth.json")):
        print(f"generating {root} …", file=sys.stderr, flush=True)
        began = time.monotonic()
        simulate(root, Spec(nodes=gpus // GPUS_PER_NODE, gpus_per_node=GPUS_PER_NODE, hours=hours,
                            step_s=15.0, seed=0, end=END))
        print(f"  generated in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    return root
