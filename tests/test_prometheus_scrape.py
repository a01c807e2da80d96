"""A real Prometheus (Debian's package) scrapes the real agent on loopback."""
import threading
import time

import pytest

from burnrate.exporter.telemetry import TelemetrySink
from burnrate.analyzer.sources import PrometheusSource
from tests.processes import agent, prometheus

pytestmark = pytest.mark.slow

# NVIDIA's Grafana dashboard 12239, its queries as Grafana sends them once the
# $instance and $gpu variables are substituted (regex-escaped instance, "All" gpus).
# Each with the range a simulated H100 (two of them, summed where the query sums) reads in.
DASHBOARD_12239 = {
    'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}': (20, 95),
    'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})': (20, 95),
    'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}': (30, 750),
    'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})': (60, 1500),
    'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000': (200e6, 2100e6),
    'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}': (0, 100),
    'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}': (1, 81559),
    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}': (0, 1),
}


def telemetry(rank: int, step: int) -> dict:
    return {"v": 1, "training_job": "llm", "namespace": "ml", "pod": f"llm-worker-{rank}", "rank": rank,
            "world_size": 2, "local_rank": rank, "step": step, "time": time.time(), "steps": 10,
            "step_s": 5.0, "data_wait_s": 0.2, "compute_s": 4.5, "samples": 80, "tokens": 81920,
            "flops": 6.0e13, "loss": 3.1, "grad_norm": 1.2, "mfu": 0.42}


def heartbeat(sock: str, stop: threading.Event) -> None:
    with TelemetrySink(sock) as sink:
        while not stop.is_set():
            for rank in (0, 1):
                sink.send({**telemetry(rank, 30), "steps": 0, "step_s": 0.0, "data_wait_s": 0.0,
                           "compute_s": 0.0, "samples": 0, "tokens": 0, "flops": 0.0})
            stop.wait(0.5)


def test_prometheus_scrapes_agent(tmp_path):
    with agent(tmp_path, "--interval", "0.5") as (url, sock, _):
        instance = url.removeprefix("http://")
        with TelemetrySink(sock) as sink:
            for step in (10, 20, 30):
                for rank in (0, 1):
                    assert sink.send(telemetry(rank, step))
        with prometheus(tmp_path, [instance]) as prom:
            util = prom.wait_for("DCGM_FI_DEV_GPU_UTIL")
            assert {r["metric"]["gpu"] for r in util} == {"0", "1"}
            steps = prom.wait_for('burnrate_train_steps_total{training_job="llm"}')
            assert sorted((r["metric"]["rank"], float(r["value"][1])) for r in steps) == [("0", 30.0), ("1", 30.0)]

            # Grafana's label_values(DCGM_FI_DEV_GPU_TEMP, instance|gpu) go to the label values API.
            assert prom.get("/api/v1/label/instance/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"}) == [instance]
            assert prom.get("/api/v1/label/gpu/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"}) == ["0", "1"]
            for query, (low, high) in DASHBOARD_12239.items():
                promql = query.replace("$instance", instance.replace(".", "\\\\.")).replace("$gpu", "0|1")
                result = prom.query(promql)
                assert result, f"no data for {promql}"
                for sample in result:
                    assert low <= float(sample["value"][1]) <= high, (promql, sample["value"])
            # A rank holds its GPU while it reports: keep both ranks alive (no new steps).
            stop = threading.Event()
            keepalive = threading.Thread(target=heartbeat, args=(sock, stop), daemon=True)
            keepalive.start()
            try:
                held = prom.wait_for('burnrate_gpu_allocated{training_job="llm"}')
                assert {r["metric"]["pod"] for r in held} == {"llm-worker-0", "llm-worker-1"}
                joined = prom.query(
                    'DCGM_FI_DEV_GPU_UTIL * on(UUID) group_left(training_job) burnrate_gpu_allocated')
                assert len(joined) == 2
            finally:
                stop.set()
                keepalive.join()
            # The source takes its finest step from the targets Prometheus scrapes (the
            # job here is `burnrate`, scraped every second); an explicit interval wins.
            assert PrometheusSource(prom.url, min_step_s=None).min_step_s == 1.0
            assert PrometheusSource(prom.url, min_step_s=30.0).min_step_s == 30.0
