"""Threads named for the kernel, so that `top -H` and the benchmarks can tell the agent's
threads apart (Python names threads only for itself)."""
from __future__ import annotations

import threading


def name_thread(name: str) -> None:
    """Name the calling thread; the kernel keeps 15 bytes of it."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass   # a /proc that does not allow it: the name is only for people looking
