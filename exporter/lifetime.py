"""A process that ends with its parent: what every part that starts others relies on.

Linux's parent-death signal: the kernel signals the process when its parent dies, even
by SIGKILL, which no handler in the parent can catch. SIGTERM, so that a trainer still
saves its emergency checkpoint. Elsewhere this does nothing.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1    # linux/prctl.h


def end_with_parent(parent: int | None = None) -> None:
    """Have SIGTERM sent to this process when its parent dies. `parent` is the pid the
    parent had (default: the current one); if it is already gone, the signal comes now."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:          # it died before the request took hold
        os.kill(os.getpid(), signal.SIGTERM)
