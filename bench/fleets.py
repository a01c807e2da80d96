"""Simulated fleets for the benchmarks, generated once into a cache directory."""
from __future__ import annotations

import os
import sys
import time


GPUS_PER_NODE = 8
END = 1_800_000_000.0  # a fixed end, so that a cached fleet is the same fleet


def cached_fleet(cache: str, gpus: int, hours: float) -> str:
    from burnrate.simulator.simulate import Spec, simulate

    root = os.path.join(cache, f"fleet-{gpus}gpus-{hours:g}h")
    if not os.path.exists(os.path.join(root, "ground_truth.json")):
        print(f"generating {root} …", file=sys.stderr, flush=True)
        began = time.monotonic()
        simulate(root, Spec(nodes=gpus // GPUS_PER_NODE, gpus_per_node=GPUS_PER_NODE, hours=hours,
                            step_s=15.0, seed=0, end=END))
        print(f"  generated in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    return root
