"""PrometheusSource against a real Prometheus: a simulated fleet back-filled with
promtool gives the same frames as the recording it came from; errors are one line."""
import contextlib
from dataclasses import replace
import http.server
import json
import math
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import msgspec
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from burnrate.exporter.recording import TABLES
from burnrate.analyzer.grid import resample
from burnrate.analyzer.grid.frames import RANK_LATEST, Window, frame_dtypes
from burnrate.analyzer.grid.views import RANK_KEY, Views
from burnrate.analyzer.sources.openmetrics import write_openmetrics
from burnrate.simulator.simulate import Spec, simulate
from burnrate.analyzer.sources import PrometheusError, PrometheusSource, RecordingSource
from burnrate.analyzer.sources import promhttp
from burnrate.analyzer.sources.promhttp import PrometheusHTTP
from burnrate.analyzer.sources import prometheus as prometheus_module
from burnrate.analyzer.sources import promtables
from burnrate.analyzer.sources.prometheus import _grouped, selector
from burnrate.analyzer.sources.promtables import Steps, _Points, consecutive, job_from_pod
from tests.conftest import free_port
from tests.processes import http_server, prometheus, promtool_backfill

pytestmark = pytest.mark.slow
STEP = 15.0


def backfill(tmp, recording: str, window: Window | None = None) -> str:
    om = tmp / "fleet.om"
    with open(om, "w", encoding="utf-8") as fh:
        write_openmetrics(recording, fh, window)
    data = tmp / "tsdb"
    promtool_backfill(om, data)
    return str(data)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A small simulated fleet ending two minutes ago, back-filled into a running Prometheus."""
    tmp = tmp_path_factory.mktemp("prom")
    end = time.time() // STEP * STEP - 120
    recording = str(tmp / "rec")
    simulate(recording, Spec(nodes=2, gpus_per_node=4, hours=1.0, step_s=STEP, seed=3, end=end))
    with prometheus(tmp, storage=backfill(tmp, recording)) as prom:
        yield prom.url, recording, Window(end - 3600 + STEP, end)


def canonical(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    labels = list(TABLES[table][0])
    out = frame.copy()
    for name in labels:
        out[name] = out[name].astype(str)
    return out.sort_values(["t", *labels], ignore_index=True)


def assert_same_tables(a, b, rtol: float = 1e-12) -> None:
    for table, (labels, columns) in TABLES.items():
        x, y = canonical(getattr(a, table), table), canonical(getattr(b, table), table)
        assert len(x) == len(y), table
        assert list(x.columns) == list(y.columns), table
        pd.testing.assert_frame_equal(x[["t", *labels]], y[["t", *labels]], obj=table)
        for column in x.columns.intersection(list(columns)):
            dtype = np.dtype(frame_dtypes(table, [column])[column])
            if table == "rank" and column in RANK_LATEST:
                dtype = pd.SparseDtype(dtype, np.nan)   # a value a series, on its last row
            assert x[column].dtype == y[column].dtype == dtype, (table, column)
            at = slice(None)
            if table == "rank" and column in RANK_LATEST:
                # Read at each series' last row only, where a store's frame alone holds it.
                at = x.groupby(list(labels), observed=True).tail(1).index
                assert y.groupby(list(labels), observed=True).tail(1).index.equals(at)
                # Every rank was heard; only a rank whose monitor closed was heard closing.
                assert column == "closed_time" or x.loc[at, column].notna().all(), \
                    f"{table}.{column} on the series' last rows"
            np.testing.assert_allclose(x.loc[at, column].to_numpy(np.float64), y.loc[at, column].to_numpy(np.float64),
                                       rtol=rtol, equal_nan=True, err_msg=f"{table}.{column}")


def test_backfilled_prometheus_gives_the_recordings_frames(fleet):
    url, recording, window = fleet
    from_prometheus = PrometheusSource(url).frames(window)
    from_recording = RecordingSource(recording).frames(window)
    assert from_prometheus.step_s == from_recording.step_s == STEP
    assert from_prometheus.missing == from_recording.missing == ()
    assert from_prometheus.simulated and from_recording.simulated
    assert len(from_recording.gpu) == 8 * 240 and from_recording.rank["loss"].isna().any()
    assert_same_tables(from_prometheus, from_recording)


def test_long_windows_come_in_chunks_with_the_same_result(fleet):
    url, recording, window = fleet
    chunked = PrometheusSource(url, chunk_points=7).frames(window)
    assert_same_tables(chunked, RecordingSource(recording).frames(window))


def test_when_each_rank_was_last_heard_is_asked_once_a_read_not_a_step(fleet, monkeypatch):
    """The ledger reads each rank's last-report time at its last sample only: the store is asked
    for each series' last value over the window, one point a series, however many chunks the
    other columns come in; the frame holds it on each series' last row, as the recording does."""
    url, recording, window = fleet
    asked = []
    query_range = PrometheusSource.query_range

    def recorded(self, promql, start, end, step, tally=None):
        asked.append((promql, start, end))
        return query_range(self, promql, start, end, step, tally)

    monkeypatch.setattr(PrometheusSource, "query_range", recorded)
    frames = PrometheusSource(url, chunk_points=7).frames(window)
    heard = [(q, a, b) for q, a, b in asked if "burnrate_train_last_report_timestamp_seconds" in q]
    last = window.end // STEP * STEP
    assert heard == [(f"last_over_time(burnrate_train_last_report_timestamp_seconds{{}}[{int((last - window.start) + STEP) * 1000 - 1}ms])",
                      last, last)], heard
    assert sum("burnrate_train_steps_total" in q for q, _, _ in asked) > 10     # the others, in chunks
    rank = frames.rank.sort_values("t", kind="stable")
    lasts = rank.groupby(list(RANK_KEY), observed=True).tail(1).index
    assert rank.loc[lasts, "last_report_time"].notna().all() and rank.drop(lasts)["last_report_time"].isna().all()
    assert_same_tables(frames, RecordingSource(recording).frames(window))


def test_a_long_window_is_reduced_alike_from_both_sources(fleet, monkeypatch):
    """Past MAX_POINTS steps a window is read at a coarser step: Prometheus reduces
    each step with the queries' *_over_time functions, the recording the same way."""
    url, recording, window = fleet
    monkeypatch.setattr(resample, "MAX_POINTS", 40)
    from_prometheus = PrometheusSource(url).frames(window)
    from_recording = RecordingSource(recording).frames(window)
    assert from_prometheus.step_s == from_recording.step_s == 90.0
    assert set(from_recording.gpu["t"] % 90.0) == {0.0} and len(from_recording.gpu) == 8 * 40
    # Averages of float32 gauges may differ in the last bit between the two sums.
    assert_same_tables(from_prometheus, from_recording, rtol=1e-6)


def test_only_the_columns_asked_for_are_fetched(fleet):
    url, recording, window = fleet
    wanted = {"gpu": ("gpu_util", "up"), "rank": ("steps",), "node": ()}
    for source in (PrometheusSource(url), RecordingSource(recording)):
        frames = source.frames(window, wanted)
        assert list(frames.gpu.columns[:3]) == ["t", "up", "gpu_util"]   # in the recording's order
        assert "power_w" not in frames.gpu.columns and "loss" not in frames.rank.columns
        assert list(frames.rank.columns[:2]) == ["t", "steps"] and len(frames.rank) > 0
        assert len(frames.node) > 0 and frames.alloc.empty and frames.pod_cpu.empty and frames.xid.empty
    assert_same_tables(PrometheusSource(url).frames(window, wanted), RecordingSource(recording).frames(window, wanted))


def test_a_coarser_step_keeps_counters_exact(fleet):
    url, recording, window = fleet
    source = PrometheusSource(url, min_step_s=60.0)
    frames = source.frames(window)
    assert frames.step_s == 60.0 and set(frames.gpu["t"] % 60.0) == {0.0}
    rec = RecordingSource(recording).frames(window).rank
    # Each step carries the series' last sample within it: the counter as it stood then.
    merged = pd.merge_asof(canonical(frames.rank, "rank"), canonical(rec, "rank"), on="t",
                           by=list(TABLES["rank"][0]), direction="backward")
    assert len(merged) == len(frames.rank) > 0
    np.testing.assert_array_equal(merged["steps_x"], merged["steps_y"])


def test_a_window_opening_mid_run_reads_its_first_increase_as_a_longer_window_does(fleet):
    """A counter's increase at a window's first point is read from the counts before it, as a
    store's increase over the step before a point is: the same as a longer window's increase
    at that time, from either source and at a coarser step; without them it would be unknown."""
    url, recording, window = fleet
    later = Window(window.start + 900 + 0.4, window.end)
    for source in (PrometheusSource(url), RecordingSource(recording), PrometheusSource(url, min_step_s=60.0)):
        frames = source.frames(later)
        whole, part = Views(source.frames(window)), Views(frames)
        assert part.step == whole.step
        first = frames.rank["t"].min()       # the window's first point or sample, in either's bins
        begin, col = (int(np.floor((first - v.start) / v.step + 0.5)) for v in (part, whole))
        assert begin <= 1 and part.rank.present[:, begin].all() and not part.rank.present[:, :begin].any()
        keys = [tuple(k) for k in whole.rank.keys[list(RANK_KEY)].to_numpy()]
        rows = [keys.index(tuple(k)) for k in part.rank.keys[list(RANK_KEY)].to_numpy()]
        assert len(rows) == 5     # the ranks stepping then
        for counter in ("steps", "step_s", "data_wait_s", "compute_s"):
            first = part.rank.values[counter][:, begin]
            assert (first > 0).all(), counter
            np.testing.assert_allclose(first, whole.rank.values[counter][rows, col], rtol=1e-6, err_msg=counter)
        unknown = Views(replace(source.frames(later), rank_before=None)).rank.values["steps"][:, begin]
        assert np.isnan(unknown).all()


def test_label_values_cannot_change_the_query(fleet):
    url, _, window = fleet
    evil = 'x"} or vector(1) #'
    assert selector("burnrate_train_loss", training_job=evil) == \
        'burnrate_train_loss{training_job="x\\"} or vector(1) #"}'
    frames = PrometheusSource(url, matchers={"training_job": evil}).frames(window)
    assert frames.rank.empty and frames.alloc.empty


def test_matchers_restrict_every_query(fleet):
    url, recording, window = fleet
    job = str(RecordingSource(recording).frames(window).rank["training_job"].iloc[0])
    frames = PrometheusSource(url, matchers={"training_job": job}).frames(window)
    assert set(frames.rank["training_job"].astype(str)) == {job}
    assert set(frames.alloc["training_job"].astype(str)) == {job}


def test_without_targets_the_finest_step_is_15s(fleet):
    """A back-filled Prometheus scrapes nothing: no hint, the default step."""
    url, _, _ = fleet
    assert PrometheusSource(url, min_step_s=None).min_step_s == 15.0


def test_an_empty_window_gives_empty_frames(fleet):
    url, _, _ = fleet
    long_ago = Window(1_000_000_000.0, 1_000_003_600.0)
    frames = PrometheusSource(url).frames(long_ago)
    assert all(getattr(frames, t).empty for t in TABLES) and frames.missing == ()
    assert list(frames.gpu.columns) == ["t", *TABLES["gpu"][1], *TABLES["gpu"][0], "held_s"]


def test_a_store_without_roll_ups_is_read_per_gpu_and_the_report_says_why(fleet):
    url, recording, window = fleet

    def analyzed(*flags: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--prometheus", url, *flags,
                               "--start", repr(window.start), "--end", repr(window.end), "--format", "json"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    unasked, per_gpu = analyzed(), analyzed("--per-gpu")
    assert unasked["notes"][0] == ("read every GPU's series: the store holds no burnrate roll-ups "
                                   "(cluster_hostname:burnrate_gpus_reporting:count) in the window; where its ruler "
                                   "keeps them (docs/fleet-mode.md) they are read instead")
    assert per_gpu["notes"][0] == "read every GPU's series, as --per-gpu asks"
    assert unasked["notes"][1:] == per_gpu["notes"][1:]
    assert unasked["jobs"] and unasked["jobs"] == per_gpu["jobs"] and unasked["findings"] == per_gpu["findings"]
    assert {j["cost_basis"] for j in unasked["jobs"]} == {"per-GPU series"}
    # a recording is read as it always was, and says nothing of roll-ups
    proc = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--recording", recording, "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and not any(n.startswith("read ") for n in json.loads(proc.stdout)["notes"])


def dcgm_only_store(tmp_path, now: float) -> str:
    """A TSDB holding only dcgm-exporter's utilization of two GPUs over 20 steps up to `now`."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for k in range(20):
        t = now - (19 - k) * STEP
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",Hostname="n1",modelName="NVIDIA H100",'
                     f'namespace="ml",pod="llm-worker-3",container="pytorch",instance="n1:9400",job="dcgm"}} 97 {t}')
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-b",Hostname="n1",modelName="NVIDIA H100",'
                     f'instance="n1:9400",job="dcgm"}} 0 {t}')
    (tmp_path / "dcgm.om").write_text("\n".join(lines) + "\n# EOF\n")
    data = tmp_path / "tsdb"
    promtool_backfill(tmp_path / "dcgm.om", data)
    return str(data)


def test_dcgm_exporter_only_cluster(tmp_path):
    """Only DCGM_* series: allocation from their pod labels, the job from the pod's name."""
    now = time.time() // STEP * STEP - 60
    with prometheus(tmp_path, storage=dcgm_only_store(tmp_path, now)) as prom:
        frames = PrometheusSource(prom.url).frames(Window(now - 19 * STEP, now))
    assert len(frames.gpu) == 40 and frames.gpu["up"].isna().all()
    assert set(frames.alloc["training_job"].astype(str)) == {"llm"} and len(frames.alloc) == 20
    assert (frames.alloc["share"] == 1.0).all() and frames.rank.empty
    assert "training telemetry" in frames.missing and "node pricing labels" in frames.missing
    assert "instance" not in frames.gpu.columns


def test_a_holders_exported_labels_win_and_one_gpu_under_both_layouts_is_one_series():
    """Where honor_labels is off the holder arrives as exported_*; a GPU scraped both ways (two
    jobs of one exporter) is one series, its larger value at each point and NaN only alone;
    labels the query does not tell series apart by (the scrape's instance) are dropped."""
    gpu = {"UUID": "GPU-1", "Hostname": "n1", "instance": "10.0.0.1:9400"}
    honored = {"metric": {**gpu, "namespace": "ml", "pod": "p-0", "container": "c"},
               "values": np.array([[15.0, 1.0], [30.0, np.nan], [45.0, 5.0]])}
    moved = {"metric": {**gpu, "namespace": "gpu-operator", "pod": "dcgm-x", "container": "exporter",
                        "exported_namespace": "ml", "exported_pod": "p-0", "exported_container": "c"},
             "values": np.array([[15.0, 3.0], [30.0, 2.0], [60.0, np.nan]])}
    free = {"metric": {"UUID": "GPU-2", "Hostname": "n1", "namespace": "gpu-operator", "pod": "dcgm-x",
                       "exported_namespace": "", "container": "exporter"},
            "values": np.array([[15.0, 0.0]])}
    labels = ("UUID", "Hostname", "namespace", "pod", "container", "exported_namespace", "exported_pod",
              "exported_container")
    (one, other) = _grouped([honored, moved, free], labels)
    assert one["metric"] == {"UUID": "GPU-1", "Hostname": "n1", "namespace": "ml", "pod": "p-0", "container": "c"}
    np.testing.assert_array_equal(one["values"], [[15.0, 3.0], [30.0, 2.0], [45.0, 5.0], [60.0, np.nan]])
    assert other["metric"] == {"UUID": "GPU-2", "Hostname": "n1", "namespace": "gpu-operator", "pod": "dcgm-x",
                               "container": "exporter"}


def test_job_from_pod():
    assert job_from_pod("llm-7b-worker-12") == "llm-7b"
    assert job_from_pod("llm-7b-master-0") == "llm-7b"
    assert job_from_pod("notebook-0") == "notebook-0"


@pytest.fixture(params=["kept connection", "urllib"])
def transport(request, monkeypatch):
    """Each way an exchange can go: a thread's kept connection, or urllib's, which a URL
    the environment proxies takes (forced here: no proxy runs in the tests)."""
    if request.param == "urllib":
        monkeypatch.setattr(PrometheusHTTP, "_kept_exchange", PrometheusHTTP._urllib_exchange)


@pytest.mark.usefixtures("transport")
def test_unreachable_prometheus_is_one_line():
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(PrometheusError, match="cannot reach Prometheus at http://127.0.0.1") as err:
        source.frames(Window(time.time() - 60, time.time()))
    assert "\n" not in str(err.value)


class _Answer(http.server.BaseHTTPRequestHandler):
    status, body, delay = 200, b"", 0.0

    def do_POST(self):  # noqa: N802 - http.server's naming
        # Read the query first, as a server does: closing on an unread request resets the
        # connection under an answer the client is still reading.
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(self.delay)
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def answering(status: int, body: bytes, delay: float = 0.0):
    with http_server(type("Handler", (_Answer,), {"status": status, "body": body, "delay": delay})) as url:
        yield url


@pytest.mark.parametrize("status, body, message", [
    (400, b'{"status":"error","errorType":"bad_data","error":"parse error at char 5"}',
     "answered HTTP 400: bad_data: parse error at char 5"),
    (503, b"Service Unavailable\n", "answered HTTP 503: Service Unavailable"),
    (200, b"<html>proxy login</html>", "not JSON"),
    (200, b'{"status":"error","errorType":"execution","error":"query timed out"}', "execution: query timed out"),
    (200, b"[" * 100_000 + b"]" * 100_000, "not JSON"),        # past the decoder's nesting: RecursionError
    (200, b'{"status":"success"}', "success without data: not a Prometheus API"),
    (200, b'{"status":"success","data":{"resultType":"vector","result":[]}}', "answered a vector, not a matrix"),
    (200, b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"x"]]}]}}',
     "answered a matrix that is not Prometheus's"),
    # As many numbers as pairs would hold, in other shapes: the flat reading must not take them.
    (200, b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1],[2,"3","4"]]}]}}',
     "answered a matrix that is not Prometheus's"),
    (200, b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"2",3,"4"]]}]}}',
     "answered a matrix that is not Prometheus's"),
    (200, b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[[1,"2"]]]}]}}',
     "answered a matrix that is not Prometheus's"),
])
@pytest.mark.usefixtures("transport")
def test_prometheus_errors_are_one_line(status, body, message):
    with answering(status, body) as url:
        with pytest.raises(PrometheusError, match=message) as err:
            PrometheusSource(url).frames(Window(time.time() - 60, time.time()))
    assert "\n" not in str(err.value)


@pytest.mark.usefixtures("transport")
def test_a_slow_prometheus_times_out():
    with answering(200, b"{}", delay=3.0) as url:
        with pytest.raises(PrometheusError, match="did not answer within 0.5 s"):
            PrometheusSource(url, timeout_s=0.5, workers=1).frames(Window(time.time() - 60, time.time()))


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Answers as a hostile or broken server would; `seen` keeps every request's headers."""
    mode, target, seen = "", "", []

    def do_POST(self):  # noqa: N802 - http.server's naming
        type(self).seen.append(dict(self.headers))
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "redirect":
            self.send_response(302)
            self.send_header("Location", self.target + self.path)
            self.end_headers()
        elif self.mode == "drip":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.3)
        elif self.mode == "drip headers":
            # A status line, then a header a byte a second: each read gets a byte in time.
            with contextlib.suppress(OSError):     # until the client gives up
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX")
                for _ in range(60):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.3)
        elif self.mode == "not http":
            self.wfile.write(b"\x1b[2J garbage\r\n\r\n")
        elif self.mode == "flood":
            self.send_response(200)
            self.end_headers()          # no length: the answer ends when the connection does
            self.wfile.write(b'{"status":"success","data":{"result":"' + b"x" * (2 << 20) + b'"}}')

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def hostile(mode: str, target: str = ""):
    handler = type("Handler", (_Hostile,), {"mode": mode, "target": target, "seen": []})
    with http_server(handler) as url:
        yield url, handler


@pytest.mark.usefixtures("transport")
def test_credentials_never_follow_a_redirect():
    """A redirect to another port was followed 17 times with the bearer token, then gave an
    empty report. Now nothing is sent on, and the user is told the URL to give."""
    with hostile("") as (elsewhere, other), hostile("redirect", elsewhere) as (url, first):
        with pytest.raises(PrometheusError, match=f"redirected \\(HTTP 302\\) to {elsewhere}/api/v1/"):
            PrometheusSource(url, bearer_token="s3cret", workers=1).frames(Window(time.time() - 60, time.time()))
    assert first.seen and all(h["Authorization"] == "Bearer s3cret" for h in first.seen)
    assert other.seen == []


@pytest.mark.usefixtures("transport")
def test_a_dripping_answer_meets_the_deadline():
    """One byte every 0.3 s never trips a per-read timeout; the deadline is for the answer."""
    with hostile("drip") as (url, _):
        with pytest.raises(PrometheusError, match="did not answer within 1 s"):
            PrometheusSource(url, timeout_s=1.0, workers=1).frames(Window(time.time() - 60, time.time()))


@pytest.mark.usefixtures("transport")
def test_headers_that_drip_meet_the_deadline():
    """Headers sent a byte every 0.3 s held `analyze --timeout 4` for minutes: the deadline
    is on the wall clock, for the status line and headers as for the body."""
    with hostile("drip headers") as (url, _):
        began = time.monotonic()
        with pytest.raises(PrometheusError, match=f"Prometheus at {url} did not answer within 1 s"):
            PrometheusHTTP(url, {}, timeout_s=1.0).data("/api/v1/query", {"query": "up"})
        assert time.monotonic() - began < 5


@pytest.mark.usefixtures("transport")
def test_a_short_deadline_behind_a_long_one_still_cuts():
    """Every exchange's deadline is kept by one watchdog, earliest first: a 1 s exchange begun
    while a 3 s one waits is cut at its own second, and the other at its third."""
    with hostile("drip") as (slow, _), hostile("drip headers") as (dripping, _):
        cut = []
        long = PrometheusHTTP(slow, {}, timeout_s=3.0)
        waiting = threading.Thread(target=lambda: cut.append(pytest.raises(PrometheusError, long.data,
                                                                           "/api/v1/query", {"query": "up"})))
        began = time.monotonic()
        waiting.start()
        time.sleep(0.3)
        with pytest.raises(PrometheusError, match="did not answer within 1 s"):
            PrometheusHTTP(dripping, {}, timeout_s=1.0).data("/api/v1/query", {"query": "up"})
        assert time.monotonic() - began < 2.5 and waiting.is_alive()
        waiting.join(10)
        assert not waiting.is_alive() and "did not answer within 3 s" in str(cut[0].value)


@pytest.mark.usefixtures("transport")
def test_exchanges_start_no_thread_each(monkeypatch):
    """A timer thread per exchange waited for the GIL while the read's other threads decoded
    answers (msgspec holds it through an answer): hundreds of milliseconds an exchange. The
    deadlines of any number of exchanges share one thread."""
    started = []
    start = threading.Thread.start

    def counted(thread):
        if sys._getframe(1).f_globals["__name__"] == promhttp.__name__:
            started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    with answering(200, body) as url:
        http_ = PrometheusHTTP(url, {}, timeout_s=5.0)
        for _ in range(20):
            assert http_.data("/api/v1/query", {"query": "up"}) == {"resultType": "vector", "result": []}
    assert started in ([], ["prometheus-deadlines"])


@pytest.mark.usefixtures("transport")
def test_an_answer_that_is_not_http_is_one_line():
    with hostile("not http") as (url, _):
        with pytest.raises(PrometheusError, match="answered something that is not HTTP") as err:
            PrometheusHTTP(url, {}, timeout_s=5.0).data("/api/v1/query", {"query": "up"})
    assert "\n" not in str(err.value)


@pytest.mark.usefixtures("transport")
def test_an_answer_over_the_limit_is_refused_as_it_streams():
    with hostile("flood") as (url, _):
        with pytest.raises(PrometheusError, match="answered more than 1 MiB"):
            PrometheusHTTP(url, {}, timeout_s=10.0, max_bytes=1 << 20).data("/api/v1/query", {"query": "up"})


class _Keeping(http.server.BaseHTTPRequestHandler):
    """An HTTP/1.1 server that keeps connections open, and records each request's client
    port; in `drop` mode it closes each connection after answering without saying so, as a
    server that times out idle connections does."""
    protocol_version = "HTTP/1.1"
    drop, ports = False, []

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).ports.append(self.client_address[1])
        body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.drop

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("drop", [False, True])
def test_a_thread_keeps_its_connection_and_opens_another_when_the_server_dropped_it(drop):
    handler = type("Handler", (_Keeping,), {"drop": drop, "ports": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = PrometheusHTTP(f"http://127.0.0.1:{server.server_address[1]}", {}, timeout_s=10.0)
        for _ in range(5):
            time.sleep(0.05)    # the dropping server has closed its end by the next request
            assert client.data("/api/v1/query", {"query": "up"}) == {"resultType": "vector", "result": []}
    finally:
        server.shutdown()
        server.server_close()
    assert len(handler.ports) == 5
    assert len(set(handler.ports)) == (5 if drop else 1)


def test_a_url_the_proxy_settings_send_through_a_proxy_takes_urllibs_way(monkeypatch):
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert not PrometheusHTTP("http://prometheus.example:9090", {}, 1.0)._direct
    monkeypatch.setenv("no_proxy", "prometheus.example")
    assert PrometheusHTTP("http://prometheus.example:9090", {}, 1.0)._direct


def test_range_answers_are_read_as_python_reads_their_json(fleet):
    """Values read as one flat list of numbers equal Python's reading of the same answer, the
    strings Prometheus writes for infinities and NaN included (the flat reading refuses them:
    such a series is read pair by pair)."""
    url, _, window = fleet
    source = PrometheusSource(url)
    for promql in ("DCGM_FI_DEV_GPU_UTIL", "vector(1) / 0", "vector(-1) / 0", "vector(0) / 0"):
        got = source.query_range(promql, window.start, window.end, STEP)
        query = urllib.parse.urlencode({"query": promql, "start": window.start, "end": window.end, "step": STEP})
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{query}", timeout=30) as resp:
            want = json.load(resp)["data"]["result"]
        assert want and [s["metric"] for s in got] == [s["metric"] for s in want], promql
        for ours, theirs in zip(got, want):
            np.testing.assert_array_equal(ours["values"], np.array([[t, float(v)] for t, v in theirs["values"]]))


_NUMBERS = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=False, allow_infinity=False))
# What a pair's place may hold: numbers bare and quoted (JSON's spellings: 1e-07, 1.5e+20), the
# strings Prometheus writes for NaN and the infinities, text, and nested lists.
_ITEMS = st.one_of(_NUMBERS, _NUMBERS.map(lambda x: json.dumps(x)), st.sampled_from(["NaN", "+Inf", "-Inf", "Inf"]),
                   st.text("0123456789.,e+-[]x", max_size=6), st.lists(_NUMBERS, max_size=2))
_PAIRS_LIKE = st.lists(st.one_of(st.tuples(_NUMBERS, _NUMBERS.map(lambda x: json.dumps(x))).map(list),
                                 st.lists(_ITEMS, max_size=3)), max_size=6)


@settings(max_examples=400, deadline=None)
@given(_PAIRS_LIKE)
def test_the_quick_reading_of_a_series_is_the_pair_by_pair_reading(values):
    """The values of a range answer's series, read the quick way (its numbers as one flat
    list where it has the shape of pairs), are exactly those read pair by pair, each checked;
    where that reading refuses them, so does the quick one."""
    raw = json.dumps(values, separators=(",", ":")).encode()
    try:
        want = np.array(promhttp._PAIRS.decode(raw.replace(b'"+Inf"', b'"Inf"')), np.float64).reshape(-1, 2)
    except (msgspec.ValidationError, msgspec.DecodeError):
        with pytest.raises((msgspec.ValidationError, msgspec.DecodeError)):
            promhttp._points(raw)
        return
    np.testing.assert_array_equal(promhttp._points(raw), want)


def test_real_prometheus_rejecting_a_query_is_one_line(fleet):
    url, _, window = fleet
    with pytest.raises(PrometheusError, match="HTTP 400: bad_data") as err:
        PrometheusSource(url).query_range("sum(", window.start, window.end, STEP)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("interval", [30.0, 60.0])
def test_prometheus_and_the_recording_cost_the_same_at_slower_scrapes(tmp_path, interval):
    """A fleet sampled every 30 or 60 s, read from its recording (at its own interval)
    and from Prometheus (at the default 15 s step, filled by holding): the same
    GPU-hours and dollars per job, and the same accounting."""
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze
    end = time.time() // interval * interval - 600
    recording = str(tmp_path / "rec")
    simulate(recording, Spec(nodes=2, gpus_per_node=4, hours=3.0, step_s=interval, seed=4, end=end))
    window = Window(end - 3 * 3600 + interval, end)
    with prometheus(tmp_path, storage=backfill(tmp_path, recording, window)) as prom:
        from_prometheus = PrometheusSource(prom.url).frames(window)
    from_recording = RecordingSource(recording).frames(window)
    assert from_prometheus.step_s == 15.0 and from_recording.step_s == interval
    a, b = (analyze(f, load_catalog(None)) for f in (from_prometheus, from_recording))
    assert a.accounting.observed_gpu_hours == pytest.approx(b.accounting.observed_gpu_hours, rel=1e-6)
    assert a.accounting.allocated_gpu_hours == pytest.approx(b.accounting.allocated_gpu_hours, rel=1e-6)
    # Every GPU seen for the whole window, its last sample holding its interval.
    assert a.accounting.observed_gpu_hours == pytest.approx(8 * 3.0, rel=1e-6)
    jobs = {(j.namespace, j.training_job): j for j in b.jobs}
    assert {(j.namespace, j.training_job) for j in a.jobs} == set(jobs)
    for job in a.jobs:
        mine = jobs[(job.namespace, job.training_job)]
        assert job.gpu_hours == pytest.approx(mine.gpu_hours, rel=1e-6)
        assert job.cost_dollars == pytest.approx(mine.cost_dollars, rel=1e-6)


def test_where_the_data_begins_and_ends_is_found_by_buckets_as_step_by_step(fleet, monkeypatch):
    """data_range asks buckets of steps first and then step by step only in the two buckets
    where the data begins and ends: the same first and last points as asking every step, for
    windows that begin and end before, inside and after the data, and asking for under half
    the points of a window long enough for buckets."""
    url, _, window = fleet
    source = PrometheusSource(url)
    asked = []
    query_range = source.query_range
    monkeypatch.setattr(source, "query_range", lambda q, a, b, step, *rest: asked.append((b - a) / step + 1)
                        or query_range(q, a, b, step, *rest))
    step = 15.0
    for before, after in [(-900, 900), (0, 0), (600, -600), (-7200, 3600), (1234, -15), (-45, -2000), (3000, -30)]:
        first = math.ceil((window.start + before) / step) * step
        last = math.floor((window.end + after) / step) * step
        asked.clear()
        by_buckets = source._present_edges(first, last, step)
        points = sum(asked)
        assert by_buckets == source._present_times(first, last, step), (before, after)
        assert by_buckets, (before, after)
        steps = (last - first) / step + 1
        assert points <= (0.5 * steps if steps >= 4 * prometheus_module.EDGE_BUCKETS else steps), (before, after)
    # Outside the data: nothing found, either way.
    assert source._present_edges(window.end + 3600, window.end + 7200, step) == ()
    assert source._present_edges(window.start - 7200, window.start - 3600, step) == ()


@pytest.mark.parametrize("dense", [True, False])
def test_a_tables_rows_are_its_points_by_time_then_series_the_last_point_winning(dense, monkeypatch):
    """Assembly lays the points out on a (series × times) grid where they fill enough of it and
    sorts them where they do not: either way each row is a (time, series) that some column has a
    point at, in that order; a later point at the same place wins, points outside the window
    are left out, and the pod labels of a row are those of its point. Series of consecutive
    steps (a store's usual answer, kept as Steps and put on the grid as a whole) are mixed with
    gappy ones and with a malformed one that repeats a time."""
    monkeypatch.setattr(promtables, "DENSE_CELLS", 2**40 if dense else -2**40)
    made = []
    monkeypatch.setattr(promtables, "_Layout",
                        lambda *a, _made=promtables._Layout: made.append(_made(*a)) or made[-1])
    rng = np.random.default_rng(0)
    step, start, n_times = 15.0, 1_000.0, 40
    points = _Points(("UUID",), start, step)
    expected: dict[str, dict[tuple[int, str], float]] = {"a": {}, "b": {}}
    pods: dict[tuple[int, str], str] = {}
    answer = []
    for n in range(60):
        uuid, column = f"GPU-{rng.integers(0, 7)}", ("a", "b")[n % 2]
        if n % 3 == 0:
            index = np.sort(rng.choice(np.arange(-5, n_times + 5), rng.integers(0, 12), replace=False))
        elif n % 3 == 1:
            index = np.arange(first := rng.integers(-8, n_times + 2), first + rng.integers(0, 15))
        else:       # a time twice: as many points as the steps they span, yet not one per step
            first = rng.integers(0, n_times - 6)
            index = np.array([first, first + 1, first + 1, first + 3])
        values = rng.normal(size=len(index))
        answer.append((column, uuid, f"pod-{n}", np.column_stack([start + index * step, values])))
        for i, v in zip(index, values):
            if 0 <= i < n_times:
                expected[column][(int(i), uuid)] = v
                if column == "a":
                    pods[(int(i), uuid)] = f"pod-{n}"
    # As the reader keeps an answer's series: consecutive steps as Steps, the rest as (time, value) pairs.
    kept = consecutive([pairs for *_, pairs in answer], step)
    for n, ((column, uuid, pod, pairs), points_kept) in enumerate(zip(answer, kept)):
        assert isinstance(points_kept, Steps) == (n % 3 == 1 and len(pairs) > 0 or n % 3 == 0 and len(pairs) > 0
                                                  and np.ptp(pairs[:, 0]) == (len(pairs) - 1) * step), n
        points.add(column, {"metric": {"UUID": uuid, "pod": pod}, "values": points_kept}, ("pod",) if column == "a" else ())
    # A latest column (RANK_LATEST): a value or two per series, as reads of parts of a window
    # give; the latest in time goes on the series' last row and makes none (GPU-7 has no row).
    heard: dict[str, tuple[float, float]] = {}
    for uuid in [f"GPU-{g}" for g in range(8) for _ in range(rng.integers(1, 3))]:
        at, value = start + rng.integers(0, n_times) * step, rng.normal()
        kept_c = Steps(at, np.array([value])) if rng.integers(0, 2) else np.array([[at - step, 0.0], [at, value]])
        points.add("c", {"metric": {"UUID": uuid}, "values": kept_c})
        if uuid not in heard or at >= heard[uuid][0]:
            heard[uuid] = (at, value)
    frame = points.frame({"a": "<f8", "c": "<f8", "b": "<f4"}, n_times, ("pod",), latest=("c",))
    assert [layout.dense for layout in made] == [dense]
    rows = sorted(set(expected["a"]) | set(expected["b"]), key=lambda r: (r[0], points.keys[(r[1],)]))
    assert list(zip(((frame["t"] - start) / step).astype(int), frame["UUID"].astype(str))) == rows
    for column, dtype in (("a", np.float64), ("b", np.float32)):
        want = np.array([expected[column].get(row, np.nan) for row in rows], dtype)
        np.testing.assert_array_equal(frame[column].to_numpy(), want)
    last_rows = {uuid: n for n, (_, uuid) in enumerate(rows)}
    want = np.full(len(rows), np.nan)
    for uuid, n in last_rows.items():
        want[n] = heard[uuid][1]
    np.testing.assert_array_equal(frame["c"].to_numpy(), want)
    assert list(frame["pod"].astype(str)) == [pods.get(row, "") for row in rows]


def test_on_a_terminal_what_the_analysis_says_starts_on_a_line_of_its_own(tmp_path):
    """Stdout and stderr on one terminal (a pty), as a user runs it: the progress bar is wiped
    before the report, so its notes (here the missing agent's signals) never share its line."""
    import os
    import pty
    import select

    now = time.time() // STEP * STEP - 60
    with prometheus(tmp_path, storage=dcgm_only_store(tmp_path, now)) as prom:
        terminal, end = pty.openpty()
        with subprocess.Popen([sys.executable, "-m", "burnrate", "analyze", "--prometheus", prom.url,
                               "--since", "10m"], stdin=end, stdout=end, stderr=end) as proc:
            os.close(end)
            seen = b""
            while select.select([terminal], [], [], 60)[0]:
                try:
                    chunk = os.read(terminal, 65536)
                except OSError:       # the other end closed
                    break
                if not chunk:
                    break
                seen += chunk
            assert proc.wait(30) == 0
        os.close(terminal)
    text = seen.decode()
    assert "reading metrics [" in text               # the bar was drawn
    shown = [line.rsplit("\r", 1)[-1] for line in text.split("\r\n")]   # what each terminal line shows
    assert not any("reading metrics" in line for line in shown), shown
    assert any(line.startswith("missing signals: training telemetry") for line in shown), shown
