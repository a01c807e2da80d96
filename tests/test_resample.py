"""A window's step and the reduction of finer samples to it, checked by hand."""
import numpy as np

from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.grid.resample import MAX_POINTS, grid_points, reduce_rows, reduction, step_for
from burnrate.analyzer.sources.prometheus import QUERIES


def test_the_step_is_the_sample_interval_until_a_window_needs_more_points():
    assert step_for(Window(0, 3600), 15.0) == 15.0
    assert step_for(Window(0, 7 * 86400), 15.0) == 55.0                  # 604,800 s / 11,000 points
    assert (7 * 86400) / step_for(Window(0, 7 * 86400), 15.0) <= MAX_POINTS


def test_grid_points_are_multiples_of_the_step_inside_the_window():
    assert grid_points(Window(100.0, 400.0), 60.0) == (120.0, 5)          # 120, 180, …, 360
    assert grid_points(Window(100.0, 110.0), 60.0) == (120.0, 0)


def test_each_point_holds_the_samples_after_the_previous_point_up_to_itself():
    # Two series sampled every 15 s, reduced to 60 s points at 60 and 120.
    t = np.repeat([15.0, 30.0, 45.0, 60.0, 75.0, 90.0, 105.0, 120.0], 2)
    series = np.tile([0, 1], 8)
    util = np.array([10, 0, 20, 0, 30, 0, 40, 100, 50, 0, 60, 0, 70, 0, 80, 0], np.float32)
    steps = np.arange(16, dtype=np.float64)
    up = np.array([1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], np.float32)
    times, rows, out = reduce_rows(t, series, 2, {"gpu_util": util, "energy_mj": steps, "up": up}, "gpu",
                                   first=60.0, step=60.0)
    assert times.tolist() == [60.0, 60.0, 120.0, 120.0] and rows.tolist() == [0, 1, 0, 1]
    assert out["gpu_util"].tolist() == [25.0, 25.0, 65.0, 0.0]            # avg_over_time
    assert out["gpu_util"].dtype == np.float32
    assert out["energy_mj"].tolist() == [6.0, 7.0, 14.0, 15.0]            # a counter keeps its last value
    assert out["up"].tolist() == [0.0, 1.0, 1.0, 1.0]                     # one lost sample marks the step


def test_a_series_missing_from_a_point_gives_no_row():
    times, rows, out = reduce_rows(np.array([10.0, 70.0, 80.0]), np.array([0, 1, 0]), 2,
                                   {"loss": np.array([1.0, 2.0, 3.0])}, "rank", first=60.0, step=60.0)
    assert list(zip(times.tolist(), rows.tolist(), out["loss"].tolist())) == [(60.0, 0, 1.0), (120.0, 0, 3.0),
                                                                               (120.0, 1, 2.0)]


def test_gauges_are_averaged_counters_keep_their_last_value():
    expected = {("gpu", "gpu_util"): "avg", ("gpu", "power_w"): "avg", ("gpu", "energy_mj"): "last",
                ("gpu", "nvlink_bandwidth_mbps"): "last", ("gpu", "nvlink_tx_bytes"): "last",
                ("gpu", "xid_total"): "last", ("gpu", "last_xid"): "last", ("gpu", "up"): "min",
                ("gpu", "throttle_reasons"): "max", ("node", "cpu_utilization"): "avg",
                ("rank", "loss"): "last", ("rank", "steps"): "last", ("alloc", "share"): "last"}
    assert {key: reduction(*key) for key in expected} == expected


def test_the_recording_reduces_each_column_as_its_promql_query_does():
    for q in QUERIES:
        if q.column != "_info":          # node info carries labels, not a value
            assert reduction(q.table, q.column) == q.over_time, (q.table, q.column)


def test_a_missing_sample_among_a_steps_samples_is_passed_over_quietly(recwarn):
    """As PromQL's max_over_time and min_over_time: a NaN sample (a reading the agent had
    none of) is passed over, and a step is NaN only where all its samples are."""
    nan = np.nan
    throttle = np.array([nan, 4.0, 2.0, nan, nan, nan], np.float32)
    up = np.array([1.0, nan, nan, 0.0, nan, nan], np.float32)
    times, rows, out = reduce_rows(np.repeat([30.0, 60.0, 120.0], 2), np.tile([0, 1], 3), 2,
                                   {"throttle_reasons": throttle, "up": up}, "gpu", first=60.0, step=60.0)
    assert times.tolist() == [60.0, 60.0, 120.0, 120.0]
    assert out["throttle_reasons"].tolist()[:2] == [2.0, 4.0] and np.isnan(out["throttle_reasons"][2:]).all()
    assert out["up"].tolist()[:2] == [1.0, 0.0] and np.isnan(out["up"][2:]).all()
    assert not recwarn.list
