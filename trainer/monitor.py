"""The instrumentation library: drop it into any PyTorch loop.

    with Monitor(model, seq_len=T) as mon:             # once; sends what is left at the end
        for x, y in mon.wrap(loader):                  # times the wait for each batch
            with mon.compute():                        # this rank's own compute
                loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad()
            mon.step(samples=len(x), loss=loss)        # counts the step, reports when due

With gradient accumulation, each micro-batch is counted with `micro_batch(samples, loss=)`
and `step()` closes the optimizer step with their sums and mean loss. A loop that fetches
its next batch inside the step times the fetch with `data_wait()`: that time is data wait,
never also compute. `eval()` and `checkpoint()` keep their time out of the step times.

Per step it measures the wait for data, this rank's own compute and the step's wall
time, counts samples, tokens and model FLOPs, and every few steps (or seconds) sends
the deltas since the last report to the node agent (docs/telemetry.md).

In DDP every rank's step takes the same wall time, because the gradient all-reduce
waits for the slowest rank. What tells the ranks apart is how long each one computed
before it had to wait: `watch(ddp_model)` puts a pass-through hook on the all-reduce
that marks when this rank's last gradient bucket was ready and when the reduction
finished; that wait is taken out of the compute phase. The straggler then shows the
longest compute and the shortest wait.

On GPU the phases are timed with CUDA events that are read back a step or more later
(`Event.query()` never blocks); the only synchronization and `.item()` calls happen on
report steps. The wait for data counts as far as the GPU waited too: the host blocks on
its loader while the GPU still runs the steps queued before, and that overlap is neither
lost time nor starvation. A wait between steps counts up to the GPU's idle time between
the two compute phases around it (their events), a wait timed with `data_wait()` inside a
phase up to the GPU's idle time across it (events of its own); on CPU the two are the same.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from burnrate.exporter.telemetry import KEEPALIVE_S, SCHEMA_VERSION, TelemetrySink, encode

from .flops import Peak, device_type, model_flops_per_token, peak_flops
from .keepalive import KeepAlive

from .telemetry import Identity

# The standard library is all the monitor needs: torch is imported only when there is a
# GPU to time or a DDP model to watch, so any loop (and any image) can report.
if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

log = logging.getLogger("burnrate.monitor")


@dataclass
class _Interval:
    """Deltas since the last report."""

    steps: int = 0
    step_s: float = 0.0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    samples: int = 0
    tokens: int = 0
    flops: float = 0.0
    checkpoint_s: float = 0.0
    eval_s: float = 0.0


# The record's deltas: a datagram the agent could not take hands them on to the next one.
OWED = ("steps", "step_s", "data_wait_s", "compute_s", "samples", "tokens", "flops", "checkpoint_s", "eval_s")


_APART = {"checkpoint_s": "a checkpoint save", "eval_s": "an evaluation"}


@dataclass
class _Apart:
    """A save or an evaluation under way: its counter, when it began, and until when the agent
    has heard of it."""

    counter: str
    began: float
    told: float


@dataclass
class _Phase:
    """One compute phase whose duration may not be known yet (GPU events in flight)."""

    start: Any = None
    end: Any = None
    ready: Any = None                       # the last gradient bucket was ready
    done: list = field(default_factory=list)  # each bucket's all-reduce finished
    before: float = 0.0                     # the host's data wait since the phase before ended
    after: Any = None                       # the end of the phase before, where there was one
    waits: list = field(default_factory=list)  # data waits inside the phase: (seconds, marks or None)


@dataclass
class _MicroBatches:
    """Micro-batches counted since the last optimizer step (gradient accumulation)."""

    count: int = 0
    samples: int = 0
    tokens: int = 0
    losses: int = 0
    loss_sum: Any = 0.0


class _CpuClock:
    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, phase: _Phase) -> bool:
        return True

    def seconds(self, a: float, b: float) -> float:
        return b - a


class _CudaClock:
    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event

    def mark(self) -> torch.cuda.Event:
        event = self._event(enable_timing=True)
        event.record()
        return event

    def ready(self, phase: _Phase) -> bool:
        return phase.end.query() and all(e.query() for e in phase.done)

    def seconds(self, a: torch.cuda.Event, b: torch.cuda.Event) -> float:
        # Only called once `ready` said so, or on report steps after synchronize().
        return a.elapsed_time(b) / 1e3


class Monitor:
    """Per-step training measurements, reported to the burnrate agent."""

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        seq_len: int | None = None,
        flops_per_token: float | None = None,
        device: torch.device | str | None = None,
        peak: float | None = None,
        every_steps: int = 0,
        every_s: float = 1.0,
        identity: Identity | None = None,
        sink: TelemetrySink | None = None,
        socket_path: str | None = None,
        jsonl_path: str | None = None,
        job: str = "local",
        start_step: int | None = None,
        start_time: float | None = None,
        on_report: Callable[[dict], None] | None = None,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        """`model` and `seq_len` give the FLOPs per token (or pass `flops_per_token`);
        `device` defaults to the model's; `peak` overrides the peak FLOP/s table.
        Reports go out every `every_steps` steps, or when 0, every `every_s` seconds;
        `on_report` also gets each record (to print progress, say). `start_step` is the step
        a resumed run continues from (0 for a fresh start); left out, the ledger knows the
        steps but not whether any were computed again. `start_time` is when this process
        started (default: the kernel's record of it), for the ledger's start-up time. The agent
        hears the rank at once (a message with nothing counted), and while no report has gone
        out for `keepalive_s` (the start-up to the first step, a hang, a long step), one with
        nothing new says the process still lives (trainer.keepalive); 0 sends none."""
        self.seq_len = seq_len
        if flops_per_token is None and model is not None and seq_len:
            flops_per_token = model_flops_per_token(model, seq_len)
        self.flops_per_token = flops_per_token or 0.0
        if device is None:
            device = next(model.parameters()).device if model is not None else "cpu"
        self.device = device
        self.peak: Peak = peak_flops(device, peak)
        self.every_steps = every_steps
        self.every_s = every_s
        self.identity = identity or Identity.from_env(job)
        self.sink = sink or TelemetrySink(socket_path, jsonl_path)
        self.step_no = start_step or 0
        self.resumed_from = start_step
        self.start_time = process_start_time() if start_time is None else start_time
        self.on_report = on_report
        self.last_compute_s = 0.0
        self.last_checkpoint_time: float | None = None
        self._clock = _CudaClock() if device_type(device) == "cuda" else _CpuClock()
        self._interval = _Interval()
        self._pending: deque[_Phase] = deque()
        self._waited = 0.0                  # the host's data wait since the last phase ended
        self._last_end: Any = None          # that phase's end mark
        self._owed: dict[str, float] | None = None     # deltas no datagram has delivered yet
        self._phase: _Phase | None = None
        self._loss: Any = None
        self._grad_norm: Any = None
        self._step_end = time.perf_counter()
        self._last_report = time.monotonic()
        self._micro = _MicroBatches()
        self._warned = False
        self._closed = False
        self._pid = os.getpid()
        # The loop's reports and the keep-alives share the sink; the last report is what a
        # keep-alive repeats, with nothing new.
        self._sending = threading.Lock()
        self._apart: _Apart | None = None                   # a save or an evaluation under way
        self._ahead: dict[str, float] = {}      # its seconds keep-alives told the agent before a report
        self._keepalive = KeepAlive(self._keep_alive, lambda: time.monotonic() - self._last_report,
                                    keepalive_s) if keepalive_s > 0 else None
        # The agent hears the rank from here on, before its first step: it lives, and (where no
        # kubelet says who holds a GPU) holds its GPU, while the model compiles and the first
        # batches load. Nothing in it is counted, so it goes to the agent only.
        self._last_record = self._record(_Interval(), None, None, None)
        self.sink.send_bytes(encode(self._last_record))
        if self._keepalive is not None:
            self._keepalive.start()
        # A loop that ends without close() still sends its last partial interval.
        atexit.register(self.close)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop-facing API --------------------------------------------------------
    def wrap(self, batches: Iterable) -> Iterator:
        """Yield from `batches`, timing how long each `next()` blocks."""
        it = iter(batches)
        self._step_end = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.add_data_wait(time.perf_counter() - t0)
            yield batch

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        """Time fetching a batch where no iterator is wrapped (`X, Y = get_batch()`). Inside
        `compute()` too, as loops that prefetch mid-step do: the time the device waited
        counts once, as wait, and the rest as compute."""
        marks = self._clock.mark() if self._phase is not None else None
        t0 = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            self._add_wait(seconds, None if marks is None else (marks, self._clock.mark()))

    # Framework callbacks (trainer.hooks) see phases begin and end in separate calls.
    def add_data_wait(self, seconds: float) -> None:
        """Count `seconds` blocked on data; inside a compute phase, they are not compute.
        Between phases they count up to the device's idle time between them."""
        self._add_wait(seconds, None)

    def _add_wait(self, seconds: float, marks: tuple | None) -> None:
        if self._phase is not None:
            self._phase.waits.append((seconds, marks))
        else:
            self._waited += seconds

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Time this rank's forward, backward and optimizer step."""
        self.begin_compute()
        try:
            yield
        finally:
            self.end_compute()

    def begin_compute(self) -> None:
        self._phase = _Phase(start=self._clock.mark(), before=self._waited, after=self._last_end)
        self._waited = 0.0

    def end_compute(self) -> None:
        phase, self._phase = self._phase, None
        if phase is not None:
            phase.end = self._last_end = self._clock.mark()
            self._pending.append(phase)

    def micro_batch(self, samples: int, tokens: int | None = None, loss: Any = None) -> None:
        """Count one micro-batch of a step that accumulates gradients over several. `loss` is
        the micro-batch's own loss, before any division by the accumulation steps."""
        micro = self._micro
        micro.count += 1
        micro.samples += samples
        micro.tokens += samples * (self.seq_len or 0) if tokens is None else tokens
        if loss is not None:
            # Tensors add on their device without a sync; the mean is read on report steps.
            micro.loss_sum = micro.loss_sum + (loss.detach() if hasattr(loss, "detach") else loss)
            micro.losses += 1

    def step(self, samples: int | None = None, tokens: int | None = None, loss: Any = None,
             grad_norm: Any = None) -> None:
        """Close an optimizer step. Without `samples`, the micro-batches counted since the
        last step give samples, tokens and (their mean) loss. `loss` and `grad_norm` may be
        tensors: they are read only when a report goes out."""
        now = time.perf_counter()
        micro = self._micro
        if micro.count:     # a fresh count only after micro-batches: nothing new per plain step
            self._micro = _MicroBatches()
        if samples is None:
            if not micro.count:
                raise ValueError("step() needs samples=, or micro_batch() calls before it")
            samples, tokens = micro.samples, micro.tokens if tokens is None else tokens
            if loss is None and micro.losses:
                loss = micro.loss_sum / micro.losses
        if tokens is None:
            tokens = samples * (self.seq_len or 0)
        iv = self._interval
        # A wait no compute phase followed (a loop that times no compute) counts as it was.
        iv.data_wait_s += self._waited
        self._waited = 0.0
        iv.steps += 1
        iv.step_s += now - self._step_end
        iv.samples += samples
        iv.tokens += tokens
        iv.flops += tokens * self.flops_per_token
        self._step_end = now
        self.step_no += 1
        self._loss, self._grad_norm = loss, grad_norm
        self._resolve(block=False)
        if self._due():
            self.report()

    def checkpoint(self) -> contextlib.AbstractContextManager[None]:
        """Time a checkpoint save (`begin_checkpoint` … `end_checkpoint`)."""
        return _apart(self.begin_checkpoint, self.end_checkpoint)

    def begin_checkpoint(self, since: float | None = None) -> None:
        """A checkpoint save begins. Its time is kept out of the step times, and the agent hears
        it while it lasts: each keep-alive carries its seconds so far, so a long save is neither
        a stall nor missing from a window that closes before it ends. `since`: when it began, by
        `time.perf_counter()`, as for `begin_eval`."""
        self._begin_apart("checkpoint_s", since)

    def end_checkpoint(self) -> None:
        self.add_checkpoint(self._end_apart("checkpoint_s"))

    def add_checkpoint(self, seconds: float) -> None:
        """Count a checkpoint save of `seconds` that just ended, kept out of the step times."""
        self._interval.checkpoint_s += seconds
        self._step_end += seconds
        self.last_checkpoint_time = time.time()

    def eval(self) -> contextlib.AbstractContextManager[None]:
        """Time an evaluation pass (`begin_eval` … `end_eval`)."""
        return _apart(self.begin_eval, self.end_eval)

    def begin_eval(self, since: float | None = None) -> None:
        """An evaluation pass begins: kept out of the step times, and heard while it lasts, as a
        save is (`begin_checkpoint`). `since`: when it began, by `time.perf_counter()`, for a
        loop that learns of it only once it is under way (a framework's first evaluation batch)."""
        self._begin_apart("eval_s", since)

    def end_eval(self) -> None:
        self.add_eval(self._end_apart("eval_s"))

    def add_eval(self, seconds: float) -> None:
        """Count an evaluation of `seconds` that just ended, kept out of the step times."""
        self._interval.eval_s += seconds
        self._step_end += seconds

    def watch(self, ddp_model: nn.Module, process_group: dist.ProcessGroup | None = None) -> None:
        """Separate waiting for other ranks from this rank's compute, by a pass-through
        hook on DDP's gradient all-reduce (the default reduction, unchanged)."""
        # Unannotated on purpose: DDP rejects a hook whose annotations are not the exact
        # objects it expects, and this module's annotations are postponed (strings).
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state, bucket):
            return self._allreduce_hook(allreduce_hook, state, bucket)

        ddp_model.register_comm_hook(process_group, hook)

    def close(self) -> None:
        """Send what is left and release the socket. Runs at interpreter exit if the loop
        did not call it; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if os.getpid() != self._pid:
            return      # the exit of a child forked from the rank's process, which inherited this at exit
        if self._keepalive is not None:
            self._keepalive.stop()
        iv = self._interval
        if iv.steps or iv.checkpoint_s or iv.eval_s or self._owed:
            self.report()
        # The process trains no more, however long its exit takes: the agent hears it from this
        # message's `final`, where the end of its keep-alives would leave it a live process's
        # silence until the next was due (docs/telemetry.md).
        with self._sending:
            self.sink.send_bytes(encode({**self._quiet(), "final": True}))
        self.sink.close()

    # --- internals ----------------------------------------------------------------
    def _allreduce_hook(self, allreduce_hook: Callable, process_group: dist.ProcessGroup | None,
                        bucket: dist.GradBucket) -> torch.futures.Future:
        phase = self._phase
        if phase is not None and bucket.is_last():
            phase.ready = self._clock.mark()

        def finished(fut: torch.futures.Future) -> torch.Tensor:
            # Runs once the reduction is complete (on GPU: on a stream that waits for it).
            if phase is not None:
                phase.done.append(self._clock.mark())
            return fut.value()

        return allreduce_hook(process_group, bucket).then(finished)

    def _resolve(self, block: bool) -> None:
        while self._pending:
            phase = self._pending[0]
            if not self._clock.ready(phase):
                if not block:
                    return
                phase.end.synchronize()
                for e in phase.done:
                    e.synchronize()
            self._pending.popleft()
            # The host's waits, as far as the device waited with it: between phases, up to its
            # idle time between them; inside, up to its idle time across the wait's own marks.
            if phase.before:
                gap = self._clock.seconds(phase.after, phase.start) if phase.after is not None else phase.before
                self._interval.data_wait_s += min(phase.before, max(gap, 0.0))
            inside = sum(min(s, max(self._clock.seconds(*marks), 0.0)) if marks else s for s, marks in phase.waits)
            self._interval.data_wait_s += inside
            seconds = max(self._clock.seconds(phase.start, phase.end) - inside, 0.0)
            if phase.ready is not None and phase.done:
                waited = max(self._clock.seconds(phase.ready, d) for d in phase.done)
                seconds -= min(max(waited, 0.0), seconds)
            self._interval.compute_s += seconds
            self.last_compute_s = seconds

    def _begin_apart(self, counter: str, since: float | None = None) -> None:
        if self._interval.steps:
            # The steps since the last report go now, with their own time: held back through a
            # long save or evaluation, they would read as made after it (a run's first steps as
            # start-up, its last after the save that ends it).
            self.report()
        with self._sending:
            if self._apart is not None:
                raise RuntimeError(f"burnrate: {_APART[counter]} began while {_APART[self._apart.counter]} "
                                   "was under way")
            now = time.perf_counter()
            began = now if since is None else min(since, now)
            self._apart = _Apart(counter, began, began)

    def _end_apart(self, counter: str) -> float:
        """The seconds since the matching begin: keep-alives may have told the agent some of them
        already (`_ahead`), which the next report's datagram leaves out."""
        with self._sending:
            apart = self._apart
            if apart is None or apart.counter != counter:
                raise RuntimeError(f"burnrate: {_APART[counter]} ended that had not begun")
            self._apart = None
        return time.perf_counter() - apart.began

    def _due(self) -> bool:
        if self.every_steps:
            return self.step_no % self.every_steps == 0
        return time.monotonic() - self._last_report >= self.every_s

    def report(self) -> dict:
        """Send the deltas since the last report now (a sync point on GPU)."""
        self._resolve(block=True)
        iv = self._interval
        mfu = iv.flops / (iv.step_s * self.peak.flops) if iv.step_s > 0 and self.peak.flops > 0 else None
        if mfu is not None and mfu > 1:
            # Only a wrong peak gets here (an estimate, or a bad override); the agent rejects
            # ratios above 1, and with them the whole record.
            mfu = None
        record = self._record(iv, _scalar(self._loss), _scalar(self._grad_norm), mfu)
        with self._sending:
            # What earlier datagrams could not deliver (the agent's queue full as every rank of a
            # job reports at once, or no agent yet) goes with this one: delayed, never lost. What
            # keep-alives told the agent ahead of it (a save or an evaluation under way) does not;
            # a report that does not hold all of that yet leaves the rest to the next.
            owed = dict.fromkeys(OWED, 0) if self._owed is None else dict(self._owed)
            for k, ahead in self._ahead.items():
                early = min(ahead, record[k] + owed[k])
                owed[k] -= early
                self._ahead[k] = ahead - early
            datagram = {**record, **{k: record[k] + owed[k] for k in OWED if owed[k]}} if any(owed.values()) \
                else record
            delivered = self.sink.send(record, None if datagram is record else datagram)
            self._last_record = record
        self._owed = None if delivered else {k: datagram[k] for k in OWED}
        if not delivered and not self._warned:
            self._warned = True
            self._warn_undelivered()
        if self.on_report is not None:
            self.on_report(record)
        self._interval = _Interval()
        self._last_report = time.monotonic()
        return record

    def _record(self, iv: _Interval, loss: float | None, grad_norm: float | None, mfu: float | None) -> dict:
        ident = self.identity
        return {
            "v": SCHEMA_VERSION,
            "training_job": ident.training_job,
            "namespace": ident.namespace,
            "pod": ident.pod,
            "rank": ident.rank,
            "local_rank": ident.local_rank,
            "world_size": ident.world_size,
            "step": self.step_no,
            "time": time.time(),
            "steps": iv.steps,
            "step_s": iv.step_s,
            "data_wait_s": iv.data_wait_s,
            "compute_s": iv.compute_s,
            "samples": iv.samples,
            "tokens": iv.tokens,
            "flops": iv.flops,
            "loss": loss,
            "grad_norm": grad_norm,
            "mfu": mfu,
            "peak_flops": self.peak.flops,
            "peak_source": self.peak.source,
            "checkpoint_time": self.last_checkpoint_time,
            "checkpoint_s": iv.checkpoint_s,
            "eval_s": iv.eval_s,
            "start_time": self.start_time,
            "resumed_from": self.resumed_from,
            "final": False,
        }

    def _keep_alive(self) -> None:
        """The last report again with nothing new in it: no steps or seconds, no loss or MFU (the
        agent keeps their last values), to the agent only (the JSON lines hold intervals); but for
        the seconds of a save or an evaluation under way since the agent last heard of it."""
        with self._sending:
            if self._closed:
                return
            quiet = self._quiet()
            apart, now = self._apart, time.perf_counter()
            if apart is not None:
                quiet[apart.counter] = now - apart.told
            if self.sink.send_bytes(encode(quiet)) and apart is not None:
                self._ahead[apart.counter] = self._ahead.get(apart.counter, 0.0) + now - apart.told
                apart.told = now

    def _quiet(self) -> dict:
        """The last report again with nothing new in it."""
        return {**self._last_record, **dict.fromkeys(OWED, 0), "time": time.time(), "loss": None, "grad_norm": None,
                "mfu": None}

    def _warn_undelivered(self) -> None:
        error = self.sink.last_error
        if error is not None and error.errno in (errno.ENOENT, errno.ECONNREFUSED):
            log.warning("burnrate: no agent is listening at %s, so this rank's telemetry is dropped (once the "
                        "agent runs there it arrives; BURNRATE_TELEMETRY_SOCKET names another socket)",
                        self.sink.path)
        else:
            log.warning("burnrate: telemetry to %s is dropped: %s", self.sink.path,
                        error.strerror if error is not None else "unknown error")


def process_start_time() -> float:
    """Unix time this process started, from /proc (so the model's loading, which happens
    before any monitor exists, counts as start-up); where /proc is absent, this module's import."""
    try:
        with open("/proc/self/stat", "rb") as f:
            # Field 22, after the parenthesised command name (which may hold spaces).
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


_IMPORTED = time.time()


@contextlib.contextmanager
def _apart(begin: Callable[[], None], end: Callable[[], None]) -> Iterator[None]:
    begin()
    try:
        yield
    finally:
        end()


def _scalar(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "detach"):   # a tensor
        return float(value.detach().float().item())  # a GPU sync: report steps only
    return float(value)
