"""The simulated GPUs behave like GPUs: deterministic, physically plausible, drivable."""
import itertools

from burnrate.agent.gpu.simulated import H100_SXM, Load, RankWorkload, SimulatedReader
from burnrate.exporter import throttle
from burnrate.exporter.snapshot import RankKey, RankState


def run(reader, n):
    for _ in range(n):
        readings = reader.read()
    return readings


def ticking(step=5.0):
    ticks = itertools.count(0.0, step)
    return lambda: next(ticks)


def test_deterministic_from_seed():
    a = run(SimulatedReader(3, seed=11, clock=ticking()), 10)
    b = run(SimulatedReader(3, seed=11, clock=ticking()), 10)
    c = run(SimulatedReader(3, seed=12, clock=ticking()), 10)
    assert a == b
    assert [g.identity.uuid for g in a] != [g.identity.uuid for g in c]
    assert all("(simulated)" in g.identity.model_name for g in a)


def test_power_follows_utilization_and_temperature_lags():
    loads = {0: Load(0.0), 1: Load(1.0)}
    reader = SimulatedReader(2, seed=1, clock=ticking(1.0), workload=lambda: loads)
    first = reader.read()
    later = run(reader, 120)
    idle, busy = later[0].fields, later[1].fields
    assert H100_SXM.idle_w * 0.9 <= idle["power_w"] < 100 < busy["power_w"] <= H100_SXM.tdp_w
    assert idle["throttle_reasons"] & 0x1 and idle["sm_clock_mhz"] == H100_SXM.sm_clock_idle_mhz
    # temperature moves towards its target over tens of seconds, not instantly
    assert first[1].fields["temp_c"] < later[1].fields["temp_c"] - 20
    assert busy["fb_used_mib"] + busy["fb_free_mib"] + busy["fb_reserved_mib"] == busy["fb_total_mib"] == H100_SXM.memory_mib
    # energy integrates power
    assert later[1].fields["energy_mj"] - first[1].fields["energy_mj"] > 120 * 500 * 1000


def test_hot_gpu_throttles_with_the_thermal_bits():
    reader = SimulatedReader(2, seed=2, clock=ticking(5.0), hot_gpus=[1])
    cool, hot = run(reader, 100)
    assert cool.fields["throttle_reasons"] & throttle.THERMAL == 0
    assert hot.fields["throttle_reasons"] & throttle.SW_THERMAL
    assert hot.fields["sm_clock_mhz"] < 0.8 * cool.fields["sm_clock_mhz"]
    assert hot.fields["temp_c"] >= H100_SXM.slowdown_temp_c - 3


def test_nvlink_counter_grows_with_traffic():
    reader = SimulatedReader(1, seed=0, clock=ticking(1.0), workload=lambda: {0: Load(0.9, nvlink_bytes_per_s=1e9)})
    a = reader.read()[0]
    b = reader.read()[0]
    assert 0.98e9 < b.nvlink_bytes["tx"] - a.nvlink_bytes["tx"] < 1.02e9
    assert 1900 < b.fields["nvlink_bandwidth_mbps"] < 2100  # tx + rx, MB/s


def test_ranks_drive_their_gpus():
    states = {}

    def ranks():
        return tuple(states.values())

    def report(rank, compute, wall):
        states[rank] = RankState(RankKey("ml", f"p{rank}", "job", rank), {"compute_s": compute, "step_s": wall}, rank)

    reader = SimulatedReader(2, seed=0, clock=ticking(1.0), workload=RankWorkload(ranks, 2), idle_when_undriven=True)
    report(0, 0.0, 0.0); report(1, 0.0, 0.0)
    reader.read()
    report(0, 0.9, 1.0); report(1, 0.2, 1.0)   # rank 1 starves: 20% of its time computing
    busy, starving = reader.read()
    assert busy.fields["gpu_util"] > 80 and starving.fields["gpu_util"] < 30
