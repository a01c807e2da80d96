"""The monitor for PyTorch Lightning, with no change to the LightningModule:

    from burnrate.trainer.lightning import BurnrateCallback
    L.Trainer(callbacks=[BurnrateCallback(seq_len=1024)]).fit(module, loader)

Lightning fetches a batch before `on_train_batch_start`, so the time from the previous
batch's end is data wait; each batch is a micro-batch, and a step closes when the
optimizer stepped (`trainer.global_step` moved). Validation time is kept out of the step
times, and so is a checkpoint save: it is under way from `on_save_checkpoint` (called as
Lightning gathers the checkpoint, before it writes it) until the next hook (the next batch,
a validation, the end). The agent hears both as they go. Samples are each batch's first
dimension; tokens are samples × `seq_len`. The loss
is each batch's own, as `training_step` returned it: Lightning divides what it hands on by
`accumulate_grad_batches`, which is undone. FLOPs per token count attention where the
module or one of its submodules carries the model's config (trainer.flops); elsewhere,
pass `flops_per_token=`.
"""
from __future__ import annotations

import time
from typing import Any

from pytorch_lightning import Callback

from .hooks import MonitorHooks


class BurnrateCallback(MonitorHooks, Callback):
    def __init__(self, seq_len: int | None = None, **monitor_args: Any) -> None:
        super().__init__(seq_len, **monitor_args)
        self._global_step = 0
        self._validation_began = time.perf_counter()
        self._validating = False

    def on_train_start(self, trainer, pl_module) -> None:
        self._start(pl_module, trainer.global_step)
        self._global_step = trainer.global_step

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._end_save()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._end_save()
        self.monitor.add_data_wait(time.perf_counter() - self._mark)
        self.monitor.begin_compute()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.monitor.end_compute()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and pl_module.automatic_optimization:
            # Lightning scales the loss it backpropagates, and hands on, by the accumulation.
            loss = loss * trainer.accumulate_grad_batches
        self.monitor.micro_batch(samples=_samples(batch), loss=loss)
        if trainer.global_step != self._global_step:
            self._global_step = trainer.global_step
            self.monitor.step()
        self._mark = time.perf_counter()

    def on_validation_start(self, trainer, pl_module) -> None:
        # Validation runs between two batches: the time before it is the batch's, after it
        # the next fetch's.
        self._end_save()
        self._validation_began = time.perf_counter()
        if self.monitor is not None:
            self.monitor.begin_eval()       # heard while it lasts: a long validation is no stall
            self._validating = True

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.monitor is not None and self._validating:
            self.monitor.end_eval()
            self._validating = False
            self._mark += time.perf_counter() - self._validation_began

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        # Saved during a validation (a callback of the user's), a save stays in its time.
        if self.monitor is not None and not self._validating and not self._saving:
            self._begin_save()

    def on_train_end(self, trainer, pl_module) -> None:
        self._end_save()
        self._close()


def _samples(batch: Any) -> int:
    """The first dimension of the batch's first tensor (batches are tensors, or tuples,
    lists or dicts of them)."""
    while not hasattr(batch, "shape"):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return int(batch.shape[0])
