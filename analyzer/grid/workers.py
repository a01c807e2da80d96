"""Thread pools for the analysis's numpy work (which runs without the GIL), only where the
tables are large enough for the threads to pay for themselves."""
from __future__ import annotations

from concurrent.futures import Executor, Future, ThreadPoolExecutor

from .frames import Frames

# Measured on 2 cores with a week of 1,024 GPUs cut to size: one analysis of 190,000 rows
# (device, allocation and rank tables together) took 70 ms in one thread and 73 to 84 ms
# with threads; of 420,000, 214 to 233 against 196 to 290 ms; of 1.7 million, 4.9 against 3.6 s.
# Fleet mode's groups are tens of thousands of rows each.
THREADED_ROWS = 400_000


class _Inline(Executor):
    """Runs each task when it is submitted, in the caller's thread."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:
            future.set_exception(error)
        return future


def pool(frames: Frames, workers: int) -> Executor:
    """A pool of `workers` threads where the frames are large, else one that runs each task inline."""
    rows = sum(len(getattr(frames, name)) for name in ("gpu", "alloc", "rank"))
    return ThreadPoolExecutor(max_workers=workers) if workers > 1 and rows >= THREADED_ROWS else _Inline()
