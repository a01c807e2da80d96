"""Many clusters, one Prometheus: each cluster's agent names its cluster on every series,
and the analyzer and dashboard report one cluster, or each apart, never the sum.

Two real agents, `--cluster eu-1` and `--cluster us-2`, on nodes of the same name, each
holding a job of the same name (`ml/llm`, two GPUs), scraped by one real Prometheus."""
import contextlib
import csv
import io
import json
import subprocess
import threading
from dataclasses import replace

import pytest

from tests.conftest import PYTHON, ROOT
from tests.processes import agent, dashboard, prometheus
from tests.test_prometheus_scrape import heartbeat

pytestmark = pytest.mark.slow


def analyze(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "burnrate", "analyze", "--prometheus", url, "--since", "5m",
                           "--scrape-interval", "1", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def two_clusters(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("clusters")
    with contextlib.ExitStack() as stack:
        targets = []
        for cluster in ("eu-1", "us-2"):
            home = tmp_path / cluster
            home.mkdir()
            url, sock, _ = stack.enter_context(agent(home, "--interval", "0.5", "--cluster", cluster))
            stop = threading.Event()
            beat = threading.Thread(target=heartbeat, args=(sock, stop), daemon=True)
            beat.start()
            stack.callback(beat.join)
            stack.callback(stop.set)
            targets.append(url.removeprefix("http://"))
        prom = stack.enter_context(prometheus(tmp_path, targets))
        for cluster in ("eu-1", "us-2"):
            prom.wait_for(f'burnrate_gpu_allocation_share_ratio{{cluster="{cluster}",pod="llm-worker-1"}}')
        # Both GPUs held for a few of the 1 s steps that the dashboard draws 5 minutes at, so
        # the jobs have hours to price.
        prom.wait_for('count_over_time(burnrate_gpu_allocation_share_ratio{cluster="us-2"}[1m]) > 5', timeout=60)
        yield prom.url


def llm_gpus(doc: dict) -> list[int]:
    return [job["gpus"] for job in doc["jobs"] if job["training_job"] == "llm"]


def test_each_cluster_is_reported_apart_and_never_summed(two_clusters):
    merged = analyze(two_clusters)
    assert merged.returncode == 2 and merged.stdout == ""
    (line,) = merged.stderr.splitlines()
    assert "the store holds 2 clusters by label 'cluster': 'eu-1', 'us-2'; choose one with --cluster NAME" in line

    one = analyze(two_clusters, "--cluster", "eu-1", "--format", "json")
    assert one.returncode == 0, one.stderr
    assert llm_gpus(json.loads(one.stdout)) == [2]

    each = analyze(two_clusters, "--cluster", "all", "--format", "json")
    assert each.returncode == 0, each.stderr
    reports = json.loads(each.stdout)["clusters"]
    assert sorted(reports) == ["eu-1", "us-2"]
    assert [llm_gpus(reports[c]) for c in ("eu-1", "us-2")] == [[2], [2]]

    table = analyze(two_clusters, "--cluster", "all")
    assert table.stdout.count("== cluster ") == 2 and "== cluster us-2 ==" in table.stdout

    rows = list(csv.DictReader(io.StringIO(analyze(two_clusters, "--cluster", "all", "--format", "csv").stdout)))
    jobs = [(r["cluster"], r["training_job"], r["gpus"]) for r in rows if r["record"] == "job" and r["training_job"] == "llm"]
    assert sorted(jobs) == [("eu-1", "llm", "2"), ("us-2", "llm", "2")]

    nowhere = analyze(two_clusters, "--cluster", "ap-3")
    assert nowhere.returncode == 2 and nowhere.stderr.strip() == (
        "burnrate analyze: error: no GPU series of cluster 'ap-3' (label 'cluster') in the window; "
        "the store holds 'eu-1', 'us-2'")


def test_the_dashboard_shows_each_cluster_apart(two_clusters, tmp_path):
    """The dashboard's own wiring (its CLI's choice of sources, the app, a page's callback):
    a cluster picker over a store of two, each cluster's page its own."""
    from burnrate.dashboard.app import cluster_sync, create_app
    from burnrate.analyzer.options import SourceOptions
    from burnrate.dashboard.cli import _prometheus
    from burnrate.dashboard.ui import range_search

    options = SourceOptions(prometheus=two_clusters)
    sources = _prometheus(options)
    assert sorted(sources) == ["eu-1", "us-2"]
    app = create_app(sources)
    from burnrate.dashboard.pages import jobs   # registered by create_app
    with app.server.test_request_context():
        for search, kept in (("?range=5m", "?range=5m"), ("?cluster=us-2&range=5m", "?cluster=us-2&range=5m")):
            page, _, _ = jobs.update(search, 1)      # the table, the progress line, the poll's state
            (table,) = [c for c in page if getattr(c, "id", None) == "jobs-table"]
            (llm,) = [r for r in table.data if r["job"].startswith("[llm]")]
            assert llm["gpus"] == 2 and llm["job"] == f"[llm](/job/ml/llm{kept})", search
        unknown = str(jobs.update("?cluster=ap-3", 1)[0])
        assert "No cluster 'ap-3' in this store (it holds eu-1, us-2)." in unknown
    assert range_search("?cluster=us-2&range=1h&kind=idle_gpu") == "?cluster=us-2&range=1h"
    # The picker writes the URL; the first cluster needs no parameter.
    assert cluster_sync("us-2", "?range=1h", "eu-1") == "?range=1h&cluster=us-2"
    assert cluster_sync("eu-1", "?range=1h&cluster=us-2", "eu-1") == "?range=1h"
    # Named, only that cluster's source.
    one = _prometheus(replace(options, cluster="us-2"))
    assert one.scope == {"cluster": "us-2"}
    # A real dashboard process over the two serves its page.
    with dashboard(tmp_path, None, "--prometheus", two_clusters):
        pass


def test_an_agents_cluster_label_is_on_every_series_and_must_not_clash():
    once = subprocess.run([PYTHON, "-m", "burnrate", "agent", "--backend", "simulated", "--gpus", "1", "--once",
                           "--telemetry-socket", "", "--cluster", "eu-1", "--cluster-label", "k8s_cluster"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert once.returncode == 0, once.stderr
    ours = [line for line in once.stdout.splitlines() if line and not line.startswith("#")
            and (line.startswith("DCGM_") or line.startswith("burnrate_"))]
    assert ours and all('k8s_cluster="eu-1"' in line for line in ours)
    clash = subprocess.run([PYTHON, "-m", "burnrate", "agent", "--backend", "simulated", "--once",
                            "--telemetry-socket", "", "--cluster", "eu-1", "--cluster-label", "UUID"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert clash.returncode == 2
    assert clash.stderr.strip() == ("burnrate agent: error: --cluster-label 'UUID' is a label the agent's series "
                                    "already carry; choose another")
