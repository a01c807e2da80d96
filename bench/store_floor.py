"""The floor under the analyzer on Prometheus: the same question answered by the store alone.

What a Grafana user writes for each training job's GPU-hours and idle GPU-hours over a
window, on dcgm-exporter's utilization series and the pod labels the agent attaches to
them (docs/metrics.md), asked as instant queries over HTTP. The analyzer answers this and
much more; the ratio of its time to the store's says how far above the floor it is.
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

from burnrate.exporter.catalog import IDLE_UTIL_PCT

UTIL = 'DCGM_FI_DEV_GPU_UTIL{training_job!=""}'
BY_JOB = "sum by (namespace, training_job)"


def queries(range_s: float, step_s: float) -> dict[str, str]:
    """GPU-hours and idle GPU-hours per job over the `range_s` before the query's time: each
    utilization sample of an attributed GPU stands for one step of one GPU."""
    window = f"{int(range_s)}s"
    hours = f"* {step_s:g} / 3600"
    return {"gpu_hours": f"{BY_JOB} (count_over_time({UTIL}[{window}])) {hours}",
            "idle_gpu_hours": f"{BY_JOB} (count_over_time(({UTIL} <= {IDLE_UTIL_PCT:g})[{window}:{step_s:g}s])) "
                              f"{hours}"}


def ask(url: str, query: str, at: float, timeout_s: float = 600.0) -> tuple[float, dict[str, float]]:
    """One instant query: its wall seconds and its answer, job ("namespace/training_job") -> value."""
    address = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    began = time.monotonic()
    with urllib.request.urlopen(address, timeout=timeout_s) as resp:
        body = json.loads(resp.read())
    took = time.monotonic() - began
    return took, by_job(body)


def by_job(body: dict) -> dict[str, float]:
    """An instant query's vector answer, keyed as the analyzer's jobs are."""
    if body.get("status") != "success":
        raise SystemExit(f"the store refused the query: {body.get('error', body)}")
    return {f"{s['metric'].get('namespace', '')}/{s['metric'].get('training_job', '')}": float(s["value"][1])
            for s in body["data"]["result"]}


def difference(analyzer: dict[str, float], store: dict[str, float]) -> dict[str, float]:
    """How two per-job answers differ: totals, the largest difference of a job both have, and
    the jobs only one of them has."""
    both = analyzer.keys() & store.keys()
    return {"analyzer": sum(analyzer.values()), "store": sum(store.values()),
            "largest_job": max((abs(analyzer[j] - store[j]) for j in both), default=0.0),
            "only_analyzer": len(analyzer.keys() - both), "only_store": len(store.keys() - both)}
