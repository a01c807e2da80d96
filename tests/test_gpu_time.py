"""The agent's GPU-second counters against the contract's accounting: observed = allocated +
unallocated, allocated = busy + idle, share-weighted, true at any collection cadence.

The expectations are written from those definitions (time × share, split where shares add
up to more than a GPU), not from the agent's code; hypothesis varies the cadence, the
gaps, the shares and the holders."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from burnrate.agent.gpu_time import STALENESS_S, GpuClock
from burnrate.exporter.snapshot import Allocation, GpuIdentity, GpuReading, PodRef

T0 = 1_800_000_000.0
TRAIN = PodRef("ml", "llm-worker-0", "trainer", "llm")
NOTEBOOK = PodRef("research", "notebook-0", "jupyter", "")


def gpu(index: int, util: float | None) -> GpuReading:
    fields = {} if util is None else {"gpu_util": util}
    return GpuReading(GpuIdentity(index, f"GPU-{index}", f"00000000:{index + 1:02x}:00.0", "NVIDIA H100 80GB HBM3"),
                      up=True, fields=fields)


def totals(rows) -> dict:
    """{uuid: observed} and {(uuid, pod): (allocated, idle, busy)}."""
    observed = {r.gpu.identity.uuid: r.observed for r in rows}
    held = {(r.gpu.identity.uuid, h.pod): (h.allocated, h.idle, h.busy) for r in rows for h in r.holders}
    return observed, held


def test_time_is_counted_as_the_state_seen_before_it():
    clock = GpuClock(interval_s=10, keep_s=300)
    busy, idle = gpu(0, 80.0), gpu(0, 0.0)
    clock.advance(T0, [busy], [Allocation("GPU-0", "GPU-0", TRAIN)])
    # Every series starts at 0, so increase() sees the first interval.
    assert totals(clock.advance(T0, [busy], [Allocation("GPU-0", "GPU-0", TRAIN)])) == (
        {"GPU-0": 0.0}, {("GPU-0", TRAIN): (0.0, 0.0, 0.0)})
    clock.advance(T0 + 10, [idle], [Allocation("GPU-0", "GPU-0", TRAIN)])
    clock.advance(T0 + 40, [idle], [])
    observed, held = totals(clock.advance(T0 + 55, [busy], []))
    # 10 s busy, 30 s idle, then 15 s nobody held it.
    assert observed == {"GPU-0": 55.0}
    assert held == {("GPU-0", TRAIN): (40.0, 30.0, 10.0)}


def test_unknown_utilization_is_busy_and_shares_split_an_oversubscribed_gpu():
    clock = GpuClock(interval_s=10, keep_s=300)
    # Two pods that each report a whole time-sliced GPU: half each, never two GPUs' worth.
    both = [Allocation("GPU-0", "GPU-0::0", TRAIN), Allocation("GPU-0", "GPU-0::1", NOTEBOOK)]
    clock.advance(T0, [gpu(0, None)], both)
    observed, held = totals(clock.advance(T0 + 20, [gpu(0, None)], both))
    assert observed == {"GPU-0": 20.0}
    assert held == {("GPU-0", TRAIN): (10.0, 0.0, 10.0), ("GPU-0", NOTEBOOK): (10.0, 0.0, 10.0)}


def test_a_gap_past_the_staleness_bound_counts_one_interval():
    clock = GpuClock(interval_s=15, keep_s=3600)
    clock.advance(T0, [gpu(0, 0.0)], [Allocation("GPU-0", "GPU-0", TRAIN, share=0.5)])
    observed, held = totals(clock.advance(T0 + STALENESS_S + 1, [gpu(0, 0.0)], []))
    assert observed == {"GPU-0": 15.0} and held == {("GPU-0", TRAIN): (7.5, 7.5, 0.0)}


def test_gone_gpus_and_holders_stay_until_keep_s_then_go():
    clock = GpuClock(interval_s=10, keep_s=60)
    clock.advance(T0, [gpu(0, 50.0), gpu(1, 50.0)], [Allocation("GPU-1", "GPU-1", TRAIN)])
    observed, held = totals(clock.advance(T0 + 10, [gpu(0, 50.0)], []))
    # GPU 1 and its holder got their last 10 s and are still exported, to be scraped.
    assert observed == {"GPU-0": 10.0, "GPU-1": 10.0} and held == {("GPU-1", TRAIN): (10.0, 0.0, 10.0)}
    observed, held = totals(clock.advance(T0 + 71, [gpu(0, 50.0)], []))
    assert observed == {"GPU-0": 71.0} and held == {}


def test_a_pod_made_again_under_its_name_continues_its_series():
    """A StatefulSet's pod, or a job's pod restarted, comes back with a new UID and the same
    labels: one series that keeps counting, never two alike."""
    clock = GpuClock(interval_s=10, keep_s=300)
    before, after = (PodRef("ml", "llm-worker-0", "trainer", "llm", uid=u) for u in ("uid-1", "uid-2"))
    clock.advance(T0, [gpu(0, 90.0)], [Allocation("GPU-0", "GPU-0", before)])
    clock.advance(T0 + 10, [gpu(0, 90.0)], [Allocation("GPU-0", "GPU-0", after)])
    rows = clock.advance(T0 + 20, [gpu(0, 90.0)], [Allocation("GPU-0", "GPU-0", after)])
    [entry] = rows
    assert [(h.pod, h.allocated) for h in entry.holders] == [(after, 20.0)]


# --- properties ----------------------------------------------------------------------------

PODS = [PodRef("ml", f"w-{i}", "trainer", "llm") for i in range(3)]
state = st.tuples(
    st.floats(0.1, 400.0),                                          # seconds until the next collection
    st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=2, max_size=2),   # util per GPU
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), st.sampled_from([1.0, 0.5, 1 / 7, 0.25])),
             max_size=4),                                           # (GPU, pod, share) holders
)


@settings(max_examples=200, deadline=None)
@given(st.lists(state, min_size=1, max_size=30), st.sampled_from([1.0, 15.0, 60.0]))
def test_the_identities_hold_and_time_is_never_lost_or_made_up(states, interval):
    clock = GpuClock(interval_s=interval, keep_s=1e9)
    now, expected_observed = T0, 0.0
    expected = {}
    for elapsed, utils, holders in states:
        gpus = [gpu(i, u) for i, u in enumerate(utils)]
        allocs = [Allocation(f"GPU-{g}", f"GPU-{g}::{p}", PODS[p], share) for g, p, share in holders]
        clock.advance(now, gpus, allocs)
        # What the contract says this interval is worth, counted from the definitions.
        counted = interval if elapsed > STALENESS_S else elapsed
        expected_observed += counted
        for g in (0, 1):
            mine = [(PODS[p], s) for gg, p, s in holders if gg == g]
            whole = max(sum(s for _, s in mine), 1.0)
            for pod, share in mine:
                seconds = counted * share / whole
                allocated, idle = expected.get((g, pod), (0.0, 0.0))
                is_idle = utils[g] is not None and utils[g] <= 2.0
                expected[(g, pod)] = (allocated + seconds, idle + (seconds if is_idle else 0.0))
        now += elapsed
    observed, held = totals(clock.advance(now, [gpu(0, 0.0), gpu(1, 0.0)], []))
    # Differences of Unix times near 1.8e9 carry about 1e-7 s of rounding each.
    assert observed == pytest.approx({"GPU-0": expected_observed, "GPU-1": expected_observed}, rel=1e-9, abs=1e-5)
    for (uuid, pod), (allocated, idle, busy) in held.items():
        g = int(uuid.removeprefix("GPU-"))
        want_allocated, want_idle = expected.get((g, pod), (0.0, 0.0))
        assert math.isclose(allocated, want_allocated, rel_tol=1e-9, abs_tol=1e-5)
        assert math.isclose(idle, want_idle, rel_tol=1e-9, abs_tol=1e-5)
        assert math.isclose(allocated, idle + busy, rel_tol=1e-12, abs_tol=1e-9)
    for g in ("GPU-0", "GPU-1"):
        # A GPU is never held for longer than it was there.
        assert sum(a for (u, _), (a, _, _) in held.items() if u == g) <= observed[g] + 1e-6
    assert {(int(u.removeprefix("GPU-")), p) for u, p in held} == set(expected)

