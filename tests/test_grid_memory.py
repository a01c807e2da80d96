"""A long window's analysis makes few temporaries the size of a table or a grid.

A week of a thousand GPUs is 11 M rows a table and 90 MB a (gpu, time) float64 grid:
every whole-size copy shows in the peak RSS (docs/benchmarks.md). numpy reports its
allocations to tracemalloc, so the peak of each step is measured here on a small fleet,
in units of its own rows or cells; the bounds sit between the step's in-place code and
the copies it made before.
"""
import subprocess
import sys
import tracemalloc
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

from burnrate.analyzer.costing import accounting
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.grid import frames as frames_module, freed, resample
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.grid.holding import _on_grid, hold_table
from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS, Views
from burnrate.analyzer.output.report import analyze, render_json
from burnrate.analyzer.sources import RecordingSource
from burnrate.analyzer.sources.allocation import best_allocation
from burnrate.analyzer.sources.promtables import Assembly, consecutive
from burnrate.analyzer.sources.recording_tables import Span, load_table
from burnrate.exporter.recording import TABLES
from burnrate.simulator.simulate import Spec, simulate

POINTS = 360     # 12 hours at 15 s read at 120 s steps: several samples a step, as a week is read


def peak_bytes(fn) -> int:
    """The most memory `fn` held at once beyond what was allocated before it."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("memory") / "rec")
    simulate(root, Spec(nodes=2, gpus_per_node=8, hours=12.0, step_s=15.0, seed=1, end=1_800_000_000.0))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resample, "MAX_POINTS", POINTS)
        frames = RecordingSource(root).frames(columns=ANALYSIS_COLUMNS)
    assert frames.step_s == 120.0
    return root, frames


def test_holding_a_reduced_table_copies_its_rows_few_times(reduced):
    root, frames = reduced
    first, points = resample.grid_points(frames.window, frames.step_s)
    span = Span(frames.window.start, first + (points - 1) * frames.step_s, first, frames.step_s)
    table = load_table(root, "gpu", ["gpu_util"], span)
    assert len(table) > 5000 and table["sample_count"].min() > 1
    rows = len(table) * 8
    # 5.1 rows of float64 at once; 7.0 before the time and cell indices were made in place.
    assert peak_bytes(lambda: hold_table(table, ("UUID",), frames.step_s, frames.window.end)) < 6 * rows


def test_holding_a_table_read_at_its_interval_holds_a_block_of_series_at_a_time(monkeypatch):
    """Read at the scrape's step (no sample counts), a table takes the general path: its
    row-long temporaries are made a block of whole series at a time."""
    import pandas as pd
    from burnrate.analyzer.grid import holding
    from tests.test_holding import GPU_KEYS, T0, gpu_rows
    series, points = 400, 500
    table = pd.concat([gpu_rows(T0 + 15.0 * np.arange(points), uuid=f"GPU-{n}") for n in range(series)],
                      ignore_index=True).sort_values("t", kind="stable", ignore_index=True)
    for name in GPU_KEYS:
        table[name] = table[name].astype("category")
    monkeypatch.setattr(holding, "BLOCK_ROWS", 20_000)
    held = []
    # 8.0 rows of float64 at once in blocks of a tenth of the table; 14.5 in one.
    assert peak_bytes(lambda: held.append(hold_table(table, GPU_KEYS, 15.0, T0 + 15.0 * points))) < 9 * len(table) * 8
    assert held[0]["held_s"].to_numpy().sum(dtype=np.float64) == series * points * 15.0


def test_the_held_seconds_of_a_reduced_table_number_its_cells_in_int32():
    # A week-long series on the grid: its run edges are few, so the cell numbers are the peak.
    series, points, step = 64, 4000, 60.0
    t = np.repeat(1.8e9 + step * np.arange(points), series)
    codes = np.tile(np.arange(series), points)
    samples = np.full(len(t), 4.0, np.float32)
    held = []
    # 1.9 rows of float64 at once; 3.4 with int64 cell numbers.
    assert peak_bytes(lambda: held.append(_on_grid(t, codes, samples, step))) < 2.5 * len(t) * 8
    # Four samples of 15 s a step: every row stands for its whole step, the runs' ends too.
    assert held[0].dtype == np.float32 and held[0].sum(dtype=np.float64) == len(t) * step


def test_building_the_gpu_grid_copies_few_grids(reduced):
    _, frames = reduced
    views = Views(frames)
    cells = 16 * views.n * 8
    # 4.1 float64 grids at once; 7.5 before its row indices were made in place.
    assert peak_bytes(lambda: views.gpu) < 5.5 * cells
    assert views.gpu.size == 16
    # Four float32 signals and the held seconds, float32 too where that holds them exactly
    # (three float64 grids' size before).
    assert sum(values.nbytes for values in views.gpu.values.values()) == 2.5 * cells
    np.testing.assert_array_equal(views.gpu.values["held_s"].sum(axis=1, dtype=np.float64),
                                  frames.gpu.groupby("UUID", observed=True)["held_s"].sum().to_numpy(np.float64))


def test_the_accounting_holds_few_grids_at_once(reduced, monkeypatch):
    _, frames = reduced
    views = Views(frames).build()
    before = accounting.account(views)
    monkeypatch.setattr(accounting, "ROWS_AT_ONCE", 4, raising=False)
    cells = views.gpu.size * views.n * 8
    # 3.3 float64 grids at once; 3.6 before the holders' shares were taken a block at a time
    # too, 5.7 before the holders were gathered a block of GPUs at a time.
    assert peak_bytes(lambda: accounting.account(views)) < 3.5 * cells
    after = accounting.account(views)
    assert after.to_dict() == before.to_dict()
    np.testing.assert_array_equal(after.row_gpu_hours, before.row_gpu_hours)
    np.testing.assert_array_equal(after.cell_seconds, before.cell_seconds)


def test_the_rank_gauges_are_read_in_float32_with_the_same_analysis(reduced, monkeypatch):
    root, frames = reduced
    narrow = frames_module.FLOAT32["rank"]
    assert {str(frames.rank[c].dtype) for c in narrow} == {"float32"}
    assert frames.rank["steps"].dtype == frames.rank["last_step_time"].dtype == np.float64
    monkeypatch.setattr(resample, "MAX_POINTS", POINTS)
    monkeypatch.setattr(frames_module, "FLOAT32", {})
    wide = RecordingSource(root).frames(columns=ANALYSIS_COLUMNS)
    assert {str(wide.rank[c].dtype) for c in narrow} == {"float64"}
    assert wide.rank.memory_usage().sum() - frames.rank.memory_usage().sum() == 4 * len(narrow) * len(wide.rank)
    # Every reader takes them as float32: the grids, and so the whole analysis, are the same.
    catalog = load_catalog()
    narrow_report, wide_report = analyze(frames, catalog), analyze(wide, catalog)
    for c in narrow:
        np.testing.assert_array_equal(narrow_report.views.rank.values[c], wide_report.views.rank.values[c])
    assert render_json(narrow_report) == render_json(wide_report)


def test_an_analysis_handed_the_frames_holds_its_grids_instead_of_the_frames_too(reduced, monkeypatch):
    root, _ = reduced
    monkeypatch.setattr(resample, "MAX_POINTS", POINTS)
    catalog = load_catalog()

    def analysed(release: bool):
        """The bytes an analysis and its frames hold once it is done, its JSON and its frames."""
        tracemalloc.start()
        try:
            frames = RecordingSource(root).frames(columns=ANALYSIS_COLUMNS)
            report = analyze(frames, catalog, release_frames=release)
            return tracemalloc.get_traced_memory()[0], render_json(report), frames
        finally:
            tracemalloc.stop()

    kept, kept_json, whole = analysed(False)
    held, released_json, handed = analysed(True)
    assert released_json == kept_json
    tables = ("gpu", "alloc", "rank")
    values = sum(getattr(whole, t).select_dtypes(exclude="category").memory_usage(index=False).sum() for t in tables)
    # The times, values and held seconds the grids were made of are gone; the labels stay.
    for t in tables:
        assert list(getattr(handed, t).select_dtypes(exclude="category").columns) == []
        assert len(getattr(handed, t)) == len(getattr(whole, t))
    assert values > 0.7 * sum(getattr(whole, t).memory_usage(index=False).sum() for t in tables)
    assert held < kept - 0.9 * values


def test_a_table_put_together_from_its_answers_lets_each_column_go_once_in_the_frame():
    """A day of a thousand ranks read per GPU: 18 columns whose answers, held until the table
    was made, were as large as the table itself (bench/RESULTS.md)."""

    step, n_times, ranks = 15.0, 2000, 64
    keys, columns = TABLES["rank"][0], list(TABLES["rank"][1])
    times = 1_000_000.0 + step * np.arange(n_times)
    rng = np.random.default_rng(2)

    def answers() -> dict[str, list[dict]]:
        out = {}
        for column in columns:
            pairs = [np.column_stack([times, rng.normal(size=n_times)]) for _ in range(ranks)]
            out[column] = [{"metric": {k: f"{k}-{r}" for k in keys}, "values": points}
                           for r, points in enumerate(consecutive(pairs, step))]
        return out

    window = Window(times[0], times[-1])
    with ThreadPoolExecutor(1) as builder:
        assembly = Assembly(window, step, times[0], None, None, None, builder)
        made = []
        # tracemalloc sees a free only of what it saw allocated: the answers are made inside.
        peak = peak_bytes(lambda: made.append(assembly._plain("rank", answers())))
    frame = made[0]
    assert len(frame) == ranks * n_times
    answered = len(columns) * ranks * n_times * 8
    table = frame.memory_usage(index=False).sum()
    # The answers, then the table made as they go: 0.44 of a table above them (the layout's
    # indices, a column and its copy), where holding every answer until the table was made took
    # the two together (1.3 tables above them).
    assert peak < answered + 0.6 * table, (peak, answered, table)


@pytest.mark.skipif(freed._TRIM is None, reason="the C library has no malloc_trim (not glibc)")
def test_memory_let_go_goes_back_to_the_system():
    """Arrays of a few megabytes freed between others that stay: glibc keeps their pages in
    the process until `give_back`. In a process of its own, so that nothing else allocates."""
    script = """
import numpy as np
from burnrate.analyzer.grid import freed

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

large = np.ones(30 << 20, np.uint8)
del large                          # an array freed above the threshold raises it: glibc's own tuning
arrays = [np.ones(4 << 20, np.uint8) for _ in range(60)]
del arrays[::2]                    # 120 MB freed between arrays that stay
before = rss()
freed.give_back()
print(before - rss())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 100 << 20


def test_choosing_the_allocation_signal_makes_its_row_long_arrays_in_place():
    """Agents on every GPU: a share ratio for each holder's row and pod labels on each device row,
    both tables' rows in one set of arrays (a day of 1,024 GPUs: 12 M rows)."""

    gpus, steps, step = 16, 20_000, 15.0
    t = np.tile(1_000_000.0 + step * np.arange(steps), gpus)
    uuid = np.repeat([f"GPU-{g}" for g in range(gpus)], steps)
    labels = {"UUID": uuid, "Hostname": "node-1", "gpu": "0", "pci_bus_id": "0", "device": "nvidia0",
              "modelName": "H100", "namespace": "ml", "pod": "train-0", "container": "main", "training_job": "train"}
    alloc = pd.DataFrame({"t": t, "share": np.float32(1.0), "allocated": np.float32(np.nan),
                          **{k: pd.Categorical(np.broadcast_to(labels[k], len(t))) for k in TABLES["alloc"][0]}})
    gpu = pd.DataFrame({"t": t, **{k: pd.Categorical(np.broadcast_to(labels[k], len(t))) for k in TABLES["gpu"][0]}})
    chosen = []
    peak = peak_bytes(lambda: chosen.append(best_allocation(alloc, gpu, t[0], step)))
    assert len(chosen[0]) == len(t) and set(chosen[0]["signal"]) == {"share_ratio"}
    # 12.2 float64s a table's row (its two signals' rows, each chosen or not, then the kept ones
    # put together); 18.9 when the time, cell and GPU arrays were each made anew.
    assert peak < 15 * 8 * len(t), peak / (8 * len(t))


@pytest.mark.parametrize("spelled", ["from_indices", "sparse_index"])
def test_a_value_a_series_holds_only_those_values_and_reads_back(spelled, monkeypatch):
    """A RANK_LATEST column (frames.on_rows) keeps a value and a position a series, not a float a
    row, and values_at reads it at any rows: through pandas' `from_indices` (3.1 on) and through
    the `sparse_index` every release before takes."""
    if spelled == "sparse_index":
        if not hasattr(pd.arrays.SparseArray, "from_indices"):
            pytest.skip("this pandas has no from_indices: the other case takes sparse_index")
        monkeypatch.delattr(pd.arrays.SparseArray, "from_indices")
    rows, n = np.array([3, 999_998]), 1_000_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # pandas 3.1 says sparse_index will go
        column = pd.Series(frames_module.on_rows(n, rows, np.array([1.5, np.nan])))
    assert column.array.nbytes < 100 and len(column) == n
    np.testing.assert_array_equal(frames_module.values_at(column, np.array([0, 3, 4, 999_998, 999_999])),
                                  [np.nan, 1.5, np.nan, np.nan, np.nan])
    assert frames_module.values_at(column, np.array([3]))[0] == 1.5
    dense = pd.Series(np.arange(5.0))
    np.testing.assert_array_equal(frames_module.values_at(dense, np.array([4, 1])), [4.0, 1.0])
