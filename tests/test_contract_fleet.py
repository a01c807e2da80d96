"""The contract fleet generator itself, not the analyzer: its truth adds up, a tiny case matches
hand arithmetic, its samples look like scrapes of the exporter each node runs, and real TSDBs
(Prometheus through promtool, VictoriaMetrics through its import API) hold every sample written."""
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tests.contract_fleet import (
    AGENT_EXPORTERS, BASE_TIME, DCGM_49_NAMES, DCGM_COUNTERS, MIN_JOB_S, Fleet, Node, Workload,
    backfill_prometheus, fleets, generate, import_victoria, openmetrics, pod_names,
)
from tests.processes import prometheus, victoria_metrics

# a drawn fleet takes milliseconds to a few tenths of a second to sample; 40 cover the mixes
FLEET_SETTINGS = settings(max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FIGURES = ("observed_gpu_hours", "allocated_gpu_hours", "unallocated_gpu_hours", "busy_gpu_hours", "idle_gpu_hours")
UTIL_NAMES = ("DCGM_FI_DEV_GPU_UTIL", DCGM_49_NAMES["DCGM_FI_DEV_GPU_UTIL"][0])
NAMES_49 = {new for new, _ in DCGM_49_NAMES.values()}
K8S_SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]"
S = BASE_TIME
H = 3600.0


def approx(x: float):
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def one(fleet: Fleet, name: str, **labels: str):
    found = [s for s in fleet.series if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, [s.labels for s in found])
    return found[0]


def tiny(exporter: str = "agent", **node: object) -> Fleet:
    """1 node, 1 GPU, scraped every 60 s; a 2 h training job inside a 6 h window."""
    job = Workload("ml", "llm-7b", "training", "PyTorchJob", (("gpu-node-1", (0,)),), S + H, S + 3 * H,
                   telemetry=True, tokens_per_step=1e5, step_s=2.0)
    return generate([Node("gpu-node-1", 1, exporter, 60.0, **node)], [job], S, S + 6 * H, seed=7)


@FLEET_SETTINGS
@given(fleets())
def test_truth_adds_up(fleet):
    t = fleet.truth
    assert t.observed_gpu_hours == approx(t.allocated_gpu_hours + t.unallocated_gpu_hours)
    assert t.allocated_gpu_hours == approx(t.busy_gpu_hours + t.idle_gpu_hours)
    assert sum(t.job_gpu_hours.values()) == approx(t.allocated_gpu_hours)
    assert t.observed_gpu_hours == approx(sum(n.gpus for n in fleet.nodes) * (fleet.end - fleet.start) / H)
    assert t.unallocated_gpu_hours >= -1e-9
    for figure in FIGURES:
        assert sum(node[figure] for node in t.per_node.values()) == approx(getattr(t, figure))
    assert set(t.job_class) == set(t.job_gpu_hours) == {(w.namespace, w.name) for w in fleet.workloads}
    for w in fleet.workloads:
        # every job holds its GPUs long enough inside the window for scrape quantization to stay < 1 %
        assert min(w.end, fleet.end) - max(w.start, fleet.start) >= MIN_JOB_S - 1e-6


@FLEET_SETTINGS
@given(fleets())
def test_samples_look_like_scrapes(fleet):
    by_instance = {f"{n.name}:9400": n for n in fleet.nodes}
    held = {pod: w for w in fleet.workloads for pod in pod_names(w, fleet.seed)}
    scrapes: dict[tuple[str, str], list[np.ndarray]] = {}
    for s in fleet.series:
        assert np.all(np.diff(s.t) > 0) and s.t[0] >= fleet.start and s.t[-1] < fleet.end, s.name
        assert np.all(np.isfinite(s.v)), s.name
        node = by_instance.get(s.labels["instance"])
        if node is None:
            assert s.name in ("kube_pod_owner", "kube_replicaset_owner")
            continue
        assert s.labels["job"] == node.scrape_job
        if s.name.startswith("burnrate_"):
            assert node.exporter in AGENT_EXPORTERS
        if s.name == "burnrate_gpu_allocation_share_ratio":
            assert node.exporter == "agent"
        if s.name.startswith("DCGM_"):
            assert node.hostname_label in s.labels
            assert (s.name in NAMES_49) == (node.exporter == "dcgm-4.9")
        if s.name in UTIL_NAMES:
            assert s.v.min() >= 0 and s.v.max() <= (1.0 if s.name != "DCGM_FI_DEV_GPU_UTIL" else 100.0)
            scrapes.setdefault((s.labels["instance"], s.labels["gpu"]), []).append(s.t)
            if s.labels.get("pod") in held:
                w = held[s.labels["pod"]]
                assert w.share == 1 and s.t[0] >= w.start and s.t[-1] < w.end
        if s.name.endswith("_total") or s.name in DCGM_COUNTERS:
            # a counter only falls where its exporter restarted
            assert np.sum(np.diff(s.v) < 0) <= len(node.restarts), s.name
    for (instance, _), chunks in scrapes.items():
        t = np.concatenate(chunks)
        # one utilization sample per GPU per scrape, whichever label set it carried then
        assert np.unique(t).size == t.size
        gpu0 = np.concatenate(scrapes[(instance, "0")])
        assert np.array_equal(np.sort(t), np.sort(gpu0))


def test_tiny_case_by_hand():
    fleet = tiny()
    t = fleet.truth
    assert t.job_gpu_hours == {("ml", "llm-7b"): approx(2.0)}
    assert (t.observed_gpu_hours, t.allocated_gpu_hours, t.unallocated_gpu_hours) == (6.0, approx(2.0), approx(4.0))
    assert (t.busy_gpu_hours, t.idle_gpu_hours) == (approx(2.0), 0.0)
    held = one(fleet, "DCGM_FI_DEV_GPU_UTIL", pod="llm-7b-master-0")
    # scrapes at S + 60 k: those in [S + 1 h, S + 3 h) see the pod
    assert held.t.size == 120 and held.t[0] == S + H and held.t[-1] == S + 3 * H - 60
    assert held.labels["training_job"] == "llm-7b" and held.labels["container"] == "pytorch"
    assert held.v.min() > 50
    free = one(fleet, "DCGM_FI_DEV_GPU_UTIL", pod=None)
    assert free.t.size == 240 and free.v.max() == 0
    assert one(fleet, "burnrate_gpu_allocation_share_ratio").t.size == 120
    assert one(fleet, "kube_pod_owner").t.size == 240  # every 30 s for 2 h
    steps = one(fleet, "burnrate_train_steps_total")
    assert steps.v[-1] == (2 * H - 60) / 2.0
    assert one(fleet, "burnrate_train_tokens_total").v[-1] == steps.v[-1] * 1e5


def test_missed_scrapes_and_restarts():
    fleet = tiny(missed=(S + 2 * H + 10,), restarts=(S + 2 * H + 1800,))
    assert one(fleet, "DCGM_FI_DEV_GPU_UTIL", pod="llm-7b-master-0").t.size == 119
    steps = one(fleet, "burnrate_train_steps_total")
    fall = np.flatnonzero(np.diff(steps.v) < 0)
    assert fall.size == 1 and steps.t[fall[0] + 1] == S + 2 * H + 1800
    # the first scrape after the restart counts the steps since the restart only
    assert steps.v[fall[0] + 1] == 0
    energy = one(fleet, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", pod="llm-7b-master-0")
    after = energy.t == S + 2 * H + 1800
    assert energy.v[after][0] == 0
    assert np.sum(np.diff(energy.v) < 0) == 1


def test_exporters_write_their_own_names_and_labels():
    for exporter, hostname in (("agent", "Hostname"), ("dcgm-4.8", "Hostname"), ("dcgm-4.8.3", "hostname")):
        fleet = tiny(exporter)
        util = one(fleet, "DCGM_FI_DEV_GPU_UTIL", pod="llm-7b-master-0")
        assert util.labels[hostname] == "gpu-node-1"
        assert ("training_job" in util.labels) == (exporter == "agent")
        assert any(s.name.startswith("burnrate_") for s in fleet.series) == (exporter == "agent")
    old = tiny("agent-old")
    assert {s.name for s in old.series} >= {"burnrate_gpu_allocated", "burnrate_node_info", "burnrate_train_loss"}
    assert "burnrate_gpu_allocation_share_ratio" not in {s.name for s in old.series}


def test_the_exported_profile_renames_the_exporters_pod_labels_and_attaches_the_targets():
    own, exported = tiny("agent"), tiny("agent", scrape_profile="exported")
    held = one(own, "DCGM_FI_DEV_GPU_UTIL", pod="llm-7b-master-0").labels
    (renamed,) = [s for s in exported.series if s.name == "DCGM_FI_DEV_GPU_UTIL"
                  and s.labels.get("exported_pod") == "llm-7b-master-0"]
    target = exported.nodes[0].target_labels
    assert renamed.labels == {**{f"exported_{k}" if k in target else k: v for k, v in held.items()}, **target}
    up = [s.labels for s in exported.series if s.name == "up"]
    assert up == [{"instance": "gpu-node-1:9400", "job": "burnrate-agent", **target}]
    # Series the exporter exposes without pod labels just gain the target's.
    (info,) = [s.labels for s in exported.series if s.name == "burnrate_node_info"]
    assert info["pod"] == target["pod"] and "exported_pod" not in info


def test_dcgm_49_names_and_base_units():
    fleet = tiny("dcgm-4.9")
    names = {s.name for s in fleet.series} - {"kube_pod_owner", "up"}
    assert names == NAMES_49
    util = one(fleet, "DCGM_FI_DEV_GPU_UTIL_RATIO", pod="llm-7b-master-0")
    assert util.labels["hostname"] == "gpu-node-1" and 0.5 < util.v.min() and util.v.max() <= 1
    assert np.allclose(util.v * 100, np.round(util.v * 100))
    fb = one(fleet, "DCGM_FI_DEV_FB_USED_BYTES", pod="llm-7b-master-0").v
    assert np.all(fb % 2 ** 20 == 0) and fb.min() > 2 ** 30
    assert one(fleet, "DCGM_FI_DEV_SM_CLOCK_HERTZ", pod="llm-7b-master-0").v.min() > 1e9
    joules = one(fleet, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", pod="llm-7b-master-0").v
    assert np.all(joules == np.floor(joules))


def test_pods_are_named_like_real_ones():
    def workload(owner: str, name: str, pods: int = 1) -> Workload:
        return Workload("ml", name, "training", owner, tuple((f"n{i}", (0,)) for i in range(pods)), S, S + H)

    assert pod_names(workload("PyTorchJob", "llm", 3), 1) == ["llm-master-0", "llm-worker-0", "llm-worker-1"]
    deployment = pod_names(workload("Deployment", "chat-api"), 1)[0]
    assert re.fullmatch(rf"chat-api-{K8S_SUFFIX}{{10}}-{K8S_SUFFIX}{{5}}", deployment)
    assert re.fullmatch(rf"embed-{K8S_SUFFIX}{{5}}", pod_names(workload("Job", "embed"), 1)[0])
    assert pod_names(workload("Notebook", "nb"), 1) == ["nb-0"]
    assert pod_names(workload("Deployment", "chat-api"), 1) == [deployment]


def test_deployment_pods_are_owned_through_a_replicaset():
    serve = Workload("inference", "chat-api", "serving", "Deployment", (("gpu-node-1", (0,)),), S, S + 3 * H)
    fleet = generate([Node("gpu-node-1", 1, "dcgm-4.8", 30.0)], [serve], S, S + 6 * H, seed=3)
    pod = one(fleet, "DCGM_FI_DEV_GPU_UTIL", namespace="inference").labels["pod"]
    owner = one(fleet, "kube_pod_owner", pod=pod).labels
    assert (owner["owner_kind"], owner["owner_name"]) == ("ReplicaSet", pod.rsplit("-", 1)[0])
    rs = one(fleet, "kube_replicaset_owner").labels
    assert (rs["replicaset"], rs["owner_kind"], rs["owner_name"]) == (owner["owner_name"], "Deployment", "chat-api")
    util = one(fleet, "DCGM_FI_DEV_GPU_UTIL", pod=pod).v
    assert util.min() >= 10 and util.max() <= 90 and util.max() - util.min() > 60  # the serving saw-tooth


def test_overcommitted_gpu_is_refused():
    a = Workload("ml", "a", "training", "PyTorchJob", (("n", (0,)),), S, S + 2 * H)
    b = Workload("ml", "b", "batch", "Job", (("n", (0,)),), S + H, S + 3 * H)
    with pytest.raises(ValueError, match="over-committed"):
        generate([Node("n", 1, "agent", 30.0)], [a, b], S, S + 6 * H, seed=0)


def test_a_sliced_gpu_is_shared_by_ratio_not_by_pod_labels():
    sliced = [Workload("ml", f"nb-{i}", "interactive", "Notebook", (("n", (0,)),), S, S + 3 * H, share=1 / 7)
              for i in range(7)]
    fleet = generate([Node("n", 1, "agent", 30.0)], sliced, S, S + 6 * H, seed=0)
    assert fleet.truth.allocated_gpu_hours == approx(3.0)
    assert fleet.truth.job_gpu_hours[("ml", "nb-0")] == approx(3.0 / 7)
    ratios = [s for s in fleet.series if s.name == "burnrate_gpu_allocation_share_ratio"]
    assert len(ratios) == 7 and all(np.all(s.v == 1 / 7) and s.t.size == 360 for s in ratios)
    # a device series names a pod only while one pod holds the whole GPU
    assert not any("pod" in s.labels for s in fleet.series if s.name == "DCGM_FI_DEV_GPU_UTIL")


def test_openmetrics_text_is_grouped_and_typed():
    text = openmetrics(tiny())
    assert text.endswith("# EOF\n")
    types = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
    assert len(types) == len({family for family, _ in types})
    kinds = dict(types)
    assert kinds["burnrate_train_steps"] == "counter" and kinds["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "unknown"
    family = None
    for line in text.splitlines()[:-1]:
        if line.startswith("# TYPE "):
            family = line.split()[2]
        else:
            assert line.split("{")[0] in (family, family + "_total")


def small_fleet() -> Fleet:
    nodes = [Node("ip-10-0-1-17.ec2.internal", 2, "agent", 30.0, jitter_s=3.0, phase_s=7.0, restarts=(S + 4 * H,)),
             Node("ip-10-0-2-40.ec2.internal", 1, "dcgm-4.8.3", 45.0, jitter_s=5.0, missed=(S + 2 * H,)),
             Node("ip-10-0-3-9.ec2.internal", 1, "dcgm-4.9", 60.0)]
    workloads = [
        Workload("ml", "llm-7b", "training", "PyTorchJob", ((nodes[0].name, (0, 1)), (nodes[1].name, (0,))),
                 S + H, S + 4 * H, telemetry=True, tokens_per_step=2e5),
        Workload("inference", "chat-api", "serving", "Deployment", ((nodes[2].name, (0,)),), S - H, S + 5 * H)]
    return generate(nodes, workloads, S, S + 6 * H, seed=11)


def expected_counts(fleet: Fleet) -> dict[str, tuple[int, int]]:
    """Per metric name, (samples, series) as written."""
    counts: dict[str, tuple[int, int]] = {}
    for s in fleet.series:
        samples, series = counts.get(s.name, (0, 0))
        counts[s.name] = (samples + s.t.size, series + 1)
    return counts


def stored_counts(db, fleet: Fleet) -> dict[str, tuple[int, int]]:
    """Per metric name, (samples, series) as the TSDB answers PromQL over a range covering the window."""
    hours = math.ceil((fleet.end - fleet.start) / H) + 1

    def scalar(promql: str) -> int:
        result = db.get("/api/v1/query", query=promql, time=fleet.end)["result"]
        return int(float(result[0]["value"][1])) if result else 0

    return {name: (scalar(f"sum(count_over_time({name}[{hours}h]))"),
                   scalar(f"count(count_over_time({name}[{hours}h]))"))
            for name in {s.name for s in fleet.series}}


@pytest.mark.slow
def test_promtool_backfill_keeps_every_sample(tmp_path):
    fleet = small_fleet()
    with prometheus(tmp_path, storage=backfill_prometheus(fleet, tmp_path)) as prom:
        assert stored_counts(prom, fleet) == expected_counts(fleet)


@pytest.mark.slow
def test_victoria_import_keeps_every_sample(tmp_path):
    fleet = small_fleet()
    with victoria_metrics(tmp_path) as vm:
        import_victoria(fleet, vm.url)
        assert stored_counts(vm, fleet) == expected_counts(fleet)
