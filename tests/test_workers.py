"""The analysis's thread pools, used only where the tables pay for them: the report is the
same with threads and without."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from burnrate.analyzer.grid import workers
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze, render_json
from burnrate.analyzer.sources import RecordingSource
from burnrate.simulator.simulate import Spec, simulate

END = 1_800_000_000.0


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    simulate(str(root), Spec(seed=0, end=END))
    return RecordingSource(str(root)).frames()


def test_threads_only_for_large_tables(frames, monkeypatch):
    rows = len(frames.gpu) + len(frames.alloc) + len(frames.rank)
    monkeypatch.setattr(workers, "THREADED_ROWS", rows)
    assert isinstance(workers.pool(frames, 2), ThreadPoolExecutor)
    assert not isinstance(workers.pool(frames, 1), ThreadPoolExecutor)
    monkeypatch.setattr(workers, "THREADED_ROWS", rows + 1)
    assert not isinstance(workers.pool(frames, 2), ThreadPoolExecutor)


def test_the_report_is_the_same_with_threads_and_inline(frames, monkeypatch):
    reports = []
    for threshold in (0, 10**12):
        monkeypatch.setattr(workers, "THREADED_ROWS", threshold)
        reports.append(render_json(analyze(frames, load_catalog())))
    assert reports[0] == reports[1]
    # a report with something in it: findings of several kinds, and jobs priced
    document = json.loads(reports[0])
    assert len({f["kind"] for f in document["findings"]}) >= 4
    assert sum(j["cost_dollars"] or 0 for j in document["jobs"]) > 0


def test_an_inline_task_raises_where_its_result_is_taken(frames, monkeypatch):
    monkeypatch.setattr(workers, "THREADED_ROWS", 10**12)
    with workers.pool(frames, 4) as pool:
        answers = pool.map(lambda x: 6 // x, [3, 0])
        assert next(answers) == 2
        with pytest.raises(ZeroDivisionError):
            next(answers)
