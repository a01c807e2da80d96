"""Serving right-sizing (`oversized_serving`, docs/findings.md) on a production GPU serving trace.

Alibaba's GenAI serving trace (github.com/alibaba/clusterdata, cluster-trace-v2026-GenAI,
`pod_gpu_duty_cycle_anon.tar.gz`: the GPU utilization of each pod of a Stable Diffusion
serving system, every 57 s for 22.8 h) is replayed as one Deployment, one GPU per pod, scraped
as dcgm-exporter is (tests/contract_fleet.py). A pod holds its GPU at the samples the trace
has for it and at no other: pods come and go as in production. The trace carries no license
that allows redistributing it, so it is not copied here: point BURNRATE_GENAI_TRACE at a
clone's cluster-trace-v2026-GenAI folder to run this test.

The truth comes from the trace's numbers alone: each UTC hour's busy GPU-equivalents (the
sum of the pods' utilization/100, averaged over the hour's samples) divided by the documented
60% target, none in an hour whose busiest sample stays within one GPU's idle 2%.
"""
from __future__ import annotations

import math
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.report import analyze, to_document
from burnrate.analyzer.sources import PrometheusSource
from tests.contract_fleet import Node, Workload, generate, import_victoria, pod_names
from tests.processes import victoria_metrics

pytestmark = pytest.mark.slow

TRACE = os.environ.get("BURNRATE_GENAI_TRACE")
MEMBER = "pod_gpu_duty_cycle_anon.csv"
STEP_S = 57.0                     # the trace's sampling interval
TARGET = 0.60                     # underused_gpu.target_util_pct, docs/findings.md
IDLE = 0.02                       # idle_gpu.util_max_pct of one GPU
RATE = 1.006                      # g5.xlarge on demand, docs/pricing.md: the trace names no GPU
LOOKBACK_S = 300.0                # Prometheus' default: a pod missing from four samples or fewer was not scraped, not gone


def read_trace(folder: str) -> pd.DataFrame:
    """The trace's rows as (t, pod, util %), t on the trace's own 57-s grid."""
    with tarfile.open(Path(folder) / "pod_gpu_duty_cycle_anon.tar.gz") as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(MEMBER))
        rows = pd.read_csv(archive.extractfile(member))
    return rows.rename(columns={"timestamp_anon": "t", "container_ip": "pod", "value": "util"})


def held_s(trace: pd.DataFrame) -> pd.Series:
    """The seconds each row's pod held its GPU: up to its next sample where that is within
    the lookback, one interval where the pod is gone longer or for good."""
    t = trace.sort_values(["pod", "t"])
    gap = t.groupby("pod").t.shift(-1) - t.t
    return gap.where(gap <= LOOKBACK_S, STEP_S).fillna(STEP_S).reindex(trace.index)


def needed_by_hour(trace: pd.DataFrame) -> dict[int, int]:
    busy = trace.groupby("t").util.sum() / 100
    out = {}
    for hour, b in busy.groupby(np.floor(busy.index / 3600).astype(int)):
        out[int(hour)] = 0 if b.max() <= IDLE else max(math.ceil(b.mean() / TARGET - 1e-6), 1)
    return out


def replay(trace: pd.DataFrame):
    """The trace as a Deployment's dcgm-exporter and kube-state-metrics series."""
    pods = sorted(trace.pod.unique())
    start, end = float(trace.t.min()), float(trace.t.max()) + STEP_S
    nodes = tuple(Node(f"gpu-{i:03d}", 1, "dcgm-4.8", STEP_S, instance_type="g5.xlarge", gpu_model="NVIDIA A10G")
                  for i in range(len(pods)))
    sd = Workload("genai", "stable-diffusion", "serving", "Deployment", tuple((n.name, (0,)) for n in nodes),
                  start, end, util_pct=50.0)
    fleet = generate(nodes, (sd,), start, end, seed=0)
    # which trace pod each node's and each pod name's series stand for
    owner = {**{f"{n.name}:9400": p for n, p in zip(nodes, pods)},
             **{name: p for name, p in zip(pod_names(sd, 0), pods)}}
    util = {p: dict(zip(rows.t.to_numpy(), rows.util.to_numpy())) for p, rows in trace.groupby("pod")}
    series = []
    for s in fleet.series:
        pod = owner.get(s.labels.get("instance")) or owner.get(s.labels.get("pod"))
        if pod is None:
            series.append(s)
            continue
        # a sample stands for its interval: kube-state-metrics' 30-s samples fall in the pod's 57-s slots
        slot = start + np.floor((s.t - start) / STEP_S) * STEP_S
        keep = np.isin(slot, list(util[pod]))
        v = np.array([util[pod][x] for x in slot[keep]]) if s.name == "DCGM_FI_DEV_GPU_UTIL" else s.v[keep]
        if keep.any():
            series.append(replace(s, t=s.t[keep], v=v))
    return replace(fleet, series=series)


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    with victoria_metrics(tmp_path_factory.mktemp("vm")) as server:
        yield server


@pytest.mark.skipif(not TRACE, reason="set BURNRATE_GENAI_TRACE to a clone's cluster-trace-v2026-GenAI folder")
def test_the_needed_replicas_follow_the_traces_own_demand(vm):
    trace = read_trace(TRACE)
    fleet = replay(trace)
    import_victoria(fleet, vm.url)
    doc = to_document(analyze(PrometheusSource(vm.url).frames(Window(fleet.start, fleet.end)), load_catalog(None)))

    truth = needed_by_hour(trace)
    [block] = doc["serving"]
    assert (block["namespace"], block["training_job"]) == ("genai", "stable-diffusion")
    assert block["fleet_replicas"] == trace.groupby("t").pod.nunique().max()
    got = {round(pd.Timestamp(h).timestamp() / 3600): n for h, n in block["needed_gpus_by_hour"].items()}
    assert sorted(got) == sorted(truth)
    # Within a replica: a pod's missed samples hold its last utilization (the lookback), which
    # tips an hour whose need sits just under a whole GPU to the next (08h: 34.95 by the trace, 36).
    assert all(abs(got[h] - n) <= 1 for h, n in truth.items()), (got, truth)
    assert abs(block["peak_replicas"] - max(truth.values())) <= 1
    assert max(got, key=got.get) == max(truth, key=truth.get)
    # The floor is the quietest whole hour's need, not the window's last minute's.
    whole = trace.groupby(np.floor(trace.t / 3600).astype(int)).t.nunique() * STEP_S >= 1800
    assert abs(block["autoscale_min_replicas"] - min(n for h, n in truth.items() if whole[h] and n)) <= 1
    assert block["autoscale_min_replicas"] > min(n for n in truth.values() if n)

    # Held: a GPU for each of the trace's samples. Waste: held beyond each hour's need, counted once.
    held = held_s(trace) / 3600
    hour = np.floor(trace.t / 3600).astype(int)
    [job] = [j for j in doc["jobs"] if j["training_job"] == "stable-diffusion"]
    assert job["gpu_hours"] == pytest.approx(held.sum(), rel=0.005)
    assert job["cost_dollars"] == pytest.approx(held.sum() * RATE, rel=0.005)
    per_hour, present = held.groupby(hour).sum(), trace.groupby(hour).t.nunique() * STEP_S / 3600
    saved = sum(max(per_hour[h] - n * present[h], 0.0) for h, n in truth.items())
    kinds = sorted(f["kind"] for f in doc["findings"] if f["training_job"] == "stable-diffusion")
    assert kinds == ["oversized_serving"]
    [finding] = [f for f in doc["findings"] if f["kind"] == "oversized_serving"]
    assert finding["wasted_gpu_hours"] == pytest.approx(saved, rel=0.02)
    assert sum(job["waste_dollars"].values()) <= job["cost_dollars"]
