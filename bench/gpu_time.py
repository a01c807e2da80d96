"""What the GPU-second counters cost the agent: `GpuClock.advance` per collection, in
process, for a usual node, a node of time-sliced or MIG GPUs, and a large one, with the
series they add to the exposition.

    .venv/bin/python bench/gpu_time.py [--collections 2000]
"""
from __future__ import annotations

import argparse
import timeit

from burnrate.agent.gpu.simulated import SimulatedReader
from burnrate.agent.gpu_time import GpuClock
from burnrate.exporter.snapshot import Allocation, PodRef

CASES = ((8, 1), (8, 7), (64, 1))   # (GPUs, holders per GPU)


def per_collection_us(gpus: int, holders: int, collections: int) -> float:
    readings = SimulatedReader(gpus, seed=1).read()
    allocs = [Allocation(g.identity.uuid, f"{g.identity.uuid}::{k}", PodRef("ml", f"pod-{i}-{k}", "main", "job"),
                         1.0 / holders) for i, g in enumerate(readings) for k in range(holders)]
    clock = GpuClock(interval_s=1.0, keep_s=300.0)
    now = [1.8e9]

    def collect() -> None:
        now[0] += 1.0
        clock.advance(now[0], readings, allocs)

    return timeit.timeit(collect, number=collections) / collections * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collections", type=int, default=2000)
    args = parser.parse_args()
    print("| GPUs | holders per GPU | µs per collection | % of a core at 1 s | series added |")
    print("|---:|---:|---:|---:|---:|")
    for gpus, holders in CASES:
        us = per_collection_us(gpus, holders, args.collections)
        series = gpus + 3 * gpus * holders      # observed per GPU; allocated, idle, busy per holder
        print(f"| {gpus} | {holders} | {us:.0f} | {us / 1e4:.3f} | {series} |")


if __name__ == "__main__":
    main()
