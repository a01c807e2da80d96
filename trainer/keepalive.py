"""A rank's word that its process still lives while its loop says nothing.

The monitor reports as steps complete. A loop hung in a collective, a deadlocked loader or
a step that takes minutes completes none, and the agent forgets a rank silent for its
`--forget-after` (5 minutes): a hung rank would then look like one whose process had exited,
and the ledger would book the hang as `no_process` while the `stalled` finding calls it a
hang. So while no report has gone out for `period_s`, a thread of its own sends one with
nothing new in it (docs/telemetry.md, keep-alives). It runs while the loop is blocked in C
(a collective, a sleep, a queue) as any Python thread does, and touches nothing the loop
times: no CUDA call, no interval of the loop's.
"""
from __future__ import annotations

import threading
from typing import Callable

from burnrate.exporter.telemetry import KEEPALIVE_S


class KeepAlive:
    """Calls `send()` each time `quiet_s()` (seconds since the last report) reaches `period_s`,
    from a daemon thread, until `stop()`."""

    def __init__(self, send: Callable[[], None], quiet_s: Callable[[], float], period_s: float = KEEPALIVE_S) -> None:
        self.period_s = period_s
        self._send, self._quiet_s = send, quiet_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="burnrate-keepalive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        wait = self.period_s
        while not self._stopped.wait(wait):
            quiet = self._quiet_s()
            if quiet >= self.period_s:
                self._send()
                quiet = 0.0
            wait = max(self.period_s - quiet, 0.01)
