"""The monitor for Hugging Face's `Trainer`, with no change to the training loop:

    from burnrate.trainer.huggingface import BurnrateCallback
    Trainer(model, args, train_dataset=..., callbacks=[BurnrateCallback(seq_len=1024)]).train()

The Trainer fetches an optimizer step's micro-batches before `on_step_begin`, so the time
from the previous step's end to this one's begin is data wait, unless an evaluation or a
checkpoint save ended in between: that time is theirs, kept out of the step times. The
Trainer tells of an evaluation only when it ends, but calls back after each of its batches:
from the first, the evaluation is under way since the last step ended, and the agent hears
it as it goes (a long one is neither a stall nor paged as one). It tells of a save only once
it is made (`on_save`), but decides on it before: where its control says a save comes next,
with no log or evaluation before it, the save is under way from that callback on, and heard
as it goes too.
Samples are the micro-batches' per-device batch size; tokens are the Trainer's own count
(`include_num_input_tokens_seen`, per rank) where it keeps one, else samples × `seq_len`.
Loss and gradient norm are the Trainer's logged ones (every `logging_steps`), sent with
the step they were logged at: the Trainer logs after `on_step_end`, so a logging step
closes when its log arrives. Later steps carry the last logged values, so a report sent
every few seconds has the newest the Trainer logged.
"""
from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from .hooks import MonitorHooks


class BurnrateCallback(MonitorHooks, TrainerCallback):
    def __init__(self, seq_len: int | None = None, **monitor_args: Any) -> None:
        super().__init__(seq_len, **monitor_args)
        self._micro = 0
        self._tokens_seen = 0
        self._ended_step: dict[str, Any] | None = None    # its counts, until its log (if any) arrives
        self._loss: float | None = None
        self._grad_norm: float | None = None
        self._training = False
        self._evaluating = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._start(model, state.global_step)
        self._tokens_seen = state.num_input_tokens_seen
        self._training = True

    def on_step_begin(self, args, state, control, **kwargs):
        self._end_save()            # one the Trainer decided on and did not make
        self._close_step()
        now = time.perf_counter()
        self.monitor.add_data_wait(now - self._mark)
        self.monitor.begin_compute()
        self._micro = 0

    def on_substep_end(self, args, state, control, **kwargs):
        self._micro += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.monitor.end_compute()
        samples = (self._micro + 1) * args.per_device_train_batch_size
        seen, self._tokens_seen = state.num_input_tokens_seen - self._tokens_seen, state.num_input_tokens_seen
        # The Trainer gathers its token count over every rank.
        tokens = seen // max(args.world_size, 1) if seen > 0 else None
        # The Trainer's own flow callback, called before this one, has decided on the log.
        self._ended_step = {"samples": samples, "tokens": tokens}
        if not control.should_log:
            self._close_step()
        self._save_may_begin(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._save_may_begin(control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        self._loss = logs.get("loss", self._loss)
        self._grad_norm = logs.get("grad_norm", self._grad_norm)
        self._close_step()
        self._save_may_begin(control)

    def on_prediction_step(self, args, state, control, **kwargs):
        if self._training and not self._evaluating:
            self.monitor.begin_eval(since=self._mark)
            self._evaluating = True

    def on_evaluate(self, args, state, control, **kwargs):
        self._end_evaluation()
        self._save_may_begin(control)

    def on_predict(self, args, state, control, **kwargs):
        self._end_evaluation()

    def on_save(self, args, state, control, **kwargs):
        if self._saving:
            self._end_save()
        else:
            self._set_apart(self.monitor.add_checkpoint)

    def on_train_end(self, args, state, control, **kwargs):
        self._close_step()
        if self._evaluating:
            self._end_evaluation()
        self._end_save()
        self._training = False
        self._close()

    def _end_evaluation(self) -> None:
        """An evaluation (or a prediction) pass ended: one heard since its first batch ends there,
        one with no batch is the time since the last mark; outside training (`evaluate()` before
        or after `train()`), none of the run's."""
        if not self._training:
            return
        if not self._evaluating:
            self._set_apart(self.monitor.add_eval)
            return
        self.monitor.end_eval()
        self._evaluating = False
        self._mark = time.perf_counter()

    def _save_may_begin(self, control) -> None:
        """A save comes next, with neither a log nor an evaluation before it: it is under way
        from here (the Trainer clears each flag as it acts on it, before calling back)."""
        if (self._training and control.should_save and not control.should_log and not control.should_evaluate
                and not self._evaluating and not self._saving):
            self._begin_save()

    def _close_step(self) -> None:
        """Count the step that ended, if it is still open, with the last logged values."""
        if self._ended_step is not None:
            self.monitor.step(**self._ended_step, loss=self._loss, grad_norm=self._grad_norm)
            self._ended_step = None
            self._mark = time.perf_counter()
