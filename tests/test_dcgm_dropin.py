"""burnrate's agent in dcgm-exporter's place, as another project's queries see it: OpenCost's
GPU queries, run by a real Prometheus scraping the real agent under both scrape profiles.

The queries are OpenCost's own (opencost/opencost, modules/prometheus-source/pkg/prom/
metricsquerier.go: QueryGPUInfo, QueryGPUsUsageAvg, QueryGPUsUsageMax), with its default
cluster label `cluster_id`, an empty cluster filter and a 1m window substituted for its
format verbs. The two profiles are two scrape jobs on the same agent:

- `burnrate` (the manifests' default): honor_labels, and the target's own namespace,
  pod and container are not attached: the series name the training pod that holds the GPU;
- `gpu-operator`: what GPU Operator's ServiceMonitor for dcgm-exporter does: the target's
  labels are attached (here as the static labels Kubernetes discovery would give), and
  honor_labels is off, so the holder's labels arrive as exported_namespace, exported_pod
  and exported_container.
"""
import threading
import time

import pytest

from burnrate.analyzer.sources import PrometheusSource
from burnrate.analyzer.grid.frames import Window
from tests.processes import agent, prometheus
from tests.test_prometheus_scrape import heartbeat

pytestmark = pytest.mark.slow

OPENCOST = {
    "QueryGPUInfo": 'avg(avg_over_time(DCGM_FI_DEV_DEC_UTIL{container!="",}[1m])) '
                    "by (container, pod, namespace, device, modelName, UUID, uid, cluster_id)",
    "QueryGPUsUsageAvg": 'avg(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[1m])) '
                         "by (container, pod, namespace, uid, cluster_id)",
    "QueryGPUsUsageMax": 'max(max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[1m])) '
                         "by (container, pod, namespace, uid, cluster_id)",
}
AGENT_POD = {"namespace": "burnrate-node", "pod": "burnrate-agent-7x2kq", "container": "agent"}


def scrape_configs(instance: str) -> str:
    return f"""scrape_configs:
  - job_name: burnrate
    honor_labels: true
    static_configs:
      - targets: ['{instance}']
  - job_name: gpu-operator
    honor_labels: false
    static_configs:
      - targets: ['{instance}']
        labels: {{namespace: {AGENT_POD['namespace']}, pod: {AGENT_POD['pod']}, container: {AGENT_POD['container']}}}
"""


def test_opencosts_gpu_queries_return_rows_under_both_scrape_profiles(tmp_path):
    with agent(tmp_path, "--interval", "0.5") as (url, sock, _):
        stop = threading.Event()
        keepalive = threading.Thread(target=heartbeat, args=(sock, stop), daemon=True)
        keepalive.start()
        try:
            with prometheus(tmp_path, scrape=scrape_configs(url.removeprefix("http://"))) as prom:
                prom.wait_for('DCGM_FI_DEV_DEC_UTIL{job="gpu-operator",exported_pod="llm-worker-1"}')
                prom.wait_for('DCGM_FI_DEV_DEC_UTIL{job="burnrate",pod="llm-worker-1"}')
                for name, promql in OPENCOST.items():
                    rows = [r["metric"] for r in prom.query(promql)]
                    # burnrate's profile: one row per training pod, under its own names.
                    own = sorted((r["namespace"], r["pod"], r["container"]) for r in rows if r["namespace"] == "ml")
                    assert own == [("ml", "llm-worker-0", "trainer"), ("ml", "llm-worker-1", "trainer")], name
                    # GPU Operator's profile: the rows carry the exporter pod, as they do with
                    # dcgm-exporter; the holders are in exported_* (checked below).
                    theirs = [r for r in rows if r["namespace"] == AGENT_POD["namespace"]]
                    assert theirs and all((r["pod"], r["container"]) == (AGENT_POD["pod"], AGENT_POD["container"])
                                          for r in theirs), name
                info = prom.query(OPENCOST["QueryGPUInfo"])
                assert {r["metric"]["modelName"] for r in info} == {"NVIDIA H100 80GB HBM3 (simulated)"}
                assert {r["metric"]["device"] for r in info if r["metric"]["namespace"] == "ml"} == {"nvidia0", "nvidia1"}
                exported = prom.query('count by (exported_namespace, exported_pod, exported_container) '
                                      '(DCGM_FI_DEV_GPU_UTIL{job="gpu-operator"})')
                assert sorted((r["metric"].get("exported_namespace"), r["metric"].get("exported_pod"),
                               r["metric"].get("exported_container")) for r in exported) == [
                    ("ml", "llm-worker-0", "trainer"), ("ml", "llm-worker-1", "trainer")]
        finally:
            stop.set()
            keepalive.join()


def test_the_analyzer_reads_who_holds_each_gpu_under_gpu_operators_profile(tmp_path):
    """Only the gpu-operator job scrapes: the holders arrive as exported_*, and the free GPU's
    series name the agent's own pod, which holds nothing."""
    with agent(tmp_path, "--interval", "0.5", "--gpus", "3") as (url, sock, _):
        stop = threading.Event()
        keepalive = threading.Thread(target=heartbeat, args=(sock, stop), daemon=True)
        keepalive.start()
        try:
            config = scrape_configs(url.removeprefix("http://"))
            config = config[config.index("  - job_name: gpu-operator"):]
            with prometheus(tmp_path, scrape="scrape_configs:\n" + config) as prom:
                prom.wait_for('burnrate_gpu_allocation_share_ratio{exported_pod="llm-worker-1"}')
                time.sleep(3)
                end = time.time()
                frames = PrometheusSource(prom.url, min_step_s=1.0).frames(Window(end - 60, end))
        finally:
            stop.set()
            keepalive.join()
    held = frames.alloc[frames.alloc["t"] == frames.alloc["t"].max()]
    assert sorted(zip(held["namespace"].astype(str), held["pod"].astype(str), held["container"].astype(str))) == [
        ("ml", "llm-worker-0", "trainer"), ("ml", "llm-worker-1", "trainer")]
    assert AGENT_POD["pod"] not in set(frames.alloc["pod"].astype(str))
    assert set(frames.gpu["UUID"].astype(str)) - set(frames.alloc["UUID"].astype(str)), "the third GPU is free"
