"""Real processes for integration tests: the agent, the dashboard and a Prometheus server, on loopback."""
from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

from tests.conftest import PYTHON, ROOT, free_port, require


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None,
              statuses: tuple[int, ...] = (200,), headers: dict[str, str] | None = None,
              context: ssl.SSLContext | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2,
                                        context=context) as resp:
                if resp.status in statuses:
                    return
        except urllib.error.HTTPError as answer:
            if answer.code in statuses:
                return
            time.sleep(0.1)
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def stop(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, and SIGKILL if that is not heeded in time: a test leaves no process behind."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def agent(tmp_path, *extra: str, context: ssl.SSLContext | None = None):
    """`burnrate agent` as a user runs it; yields (base URL, telemetry socket path, process).
    With `context`, it serves https (`extra` has its --web-config), asked with that context."""
    port = free_port()
    url = f"{'https' if context else 'http'}://127.0.0.1:{port}"
    sock = str(tmp_path / "telemetry.sock")
    log = open(tmp_path / "agent.log", "wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "burnrate", "agent", "--backend", "simulated", "--gpus", "2",
         "--listen", f"127.0.0.1:{port}", "--telemetry-socket", sock, "--node", "node-a", *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"{url}/healthz", proc=proc, context=context)
        yield url, sock, proc
    finally:
        stop(proc, 10)
        log.close()


@contextlib.contextmanager
def dashboard(tmp_path, recording: str | None, *extra: str):
    """`burnrate dashboard --recording` (or with the source `extra` names) as a user runs
    it; yields its base URL."""
    port = free_port()
    log = open(tmp_path / "dashboard.log", "wb")
    source = ["--recording", recording] if recording else []
    proc = subprocess.Popen([PYTHON, "-m", "burnrate", "dashboard", *source,
                             "--listen", f"127.0.0.1:{port}", *extra], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        # A 401 says it serves too, where it asks for a password.
        wait_http(f"http://127.0.0.1:{port}/", timeout=60, proc=proc, statuses=(200, 401))
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc, 10)
        log.close()


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        return self.get("/api/v1/query", query=promql)["result"]

    def wait_for(self, promql: str, timeout: float = 40.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(0.5)
        raise TimeoutError(f"no data for {promql} within {timeout}s")


def promtool_backfill(openmetrics: str | os.PathLike, data: str | os.PathLike) -> None:
    """promtool's backfill of an OpenMetrics file into the TSDB blocks of `data`. Blocks of up to
    31 days, not promtool's 2 hours: the tests' stores span days, and in two-hour blocks three
    days of 16 GPUs took 25.7 s to write against 2.2 s."""
    subprocess.run([require("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=744h",
                    str(openmetrics), str(data)], check=True, capture_output=True, timeout=300)


@contextlib.contextmanager
def prometheus(tmp_path, targets: list[str] = (), storage: str | None = None, extra_args: tuple[str, ...] = (),
               scrape: str = "", config: str = "", web_config: str = "", headers: dict[str, str] | None = None,
               context: ssl.SSLContext | None = None):
    """Debian's Prometheus on a free loopback port, scraping `targets` every second (or as
    the `scrape_configs:` section given says); `config` adds other top-level sections.
    `web_config` is its own --web.config.file (TLS, basic auth): it is then asked whether it
    is ready with `headers`, over https:// with `context` where that is given."""
    binary = require("prometheus")
    port = free_port()
    if targets:
        scrape = ("scrape_configs:\n  - job_name: burnrate\n    static_configs:\n"
                  f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
    path = tmp_path / "prometheus.yml"
    path.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{scrape}{config}")
    data = storage or str(tmp_path / "tsdb")
    if web_config:
        (tmp_path / "web.yml").write_text(web_config)
        extra_args = (*extra_args, f"--web.config.file={tmp_path / 'web.yml'}")
    url = f"{'https' if context else 'http'}://127.0.0.1:{port}"
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={path}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}", *extra_args],
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        wait_http(f"{url}/-/ready", timeout=60, proc=proc, headers=headers, context=context)
        yield Prometheus(url)
    finally:
        stop(proc, 20)
        log.close()


@contextlib.contextmanager
def victoria_metrics(tmp_path):
    """Debian's VictoriaMetrics on a free loopback port; it answers Prometheus' query API, so the
    object yielded is a Prometheus client (.url, .query) pointed at it."""
    binary = require("victoria-metrics")
    port = free_port()
    log = open(tmp_path / "victoria-metrics.log", "wb")
    proc = subprocess.Popen(
        [binary, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp_path / 'vmdata'}",
         # back-filled history is years old by the wall clock; keep all of it
         "-retentionPeriod=100y",
         # answer from the raw samples at once: no response cache, no 30 s hold-back of recent points
         "-search.disableCache", "-search.latencyOffset=0s"],
        stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        yield Prometheus(f"http://127.0.0.1:{port}")
    finally:
        stop(proc, 20)
        log.close()


@contextlib.contextmanager
def http_server(handler: type) -> Iterator[str]:
    """A stdlib HTTP server on a free loopback port answering with `handler`: its base URL,
    shut down and closed afterwards (the stand-in stores of the client tests)."""
    import http.server
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
