"""The monitor's data wait on a device that runs behind the host, as a GPU does.

No GPU runs here, so the monitor is given a stand-in for one CUDA stream in place of its
CUDA clock: work launched on it runs after the work queued before it while the host goes
on, an event's time is when the stream reaches it, and the host blocks once a step's worth
of work is waiting, as CUDA's launch queue (or a loop's own syncs) makes it. The stand-in counts the stream's
own idle time, which is the truth the monitor's data wait is held to. On a real H200 the
reference trainer's host waited 3 to 4% of its step time for synthetic batches while the GPU
ran the steps queued before: counted in full, compute plus data wait came to 103 to 105% of
the step time.
"""
from __future__ import annotations

import logging
import time

import pytest

from burnrate.trainer.monitor import Monitor


class Event:
    def __init__(self, at: float) -> None:
        self.at = at

    def synchronize(self) -> None:
        time.sleep(max(self.at - time.perf_counter(), 0.0))

    def query(self) -> bool:
        return time.perf_counter() >= self.at


class Stream:
    """One device stream in real time, in the monitor's clock interface (mark, ready, seconds)."""

    def __init__(self, queue_s: float) -> None:
        self.queue_s = queue_s
        self.free_at = time.perf_counter()   # when the work queued so far is done
        self.idle = 0.0                      # seconds the stream had nothing to run

    def launch(self, seconds: float) -> None:
        now = time.perf_counter()
        self.idle += max(now - self.free_at, 0.0)
        self.free_at = max(self.free_at, now) + seconds
        time.sleep(max(self.free_at - time.perf_counter() - self.queue_s, 0.0))

    def mark(self) -> Event:
        return Event(max(self.free_at, time.perf_counter()))

    def ready(self, phase) -> bool:
        return phase.end.query() and all(e.query() for e in phase.done)

    def seconds(self, a: Event, b: Event) -> float:
        return b.at - a.at


def run(loader_s: float, work_s: tuple[float, ...], steps: int, inside_s: float = 0.0) -> tuple[dict, Stream]:
    """`steps` steps of a loop whose loader blocks the host `loader_s` per batch and whose
    compute launches `work_s` of device work, with a `data_wait()` of `inside_s` after the
    first launch (a mid-step prefetch, as nanoGPT does). One report at the end."""
    logging.getLogger("burnrate.monitor").setLevel(logging.ERROR)
    records: list[dict] = []
    stream = Stream(queue_s=sum(work_s))
    mon = Monitor(flops_per_token=1.0, seq_len=4, every_steps=steps, socket_path="/nonexistent/nobody.sock",
                  on_report=records.append, keepalive_s=0)
    mon._clock = stream   # the stand-in for _CudaClock
    stream.free_at = time.perf_counter()

    def loader():
        for _ in range(steps):
            time.sleep(loader_s)
            yield None

    for _ in mon.wrap(loader()):
        with mon.compute():
            stream.launch(work_s[0])
            if inside_s:
                with mon.data_wait():
                    time.sleep(inside_s)
            for w in work_s[1:]:
                stream.launch(w)
        mon.step(samples=1)
    mon.close()
    record = records[0]   # close() sends again what no agent took
    assert record["steps"] == steps
    return record, stream


def within_the_steps(record: dict, work_s: tuple[float, ...]) -> bool:
    """Compute and data wait within the host's step time, but for the step's work that can
    still be queued when the report goes out (the host's time stops before the device's)."""
    return record["compute_s"] + record["data_wait_s"] <= record["step_s"] + sum(work_s) + 0.005


def test_a_wait_the_device_spends_running_queued_steps_is_not_data_wait():
    """The loader (10 ms) is faster than the device (30 ms a step): after the first batch the
    device never waits for data, however long the host blocked on its loader."""
    record, stream = run(loader_s=0.010, work_s=(0.030,), steps=12)
    host_wait = 12 * 0.010
    assert record["data_wait_s"] < 0.4 * host_wait, record          # in full it would be >= 0.12 s
    assert record["data_wait_s"] == pytest.approx(stream.idle, abs=0.015)
    assert within_the_steps(record, (0.030,))


def test_a_starved_device_waits_for_what_the_loader_makes_it_wait():
    """The loader (40 ms) is slower than the device (10 ms a step): the device waits about
    30 ms a step, the stream's own idle time, and computes 10."""
    record, stream = run(loader_s=0.040, work_s=(0.010,), steps=8)
    assert stream.idle > 8 * 0.025
    assert record["data_wait_s"] == pytest.approx(stream.idle, abs=0.02)
    assert record["compute_s"] == pytest.approx(8 * 0.010, abs=0.02)
    assert within_the_steps(record, (0.010,))


@pytest.mark.parametrize("inside_s, device_waits", [(0.010, False), (0.060, True)])
def test_a_prefetch_inside_the_step_counts_as_far_as_the_device_waited(inside_s, device_waits):
    """A fetch in the middle of the step, after the forward pass (20 ms) was launched, in a
    loop whose steps launch 40 ms of work: 10 ms a step is hidden behind the work queued
    before it; 60 ms a step outlasts it, and the device waits about 20 ms a step. Either way
    the step's compute is the 40 ms of work launched."""
    work = (0.020, 0.020)
    record, stream = run(loader_s=0.0, work_s=work, steps=8, inside_s=inside_s)
    if device_waits:
        assert stream.idle > 8 * 0.012
    else:
        assert record["data_wait_s"] < 0.02, record   # in full it would be 0.08 s
    assert record["data_wait_s"] == pytest.approx(stream.idle, abs=0.02)
    assert record["compute_s"] == pytest.approx(8 * 0.040, abs=0.03)
    assert within_the_steps(record, work)
