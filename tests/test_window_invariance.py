"""Findings are a property of the data, not of the window or the grid.

A recording whose every series is sampled every 15 s for two and a half hours (the history) and
then every second (the live tail, as `burnrate demo` records beside its simulated
fleet) holds four episodes of known kinds: a job far below its MFU floor, a job that
hangs in the history, one that hangs in the live tail, and an idle notebook. Any window
that contains an episode, read at any step the analyzer may choose, finds it with the
same start and end (within a sample interval and a step of the grid), the same severity and the same wasted dollars (within 3 %); a
healthy job across both intervals is never found stalled, with the default thresholds or
the demo's live ones.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, example, given, settings, strategies as st

from burnrate.agent.recording import open_recording
from burnrate.analyzer.grid import resample
from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.detectors.config_file import detector_config, dump_detector_config
from burnrate.analyzer.detectors.episodes import identity
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze
from burnrate.analyzer.sources.recording import RecordingSource
from burnrate.demo import live_config
from burnrate.exporter.recording import TABLES

import yaml

T0 = 1_800_000_000.0
HISTORY_S, LIVE_S = 15.0, 1.0
LIVE = T0 + 2.5 * 3600            # history until here, live samples after: 10,200 s in all, one step a second
END = LIVE + 20 * 60
MIN = 60.0
HOST, OTHER, MODEL = "node-a", "node-b", "NVIDIA H100 80GB HBM3"
DOLLARS_TOLERANCE = 0.03
CATALOG = load_catalog(None)


@dataclass(frozen=True)
class Job:
    name: str
    gpus: tuple[int, ...]
    start: float
    end: float
    stall_from: float | None = None     # steps stop here; reports and GPUs stay until `end`
    mfu: float = 0.45
    util: float = 92.0
    pod: str | None = None              # a pod outside any training job, without telemetry
    host: str = HOST
    compute: float = 0.9                # of each step
    episode: tuple[float, float] | None = None   # where the two below hold
    data_wait: float = 0.01             # of each step: the loader's share, within the episode
    slowdown: float = 1.0               # rank 1's compute per step, within the episode, over the others'


JOBS = (
    Job("slow", (0, 1), T0 + 20 * MIN, LIVE + 8 * MIN, mfu=0.05),
    Job("hung", (2, 3), T0 + 10 * MIN, T0 + 120 * MIN, stall_from=T0 + 60 * MIN, util=100.0),
    Job("hung-live", (4,), T0 + 90 * MIN, LIVE + 16 * MIN, stall_from=LIVE + 3 * MIN, util=100.0),
    Job("", (5,), T0 + 100 * MIN, LIVE + 12 * MIN, util=0.0, pod="nb-0"),
    Job("healthy", (6, 7), T0, END),
    Job("starved", (0, 1), T0 + 30 * MIN, END, host=OTHER, compute=0.5, episode=(T0 + 100 * MIN, LIVE + 6 * MIN),
        data_wait=0.4),
    Job("lagging", (2, 3), T0 + 15 * MIN, END, host=OTHER, compute=0.6, episode=(T0 + 70 * MIN, T0 + 130 * MIN),
        slowdown=1.3),
)
# kind, namespace/job, the span the episode covers (a window must hold it all: for a stall
# the last step before it, for low MFU the job's whole life, for a share taken over a
# centered window that window's half on either side) and the severity it must have.
EPISODES = (
    ("low_mfu", "slow", (T0 + 20 * MIN, LIVE + 8 * MIN), "critical"),
    ("stalled", "hung", (T0 + 50 * MIN, T0 + 120 * MIN), "critical"),
    ("stalled", "hung-live", (LIVE - 5 * MIN, LIVE + 16 * MIN), "critical"),
    ("idle_gpu", "nb-0", (T0 + 100 * MIN, LIVE + 12 * MIN), "warning"),
    ("dataloader_starvation", "starved", (T0 + 90 * MIN, LIVE + 16 * MIN), "warning"),
    ("straggler", "lagging", (T0 + 65 * MIN, T0 + 135 * MIN), "warning"),
)


def sample_times(start: float, end: float) -> np.ndarray:
    """Every 15 s in the history and every second in the live tail, as one series is scraped."""
    history = np.arange(np.ceil(start / HISTORY_S) * HISTORY_S, min(end, LIVE), HISTORY_S)
    live = np.arange(max(np.ceil(start), LIVE), end + 1e-9, LIVE_S)
    return np.concatenate([history, live])


def write_recording(root: str) -> None:
    rows: dict[str, list[tuple[float, tuple[str, ...], dict[str, float]]]] = {name: [] for name in TABLES}
    device = lambda g, host: (str(g), f"GPU-{host}-{g}", f"0000:{g:02x}:00.0", f"nvidia{g}", MODEL, host)  # noqa: E731
    gpus = {(HOST, g): 0.0 for g in range(8)} | {(OTHER, g): 0.0 for g in range(4)}
    for t in sample_times(T0, END):
        for host, count in ((HOST, "8"), (OTHER, "4")):
            rows["node"].append((t, (host, "p5.48xlarge", "on-demand", "us-east-1a", MODEL, count),
                                 {"cpu_utilization": 0.3}))
    util = {gpu: np.full(len(sample_times(T0, END)), 0.0) for gpu in gpus}
    for job in JOBS:
        t = sample_times(job.start, job.end)
        pod_of = (lambda r: job.pod) if job.pod else (lambda r: f"{job.name}-{r}")
        for r, g in enumerate(job.gpus):
            labels = device(g, job.host) + ("ml", pod_of(r), "main", job.name)
            for when in t:
                rows["alloc"].append((when, labels, {"share": 1.0}))
            util[(job.host, g)][np.isin(sample_times(T0, END), t)] = job.util
            if job.pod:
                continue
            stepping = np.minimum(t, job.stall_from or np.inf) - job.start
            steps = np.floor(stepping)                                # a step a second
            a, b = job.episode or (job.start, job.start)
            inside = np.clip(job.start + stepping, a, b) - a          # seconds stepped within the episode
            waiting = 0.01 * stepping + (job.data_wait - 0.01) * inside
            computing = job.compute * stepping - (job.data_wait - 0.01) * inside + \
                (job.slowdown - 1.0) * job.compute * inside * (r == 1)
            for when, made, busy, wait, compute in zip(t, steps, stepping, waiting, computing):
                rows["rank"].append((when, ("ml", pod_of(r), job.name, str(r), job.host), {
                    "steps": made, "step_s": busy, "compute_s": compute, "data_wait_s": wait,
                    "tokens": 4096 * made, "samples": 8 * made, "flops": 1e15 * made, "mfu": job.mfu,
                    "loss": 2.0, "grad_norm": 1.0, "world_size": float(len(job.gpus)),
                    "last_step_time": job.start + made, "global_step": made, "start_time": job.start}))
    for (host, g), used in util.items():
        for when, u in zip(sample_times(T0, END), used):
            rows["gpu"].append((when, device(g, host) + ("",) * 4, {"up": 1.0, "gpu_util": u, "sm_clock_mhz": 1980.0,
                                                                    "throttle_reasons": 0.0}))
    tables = open_recording(root, segment="fleet")
    for name, table in rows.items():
        for t, labels, values in sorted(table, key=lambda row: row[0]):
            tables[name].append(t, labels, values)
        tables[name].close()


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> RecordingSource:
    root = str(tmp_path_factory.mktemp("window") / "recording")
    write_recording(root)
    return RecordingSource(root)


@contextmanager
def points_per_series(points: int):
    """The analyzer's resolution: at most this many points a window (as Prometheus' query
    limit sets it), so a longer window, or fewer points, reads at a coarser step."""
    with mock.patch.object(resample, "MAX_POINTS", points):
        yield


def findings(source: RecordingSource, window: Window, config: DetectorConfig = DetectorConfig(),
             points: int = resample.MAX_POINTS):
    with points_per_series(points):
        frames = source.frames(window)
    return frames.step_s, analyze(frames, CATALOG, config).findings


def episode(found, kind: str, job: str):
    mine = [f for f in found if f.kind == kind and f.training_job == job]
    assert len(mine) == 1, f"{kind} of {job}: {[(f.kind, f.training_job, f.start, f.end) for f in found]}"
    return mine[0]


@pytest.fixture(scope="module")
def reference(recording):
    """Each episode as the whole recording, read at its native step, finds it."""
    step, found = findings(recording, Window(T0, END))
    assert step == LIVE_S
    return {(kind, job): episode(found, kind, job) for kind, job, _, _ in EPISODES}


def assert_same(found, ref, step: float) -> None:
    # A window opens between two samples and its grid's points between them: a sample
    # interval, and a step, either way. A start read from a counter too: a window's first
    # increase is read from the counts before it (a job whose first sample falls 0.4 s
    # before the window once started 23.4 s after the reference at 8 s steps).
    tolerance = HISTORY_S + step + 1e-6
    assert identity(found) == identity(ref)
    assert found.severity == ref.severity
    assert abs(found.start - ref.start) <= tolerance, (found.start - ref.start, step)
    assert abs(found.end - ref.end) <= tolerance, (found.end - ref.end, step)
    assert found.wasted_dollars == pytest.approx(ref.wasted_dollars, rel=DOLLARS_TOLERANCE)


def test_the_reference_finds_each_episode_where_it_was_put(reference):
    for kind, job, (start, end), severity in EPISODES:
        f = reference[(kind, job)]
        assert f.severity == severity
        assert f.wasted_dollars > 0
        if kind == "stalled":
            stall_from = next(j.stall_from for j in JOBS if j.name == job)
            assert abs(f.start - stall_from) <= HISTORY_S
            assert abs(f.end - end) <= HISTORY_S
            assert f.evidence["stalled_minutes"] == pytest.approx((end - stall_from) / 60, abs=0.5)
        elif kind == "dataloader_starvation":
            # The share is taken over a 10-minute centered window: it crosses 5 % a few minutes out.
            starved = next(j for j in JOBS if j.name == job)
            assert 0 < starved.episode[0] - f.start <= 5 * MIN and 0 < f.end - starved.episode[1] <= 5 * MIN
            assert 0.3 < f.evidence["data_wait_share"] < starved.data_wait
        elif kind == "straggler":
            # Compute per step is compared over 5-minute blocks.
            lagging = next(j for j in JOBS if j.name == job)
            assert abs(f.start - lagging.episode[0]) <= 5 * MIN and abs(f.end - lagging.episode[1]) <= 5 * MIN
            assert f.rank == 1 and f.evidence["slowdown"] == pytest.approx(lagging.slowdown, abs=0.02)
        else:
            assert abs(f.start - start) <= HISTORY_S and abs(f.end - end) <= HISTORY_S


EXAMPLES = int(os.environ.get("BURNRATE_EXAMPLES", "16"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("BURNRATE_EXAMPLES"), database=None)
# A drawn window: ten minutes of the hung job's 15 s steps, then its stall, read at 5 s steps
# beside 1 s live data (its steps once read as none, and its stall went unfound).
@example(which=next(e for e in EPISODES if e[:2] == ("stalled", "hung")), before=1.0, after=1.0, points=1500)
# Drawn windows: the slow job's first sample 0.4 s before it opens, read at 8 s steps; the
# hung job's stall read at 13 s steps (its end was read 28.4 s late when a step's point was
# taken for the step after it).
@example(which=EPISODES[0], before=1.0, after=0.0, points=11000)
@example(which=EPISODES[1], before=0.875, after=1.0, points=600)
@given(which=st.sampled_from(EPISODES), before=st.floats(0.0, 1.0), after=st.floats(0.0, 1.0),
       points=st.sampled_from([resample.MAX_POINTS, 4000, 1500, 600]))
def test_any_window_that_holds_an_episode_finds_it_with_the_same_figures(recording, reference, which, before,
                                                                          after, points):
    kind, job, (start, end), _ = which
    # Off the sample times on purpose: a window opens and closes between two samples.
    window = Window(T0 + before * (start - T0) + 0.4, end + 60 + after * (END - end - 60))
    step, found = findings(recording, window, points=points)
    assert_same(episode(found, kind, job), reference[(kind, job)], step)
    assert not [f for f in found if f.training_job == "healthy"]


# How long an episode must last within a window to be found at all; a stall is known from when
# the job last stepped (its ranks report that time), however little of it a window holds.
CONFIG = DetectorConfig()
SHORTEST_S = {"low_mfu": CONFIG.low_mfu.min_minutes * MIN, "idle_gpu": CONFIG.idle_gpu.min_minutes * MIN, "stalled": 0.0,
              "dataloader_starvation": (CONFIG.dataloader_starvation.min_minutes
                                        + CONFIG.dataloader_starvation.window_minutes / 2) * MIN,
              "straggler": (CONFIG.straggler.min_minutes + CONFIG.straggler.block_minutes) * MIN}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("BURNRATE_EXAMPLES"), database=None)
# A drawn window: the slow job's last 38 minutes read at 3 s steps, more of its ranks' points in
# its 1 s live data than in its 15 s history; the history's points between samples were left
# unfilled and the job read as working 8 minutes, too short to judge.
@example(which=EPISODES[0], into=0.72375170109712, points=1500)
@given(which=st.sampled_from(EPISODES), into=st.floats(0.02, 0.98), points=st.sampled_from([resample.MAX_POINTS, 4000, 1500]))
def test_a_window_that_opens_inside_an_episode_finds_the_rest_of_it(recording, reference, which, into, points):
    """From the window's start to the episode's end, with its wasted dollars in proportion (a
    hung job's last hour, looked at as its last hour, is a stall)."""
    kind, job, _, _ = which
    ref = reference[(kind, job)]
    window = Window(ref.start + into * (ref.end - ref.start) + 0.4, END)
    assume(ref.end - window.start >= SHORTEST_S[kind] + 2 * HISTORY_S)
    step, found = findings(recording, window, points=points)
    f = episode(found, kind, job)
    tolerance = HISTORY_S + step + 1e-6
    assert f.severity == ref.severity
    assert window.start <= f.start <= window.start + tolerance, (f.start - window.start, step)
    assert abs(f.end - ref.end) <= tolerance, (f.end - ref.end, step)
    # n samples stand for n intervals (analyzer.grid.holding): the window's first sample may
    # fall up to an interval after it opens, and its time is counted after the episode's end.
    rate = waste_rate(kind, job, np.arange(ref.start, ref.end))
    per_s = ref.wasted_dollars / rate.sum()
    rest = per_s * rate[int(window.start - ref.start):].sum()
    assert abs(f.wasted_dollars - rest) <= DOLLARS_TOLERANCE * rest + per_s * rate.max() * tolerance, \
        (f.wasted_dollars, rest)


def waste_rate(kind: str, job: str, t: np.ndarray) -> np.ndarray:
    """How fast an episode wastes, second by second, as the recording was written: a share over a
    centered window and blocks of compute both reach past the episode into time that wastes little."""
    slow = next((j for j in JOBS if j.name == job and j.episode), None)
    within = (t >= slow.episode[0]) & (t < slow.episode[1]) if slow else np.ones(len(t), bool)
    if kind == "dataloader_starvation":
        return np.where(within, slow.data_wait, 0.01)
    return within.astype(float)


def test_low_mfu_on_15s_history_and_1s_live_data_is_found_whatever_the_window_end(recording, reference):
    steps = set()
    for end in (LIVE + 8 * MIN + 30, LIVE + 9 * MIN, LIVE + 10 * MIN, LIVE + 12 * MIN, END):
        step, found = findings(recording, Window(T0, end))
        steps.add(step)
        assert_same(episode(found, "low_mfu", "slow"), reference[("low_mfu", "slow")], step)
        # The job steps in every second of its life: its GPU-hours are its two GPUs' whole time.
        evidence = episode(found, "low_mfu", "slow").evidence
        assert evidence["gpu_hours"] == pytest.approx(2 * (LIVE + 8 * MIN - (T0 + 20 * MIN)) / 3600, rel=0.01)
    # Ending the window later turns its grid from the history's 15 s to the live 1 s.
    assert {HISTORY_S, LIVE_S} <= steps


def demo_live_thresholds() -> DetectorConfig:
    """The thresholds file `burnrate demo` writes beside its recording, read back."""
    return detector_config(yaml.safe_load(dump_detector_config(live_config(DetectorConfig()))))


@pytest.mark.parametrize("window", [Window(T0, END), Window(LIVE - 30 * MIN + 7.0, END), Window(T0 + 3.0, LIVE + 90)])
def test_a_job_stepping_every_15s_then_every_second_is_not_stalled_under_the_demos_live_thresholds(recording, window):
    _, found = findings(recording, window, demo_live_thresholds())
    stalled = {f.training_job for f in found if f.kind == "stalled"}
    # The hung jobs are stalled (their stalls are minutes long); the stepping ones are not.
    assert "healthy" not in stalled and "slow" not in stalled
    assert stalled <= {"hung", "hung-live"}
    hung = [f for f in found if f.kind == "stalled" and f.training_job == "hung"]
    if window.start < T0 + 60 * MIN:
        assert len(hung) == 1 and abs(hung[0].start - (T0 + 60 * MIN)) <= HISTORY_S


def test_a_job_scraped_every_15s_beside_1s_data_lives_to_the_window_s_end(tmp_path):
    """A training job scraped every 15 s, stepping and heard by its agent at each scrape, beside a
    job sampled every second: the window's grid is 1 s, and each of the first job's samples holds
    on over the 14 bins after it. Its process lived through its last sample's time; none of it is
    `no_process`, and no `held_after_exit` (the demo's fleet at the end of its live part)."""
    root, end = str(tmp_path / "recording"), T0 + 10 * MIN
    tables = open_recording(root, segment="fleet")
    device = (lambda g: (str(g), f"GPU-{HOST}-{g}", f"0000:{g:02x}:00.0", f"nvidia{g}", MODEL, HOST))   # noqa: E731
    every = {"fleet": (0, np.arange(T0, end - 7.0, HISTORY_S)), "live": (1, np.arange(T0, end + 1e-9, LIVE_S))}
    for t in every["live"][1]:
        tables["node"].append(t, (HOST, "p5.48xlarge", "on-demand", "us-east-1a", MODEL, "2"), {"cpu_utilization": 0.3})
    rows = []
    for name, (g, times) in every.items():
        for t in times:
            made = t - T0
            rows.append(("gpu", t, device(g) + ("",) * 4, {"up": 1.0, "gpu_util": 90.0, "sm_clock_mhz": 1980.0,
                                                         "throttle_reasons": 0.0}))
            rows.append(("alloc", t, device(g) + ("ml", f"{name}-0", "main", name), {"share": 1.0}))
            rows.append(("rank", t, ("ml", f"{name}-0", name, "0", HOST), {
                "steps": made, "step_s": made, "compute_s": 0.9 * made, "data_wait_s": 0.01 * made,
                "tokens": 4096 * made, "mfu": 0.45, "loss": 2.0, "grad_norm": 1.0, "world_size": 1.0,
                "last_step_time": t, "global_step": made, "start_time": T0 - 60.0, "resumed_from": 0.0,
                "last_report_time": t}))
    for table, t, labels, values in sorted(rows, key=lambda row: row[1]):
        tables[table].append(t, labels, values)
    for table in tables.values():
        table.close()
    frames = RecordingSource(root).frames(Window(T0, end))
    assert frames.step_s == LIVE_S
    report = analyze(frames, CATALOG, demo_live_thresholds())
    (fleet,) = [j for j in report.jobs if j.training_job == "fleet"]
    assert fleet.ledger.gpu_hours["no_process"] == 0 and fleet.ledger.gpu_hours["stalled"] == 0, fleet.ledger.gpu_hours
    assert not [(f.kind, f.training_job) for f in report.findings if f.kind in ("held_after_exit", "stalled")]


def _job_beside_live(root: str, start: float, stop_step: float, exit_at: float, closes: bool, release: float,
                     end: float, live: bool) -> None:
    """A 2-GPU job scraped every 15 s: stepping a step a second from `start` until `stop_step`
    (then hung, if that is before its exit), its process ending at `exit_at` (its monitor saying
    so where `closes`), its GPUs held until `release`, its ranks' series kept the agent's five
    minutes after the exit while held; with `live`, a job on a third GPU sampled every second."""
    tables = open_recording(root, segment="fleet")
    device = (lambda g: (str(g), f"GPU-{HOST}-{g}", f"0000:{g:02x}:00.0", f"nvidia{g}", MODEL, HOST))   # noqa: E731
    rows = []

    def ranks(t: float, name: str, pod: str, rank: int, made: float, began: float, heard: float, closed: float):
        rows.append(("rank", t, ("ml", pod, name, str(rank), HOST), {
            "steps": made, "step_s": made, "compute_s": 0.9 * made, "data_wait_s": 0.01 * made, "tokens": 4096 * made,
            "mfu": 0.45, "loss": 2.0, "grad_norm": 1.0, "world_size": 2.0 if name == "job" else 1.0,
            "last_step_time": began + made, "global_step": made, "start_time": began - 30.0, "resumed_from": 0.0,
            "last_report_time": heard, "closed_time": closed}))

    for t in np.arange(T0, end + 1e-9, HISTORY_S):
        for g in (0, 1):
            rows.append(("gpu", t, device(g) + ("",) * 4, {"up": 1.0, "gpu_util": 90.0 if start <= t < exit_at else 0.0,
                                                         "sm_clock_mhz": 1980.0, "throttle_reasons": 0.0}))
            if start <= t < release:
                rows.append(("alloc", t, device(g) + ("ml", f"job-{g}", "main", "job"), {"share": 1.0}))
            if start <= t < min(release, exit_at + 300.0):
                ranks(t, "job", f"job-{g}", g, np.floor(max(0.0, min(t, stop_step, exit_at) - start)), start,
                      min(t, exit_at), exit_at if closes and t >= exit_at else np.nan)
    for t in np.arange(T0 + 5.0, end + 1e-9, LIVE_S) if live else ():
        rows.append(("gpu", t, device(2) + ("",) * 4, {"up": 1.0, "gpu_util": 90.0, "sm_clock_mhz": 1980.0,
                                                     "throttle_reasons": 0.0}))
        rows.append(("alloc", t, device(2) + ("ml", "live-0", "main", "live"), {"share": 1.0}))
        ranks(t, "live", "live-0", 0, t - T0 - 5.0, T0 + 5.0, t, np.nan)
    for t in np.arange(T0, end + 1e-9, LIVE_S if live else HISTORY_S):
        rows.append(("node", t, (HOST, "p5.48xlarge", "on-demand", "us-east-1a", MODEL, "3"), {"cpu_utilization": 0.3}))
    for table, t, labels, values in sorted(rows, key=lambda row: row[1]):
        tables[table].append(t, labels, values)
    for table in tables.values():
        table.close()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("BURNRATE_EXAMPLES"), database=None)
@given(start=st.floats(30.0, 150.0), life=st.floats(600.0, 2400.0), hung=st.one_of(st.just(0.0), st.floats(0.1, 0.7)),
       closes=st.booleans(), keep=st.sampled_from(["none", "seconds", "minutes"]), after=st.floats(0.0, 600.0),
       cut=st.one_of(st.none(), st.floats(0.3, 0.95)))
def test_a_job_s_ledger_is_the_same_on_its_own_grid_and_beside_1s_data(tmp_path_factory, start, life, hung, closes,
                                                                        keep, after, cut):
    """A job scraped every 15 s, read alone (a 15 s grid) and beside a job sampled every second (a
    1 s grid, each of its samples held over the 14 bins after it), over windows that close after it
    or while it steps or hangs: its ledger is the same within a sample at each of its edges, and so
    are its findings, to less than one sample of one GPU."""
    closes = closes and not hung
    start, exit_at = T0 + start, T0 + start + life
    stop_step = exit_at - hung * life
    release = exit_at + {"none": 0.0, "seconds": 23.0, "minutes": 800.0}[keep]
    end = release + after if cut is None else start + cut * life      # `cut`: the window closes first
    read = []
    for live in (False, True):
        root = str(tmp_path_factory.mktemp("grids") / "recording")
        _job_beside_live(root, start, stop_step, exit_at, closes, release, end, live)
        frames = RecordingSource(root).frames(Window(T0, end))
        report = analyze(frames, CATALOG, DetectorConfig())
        (job,) = [j for j in report.jobs if j.training_job == "job"]
        read.append((frames.step_s, {k: v or 0.0 for k, v in job.ledger.gpu_hours.items()},
                     sorted(f.kind for f in report.findings if f.training_job == "job")))
    (alone, ledger, kinds), (beside, ledger_beside, kinds_beside) = read
    assert (alone, beside) == (HISTORY_S, LIVE_S)
    # The same samples either way: what a grid changes is where a sample's time falls, less than
    # one sample of one GPU (measured: under 5 GPU-seconds).
    assert ledger == pytest.approx(ledger_beside, abs=HISTORY_S / 3600), (ledger, ledger_beside)
    assert kinds == kinds_beside
