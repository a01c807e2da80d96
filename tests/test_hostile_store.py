"""What a hostile store can do to the analyzer. Its answers are bounded in size as they
arrive: `burnrate analyze` against a server that answers every range query with as many series
as it is told, generated as it is sent, stops reading at the limits, says so in one line, and
keeps its memory (measured in its own process) far from the Deployment's 4 GiB. What it says
reaches the terminal with its control characters escaped, and no label it could set is taken
for the cluster's."""
from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import urllib.parse

import pytest

from tests.processes import http_server

from burnrate.agent.cli import _cluster
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.options import SourceOptions
from burnrate.analyzer.output.report import analyze, render_table
from burnrate.analyzer.sources.promhttp import PrometheusHTTP
from burnrate.analyzer.sources.prometheus import PrometheusError
from burnrate.cli import main
from burnrate.exporter.errors import UserError
from test_detectors import healthy_job, Fleet
from test_prometheus_source import answering

# Runs the command in-process and reports the process's own peak RSS (KiB on Linux) last.
MEASURED = ("import resource, sys\n"
            "from burnrate.cli import main\n"
            "rc = main(sys.argv[1:])\n"
            "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(rc)\n")


class _Flood(http.server.BaseHTTPRequestHandler):
    """Every range query is answered with `series` series of one point each, written as they
    are made; the query for where data lies is answered truthfully, the rest with nothing."""
    series = 0
    protocol_version = "HTTP/1.0"       # the answer ends when the connection does: no length to give

    def do_POST(self):  # noqa: N802 - http.server's naming
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        query = form.get("query", [""])[0]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.path != "/api/v1/query_range":
            self.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[]}}')
            return
        start, end, step = (float(form[k][0]) for k in ("start", "end", "step"))
        if query.startswith("count("):
            points = ",".join(f'[{start + k * step:.0f},"1"]' for k in range(int((end - start) / step) + 1))
            self.wfile.write(f'{{"status":"success","data":{{"resultType":"matrix","result":'
                             f'[{{"metric":{{}},"values":[{points}]}}]}}}}'.encode())
            return
        try:
            self.wfile.write(b'{"status":"success","data":{"resultType":"matrix","result":[')
            for first in range(0, self.series, 1000):
                self.wfile.write(",".join(
                    f'{{"metric":{{"Hostname":"node-{i // 8}","gpu":"{i % 8}","UUID":"GPU-{i:012d}",'
                    f'"namespace":"ml","pod":"p-{i}"}},"values":[[{end:.0f},"50"]]}}'
                    for i in range(first, min(first + 1000, self.series))).encode()
                    + (b"," if first + 1000 < self.series else b""))
            self.wfile.write(b"]}}")
        except (BrokenPipeError, ConnectionResetError):
            pass        # the analyzer stopped reading: what it was meant to do

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def flooding(series: int):
    with http_server(type("Handler", (_Flood,), {"series": series})) as url:
        yield url


def analyze_measured(url: str, *flags: str) -> tuple[int, list[str], int]:
    """The exit status, stderr's lines and peak RSS in MiB of `burnrate analyze` on `url`."""
    proc = subprocess.run([sys.executable, "-c", MEASURED, "analyze", "--prometheus", url, "--since", "10m",
                           "--scrape-interval", "15", "--format", "json", *flags],
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("maxrss_kib "), proc.stderr
    return proc.returncode, lines[:-1], int(lines[-1].split()[1]) // 1024


@pytest.mark.slow
def test_a_million_series_an_answer_stop_at_the_series_limit_in_bounded_memory():
    """Each answer of 10**6 series (133 MB) took the analyzer to 4.4 GB and a MemoryError
    traceback. The default limit stops the read at a million series in all, within the
    Deployment's 4 GiB: where one answer of exactly a million series completes before the
    next passes the limit (the answers stream side by side, so it depends on the machine's
    timing), its million series are decoded first, which takes about 2.2 GB; where two
    answers pass it together, the read stops at about 250 MB."""
    with flooding(10**6) as url:
        rc, errors, rss_mib = analyze_measured(url)
    assert rc == 2
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"burnrate analyze: error: Prometheus at {url} answered more than 1,000,000 series "
                                "(--max-series) reading ")
    assert rss_mib < 3 * 1024, rss_mib


def test_the_limits_are_settable_and_name_the_query():
    with flooding(5000) as url:
        rc, errors, _ = analyze_measured(url, "--max-series", "2000")
        assert (rc, len(errors)) == (2, 1), errors
        assert "answered more than 2,000 series (--max-series) reading " in errors[0]
        assert "DCGM_FI_DEV_" in errors[0] or "burnrate_" in errors[0]
        rc, errors, _ = analyze_measured(url, "--max-points", "3000")
        assert (rc, len(errors)) == (2, 1), errors
        assert "answered more than 3,000 points (--max-points) reading " in errors[0]


def test_a_read_within_the_limits_is_read_whole():
    with flooding(300) as url:
        rc, errors, _ = analyze_measured(url, "--max-series", "1000000")
    assert rc == 0, errors


def test_the_series_of_one_answer_count_against_its_limit_as_they_arrive():
    """An instant query's answer is counted too: Python's json takes far more than its size."""
    with flooding(5000) as url:
        http_ = PrometheusHTTP(url, {}, timeout_s=30.0)
        assert len(http_.matrix("/api/v1/query_range", {"query": "up{}", "start": "0", "end": "0",
                                                        "step": "15"})) == 5000
        small = PrometheusHTTP(url, {}, timeout_s=30.0, limits=type(http_.limits)(series=4999))
        with pytest.raises(PrometheusError, match=r"more than 4,999 series \(--max-series\) reading up: stopped"):
            small.matrix("/api/v1/query_range", {"query": "up{}", "start": "0", "end": "0", "step": "15"})



ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e"


def test_a_stores_error_reaches_the_terminal_escaped(capsys):
    """An error text with escape sequences cleared the screen and retitled the terminal."""
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": ESCAPES}).encode()
    with answering(200, body) as url:
        assert main(["analyze", "--prometheus", url, "--since", "10m", "--scrape-interval", "15"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("answered an error: bad_data: \\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202e\n")
    assert not any(c in err for c in "\x1b\x07\x9b\u202e")


def test_label_values_reach_the_table_escaped():
    f = Fleet()
    healthy_job(f, job="llm" + ESCAPES)
    table = render_table(analyze(f.frames(), load_catalog(None)))
    assert "ml/llm\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202e" in table
    assert not any(c in table for c in "\x1b\x07\x9b\u202e")


@pytest.mark.parametrize("label", ["job", "instance", "__name__", "__tmp"])
def test_a_label_prometheus_sets_on_scrape_names_no_cluster(label):
    """With honor_labels, an agent's `job` replaced the scrape job's on every series."""
    message = f"--cluster-label {label!r} is a label Prometheus sets on every scrape"
    with pytest.raises(UserError, match=message):
        SourceOptions(prometheus="http://prometheus:9090", cluster_label=label)
    with pytest.raises(UserError, match=message):
        _cluster("eu-1", label)


def test_no_single_answer_holds_more_points_than_its_decoding_can_take(monkeypatch):
    from burnrate.analyzer.sources import promhttp
    monkeypatch.setattr(promhttp, "ANSWER_POINTS", 4000)
    with flooding(5000) as url:
        with pytest.raises(PrometheusError, match="answered more than 4,000 points in one answer"):
            PrometheusHTTP(url, {}, timeout_s=30.0).matrix("/api/v1/query_range", {
                "query": "up{}", "start": "0", "end": "0", "step": "15"})
