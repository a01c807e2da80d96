"""Reports past the store's retention: a real Prometheus holding data from a known start
says where its data begins, and `--serve --keep-summaries` keeps each finished job's
summary once, across evaluations, restarts and a torn last line."""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.request

import pytest

from burnrate.analyzer import cli
from burnrate.analyzer.sources.summaries import append_summary, read_summaries
from burnrate.analyzer.sources.timeparse import format_time, parse_time
from burnrate.simulator.simulate import Spec, simulate
from test_analyze_cli import parse
from test_prometheus_source import backfill
from tests.conftest import free_port
from tests.processes import prometheus

pytestmark = pytest.mark.slow
STEP = 15.0


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """An hour of a small fleet ending two minutes ago, in a Prometheus keeping 15 days:
    its data begins at the fleet's first sample."""
    tmp = tmp_path_factory.mktemp("retention")
    spec = Spec(nodes=1, gpus_per_node=2, hours=1.0, step_s=STEP, seed=3, end=time.time() // STEP * STEP - 120)
    simulate(str(tmp / "rec"), spec)
    with prometheus(tmp, storage=backfill(tmp, str(tmp / "rec")),
                    extra_args=("--storage.tsdb.retention.time=15d",)) as prom:
        yield prom.url, spec.start_end()[0]


def begins_in(text: str, pattern: str) -> float:
    found = re.search(pattern + r" (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", text)
    assert found, text
    return parse_time(found.group(1))


def test_a_window_starting_before_the_data_says_where_it_begins(store, capsys):
    url, first = store
    args = parse("--prometheus", url, "--start", format_time(first - 3 * 3600), "--format", "json")
    assert cli.run(args) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    (note,) = [n for n in doc["notes"] if "store holds data" in n]
    assert abs(begins_in(note, "holds data from") - first) <= STEP
    assert "(retention 15d)" in note and "first 3 hours are not in it" in note and "docs/retention.md" in note
    assert f"burnrate analyze: {note}" in out.err
    assert doc["jobs"] and sum(j["gpu_hours"] for j in doc["jobs"]) > 1.9     # the data held is still reported


def test_a_window_within_the_data_has_no_such_note(store, capsys):
    url, first = store
    assert cli.run(parse("--prometheus", url, "--start", format_time(first + 600), "--format", "json")) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "store holds data" in n]


def test_one_command_reads_the_stores_range_of_its_window_once(store, monkeypatch, capsys):
    """The read and the retention check ask where the window's data lies: the store answers
    once (each answer reads every step of the window), and again once the answer is a minute old."""
    from burnrate.analyzer.sources import prometheus
    url, first = store
    read, real, clock = [], prometheus.PrometheusSource._data_range, [1000.0]
    monkeypatch.setattr(prometheus.PrometheusSource, "_data_range",
                        lambda self, window, *rest: read.append(window) or real(self, window, *rest))
    monkeypatch.setattr(prometheus.time, "monotonic", lambda: clock[0])
    assert cli.run(parse("--prometheus", url, "--start", format_time(first - 3 * 3600), "--format", "json")) == 0
    assert "store holds data" in capsys.readouterr().out and len(read) == len(set(read)) == 1
    source = prometheus.PrometheusSource(url, min_step_s=STEP)
    source.data_range(read[0]), source.data_range(read[0])
    clock[0] += prometheus.RANGE_KEPT_S
    source.data_range(read[0])
    assert read == [read[0]] * 3


def test_a_window_wholly_before_the_data_exits_3_naming_where_it_begins(store):
    url, first = store
    args = parse("--prometheus", url, "--start", format_time(first - 5 * 3600), "--end", format_time(first - 3 * 3600))
    with pytest.raises(cli.NothingFound) as nothing:
        cli.run(args)
    assert nothing.value.exit_code == 3
    assert abs(begins_in(str(nothing.value), "GPU data begins at") - first) <= STEP
    assert "(retention 15d; see docs/retention.md)" in str(nothing.value) and "\n" not in str(nothing.value)


@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    """An hour of a fleet, analysed over a window reaching an hour past its end: every job ended."""
    tmp = tmp_path_factory.mktemp("ended")
    spec = Spec(nodes=1, gpus_per_node=4, hours=1.0, step_s=STEP, seed=3, end=1795647600.0)
    simulate(str(tmp / "rec"), spec)
    start, end = spec.start_end()
    return str(tmp / "rec"), ("--start", format_time(start), "--end", format_time(end + 3600))


def serve_until(recording: str, window: tuple[str, ...], kept, evaluations: int = 3) -> None:
    """`--serve --keep-summaries kept` on a thread until /metrics has shown `evaluations`
    finished analyses, then stopped."""
    port = free_port()
    args = parse("--recording", recording, *window, "--serve", "--listen", f"127.0.0.1:{port}",
                 "--interval", "0.05", "--keep-summaries", str(kept))
    stop = threading.Event()
    worker = threading.Thread(target=cli.run, args=(args, stop), daemon=True)
    worker.start()
    finished: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while len(finished) < evaluations and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                body = ""
            finished |= set(re.findall(r"^burnrate_analyze_last_run_timestamp_seconds (\S+)$", body, re.M))
            time.sleep(0.02)
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive() and len(finished) >= evaluations


def test_serve_keeps_each_finished_jobs_summary_once(ended, tmp_path, capsys):
    recording, window = ended
    kept = tmp_path / "kept.jsonl"
    assert cli.run(parse("--recording", recording, *window, "--format", "json")) == 0
    report = json.loads(capsys.readouterr().out)
    serve_until(recording, window, kept)
    first = read_summaries(str(kept))
    by_job = {(s["namespace"], s["training_job"]): s for s in first.summaries}
    assert len(first.summaries) == len(by_job) == len(report["jobs"]) > 0 and first.torn == 0
    for job in report["jobs"]:
        summary = by_job[(job["namespace"], job["training_job"])]
        assert (summary["gpu_hours"], summary["cost_dollars"], summary["on_demand_cost_dollars"],
                summary["goodput"]) == (job["gpu_hours"], job["cost_dollars"], job["on_demand_cost_dollars"],
                                        job["goodput"])
        wasted = [f["wasted_dollars"] or 0 for f in report["findings"]
                  if (f["namespace"], f["training_job"]) == (job["namespace"], job["training_job"])]
        assert summary["wasted_dollars"] == pytest.approx(sum(wasted), abs=1e-3)
        assert parse_time(summary["end"]) <= parse_time(report["window"]["end"]) - 3600 + STEP

    serve_until(recording, window, kept)      # a restart reads back what is kept
    assert read_summaries(str(kept)).summaries == first.summaries


def test_a_torn_last_line_is_skipped_counted_and_written_past(ended, tmp_path, capsys):
    kept = tmp_path / "kept.jsonl"
    whole = {"namespace": "ml", "training_job": "a", "start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z",
             "gpu_hours": 8.0}
    append_summary(str(kept), whole)
    with open(kept, "a", encoding="utf-8") as fh:
        fh.write('{"namespace": "ml", "training_job": "b", "st')      # a crash mid-line
    torn = read_summaries(str(kept))
    assert (torn.summaries, torn.torn) == ([whole], 1)
    later = {**whole, "training_job": "c", "end": "2026-11-20T00:00:00Z"}
    append_summary(str(kept), later)
    assert read_summaries(str(kept)) == type(torn)([whole, later], 1)
    assert read_summaries(str(kept), parse_time("2026-11-10T00:00:00Z"), parse_time("2026-12-01T00:00:00Z")).summaries \
        == [later]

    recording, window = ended
    serve_until(recording, window, kept)
    assert f"{kept}: skipped 1 torn line(s)" in capsys.readouterr().err
    again = read_summaries(str(kept))
    assert again.torn == 1 and len(again.summaries) > 2


def test_keep_summaries_needs_serve(ended):
    recording, window = ended
    with pytest.raises(cli.UserError, match="--keep-summaries .* needs --serve"):
        cli.run(parse("--recording", recording, "--keep-summaries", "kept.jsonl"))
