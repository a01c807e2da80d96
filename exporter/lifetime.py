"""A process that ends with its parent: what every part that starts others relies on.

Linux's parent-death signal: the kernel signals the process when its parent dies, even
by SIGKILL, which no handler in the parent can catch. SIGTERM, so that a trainer still
saves its emergency checkpoint. Elsewhere this does nothing.

A handler acts only when the main thread comes back to Python: one blocked for good (on a
loader's queue that nothing fills, in a collective) never does. A launcher ends such a rank
itself some time after its SIGTERM; a killed launcher cannot, so `exit_after_parent` does.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1    # linux/prctl.h
_POLL_S = 1.0


def end_with_parent(parent: int | None = None) -> None:
    """Have SIGTERM sent to this process when its parent dies. `parent` is the pid the
    parent had (default: the current one); if it is already gone, the signal comes now."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:          # it died before the request took hold
        os.kill(os.getpid(), signal.SIGTERM)


def exit_after_parent(parent: int, grace_s: float) -> None:
    """End this process outright `grace_s` after its parent (`parent`, a pid) died, if it has
    not ended by then, from a thread that watches for it; its own children (a loader's
    workers, busy where they would not see it go) are ended with it."""
    threading.Thread(target=_exit_after, args=(parent, grace_s), name="exit-after-parent", daemon=True).start()


def _exit_after(parent: int, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_S)
    time.sleep(grace_s)
    with contextlib.suppress(OSError):      # the parent may have held the other end of stderr
        print(f"process {os.getpid()}: its parent ({parent}) ended {grace_s:g} s ago and it has not: exiting",
              file=sys.stderr, flush=True)
    for child in _children():
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
    os._exit(128 + signal.SIGTERM)


def _children() -> list[int]:
    mine = os.getpid()
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(stat, "rb") as f:     # pid (comm) state ppid ...: comm may hold spaces
                if int(f.read().rsplit(b")", 1)[1].split()[1]) == mine:
                    out.append(int(stat.split("/")[2]))
    return out
