"""What the framework callbacks (trainer.huggingface, trainer.lightning) share: a monitor
started when training starts, a clock mark since the last batch ended, and closing."""
from __future__ import annotations

import time
from typing import Any, Callable

from .monitor import Monitor


class MonitorHooks:
    def __init__(self, seq_len: int | None = None, **monitor_args: Any) -> None:
        """`seq_len`: the training sequence length, for tokens and the FLOPs per token;
        `monitor_args` go to `Monitor` (socket_path, peak, every_s, job, ...)."""
        self.seq_len = seq_len
        self.monitor_args = monitor_args
        self.monitor: Monitor | None = None
        self._mark = time.perf_counter()    # when the last batch, evaluation or save ended
        self._saving = False                # a save under way, begun where the framework decided on it

    def _start(self, model: Any, step: int) -> None:
        self.monitor = Monitor(model, seq_len=self.seq_len, start_step=step, **self.monitor_args)
        self._mark = time.perf_counter()

    def _set_apart(self, add: Callable[[float], None]) -> None:
        """Count the time since the mark with `add` (the monitor's add_eval or add_checkpoint)."""
        now = time.perf_counter()
        if self.monitor is not None:
            add(now - self._mark)
        self._mark = now

    def _begin_save(self) -> None:
        self.monitor.begin_checkpoint()
        self._saving = True

    def _end_save(self) -> None:
        """The save under way, if any, ended: its time is not the next fetch's."""
        if self._saving:
            self.monitor.end_checkpoint()
            self._saving = False
            self._mark = time.perf_counter()

    def _close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
