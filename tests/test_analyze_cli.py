"""`burnrate analyze` end to end on a simulated recording: the three formats, the
docs/report.md document, one-line errors, an empty window, and `--serve`."""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import pty
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from burnrate.analyzer import cli
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.grid import freed
from burnrate.analyzer.output.report import analyze, render_json
from burnrate.cli import main as burnrate
from burnrate.exporter.errors import UserError
from burnrate.simulator.simulate import Spec, simulate
from test_detectors import Fleet, healthy_job
from tests.conftest import free_port
from tests.processes import prometheus
from tests.tls import basic, self_signed, trusting, web_config

END = 1_800_000_000.0
FINDING_KEYS = {"kind", "severity", "namespace", "training_job", "Hostname", "gpu", "pod", "rank", "start", "end",
                "wasted_gpu_hours", "wasted_dollars", "evidence", "recommendation"}
JOB_KEYS = {"namespace", "training_job", "gpus", "gpu_hours", "capacity_type", "cost_dollars", "steps", "tokens",
            "cost_per_step", "cost_per_billion_tokens", "mfu", "waste_dollars", "on_demand_cost_dollars"}


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("fleet"))
    simulate(root, Spec(nodes=4, gpus_per_node=8, hours=2, seed=3, end=END))
    return root


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="burnrate analyze")
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def run(capsys, *argv: str) -> str:
    assert cli.run(parse(*argv)) == 0
    return capsys.readouterr().out


def test_json_is_the_contract_document(capsys, recording):
    doc = json.loads(run(capsys, "--recording", recording, "--format", "json"))
    assert {"window", "findings", "jobs"} <= set(doc)
    assert set(doc["window"]) == {"start", "end"} and doc["window"]["start"].endswith("Z")
    assert doc["findings"] and doc["jobs"]
    for finding in doc["findings"]:
        assert set(finding) == FINDING_KEYS
        assert finding["severity"] in ("info", "warning", "critical")
        assert isinstance(finding["evidence"], dict) and finding["recommendation"]
        assert finding["rank"] is None or isinstance(finding["rank"], int)
    kinds = {f["kind"] for f in doc["findings"]}
    assert {"straggler", "stalled", "idle_gpu", "unallocated_gpu"} <= kinds
    for job in doc["jobs"]:
        assert JOB_KEYS <= set(job)
        assert job["capacity_type"] in ("spot", "on-demand", "mixed", "unknown")
        assert isinstance(job["waste_dollars"], dict)
    # A job on on-demand nodes costs its on-demand price; one on spot, less.
    on_demand = [j for j in doc["jobs"] if j["capacity_type"] == "on-demand"]
    spot = [j for j in doc["jobs"] if j["capacity_type"] == "spot"]
    assert on_demand and spot and all(j["cost_dollars"] is not None for j in on_demand + spot)
    for job in on_demand:
        assert job["cost_dollars"] == pytest.approx(job["on_demand_cost_dollars"]) and job["cost_dollars"] > 0
    for job in spot:
        assert 0 < job["cost_dollars"] < job["on_demand_cost_dollars"]
    assert doc["simulated"] is True


def test_table_is_the_default_and_csv_parses(capsys, recording):
    table = run(capsys, "--recording", recording)
    assert "FINDINGS" in table and "JOBS" in table and "WHAT TO DO" in table
    rows = list(csv.DictReader(io.StringIO(run(capsys, "--recording", recording, "--format", "csv"))))
    assert {r["record"] for r in rows} == {"finding", "job"}
    assert all(json.loads(r["evidence"]) for r in rows if r["record"] == "finding")


def test_window_selection(capsys, recording):
    doc = json.loads(run(capsys, "--recording", recording, "--format", "json",
                         "--start", str(END - 3600), "--end", str(END)))
    assert doc["window"]["start"] == "2027-01-15T07:00:00Z"


def test_nan_losses_survive_into_strict_json():
    f = Fleet()
    loss = np.full(f.n, 2.5)
    loss[300:] = np.nan
    healthy_job(f, ranks=2, per_rank={r: {"loss": loss} for r in range(2)})
    doc = json.loads(render_json(analyze(f.frames(), load_catalog())))
    diverging = [x for x in doc["findings"] if x["kind"] == "diverging"]
    assert diverging and diverging[0]["evidence"]["loss_after"] == "nan"


@pytest.mark.parametrize("text, message", [
    ("idle_gpu: [", "is not valid YAML"),
    ("idle_gpus: {min_minutes: 5}", "unknown detector 'idle_gpus'"),
    ("idle_gpu: {min_minute: 5}", "unknown setting 'min_minute'"),
    ("idle_gpu: {min_minutes: -5}", "idle_gpu.min_minutes: expected a non-negative float"),
    ("diverging: {loss_reports: 2.5}", "diverging.loss_reports: expected a non-negative int"),
    ("straggler: {slowdown: true}", "straggler.slowdown: expected a non-negative float"),
])
def test_a_bad_detector_config_is_one_line(recording, tmp_path, text, message):
    path = tmp_path / "detectors.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as info:
        cli.run(parse("--recording", recording, "--detector-config", str(path)))
    assert "\n" not in str(info.value)


def test_a_dumped_detector_config_reads_back_as_itself(tmp_path):
    from burnrate.analyzer.detectors import DetectorConfig
    from burnrate.analyzer.detectors.config_file import dump_detector_config, load_detector_config
    from burnrate.demo import live_config

    for config in (DetectorConfig(), live_config(DetectorConfig())):
        path = tmp_path / "thresholds.yaml"
        path.write_text(dump_detector_config(config))
        assert load_detector_config(str(path)) == config


def test_detector_config_moves_the_thresholds(capsys, recording, tmp_path):
    """The same recording, with the idle threshold past the window's two hours, names no idle GPU;
    every other detector keeps its defaults and finds what it found."""
    default = json.loads(run(capsys, "--recording", recording, "--format", "json"))["findings"]
    assert any(f["kind"] == "idle_gpu" for f in default)
    path = tmp_path / "detectors.yaml"
    path.write_text("idle_gpu:\n  min_minutes: 600\n")
    strict = json.loads(run(capsys, "--recording", recording, "--format", "json", "--detector-config", str(path)))
    assert not any(f["kind"] == "idle_gpu" for f in strict["findings"])
    kept = lambda findings: sorted((f["kind"], f["namespace"], f["training_job"], f["start"]) for f in findings
                                   if f["kind"] not in ("idle_gpu", "underused_gpu"))
    assert kept(strict["findings"]) == kept(default)


@pytest.mark.parametrize("argv, message", [
    (["--recording", "/nonexistent"], "is not a burnrate recording"),
    (["--recording", "{rec}", "--since", "2x"], "invalid duration"),
    (["--recording", "{rec}", "--since", "1h", "--start", "0"], "either --since or --start"),
    (["--recording", "{rec}", "--start", "10", "--end", "5"], "before it starts"),
    (["--recording", "{rec}", "--start", "nan"], "outside 1970-01-01"),
    (["--recording", "{rec}", "--start", "1e300"], "outside 1970-01-01"),
    (["--recording", "{rec}", "--since", "100000y"], "longer than 1000y"),
    (["--recording", "{rec}", "--pricing", "/nonexistent.yaml"], "cannot read pricing file"),
    (["--recording", "{rec}", "--checkpoint-seconds", "-1"], "must be positive"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "1h", "--timeout", "2"], "Prometheus"),
    (["--prometheus", "http://127.0.0.1:1", "--bearer-token-file", "/nonexistent"], "cannot read bearer token"),
    (["--recording", "{rec}", "--detector-config", "/nonexistent.yaml"], "cannot read detector config"),
    (["--recording", "{rec}", "--web-config", "/nonexistent.yml"], "--web-config secures the endpoint of --serve"),
    (["--recording", "{rec}", "--serve", "--web-config", "/nonexistent.yml"], "cannot read web config"),
])
def test_user_errors_are_one_line(recording, argv, message):
    args = parse(*[a.replace("{rec}", recording) for a in argv])
    with pytest.raises(UserError, match=message) as info:
        cli.run(args)
    assert "\n" not in str(info.value)


@contextlib.contextmanager
def serving(args: argparse.Namespace):
    """`burnrate analyze --serve` on a thread; yields the event that stops it."""
    stop = threading.Event()
    worker = threading.Thread(target=cli.run, args=(args, stop), daemon=True)
    worker.start()
    try:
        yield stop
    finally:
        stop.set()
        worker.join(10)
        assert not worker.is_alive()


def scrape_once_analyzed(url: str, headers: dict[str, str] | None = None, context=None) -> str:
    """/metrics once the first analysis is in it."""
    deadline, body = time.monotonic() + 30, ""
    while time.monotonic() < deadline and "burnrate_analyze_last_run_timestamp_seconds" not in body:
        time.sleep(0.2)
        try:
            request = urllib.request.Request(url, headers=headers or {})
            body = urllib.request.urlopen(request, timeout=5, context=context).read().decode()
        except OSError:
            continue
    return body


def test_serve_exports_costs_and_findings(recording, monkeypatch):
    trims = []
    monkeypatch.setattr(freed, "_TRIM", trims.append)
    port = free_port()
    args = parse("--recording", recording, "--serve", "--listen", f"127.0.0.1:{port}", "--interval", "60")
    with serving(args):
        body = scrape_once_analyzed(f"http://127.0.0.1:{port}/metrics")
        deadline = time.monotonic() + 10
        while not trims and time.monotonic() < deadline:
            time.sleep(0.05)
    # Between evaluations the process gives back what the last one freed (analyzer/grid/freed.py).
    assert trims == [0]
    assert 'burnrate_job_cost_dollars{capacity_type=' in body
    assert 'burnrate_job_waste_dollars{cause="straggler"' in body
    assert 'burnrate_finding{Hostname=' in body and 'kind="stalled"' in body


def test_serve_with_the_agents_web_config_asks_for_tls_and_a_password(recording, tmp_path):
    """The same exporter-toolkit file as `burnrate agent --web-config`: TLS by a self-signed
    certificate and one user by bcrypt hash."""
    cert, key = self_signed(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text(web_config(cert, key, "prometheus", "s3cret"))
    port = free_port()
    args = parse("--recording", recording, "--serve", "--listen", f"127.0.0.1:{port}", "--interval", "60",
                 "--web-config", str(config))
    url, context = f"https://127.0.0.1:{port}/metrics", trusting(cert)
    with serving(args):
        body = scrape_once_analyzed(url, basic("prometheus", "s3cret"), context)
        for headers in ({}, basic("prometheus", "wrong"), basic("nobody", "s3cret")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5, context=context)
            assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"].startswith("Basic")
            assert b"burnrate_job_cost_dollars" not in refused.value.read()
        # a liveness probe needs no password and learns only that the server is up
        assert urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=5, context=context).read() == b"ok\n"
        health = urllib.request.Request(url.replace("/metrics", "/healthz"), headers=basic("prometheus", "s3cret"))
        assert urllib.request.urlopen(health, timeout=5, context=context).read().startswith(b"last analysis finished")
        with pytest.raises(OSError):        # plain HTTP to the TLS port gets no metrics
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read()
    assert 'burnrate_job_cost_dollars{capacity_type=' in body and 'kind="stalled"' in body


def test_a_terminal_sees_a_progress_bar_while_metrics_are_read(recording):
    """Through a real pseudo-terminal: the bar is drawn, reaches 100% and is erased
    before the table; a pipe (a script) gets no bar at all."""
    main, terminal = pty.openpty()
    done = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--recording", recording],
                          stdout=subprocess.PIPE, stderr=terminal, timeout=120, check=True)
    os.close(terminal)
    drawn = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:          # the terminal closed: everything is read
            break
        if not chunk:
            break
        drawn += chunk
    os.close(main)
    frames = drawn.decode().split("\r")
    assert any("reading metrics [" in f and "100%" in f for f in frames), drawn
    assert drawn.endswith(b"\x1b[K")
    assert b"FINDINGS" in done.stdout and b"reading metrics" not in done.stdout
    piped = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--recording", recording],
                           capture_output=True, timeout=120, check=True)
    assert b"reading metrics" not in piped.stderr


@pytest.mark.parametrize("argv, message", [
    (["--recording", "{rec}", "--sinc", "2h"], "unrecognized argument --sinc (did you mean --since?)"),
    (["--recordng", "{rec}"], "unrecognized argument --recordng (did you mean --recording?)"),
    (["--recording", "{rec}", "--since", "-2h"], "--since wants a duration like 2h; -2h is not one "
                                                 "(durations are positive)"),
    (["--recording", "{rec}", "--format", "--since", "2h"], "--format wants a value; --since is not one"),
])
def test_a_mistyped_flag_is_named_with_what_to_give(capsys, recording, argv, message):
    with pytest.raises(SystemExit) as exited:
        burnrate(["analyze", *[a.replace("{rec}", recording) for a in argv]])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"burnrate analyze: error: {message}\n"


@pytest.mark.parametrize("command, message", [
    ("analyz", "no command 'analyz' (did you mean analyze?); the commands: demo, agent, train, simulate, analyze, "
               "report, dashboard, rules"),
    ("xyz", "no command 'xyz'; the commands: demo, agent, train, simulate, analyze, report, dashboard, rules"),
])
def test_a_mistyped_command_is_named_with_the_one_meant(capsys, command, message):
    with pytest.raises(SystemExit) as exited:
        burnrate([command, "--recording", "r"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"burnrate: error: {message}\n"


@pytest.mark.parametrize("url, message", [
    ("127.0.0.1:9999", "--prometheus '127.0.0.1:9999' has no scheme: give the URL with it, e.g. http://127.0.0.1:9999"),
    ("http://127.0.0.1:9999/api/v1", "--prometheus wants the server's base URL, without /api/v1: "
                                     "http://127.0.0.1:9999"),
])
def test_a_prometheus_url_mistake_says_which_url_to_give(capsys, url, message):
    assert burnrate(["analyze", "--prometheus", url]) == 2
    assert capsys.readouterr().err == f"burnrate analyze: error: {message}\n"


def test_a_window_outside_the_recording_says_where_its_data_is(capsys, recording):
    assert burnrate(["analyze", "--recording", recording, "--start", "2020-01-01T00:00:00Z",
                     "--end", "2020-01-01T01:00:00Z"]) == cli.NOTHING_FOUND == 3
    out, err = capsys.readouterr()
    assert out == "" and err == ("burnrate analyze: error: no GPU samples from 2020-01-01T00:00:00Z to "
                                 f"2020-01-01T01:00:00Z: the recording {recording} holds 2027-01-15T06:00:15Z "
                                 "to 2027-01-15T08:00:00Z\n")


@pytest.mark.slow
def test_an_empty_or_misaddressed_prometheus_says_what_it_found(capsys, tmp_path):
    """Real Prometheus, scraping nothing: an empty store, its URL under a path it does
    not serve, and https:// to its plain HTTP."""
    with prometheus(tmp_path) as prom:
        base = prom.url
        assert burnrate(["analyze", "--prometheus", base, "--start", "2026-01-01T00:00:00Z",
                         "--end", "2026-01-01T01:00:00Z"]) == 3
        assert capsys.readouterr().err == (
            "burnrate analyze: error: no GPU samples (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_GPU_UTIL_RATIO, "
            "burnrate_gpu_up) from 2026-01-01T00:00:00Z to 2026-01-01T01:00:00Z: "
            f"Prometheus at {base} holds 0 burnrate or DCGM series now\n")
        assert burnrate(["analyze", "--prometheus", f"{base}/prom", "--since", "1h"]) == 2
        assert capsys.readouterr().err == (
            f"burnrate analyze: error: Prometheus at {base}/prom answered HTTP 404: 404 page not found "
            "(a Prometheus API answers under URL/api/v1/: give the server's base URL)\n")
        tls = base.replace("http:", "https:")
        assert burnrate(["analyze", "--prometheus", tls, "--since", "1h"]) == 2
        assert capsys.readouterr().err == (f"burnrate analyze: error: Prometheus at {tls} speaks plain HTTP, "
                                           f"not TLS: use {base}\n")
