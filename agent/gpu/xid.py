"""XID critical errors, counted per code per GPU from an NVML event set.

dcgm-exporter keeps only the last XID code; burnrate counts every event, so a GPU
that threw XID 79 once and XID 13 forty times shows both.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..thread_names import name_thread


def handle_key(handle: Any) -> int:
    """A device handle's address. NVML handles are ctypes pointers: two pointer objects
    for one device compare unequal, their addresses do not."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class XidWatcher:
    """Waits on one NVML event set in a daemon thread and counts XID events per device.

    The wait has a short timeout (`wait_ms`) so that `close()` returns promptly.
    """

    def __init__(self, nvml: Any, wait_ms: int = 500) -> None:
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._lock = threading.Lock()
        self._counts: dict[int, dict[int, int]] = {}
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            # Events unavailable on this driver: XID counting is off, the rest still works.
            self._set = None

    def register(self, handle: Any) -> bool:
        """Watch one GPU. False where it cannot report XID events."""
        nvml = self._nvml
        if self._set is None:
            return False
        try:
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return False
            raise
        with self._lock:   # GPUs register from their own threads
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
                self._thread.start()
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def counts(self, handle: Any) -> tuple[dict[int, int], int | None]:
        """(events per XID code, last code) seen so far for one GPU."""
        key = handle_key(handle)
        with self._lock:
            return dict(self._counts.get(key, {})), self._last.get(key)

    def _run(self) -> None:
        name_thread("nvml-xid")
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, self._wait_ms)
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_TIMEOUT:
                    # A failing wait returns at once; pause so the loop cannot spin a core.
                    self._stop.wait(self._wait_ms / 1000)
                continue
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                self._record(handle_key(data.device), int(data.eventData))

    def _record(self, key: int, code: int) -> None:
        with self._lock:
            per_code = self._counts.setdefault(key, {})
            per_code[code] = per_code.get(code, 0) + 1
            self._last[key] = code

    def close(self) -> None:
        """Stop the thread (within about one wait) and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 1.0)
            if self._thread.is_alive():
                # The wait is stuck in the driver; freeing the set under it is unsafe.
                return
        if self._set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._set)
            except self._nvml.NVMLError:
                pass  # shutting down: a set the driver already dropped needs no freeing
            self._set = None
