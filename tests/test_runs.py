"""One job name, several runs: each run costs on its own."""
import numpy as np
import pytest

from burnrate.analyzer.detectors.findings import iso
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.grid.holding import hold
from burnrate.analyzer.output.report import analyze, render_json
from test_detectors import N, STEP, T0, Fleet


def two_runs(gap_minutes: float) -> Fleet:
    """A 2-GPU job held for two hours whose trainer reports for 40 minutes, goes quiet
    for `gap_minutes`, then reports again until the end."""
    f = Fleet()
    f.node("node-a")
    quiet = int(gap_minutes * 60 / STEP)
    for r in range(2):
        f.gpu("node-a", r)
        f.alloc("node-a", r, f"sweep-{r}", "sweep")
        f.rank("sweep", r, "node-a", mask=np.arange(N) < 160)
        f.rank("sweep", r, "node-a", mask=np.arange(N) >= 160 + quiet)
    return f


def jobs(f: Fleet) -> dict:
    return {j.training_job: j for j in analyze(f.frames(), load_catalog(None)).jobs}


def test_a_trainer_that_comes_back_after_a_silence_is_a_new_run():
    found = jobs(two_runs(gap_minutes=20))
    second = T0 + (160 + 80) * STEP
    assert set(found) == {f"sweep@{iso(T0)}", f"sweep@{iso(second)}"}
    first_run, second_run = found[f"sweep@{iso(T0)}"], found[f"sweep@{iso(second)}"]
    # The GPUs held through the silence are the first run's: 2 GPUs x 60 min, then 2 x 60 min.
    assert first_run.gpu_hours == pytest.approx(2 * 240 * STEP / 3600)
    assert second_run.gpu_hours == pytest.approx(2 * (N - 240) * STEP / 3600)
    assert first_run.steps == pytest.approx(159 * 10) and second_run.steps > 0


def test_a_short_pause_is_the_same_run():
    assert set(jobs(two_runs(gap_minutes=2))) == {"sweep"}


def test_a_new_world_is_a_new_run():
    f = Fleet()
    f.node("node-a")
    for r in range(2):
        f.gpu("node-a", r)
        f.alloc("node-a", r, f"sweep-{r}", "sweep")
    later = np.arange(N) >= 160
    f.rank("sweep", 0, "node-a", mask=~later)
    f.rank("sweep", 1, "node-a", mask=~later)
    f.rank("sweep", 0, "node-a", mask=later)
    f.rows["rank"][-1]["world_size"] = 1.0          # the job came back on one rank
    assert set(jobs(f)) == {f"sweep@{iso(T0)}", f"sweep@{iso(T0 + 160 * STEP)}"}


def test_frames_handed_to_the_analysis_are_renamed_in_place_with_the_same_runs_and_costs():
    # Held as a source holds them: the analysis renames these very tables rather than copies.
    kept, handed = hold(two_runs(gap_minutes=20).frames()), hold(two_runs(gap_minutes=20).frames())
    catalog = load_catalog(None)
    expected, report = analyze(kept, catalog), analyze(handed, catalog, release_frames=True)
    assert render_json(report) == render_json(expected)
    second = T0 + (160 + 80) * STEP
    assert {j.training_job for j in report.jobs} == {f"sweep@{iso(T0)}", f"sweep@{iso(second)}"}
    for table in (handed.rank, handed.alloc):
        assert set(table["training_job"].astype(str)) == {f"sweep@{iso(T0)}", f"sweep@{iso(second)}"}
    assert not {"t", "steps", "mfu", "share", "held_s", "gpu_util"} & {*handed.rank, *handed.alloc, *handed.gpu}
    assert set(kept.rank["training_job"].astype(str)) == {"sweep"} and "t" in kept.rank.columns
