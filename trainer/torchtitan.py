"""The monitor for torchtitan (0.3 or later), with no change to its Trainer: the job's
config selects a metrics processor that is torchtitan's own (its console, TensorBoard and
W&B logging unchanged) and also feeds burnrate's monitor.

    from burnrate.trainer.torchtitan import BurnrateMetricsProcessor, with_burnrate
    config = with_burnrate(llama3_8b())        # or metrics=BurnrateMetricsProcessor.Config(...)

The Trainer tells its metrics processor enough to close every step without a hook of its
own: `should_log(step)` opens each step; each batch it fetches adds its tokens to
`ntokens_since_last_log` and its fetch time to `data_loading_times` (data wait; compute
begins after the first fetch, and later fetches of the step are not compute); the
optimizer step ends compute (a post-hook on its optimizers); `log()` hands over the loss
and gradient norm on logging steps (1 and every `log_freq`). The steps between logs carry
the last logged values, so a report sent every few seconds, and the last one, has the
newest torchtitan logged. FLOPs per token are torchtitan's own count, so MFU agrees with
the MFU it logs over the same peak.

Between one step's optimizer step and the next step, the Trainer may save a checkpoint and
then validate: a save is known by the job's checkpoint settings (the steps torchtitan saves
at) and begins where the step's own work ends; a validation begins at its first batch (which
ends the save) and ends at its `log_validation()` call. Both are kept out of the step times,
and the agent hears each while it lasts (`Monitor.begin_checkpoint`, `begin_eval`), so a long
one is no stall. The save after the last step is not timed: the Trainer closes without
telling its metrics processor when that save ended.

Samples and tokens are each rank's data-parallel share, as torchtitan counts throughput:
ranks that share a batch through tensor, context or pipeline parallelism divide it.

Written for torchtitan's language-model `Trainer` (torchtitan.trainer), which asks
`should_log` as each step begins; trainers that ask it only after the step (flux's) would
see each step's fetches counted with the step before.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools import utils

from burnrate.exporter.telemetry import KEEPALIVE_S

from .monitor import Monitor


class BurnrateMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        socket_path: str | None = None
        """The agent's telemetry socket (default: BURNRATE_TELEMETRY_SOCKET, else the agent's own path)"""

        jsonl_path: str | None = None
        """Also append every record to this file, as JSON lines"""

        job: str = "local"
        """The training job's name where BURNRATE_TRAINING_JOB and the pod name give none"""

        every_s: float = 1.0
        """Send to the agent every so many seconds..."""

        every_steps: int = 0
        """...or, when above 0, every so many steps"""

        peak_tflops: float | None = None
        """The GPU's peak dense TFLOP/s, where burnrate's table does not know it"""

        keepalive_s: float = KEEPALIVE_S
        """With nothing sent for this long (a save, a validation, a hang), tell the agent the
        process lives, with the save's or the validation's seconds so far"""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        # The base class and the Trainer write three attributes through properties (below):
        # what they keep exists before the base class first writes them.
        self._ntokens = 0
        self._fetches = _Fetches(self)
        self._optimizers = None
        super().__init__(config, **kwargs)
        job = (kwargs.get("config_dict") or {})
        self._seq_len = job.get("training", {}).get("seq_len") or 0
        self._last_step = job.get("training", {}).get("steps")
        self._checkpoint = job.get("checkpoint", {})
        self.monitor: Monitor | None = None
        self._step: int | None = None        # the open step, until it is closed
        self._fresh_tokens = 0               # counted but not yet matched to a fetch
        self._computing = False
        self._ended: float | None = None     # when the open step's own work ended
        self._apart: str | None = None       # "save" or "validation", while one goes on
        self._loss = self._grad_norm = None     # the newest logged, carried by the steps after

    # --- what the Trainer writes -----------------------------------------------------
    @property
    def ntokens_since_last_log(self) -> int:
        return self._ntokens

    @ntokens_since_last_log.setter
    def ntokens_since_last_log(self, value: int) -> None:
        if value > self._ntokens:
            self._fresh_tokens += value - self._ntokens
            if self._ended is not None and self._apart != "validation":
                # Training batches are counted before the open step ends; after it, only
                # a validation's.
                self._begin_validation()
        self._ntokens = value

    @property
    def data_loading_times(self) -> list[float]:
        return self._fetches

    @data_loading_times.setter
    def data_loading_times(self, value: list[float]) -> None:
        self._fetches = _Fetches(self, value)

    @property
    def optimizers(self):
        return self._optimizers

    @optimizers.setter
    def optimizers(self, value) -> None:
        self._optimizers = value
        if value is not None:
            value.register_step_post_hook(self._optimizer_stepped)

    # --- what the Trainer calls --------------------------------------------------------
    def should_log(self, step: int) -> bool:
        if self._step is not None:
            self._close_step(time.perf_counter())
        if self.monitor is None:
            self.monitor = self._start_monitor(step - 1)
        self._step = step
        self._fresh_tokens = 0
        return super().should_log(step)

    def log(self, step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
            extra_metrics: dict[str, Any] | None = None) -> None:
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)
        self._loss, self._grad_norm = global_avg_loss, grad_norm
        self._work_ended(time.perf_counter())    # logging is the step's own work

    def log_validation(self, loss: float, step: int, extra_metrics: dict[str, Any] | None = None) -> None:
        super().log_validation(loss, step, extra_metrics)
        self._fresh_tokens = 0
        if self.monitor is None:
            return
        if self._apart != "validation":
            self._begin_validation()        # one with no batches
        self.monitor.end_eval()
        self._apart = None

    def close(self) -> None:
        if self._step is not None and self._ended is not None:
            self._close_step(self._ended)
        if self.monitor is not None:
            self.monitor.close()
        super().close()

    # --- the steps -----------------------------------------------------------------
    def _start_monitor(self, start_step: int) -> Monitor:
        c = self.config
        peak = c.peak_tflops * 1e12 if c.peak_tflops else None
        return Monitor(flops_per_token=float(self.num_flops_per_token), seq_len=self._seq_len,
                       device=utils.device_type, peak=peak, every_s=c.every_s,
                       every_steps=c.every_steps, socket_path=c.socket_path, jsonl_path=c.jsonl_path,
                       job=c.job, start_step=start_step, keepalive_s=c.keepalive_s)

    def _fetched(self, seconds: float) -> None:
        if self.monitor is None or self._step is None:
            return
        self.monitor.add_data_wait(seconds)
        if not self._computing:
            self.monitor.begin_compute()
            self._computing = True
        share = self.parallel_dims.non_data_parallel_size
        tokens, self._fresh_tokens = self._fresh_tokens, 0
        samples = tokens / self._seq_len if self._seq_len else 0
        self.monitor.micro_batch(samples=_count(samples / share), tokens=_count(tokens / share))

    def _optimizer_stepped(self, optimizer, args, kwargs) -> None:
        if self._computing:
            self.monitor.end_compute()
            self._computing = False
            if not MetricsProcessor.should_log(self, self._step):
                self._work_ended(time.perf_counter())
            else:
                self._ended = time.perf_counter()    # and again once it has logged

    def _work_ended(self, now: float) -> None:
        """The open step's own work ended at `now`: the last step closes there; after any
        other, the save the job's settings make there begins."""
        self._ended = now
        if self._step == self._last_step:
            self._close_step(now)
        elif self._saves_at(self._step) and self._apart is None:
            self.monitor.begin_checkpoint(since=now)
            self._apart = "save"

    def _begin_validation(self) -> None:
        """A validation's first batch: the save before it (if any) ended here. One with no save
        before it began where the step ended, one after the last step at its first batch."""
        now = time.perf_counter()
        since = now
        if self._apart == "save":
            self.monitor.end_checkpoint()
        elif self._step is not None and self._ended is not None:
            since = self._ended
        self.monitor.begin_eval(since=since)
        self._apart = "validation"

    def _close_step(self, now: float) -> None:
        """Close the open step at `now`: the save after it, if no validation ended it, ends here."""
        step, self._step = self._step, None
        if self._apart == "save":
            self.monitor.end_checkpoint()
            self._apart = None
        if self._computing:     # the step never reached its optimizer step
            self.monitor.end_compute()
            self._computing = False
        self.monitor.step(loss=self._loss, grad_norm=self._grad_norm)
        # After the last step, a validation is timed from its first batch.
        self._ended = now if step == self._last_step else None

    def _saves_at(self, step: int) -> bool:
        """Whether torchtitan's checkpointer saves after `step`, by the job's settings."""
        c = self._checkpoint
        if not c.get("enable") or c.get("load_only"):
            return False
        return ((step == 1 and c.get("enable_first_step_checkpoint", False)) or step == self._last_step
                or step % max(c.get("interval", 1), 1) == 0)


class _Fetches(list):
    """The Trainer's list of fetch times: each one appended is a training batch fetched."""

    def __init__(self, processor: BurnrateMetricsProcessor, values: list[float] = ()) -> None:
        super().__init__(values)
        self._processor = processor

    def append(self, seconds: float) -> None:
        super().append(seconds)
        self._processor._fetched(seconds)


def _count(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def with_burnrate(config: Any, **fields: Any) -> Any:
    """`config` (a torchtitan Trainer.Config) with its metrics processor swapped for
    burnrate's, its own metrics settings kept; `fields` set the burnrate ones."""
    kept = {f.name: getattr(config.metrics, f.name) for f in dataclasses.fields(config.metrics)}
    config.metrics = BurnrateMetricsProcessor.Config(**{**kept, **fields})
    return config
