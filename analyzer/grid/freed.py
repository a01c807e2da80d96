"""Memory the analysis has let go of, given back to the system.

A read's answers come in arrays of a few megabytes (a column of a day of a thousand ranks is
read in 8 MB chunks). glibc's malloc serves arrays below its mmap threshold, which rises to
32 MB as larger arrays are freed, from its heaps, and a heap keeps what is freed in it for the
process: the process's memory stays as large as if the answers were still held, and a
column's answer let go once it is in its table (analyzer.sources.promtables) lowers nothing.
`malloc_trim` gives those pages back. On a day of 1,024 GPUs read per GPU, the read's answers
let go as they are used and given back brought the analysis' peak from 2.3-2.4 to 1.64 GiB
(bench/RESULTS.md). A call walks the whole heap (20 to 28 ms there), so it is made once enough
has been let go: 19 calls in that read. The dashboard and `analyze --serve`, which live for
weeks, give back after each analysis too. Where the C library has no `malloc_trim` (musl,
macOS) nothing is done.
"""
from __future__ import annotations

import ctypes
import threading

# Let go of at least this much before a call: a small table's columns never pay for one.
AT_LEAST = 128 << 20


def _trim():
    # The C library the process runs on, as it is already loaded: no search for it.
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _trim()
_lock = threading.Lock()
_pending = 0


def give_back() -> None:
    """Give back whatever has been freed: once a read is done with its answers, or a long-lived
    process with a computation."""
    global _pending
    if _TRIM is None:
        return
    with _lock:
        _pending = 0
    _TRIM(0)


def let_go(nbytes: int) -> None:
    """`nbytes` were just freed: give the freed memory back once enough of it has been."""
    global _pending
    if _TRIM is None:
        return
    with _lock:
        _pending += nbytes
        if _pending < AT_LEAST:
            return
        _pending = 0
    _TRIM(0)
