"""An MFU no GPU can reach (above 100%, below 0, infinite) is not a figure: the report never
shows it, the job's MFU is from its valid samples or unknown, and a note says what was dropped."""
from __future__ import annotations

import numpy as np
import pytest

from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze, render_json, render_table
from test_detectors import Fleet


def job_reporting(*mfus: float) -> Fleet:
    f = Fleet()
    f.node("n", "p5.48xlarge", "on-demand", model="NVIDIA H100 80GB HBM3")
    for rank, mfu in enumerate(mfus):
        f.gpu("n", rank, model="NVIDIA H100 80GB HBM3")
        f.alloc("n", rank, f"job-{rank}", "job")
        f.rank("job", rank, "n", mfu=mfu)
    return f


@pytest.mark.parametrize("hostile", [2.01, -0.5, np.inf])
def test_an_impossible_mfu_is_dropped_and_the_rest_kept(hostile):
    report = analyze(job_reporting(hostile, 0.4).frames(), load_catalog(None))
    [job] = report.jobs
    assert job.mfu == pytest.approx(0.4)
    [note] = [n for n in report.notes if "MFU" in n]
    assert note.startswith(f"{job_reporting(0.4).n:,} MFU samples outside 0-100% dropped, of ml/job")


def test_a_job_with_only_impossible_mfu_shows_none_and_no_finding():
    report = analyze(job_reporting(2.01, 2.01).frames(), load_catalog(None))
    [job] = report.jobs
    assert job.mfu is None
    assert not [f for f in report.findings if f.kind == "low_mfu"]
    table = render_table(report)
    assert "201.0%" not in table and "MFU samples outside 0-100% dropped" in table
    assert '"mfu": null' in render_json(report)
