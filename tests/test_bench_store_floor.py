"""bench/store_floor.py: the store's per-job answer keyed as the analyzer's jobs, and how the two differ."""
import os
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import store_floor  # noqa: E402


def answer(*jobs):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"namespace": ns, "training_job": job}, "value": [1800000060.0, str(value)]}
        for ns, job, value in jobs]}}


def test_the_store_answer_is_keyed_as_the_analyzers_jobs_and_compared_job_by_job():
    store = store_floor.by_job(answer(("vision", "resnet-1", "96"), ("nlp", "bert-2", "12.5"), ("nlp", "gone", "1")))
    assert store == {"vision/resnet-1": 96.0, "nlp/bert-2": 12.5, "nlp/gone": 1.0}
    analyzer = {"vision/resnet-1": 95.75, "nlp/bert-2": 12.5, "nlp/new": 4.0}
    assert store_floor.difference(analyzer, store) == {
        "analyzer": 112.25, "store": 109.5, "largest_job": 0.25, "only_analyzer": 1, "only_store": 1}


def test_a_refused_query_is_one_line():
    with pytest.raises(SystemExit, match="the store refused the query: parse error"):
        store_floor.by_job({"status": "error", "error": "parse error"})


def test_the_queries_count_attributed_samples_over_the_window_at_the_sample_step():
    q = store_floor.queries(86520.0, 15.0)
    assert q["gpu_hours"] == ('sum by (namespace, training_job) (count_over_time('
                              'DCGM_FI_DEV_GPU_UTIL{training_job!=""}[86520s])) * 15 / 3600')
    assert '(DCGM_FI_DEV_GPU_UTIL{training_job!=""} <= 2)[86520s:15s]' in q["idle_gpu_hours"]


def test_the_benchmark_table_reads_the_ratio_of_a_side_by_side_cell():
    from bench import readme_table
    doc = ("## Store floor: `bench/fleet_mode.py`\n\n| run | analyzer s / store s = ratio |\n|---|---|\n"
           "| per-GPU | 49.0 / 0.35 = 141.9x |\n")
    section = readme_table.sections(doc)["Store floor"]
    assert readme_table.ratio("per-GPU", "analyzer s / store s = ratio")(section) == 141.9
