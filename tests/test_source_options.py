"""One set of source options for every command that reads a store (analyzer/options.py):
the same flags on `analyze` and `dashboard`, one-line errors for a user's mistakes, and both
commands reading a secured Prometheus for real: behind a proxy that demands a bearer token,
and with Prometheus' own TLS and basic auth (its --web.config.file)."""
from __future__ import annotations

import argparse
import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from burnrate.analyzer import cli as analyze_cli
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze
from burnrate.analyzer.sources import PrometheusSource, RecordingSource
from burnrate.analyzer.options import SourceOptions, source_options
from burnrate.cli import main as burnrate
from burnrate.dashboard import cli as dashboard_cli
from burnrate.exporter.errors import UserError
from burnrate.simulator.simulate import Spec, simulate
from tests.processes import dashboard, prometheus
from tests.test_prometheus_source import STEP, backfill
from tests.tls import basic, self_signed, trusting, web_config

SOURCE_FLAGS = {"--prometheus", "--recording", "--pricing", "--detector-config", "--cluster", "--cluster-label",
                "--scrape-interval", "--bearer-token-file", "--basic-auth-user", "--basic-auth-password-file",
                "--ca-file", "--insecure-skip-verify", "--timeout", "--max-series", "--max-points"}


def parser_of(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser


def options_of(module, *argv: str) -> SourceOptions:
    return source_options(parser_of(module).parse_args(list(argv)))


# --- the flags -----------------------------------------------------------------------------

def test_analyze_and_the_dashboard_take_the_same_source_flags_and_read_them_alike(tmp_path):
    for module in (analyze_cli, dashboard_cli):
        taken = {o for action in parser_of(module)._actions for o in action.option_strings}
        assert SOURCE_FLAGS <= taken, SOURCE_FLAGS - taken
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    argv = ("--prometheus", "https://prometheus:9090", "--bearer-token-file", str(token), "--insecure-skip-verify",
            "--timeout", "5", "--scrape-interval", "30", "--cluster", "eu-1", "--cluster-label", "k8s",
            "--max-series", "7000", "--max-points", "9000")
    ours = options_of(analyze_cli, *argv)
    assert ours == options_of(dashboard_cli, *argv)
    assert (ours.timeout_s, ours.scrape_interval_s, ours.cluster, ours.cluster_label) == (5.0, 30.0, "eu-1", "k8s")
    store = ours.open("eu-1")
    assert isinstance(store, PrometheusSource) and store.scope == {"k8s": "eu-1"}
    assert store._headers["Authorization"] == "Bearer s3cret" and store.min_step_s == 30.0
    assert (store._http.limits.series, store._http.limits.points) == (7000, 9000)


def test_the_dashboards_own_password_is_not_the_stores(tmp_path):
    """`--ui-basic-auth` (and its older name `--basic-auth`) guard the dashboard's pages;
    `--basic-auth-user` with `--basic-auth-password-file` is what it sends to Prometheus."""
    password = tmp_path / "password"
    password.write_text("reader-pw\n")
    for ui_flag in ("--ui-basic-auth", "--basic-auth"):
        args = parser_of(dashboard_cli).parse_args(
            ["--prometheus", "http://prometheus:9090", ui_flag, "team:s3cret", "--basic-auth-user", "reader",
             "--basic-auth-password-file", str(password)])
        assert args.ui_basic_auth == "team:s3cret"
        options = source_options(args)
        assert options.basic_auth_user == "reader"
        assert options.open()._headers["Authorization"] == basic("reader", "reader-pw")["Authorization"]


@pytest.mark.parametrize("argv, message", [
    (["--prometheus", "prometheus:9090"], "'prometheus:9090' has no scheme: give the URL with it, "
                                          "e.g. http://prometheus:9090"),
    (["--prometheus", "http://"], "wants an http:// or https:// URL"),
    (["--prometheus", "http://prometheus:port"], "--prometheus 'http://prometheus:port': Port could not be cast"),
    (["--prometheus", "http://p:9090", "--bearer-token-file", "/nonexistent"],
     "cannot read bearer token file /nonexistent: No such file or directory"),
    (["--prometheus", "http://p:9090", "--bearer-token-file", "{empty}"], "bearer token file .* is empty"),
    (["--prometheus", "http://p:9090", "--basic-auth-user", "u", "--basic-auth-password-file", "/nonexistent"],
     "cannot read basic auth password file /nonexistent"),
    (["--prometheus", "http://p:9090", "--basic-auth-password-file", "{empty}"],
     "--basic-auth-password-file needs --basic-auth-user"),
    (["--prometheus", "http://p:9090", "--basic-auth-user", "u", "--bearer-token-file", "{token}"],
     "give --bearer-token-file or --basic-auth-user, not both"),
    (["--prometheus", "http://p:9090", "--ca-file", "{token}"], "are for an https:// URL, not http://p:9090"),
    (["--prometheus", "https://p:9090", "--ca-file", "/nonexistent.pem"], "cannot read CA file /nonexistent.pem"),
    (["--prometheus", "http://p:9090", "--timeout", "0"], "--timeout must be positive"),
    (["--prometheus", "http://p:9090", "--scrape-interval", "-1"], "--scrape-interval must be positive"),
    (["--recording", "rec", "--bearer-token-file", "{token}", "--insecure-skip-verify"],
     "--bearer-token-file, --insecure-skip-verify: for --prometheus only"),
    (["--recording", "rec", "--cluster", "eu-1"], "--cluster chooses among the clusters of a Prometheus store"),
    (["--recording", "rec", "--fleet"], "--fleet reads a store's roll-ups: it needs --prometheus URL"),
    (["--prometheus", "http://p:9090", "--rollup-interval", "0"], "--rollup-interval must be positive"),
])
@pytest.mark.parametrize("command", ["analyze", "dashboard"])
def test_a_mistake_in_the_source_flags_is_one_line_from_either_command(tmp_path, capsys, command, argv, message):
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "token").write_text("t0ken\n")
    argv = [a.format(empty=tmp_path / "empty", token=tmp_path / "token") for a in argv]
    assert burnrate([command, *argv]) == 2
    out = capsys.readouterr()
    (line,) = out.err.splitlines()
    assert re.search(message, line) and line.startswith(f"burnrate {command}: error: "), line
    assert not out.out


# --- a secured Prometheus, read for real ------------------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A small simulated fleet ending two minutes ago, back-filled into a TSDB that each test's
    Prometheus opens in turn, and its jobs as the recording itself gives them."""
    tmp = tmp_path_factory.mktemp("secured")
    end = time.time() // STEP * STEP - 120
    recording = str(tmp / "rec")
    simulate(recording, Spec(nodes=2, gpus_per_node=4, hours=1.0, step_s=STEP, seed=3, end=end))
    report = analyze(RecordingSource(recording).frames(), load_catalog())
    jobs = {(j.namespace, j.training_job): (j.gpus, j.cost_dollars) for j in report.jobs}
    assert len(jobs) >= 3 and all(cost for _, cost in jobs.values())
    return backfill(tmp, recording), jobs


class BearerProxy:
    """A reverse proxy that forwards to Prometheus only the requests that carry its bearer
    token. Prometheus' own web config has basic auth but no bearer tokens: in a cluster the
    token is checked by a proxy in front of it (kube-rbac-proxy, oauth2-proxy, an ingress),
    none of which is installed here; this one, from the standard library, does that one job
    and counts what it let through and what it refused."""

    def __init__(self, upstream: str, token: str) -> None:
        self.forwarded = self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"     # keeps the analyzer's connections open, as a real proxy does

            def log_message(self, *_) -> None:
                pass

            def _answer(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                sent = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                if self.headers.get("Authorization") != f"Bearer {token}":
                    proxy.refused += 1
                    return self._answer(401, b"Unauthorized\n", "text/plain")
                proxy.forwarded += 1
                forward = urllib.request.Request(upstream + self.path, data=sent, method=self.command, headers={
                    k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")})
                try:
                    with urllib.request.urlopen(forward, timeout=30) as resp:
                        self._answer(resp.status, resp.read(), resp.headers["Content-Type"])
                except urllib.error.HTTPError as err:
                    self._answer(err.code, err.read(), err.headers.get("Content-Type", "text/plain"))

            do_POST = do_GET

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def jobs_page(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, str], tuple[float, float]]:
    """The Jobs page's table, through the dashboard's own callback over HTTP, as a browser
    asks for it: the first answer draws from the early read while the analysis runs, and the
    page's poll asks again until it is done. (namespace, job) -> (GPUs, cost)."""
    outputs = [{"id": "jobs-content", "property": "children"}, {"id": "jobs-progress", "property": "children"},
               {"id": "jobs-poll", "property": "disabled"}]
    for polls in range(120):
        body = {"output": "..jobs-content.children...jobs-progress.children...jobs-poll.disabled..",
                "outputs": outputs,
                "inputs": [{"id": "app-url", "property": "search", "value": "?range=6h"},
                           {"id": "app-refresh", "property": "n_intervals", "value": 0},
                           {"id": "jobs-poll", "property": "n_intervals", "value": polls}],
                "changedPropIds": ["jobs-poll.n_intervals" if polls else "app-url.search"], "state": []}
        request = urllib.request.Request(url + "/_dash-update-component", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer = json.load(resp)["response"]
        if answer.get("jobs-poll", {}).get("disabled", True):    # the analysis is done: the full table
            break
        time.sleep(0.5)
    children = answer["jobs-content"]["children"]
    tables = [c["props"]["data"] for c in children if c["props"].get("id") == "jobs-table"]
    assert tables, children        # not the page's notice of an error or of no jobs
    return {(row["namespace"], re.search(r"/job/[^/]+/([^?]+)\?", row["job"]).group(1)):
            (row["gpus"], row["cost_dollars"]) for row in tables[0]}


def assert_same_jobs(shown: dict, truth: dict) -> None:
    assert shown.keys() == truth.keys()
    for key, (gpus, cost) in shown.items():
        assert gpus == truth[key][0] and cost == pytest.approx(truth[key][1], abs=0.01), key


@pytest.mark.slow
def test_the_dashboard_shows_jobs_read_through_a_proxy_that_demands_a_bearer_token(tmp_path, capsys, fleet):
    storage, truth = fleet
    token, wrong = tmp_path / "token", tmp_path / "wrong"
    token.write_text("s3cret-token\n")
    wrong.write_text("guess\n")
    with prometheus(tmp_path, storage=storage) as prom:
        proxy = BearerProxy(prom.url, "s3cret-token")
        try:
            with dashboard(tmp_path, None, "--prometheus", proxy.url, "--bearer-token-file", str(token)) as url:
                assert_same_jobs(jobs_page(url), truth)
            assert proxy.forwarded > 0 and proxy.refused == 0
            for given, why in (([], "it asks for credentials"),
                               (["--bearer-token-file", str(wrong)], "the credentials given were refused")):
                assert burnrate(["dashboard", "--prometheus", proxy.url, "--listen", "127.0.0.1:0", *given]) == 2
                (line,) = capsys.readouterr().err.splitlines()
                assert line.startswith(f"burnrate dashboard: error: Prometheus at {proxy.url} answered HTTP 401: "
                                       f"Unauthorized ({why}"), line
            assert proxy.refused == 2
        finally:
            proxy.close()


@pytest.mark.slow
def test_analyze_and_the_dashboard_read_a_prometheus_with_tls_and_basic_auth(tmp_path, capsys, fleet):
    """Prometheus' own --web.config.file: TLS by a self-signed certificate and one user. The
    dashboard also asks its visitors for a password of its own, which is not the store's."""
    storage, truth = fleet
    cert, key = self_signed(tmp_path)
    password = tmp_path / "password"
    password.write_text("reader-pw\n")
    secured = ["--ca-file", cert, "--basic-auth-user", "reader", "--basic-auth-password-file", str(password)]
    with prometheus(tmp_path, storage=storage, web_config=web_config(cert, key, "reader", "reader-pw"),
                    headers=basic("reader", "reader-pw"), context=trusting(cert)) as prom:
        assert prom.url.startswith("https://")
        with dashboard(tmp_path, None, "--prometheus", prom.url, *secured, "--ui-basic-auth", "team:ui-pw") as url:
            assert_same_jobs(jobs_page(url, basic("team", "ui-pw")), truth)
            with pytest.raises(urllib.error.HTTPError) as refused:
                jobs_page(url, basic("reader", "reader-pw"))        # the store's password opens no page
            assert refused.value.code == 401

        assert analyze_cli.run(parser_of(analyze_cli).parse_args([
            "--prometheus", prom.url, *secured, "--since", "6h", "--format", "json"])) == 0
        document = json.loads(capsys.readouterr().out)
        assert_same_jobs({(j["namespace"], j["training_job"]): (j["gpus"], j["cost_dollars"])
                          for j in document["jobs"]}, truth)

        wrong = tmp_path / "wrong"
        wrong.write_text("guess\n")
        for given, why in (
                (["--ca-file", cert], r"answered HTTP 401: Unauthorized \(it asks for credentials"),
                ([*secured[:4], "--basic-auth-password-file", str(wrong)],
                 r"answered HTTP 401: Unauthorized \(the credentials given were refused\)"),
                (secured[2:], r"certificate verify failed: self-signed .* \(name the CA that signed it with "
                              r"--ca-file\)")):
            with pytest.raises(UserError, match=why) as info:
                analyze_cli.run(parser_of(analyze_cli).parse_args(["--prometheus", prom.url, *given, "--since", "1h"]))
            assert "\n" not in str(info.value)


def test_options_are_frozen_and_checked_on_every_copy():
    options = SourceOptions(prometheus="http://prometheus:9090")
    with pytest.raises(AttributeError):
        options.cluster = "eu-1"                          # type: ignore[misc]
    with pytest.raises(UserError, match="--timeout must be positive"):
        replace(options, timeout_s=0)
