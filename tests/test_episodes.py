"""Findings merged into episodes: one finding per problem, with its basis in the evidence."""
from __future__ import annotations

import numpy as np
import pytest

from burnrate.analyzer.detectors import detect_all
from burnrate.analyzer.detectors.episodes import KEYS, Config, merge_episodes
from burnrate.analyzer.detectors.findings import KINDS, Finding
from tests.test_detectors import STEP, T0, Fleet

MIN = 60.0
HOUR = 3600.0


def idle(start_min: float, end_min: float, gpu: str = "0", job: str = "nb", pod: str = "nb-0", host: str = "n1",
         severity: str = "warning", **evidence) -> Finding:
    hours = (end_min - start_min) / 60
    return Finding("idle_gpu", severity, T0 + start_min * MIN, T0 + end_min * MIN, namespace="ml",
                   training_job=job, hostname=host, gpu=gpu, pod=pod, wasted_gpu_hours=hours,
                   evidence={"idle_hours": hours, **evidence}, recommendation=f"{severity} advice")


def test_every_kind_has_a_merge_key():
    assert set(KEYS) == set(KINDS)


def test_stretches_ten_minutes_apart_are_one_episode():
    [f] = merge_episodes([idle(0, 60), idle(70, 100)])
    assert (f.start, f.end) == (T0, T0 + 100 * MIN)
    assert f.wasted_gpu_hours == pytest.approx(1.5)
    assert f.evidence["episodes"] == 2
    assert f.evidence["hours"] == pytest.approx(1.5)           # the stretches, not end - start
    assert f.evidence["idle_hours"] == pytest.approx(1.5)
    assert f.gpu == "0" and f.evidence["gpus"] == [0]


def test_stretches_two_hours_apart_stay_apart():
    found = merge_episodes([idle(0, 60), idle(180, 240)])
    assert [(f.start, f.evidence["episodes"], f.evidence["hours"]) for f in found] == [
        (T0, 1, 1.0), (T0 + 180 * MIN, 1, 1.0)]


def test_the_gap_is_configurable():
    assert len(merge_episodes([idle(0, 60), idle(70, 100)], Config(gap_minutes=5))) == 2
    assert len(merge_episodes([idle(0, 60), idle(180, 240)], Config(gap_minutes=150))) == 1


def test_close_stretches_chain_into_one_episode():
    # 0-60, 80-140, 160-200: each 20 min from the next, the first and last 100 min apart.
    [f] = merge_episodes([idle(160, 200), idle(0, 60), idle(80, 140)])
    assert f.evidence["episodes"] == 3 and f.evidence["hours"] == pytest.approx(160 / 60)


def test_different_jobs_never_merge():
    found = merge_episodes([idle(0, 60, job="a", pod="a-0"), idle(0, 60, job="b", pod="b-0")])
    assert sorted(f.training_job for f in found) == ["a", "b"]
    assert all(f.evidence["episodes"] == 1 for f in found)


def test_different_kinds_never_merge():
    other = Finding("stalled", "critical", T0, T0 + HOUR, namespace="ml", training_job="nb")
    assert len(merge_episodes([idle(0, 60), other])) == 2


def test_severity_and_advice_are_the_worst_members():
    [f] = merge_episodes([idle(0, 60), idle(70, 80, severity="critical"), idle(90, 100)])
    assert f.severity == "critical" and f.recommendation == "critical advice"


def test_gpus_of_a_job_merge_into_one_finding_with_the_gpu_list():
    stretches = [idle(0, 60, gpu=g) for g in ("10", "2", "0", "1")] + [idle(70, 100, gpu="2")]
    [f] = merge_episodes(stretches)
    assert f.gpu == "0,1,2,10" and f.evidence["gpus"] == [0, 1, 2, 10]
    assert f.hostname == "n1" and f.pod == "nb-0"
    assert f.evidence["episodes"] == 2                           # two stretches of time, on any GPU
    assert f.evidence["hours"] == pytest.approx(1.5)
    assert f.evidence["idle_hours"] == pytest.approx(4.5)         # summed over GPUs: GPU-hours
    assert f.wasted_gpu_hours == pytest.approx(4.5)
    assert "nodes" not in f.evidence


def test_a_job_across_nodes_names_no_single_node_or_pod():
    [f] = merge_episodes([idle(0, 60, gpu="0", host="n1", pod="w-0"), idle(0, 60, gpu="3", host="n2", pod="w-1")])
    assert (f.hostname, f.pod, f.gpu) == (None, None, "0,3")
    assert f.evidence["nodes"] == {"n1": [0], "n2": [3]}


def test_evidence_is_the_most_wasteful_members():
    [f] = merge_episodes([idle(0, 20, mean_util_pct=1.5), idle(30, 90, mean_util_pct=0.5)])
    assert f.evidence["mean_util_pct"] == 0.5


def test_a_single_finding_gets_its_basis_and_keeps_the_rest():
    one = idle(0, 45, mean_util_pct=0.5)
    [f] = merge_episodes([one])
    assert f.evidence == {**one.evidence, "episodes": 1, "hours": 0.75, "gpus": [0]}
    assert (f.start, f.end, f.gpu, f.pod, f.severity, f.wasted_gpu_hours) == (
        one.start, one.end, one.gpu, one.pod, one.severity, one.wasted_gpu_hours)


def test_unallocated_capacity_merges_per_node():
    free = [Finding("unallocated_gpu", "warning", T0, T0 + HOUR, hostname=h, gpu=g, wasted_gpu_hours=1.0,
                    evidence={"unallocated_hours": 1.0}) for h, g in (("a", "1"), ("a", "0"), ("a", "5"), ("b", "0"))]
    found = {f.hostname: f for f in merge_episodes(free)}
    assert found["a"].gpu == "0,1,5" and found["a"].evidence["gpus"] == [0, 1, 5]
    assert found["a"].evidence["unallocated_hours"] == pytest.approx(3.0) == found["a"].wasted_gpu_hours
    assert found["b"].gpu == "0" and found["b"].evidence["gpus"] == [0]


def test_gpu_errors_merge_per_gpu_and_add_up_their_events():
    def xid(gpu: str, start_min: float, codes: dict[str, int]) -> Finding:
        return Finding("gpu_error", "warning", T0 + start_min * MIN, T0 + (start_min + 1) * MIN, hostname="n",
                       gpu=gpu, namespace="ml", training_job="j", pod=f"j-{gpu}", wasted_gpu_hours=0.0,
                       evidence={"xid_events": codes, "down_minutes": 0.0})
    found = merge_episodes([xid("0", 0, {"13": 1}), xid("0", 20, {"13": 2, "79": 1}), xid("1", 0, {"13": 1})])
    by_gpu = {f.gpu: f for f in found}
    assert by_gpu["0"].evidence["xid_events"] == {"13": 3, "79": 1} and by_gpu["0"].evidence["episodes"] == 2
    assert by_gpu["1"].evidence["xid_events"] == {"13": 1}


def test_stragglers_merge_per_rank_and_keep_it():
    def slow(rank: int, start_min: float) -> Finding:
        return Finding("straggler", "warning", T0 + start_min * MIN, T0 + (start_min + 30) * MIN, namespace="ml",
                       training_job="llm", hostname="n", gpu=str(rank), pod=f"llm-{rank}", rank=rank,
                       wasted_gpu_hours=0.1)
    found = merge_episodes([slow(2, 0), slow(2, 40), slow(3, 0)])
    assert sorted((f.rank, f.evidence["episodes"]) for f in found) == [(2, 2), (3, 1)]


def test_one_idle_pod_and_one_free_node_end_to_end():
    n = 720                                   # three hours
    f = Fleet(n=n)
    f.node("nb")
    util = np.zeros(n)
    util[350:370] = 95.0                      # five busy minutes in the middle
    for g in range(4):
        f.gpu("nb", g, util=util)
        f.alloc("nb", g, "jupyter-0", "jupyter", namespace="notebooks")
    f.node("spare")
    for g in range(3):
        f.gpu("spare", g, util=0.0)
    found = {x.kind: x for x in detect_all(f.frames())}
    assert sorted(found) == ["idle_gpu", "unallocated_gpu"]

    idle_pod = found["idle_gpu"]
    assert (idle_pod.hostname, idle_pod.pod, idle_pod.gpu) == ("nb", "jupyter-0", "0,1,2,3")
    assert idle_pod.evidence["gpus"] == [0, 1, 2, 3] and idle_pod.evidence["episodes"] == 2
    # Both stretches, without the busy blip (the window ends at its last sample).
    assert idle_pod.evidence["hours"] == pytest.approx((idle_pod.end - idle_pod.start - 20 * STEP) / HOUR)
    assert idle_pod.wasted_gpu_hours == pytest.approx(4 * (n - 20) * STEP / HOUR)
    assert idle_pod.evidence["idle_hours"] == pytest.approx(idle_pod.wasted_gpu_hours)

    free = found["unallocated_gpu"]
    assert (free.hostname, free.gpu, free.evidence["gpus"], free.evidence["episodes"]) == ("spare", "0,1,2", [0, 1, 2], 1)
    assert free.wasted_gpu_hours == pytest.approx(3 * n * STEP / HOUR) == free.evidence["unallocated_hours"]
