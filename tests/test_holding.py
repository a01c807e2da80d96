"""Each sample stands for its own interval: GPU-time is the same at any scrape
interval and for any window that holds the same samples."""
import numpy as np
import pandas as pd
import pytest

from burnrate.exporter.recording import TABLES
from burnrate.analyzer.costing.accounting import account
from burnrate.analyzer.grid.views import Views
from burnrate.analyzer.grid.frames import Frames, Window
from burnrate.analyzer.grid.holding import STALENESS_S, hold_table, series_intervals
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.sources.recording_tables import empty_table
from burnrate.analyzer.output.report import analyze
from burnrate.simulator.simulate import Spec, simulate
from burnrate.analyzer.sources import RecordingSource
from burnrate.analyzer.sources.allocation import best_allocation
from tests.snapshots import record_live_node

T0 = 1_800_000_000.0
GPU_KEYS = TABLES["gpu"][0]


def gpu_rows(times, uuid="GPU-a", host="node-1", util=50.0, pod="", samples=None) -> pd.DataFrame:
    frame = pd.DataFrame({"t": np.asarray(times, float), "gpu_util": np.float32(util)})
    for name in GPU_KEYS:
        frame[name] = {"UUID": uuid, "Hostname": host, "gpu": "0", "pod": pod, "namespace": "ml" if pod else "",
                       "training_job": pod}.get(name, "")
        frame[name] = frame[name].astype("category")
    if samples is not None:
        frame["sample_count"] = np.float32(samples)
    return frame


def test_a_sample_every_60s_read_at_15s_steps_fills_each_step_once():
    times = T0 + 60.0 * np.arange(10)
    held = hold_table(gpu_rows(times), GPU_KEYS, step=15.0, limit=T0 + 10_000)
    assert len(held) == 40 and np.allclose(np.diff(held["t"]), 15.0)
    assert held["held_s"].sum() == pytest.approx(600.0)        # 10 samples x 60 s, the last one included


def test_a_missed_scrape_is_bridged_and_an_outage_is_not():
    times = T0 + 30.0 * np.array([0, 1, 2, 4, 5])                # one missed scrape at 90 s
    assert hold_table(gpu_rows(times), GPU_KEYS, 15.0, T0 + 1e4)["held_s"].sum() == pytest.approx(180.0)
    gone = STALENESS_S + 300.0
    times = np.concatenate([T0 + 30.0 * np.arange(3), T0 + 60.0 + gone + 30.0 * np.arange(3)])
    held = hold_table(gpu_rows(times), GPU_KEYS, 15.0, T0 + 1e4)
    assert held["held_s"].sum() == pytest.approx(2 * 90.0)      # the outage is not GPU-time seen


def test_jittered_samples_hold_until_the_next_one():
    rng = np.random.default_rng(1)
    times = T0 + 57.0 * np.arange(200) + rng.uniform(-8, 8, 200)
    held = hold_table(gpu_rows(times), GPU_KEYS, 15.0, T0 + 1e6)
    # Every sample holds until the next; the last for the interval, a median of the gaps.
    assert held["held_s"].sum() == pytest.approx(times[-1] - times[0] + 57.0, abs=8.0)


def test_a_series_that_went_from_15s_to_1s_samples_has_one_of_those_intervals():
    """As many 15 s gaps as 1 s ones (history, then a live tail): the middle of them is no
    interval the series ever had, and a recording read at 8 s steps would be read at neither."""
    times = np.concatenate([T0 + 15.0 * np.arange(33), T0 + 480.0 + np.arange(1, 33)])
    assert np.diff(times).tolist().count(15.0) == np.diff(times).tolist().count(1.0) == 32
    interval = series_intervals(times, np.zeros(len(times), np.int64), np.ones(len(times)), STALENESS_S)
    assert interval.tolist() == [1.0]


def test_a_short_series_interval_is_the_median_of_all_its_gaps():
    """An agent's first two samples 3 ms apart (a collection at its start, then its schedule's
    first), then every second: the interval is a second, and so is the step a recording of it
    is read at; it was 3 ms, read from the series' first gaps only."""
    times = T0 + np.array([0.0, 0.0032, 1.0037, 2.0072])
    interval = series_intervals(times, np.zeros(4, np.int64), np.ones(4), STALENESS_S)
    assert interval.tolist() == [pytest.approx(1.0005)]


def test_coarse_steps_count_only_the_samples_a_step_holds():
    """A 55 s step over 15 s samples: a run's first and last steps stand for the
    samples in them, so a job that starts mid-step is not charged the whole step."""
    step = 55.0
    samples = np.array([1, 4, 4, 3, 4, 2], np.float32)     # a run starting and ending mid-step
    times = T0 + step * np.arange(len(samples))
    frame = gpu_rows(times, samples=samples)
    held = hold_table(frame, GPU_KEYS, step, T0 + 1e4)
    assert "sample_count" not in held
    # First and last steps from their counts at the interval the inner steps imply
    # (their time over their samples: 4 steps of 55 s over 15 samples), the rest whole.
    interval = 4 * step / samples[1:-1].sum()
    expected = min(1 * interval, step) + 4 * step + min(2 * interval, step)
    assert held["held_s"].sum() == pytest.approx(expected)


@pytest.mark.parametrize("jitter", [0.0, 0.4], ids=["on_the_grid", "off_it"])
def test_a_gpu_whose_holder_changes_within_a_coarse_step_is_seen_for_that_step_once(jitter):
    """A 55 s step over 15 s samples: a GPU's series (its labels name its holder) changes from no
    pod to a trainer's within a step, so that step has a row of each, two samples each. The GPU
    was seen for the same time as if its labels had not changed; each row stood for the whole
    step, and the GPU for two steps in one. Rows a little off the grid take the general path."""
    step = 55.0
    times = T0 + step * np.arange(8) + jitter * (np.arange(8) % 2)
    steady = gpu_rows(times, samples=np.full(8, 4.0))
    changed = pd.concat([gpu_rows(times[:4], samples=[4, 4, 4, 2]),
                         gpu_rows(times[3:], pod="trainer-0", samples=[2, 4, 4, 4, 4])], ignore_index=True)
    changed = changed.sort_values("t", kind="stable").reset_index(drop=True)
    for name in GPU_KEYS:
        changed[name] = changed[name].astype(str).astype("category")
    seen = []
    for gpu in (steady, changed):
        tables = {name: empty_table(name) for name in TABLES}
        tables["gpu"] = gpu
        seen.append(account(Views(Frames(Window(T0, times[-1]), step, **tables))).observed_gpu_hours * 3600)
    assert seen[1] == pytest.approx(seen[0]) and seen[0] <= 8 * step


def test_the_best_allocation_signal_is_chosen_per_gpu_and_per_time():
    grid = T0 + 15.0 * np.arange(4)
    share_ratio = pd.DataFrame({"t": grid[:2], "share": np.float32([0.5, 0.5]), "allocated": np.float32(np.nan)})
    allocated = pd.DataFrame({"t": np.repeat(grid, 2), "share": np.float32(np.nan), "allocated": np.float32(1.0)})
    alloc = pd.concat([share_ratio.assign(UUID="GPU-a", pod="notebook-0"),
                       allocated.assign(UUID="GPU-a", pod=["notebook-0", "other-0"] * 4)], ignore_index=True)
    for name in TABLES["alloc"][0]:
        if name not in alloc:
            alloc[name] = "ml" if name == "namespace" else ""
    dcgm = gpu_rows(grid, uuid="GPU-b", host="node-2", pod="server-7d9f-x2k4q")
    chosen = best_allocation(alloc, dcgm, grid[0], 15.0)
    a = chosen[chosen["UUID"] == "GPU-a"]
    # While the share ratio exists it alone counts; after it, two allocated pods split the GPU.
    assert set(a[a["t"] < grid[2]]["signal"]) == {"share_ratio"} and (a[a["t"] < grid[2]]["share"] == 0.5).all()
    later = a[a["t"] >= grid[2]]
    assert set(later["signal"]) == {"allocated"} and (later["share"] == 0.5).all() and len(later) == 4
    b = chosen[chosen["UUID"] == "GPU-b"]
    assert set(b["signal"]) == {"pod_labels"} and (b["share"] == 1.0).all() and len(b) == 4


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hold") / "fleet")
    simulate(path, Spec(nodes=2, gpus_per_node=4, hours=2.0, step_s=15.0, seed=5, end=T0))
    return path


def test_the_accounting_identity_holds(recording):
    views = Views(RecordingSource(recording).frames())
    a = account(views)
    assert a.observed_gpu_hours == pytest.approx(8 * 2.0, rel=1e-6)       # 480 samples of 15 s
    assert a.observed_gpu_hours == pytest.approx(a.allocated_gpu_hours + a.unallocated_gpu_hours)
    assert a.allocated_gpu_hours == pytest.approx(a.busy_gpu_hours + a.idle_gpu_hours)
    assert a.row_gpu_hours.sum() == pytest.approx(a.allocated_gpu_hours)
    assert a.coverage == pytest.approx(1.0) and 0 < a.unallocated_gpu_hours < a.observed_gpu_hours


@pytest.mark.parametrize("days", [30, 180, 365, 3650])
def test_a_job_costs_the_same_in_every_window_that_holds_it(recording, days):
    catalog = load_catalog(None)
    source = RecordingSource(recording)
    own = {(j.namespace, j.training_job): j for j in analyze(source.frames(), catalog).jobs}
    wide = {(j.namespace, j.training_job): j for j in
            analyze(source.frames(Window(T0 - days * 86400.0, T0 + 3600.0)), catalog).jobs}
    assert own.keys() == wide.keys() and own
    for job, cost in own.items():
        assert wide[job].gpu_hours == pytest.approx(cost.gpu_hours, rel=1e-9)
        assert wide[job].cost_dollars == pytest.approx(cost.cost_dollars, rel=1e-9)


def test_sixty_second_samples_account_the_same_hours_as_fifteen(tmp_path):
    """The same fleet recorded at 15 s and 60 s: every job's GPU-hours within one
    sample interval at each end of its allocation."""
    fine, coarse = str(tmp_path / "fine"), str(tmp_path / "coarse")
    simulate(fine, Spec(nodes=1, gpus_per_node=4, hours=4.0, step_s=15.0, seed=2, end=T0))
    simulate(coarse, Spec(nodes=1, gpus_per_node=4, hours=4.0, step_s=60.0, seed=2, end=T0))
    a, b = (account(Views(RecordingSource(p).frames())) for p in (fine, coarse))
    assert b.observed_gpu_hours == pytest.approx(a.observed_gpu_hours, rel=0.01)
    assert b.allocated_gpu_hours == pytest.approx(a.allocated_gpu_hours, rel=0.02)


def test_hand_built_frames_are_held_too():
    tables = {name: empty_table(name) for name in TABLES}
    tables["gpu"] = gpu_rows(T0 + 60.0 * np.arange(60))
    frames = Frames(Window(T0, T0 + 3600), 15.0, **tables)
    assert account(Views(frames)).observed_gpu_hours == pytest.approx(1.0)


@pytest.mark.parametrize("step", [1.0, 0.99992], ids=["step-1s", "step-just-under-1s"])
@pytest.mark.parametrize("phase", [0.1, 0.45, 0.55, 0.9])
def test_a_gpu_sampled_through_the_window_s_end_reports_at_its_last_point_whatever_its_phase(step, phase):
    """A GPU sampled every second reports at the window's last point, however its samples fall
    between the grid's points: the point takes samples up to half a step either side, and one
    0.6 s before the end stands for it. The step a recording is read at is its measured interval,
    a hair under 1 s as often as on it. The GPU's seconds are its samples' wherever they fall."""
    tables = {name: empty_table(name) for name in TABLES}
    tables["gpu"] = gpu_rows(T0 + phase + np.arange(100.0))
    views = Views(Frames(Window(T0, T0 + 100.0), step, **tables))
    # From its first sample's point on (one past the start's half step is in the next).
    assert views.gpu.present[0][int(phase >= 0.5):].all()
    assert account(views).observed_gpu_hours * 3600 == pytest.approx(100.0)


def test_successive_jobs_in_one_pod_stay_apart():
    """A dev pod (or a host outside Kubernetes) runs one job, then another: each keeps its own hours."""
    grid = T0 + 60.0 * np.arange(120)
    tables = {name: empty_table(name) for name in TABLES}
    gpu = gpu_rows(grid, pod="dev-0")
    alloc = gpu[["t"]].assign(share=np.float32(1.0))
    for name in TABLES["alloc"][0]:
        alloc[name] = gpu[name]
    alloc["training_job"] = pd.Categorical(np.where(np.arange(120) < 30, "sweep-a", "sweep-b"))
    tables["gpu"], tables["alloc"] = gpu, alloc
    jobs = {j.training_job: j for j in analyze(Frames(Window(T0, grid[-1]), 60.0, **tables), load_catalog(None)).jobs}
    assert jobs["sweep-a"].gpu_hours == pytest.approx(0.5) and jobs["sweep-b"].gpu_hours == pytest.approx(1.5)


@pytest.mark.parametrize("device_sampled", [True, False], ids=["released", "missed_scrapes"])
def test_a_holder_that_lets_its_gpu_go_for_minutes_holds_none_of_them(device_sampled):
    """A pod's series pauses 4 minutes, within the staleness bound, and comes back (a pod re-created
    under its name, a local rank restarted). Where the exporter went on sampling the GPU, the GPU
    was seen without that holder: the pause is not its time. Where nothing of the node was
    sampled either, the scrapes were missed and the pause is bridged."""
    before, after = T0 + 15.0 * np.arange(20), T0 + 285.0 + 240.0 + 15.0 * np.arange(20)
    alloc = gpu_rows(np.concatenate([before, after]), pod="trainer-0").assign(share=np.float32(1.0))
    device = gpu_rows(np.arange(T0, after[-1] + 1, 15.0) if device_sampled else alloc["t"].to_numpy())
    keys = ("UUID", "namespace", "pod", "training_job")
    held = hold_table(alloc[[*keys, "t", "share"]], keys, 15.0, T0 + 1e4, device=device)
    assert held["held_s"].sum() == pytest.approx(40 * 15.0 if device_sampled else after[-1] + 15.0 - T0)


@pytest.mark.parametrize("every_s", [1.0, 5.0])
def test_a_node_sampled_faster_than_the_fleet_reads_the_same_in_every_window(tmp_path, every_s):
    """A fleet recorded at 15 s, then one node at `every_s` (the demo's recording): each
    window that holds a job gives it the same GPU-hours, dollars and findings. Read at
    the fleet's 15 s, the fast node's samples used to pile up in each step and charge
    its job up to 15 times its hours."""
    root, live_s = str(tmp_path / "rec"), 120
    simulate(root, Spec(nodes=2, gpus_per_node=4, hours=2.0, step_s=15.0, seed=5, end=T0))
    record_live_node(root, T0, live_s, every_s)
    catalog, source = load_catalog(None), RecordingSource(root)

    def read(start: float, end: float):
        report = analyze(source.frames(Window(start, end)), catalog)
        return ({j.training_job: (j.gpu_hours, j.cost_dollars) for j in report.jobs},
                sorted((f.kind, f.job, round(f.wasted_dollars or 0.0, 6)) for f in report.findings))

    fleet_jobs, fleet_findings = read(T0 - 2 * 3600, T0)
    live_only, _ = read(T0 + 1, T0 + live_s)
    for start in (T0 - 2 * 3600, T0 - 3600, T0 - 60):
        jobs, findings = read(start, T0 + live_s)
        assert jobs["live"] == pytest.approx(live_only["live"], rel=1e-6), start
        assert jobs["live"][0] == pytest.approx(2 * live_s / 3600, rel=1e-6)
    everything, findings = read(T0 - 2 * 3600, T0 + live_s)
    assert everything.keys() - {"live"} == fleet_jobs.keys()
    for name, hours_and_dollars in fleet_jobs.items():
        assert everything[name] == pytest.approx(hours_and_dollars, rel=1e-9), name
    assert findings == fleet_findings and fleet_findings


def mixed_series(n_series: int, rng) -> pd.DataFrame:
    """Device rows by time of series sampled at 15, 60 and 1 s, some with gaps and lone samples."""
    parts = []
    for n in range(n_series):
        interval = (15.0, 60.0, 1.0)[n % 3]
        times = T0 + interval * np.sort(rng.choice(400, rng.integers(1, 120), replace=False))
        parts.append(gpu_rows(times, uuid=f"GPU-{n}", util=float(n)))
    frame = pd.concat(parts, ignore_index=True).sort_values("t", kind="stable", ignore_index=True)
    for name in GPU_KEYS:
        frame[name] = frame[name].astype("category")
    return frame


def test_held_a_block_of_series_at_a_time_is_held_as_the_whole(monkeypatch):
    """The general path holds blocks of whole series at a time (their rows look only at their
    series' neighbours): any block size gives the same rows, times and seconds."""
    from burnrate.analyzer.grid import holding
    frame = mixed_series(40, np.random.default_rng(3))
    whole = hold_table(frame, GPU_KEYS, 15.0, T0 + 400 * 60.0)
    assert len(whole) > len(frame)       # the 60 s series are repeated into the 15 s steps
    for rows in (1, 7, 100):
        monkeypatch.setattr(holding, "BLOCK_ROWS", rows)
        assert len(holding._blocks(np.sort(frame["UUID"].cat.codes.to_numpy()))) > (1 if rows == 100 else 39)
        pd.testing.assert_frame_equal(hold_table(frame, GPU_KEYS, 15.0, T0 + 400 * 60.0), whole)


def test_the_last_point_a_series_last_sample_stands_for_reads_it_present_and_its_counts_unknown():
    """A window ending 0.6 of a step after the last samples: the grid's last point lies past
    them, and each series' last sample stands for it. GPUs and ranks report there, and the
    ranks' steps there are unknown, not none (the interval after a last sample says nothing of
    them), so that point is neither a stall's evidence nor a count that was not made."""
    from dataclasses import replace
    from tests.test_detectors import STEP
    from tests.test_ledger import ended_job

    frames = ended_job(alive_until=479).frames()
    window = frames.window
    views = Views(replace(frames, window=Window(window.start, window.end + 0.6 * STEP)))
    last = float(frames.rank["t"].max())
    assert views.time(views.n - 1) > last + 0.5 * STEP        # the last samples fall in the point before
    assert views.gpu.present[:, -2:].all() and views.rank.present[:, -2:].all()
    steps = views.rank.values["steps"]
    assert (steps[:, -2] == 0).all() and np.isnan(steps[:, -1]).all()
