"""The Grafana dashboards in manifests/grafana: their structure, and every panel's query run by
a real Prometheus that scrapes a real agent (fed a two-rank job's telemetry) and a real
`burnrate analyze --serve` reading that Prometheus."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import time

import pytest
import yaml

from burnrate.exporter import ledger, ledger_rules
from burnrate.exporter.telemetry import TelemetrySink
from tests.conftest import PYTHON, ROOT, free_port
from tests.processes import agent, prometheus, wait_http

pytestmark = pytest.mark.slow

GRAFANA = os.path.join(ROOT, "manifests", "grafana")
DASHBOARDS = ("burnrate-training-job.json", "burnrate-fleet-cost.json")
NAMESPACE, JOB = "ml", "llm"
LOSS = {0: 2.75, 1: 2.5}
# What Grafana puts in place of its own variables, for instant queries over a short test.
BUILTINS = {"$__rate_interval": "30s", "$__interval": "1s", "$__range": "5m", "${datasource}": "prometheus"}
# A starved loader for a test-sized window: the thresholds of the file a team passes with
# --detector-config, so that the finding panels have a finding to show.
DETECTOR_CONFIG = "dataloader_starvation:\n  window_minutes: 0.2\n  min_minutes: 0.1\n  gap_minutes: 0.05\n"


def load(name: str) -> dict:
    with open(os.path.join(GRAFANA, name)) as fh:
        return json.load(fh)


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.extend(p.get("panels", []) if p["type"] == "row" else [p])
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in {**BUILTINS, **{f"${k}": v for k, v in variables.items()}}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_structure(name):
    d = load(name)
    assert d["uid"] == name.removesuffix(".json") and d["title"].startswith("burnrate / ")
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    if name == "burnrate-training-job.json":
        for var in ("namespace", "training_job"):
            assert variables[var]["type"] == "query"
            assert "label_values(burnrate_train_steps_total" in variables[var]["definition"]
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    for p in panels(d):
        assert p["title"], p
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"] and t["datasource"]["uid"] == "${datasource}", p["title"]
            # Rate windows follow Grafana's step, never a fixed width.
            for window in re.findall(r"\b(?:rate|increase|irate)\([^\[]*\[([^\]]+)\]", t["expr"]):
                assert window == "$__rate_interval", (p["title"], t["expr"])
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]


def ledger_rules_file(tmp_path) -> str:
    """The shipped burnrate-ledger group, evaluated each second instead of each minute (as the
    chart's prometheusRule.interval does), so that the Goodput row's recording rules have
    values within the test."""
    with open(os.path.join(ROOT, "manifests", "alerts", "burnrate-rules.yaml")) as fh:
        [group] = [g for g in yaml.safe_load(fh)["groups"] if g["name"] == ledger_rules.GROUP]
    path = tmp_path / "ledger-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{**group, "interval": "1s"}]}))
    return str(path)


def telemetry(rank: int, step: int) -> dict:
    return {"v": 1, "training_job": JOB, "namespace": NAMESPACE, "pod": f"{JOB}-worker-{rank}", "rank": rank,
            "world_size": 2, "local_rank": rank, "step": step, "time": time.time(), "steps": 1,
            "step_s": 0.5, "data_wait_s": 0.3, "compute_s": 0.15, "samples": 8, "tokens": 8192,
            "flops": 4.0e14, "loss": LOSS[rank], "grad_norm": 0.75, "mfu": 0.4}


def train(sock: str, stop: threading.Event) -> None:
    """Two ranks, a step each every half second, until told to stop: a job that holds its GPUs."""
    step = 0
    with TelemetrySink(sock) as sink:
        while not stop.is_set():
            step += 1
            for rank in (0, 1):
                sink.send(telemetry(rank, step))
            stop.wait(0.5)


@contextlib.contextmanager
def analyzer(tmp_path, prometheus_url: str, port: int):
    config = tmp_path / "detectors.yaml"
    config.write_text(DETECTOR_CONFIG)
    log = open(tmp_path / "analyze.log", "wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "burnrate", "analyze", "--prometheus", prometheus_url, "--serve",
         "--listen", f"127.0.0.1:{port}", "--interval", "2", "--since", "10m", "--scrape-interval", "1",
         "--detector-config", str(config)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", proc=proc)
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def value(result: list[dict]) -> float:
    [sample] = result
    return float(sample["value"][1])


def test_every_panel_query_returns_data(tmp_path):
    analyzer_port = free_port()
    with agent(tmp_path, "--gpus", "3", "--interval", "0.5") as (url, sock, _):
        stop = threading.Event()
        trainer = threading.Thread(target=train, args=(sock, stop), daemon=True)
        trainer.start()
        try:
            scrape = ("scrape_configs:\n"
                      "  - job_name: burnrate-agent\n"
                      f"    static_configs: [{{targets: ['{url.removeprefix('http://')}']}}]\n"
                      "  - job_name: burnrate-analyzer\n"
                      f"    static_configs: [{{targets: ['127.0.0.1:{analyzer_port}']}}]\n")
            with prometheus(tmp_path, scrape=scrape, config=f"rule_files: [{ledger_rules_file(tmp_path)}]\n") as prom, \
                    analyzer(tmp_path, prom.url, analyzer_port):
                prom.wait_for(f'burnrate_gpu_allocated{{training_job="{JOB}"}}')
                prom.wait_for(f'{ledger_rules.goodput_record()}{{training_job="{JOB}"}}', timeout=30)
                # The analyzer has exported a report that prices the job and names its finding.
                prom.wait_for(f'burnrate_job_cost_dollars{{training_job="{JOB}"}}', timeout=60)
                prom.wait_for(f'burnrate_finding{{training_job="{JOB}"}}', timeout=60)
                prom.wait_for('burnrate_finding_wasted_dollars', timeout=30)

                variables = {"namespace": NAMESPACE, "training_job": JOB}
                # The variables' own queries: label_values() goes to the label values API.
                assert prom.get("/api/v1/label/namespace/values",
                                **{"match[]": "burnrate_train_steps_total"}) == [NAMESPACE]
                assert prom.get("/api/v1/label/training_job/values",
                                **{"match[]": f'burnrate_train_steps_total{{namespace="{NAMESPACE}"}}'}) == [JOB]
                answers: dict[str, list[list[dict]]] = {}
                for name in DASHBOARDS:
                    for p in panels(load(name)):
                        for t in p["targets"]:
                            promql = substitute(t["expr"], variables)
                            result = prom.query(promql)
                            assert result, f"{name}: {p['title']}: no data for {promql}"
                            answers.setdefault(p["title"], []).append(result)

                assert value(answers["GPUs held"][0]) == 2
                assert value(answers["Tokens per second"][0]) > 0
                assert value(answers["MFU"][0]) == pytest.approx(0.4)
                assert {r["metric"]["rank"]: float(r["value"][1]) for r in answers["Loss"][0]} == \
                    {str(rank): loss for rank, loss in LOSS.items()}
                assert {float(r["value"][1]) for r in answers["Gradient norm"][0]} == {0.75}
                assert len(answers["GPU utilization of the job's GPUs"][0]) == 2
                wait, compute, step = answers["Step time per rank: data wait vs compute"]
                for series, expected in ((wait, 0.3), (compute, 0.15), (step, 0.5)):
                    assert sorted(r["metric"]["rank"] for r in series) == ["0", "1"]
                    for r in series:
                        assert float(r["value"][1]) == pytest.approx(expected, rel=0.05)
                assert value(answers["Cost over the analysis window"][0]) > 0
                assert value(answers["Open findings"][0]) >= 1
                assert "dataloader_starvation" in {r["metric"]["kind"] for r in answers["Findings"][0]}
                # The fleet: three GPUs, the job holds two, nobody the third.
                assert value(answers["GPUs"][0]) == 3
                assert value(answers["Allocated GPUs"][0]) == 2
                assert value(answers["Unallocated GPUs"][0]) == 1
                assert [r["metric"]["training_job"] for r in answers["Cost per job"][0]] == [JOB]
                assert "dataloader_starvation" in {r["metric"]["kind"] for r in answers["Waste per kind"][0]}
                assert value(answers["Analysis age"][0]) < 30
                # The Goodput row: each rank, on a GPU of its own, computes 0.15 s, waits 0.3 s for
                # data and so 0.05 s for the other rank in every 0.5 s step, and saves and evaluates
                # nothing. Its counters and its GPUs' start together, so the shares hold before the
                # 5-minute window has filled.
                assert value(answers["Goodput"][0]) == pytest.approx(0.15 / 0.5, rel=0.1)
                stacked = answers["Where the job's GPU-time goes"]
                assert len(stacked) == len(ledger.COUNTED) + 1
                rate = {c.name: value(result) for c, result in zip(ledger.COUNTED, stacked)}
                assert rate["productive"] > 0
                assert rate["data_wait"] == pytest.approx(2 * rate["productive"], rel=0.05)
                assert rate["sync_wait"] == pytest.approx(rate["productive"] / 3, rel=0.05)
                assert rate["checkpoint"] == rate["evaluation"] == 0
                assert value(stacked[-1]) > 0  # the GPUs held
        finally:
            stop.set()
            trainer.join(5)
