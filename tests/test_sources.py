"""RecordingSource, the PromQL selector and the CLI's time parsing."""
import pytest

from burnrate.agent.recording import Recorder
from burnrate.exporter.recording import TABLES
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.sources.recording_tables import RecordingError
from burnrate.simulator.simulate import Spec, simulate
from burnrate.analyzer.sources import RecordingSource, selector
from burnrate.analyzer.sources.timeparse import format_time, parse_duration, parse_time, resolve_window
from tests.snapshots import fixed_snapshot

END = 1_800_000_000.0


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("rec") / "fleet")
    simulate(out, Spec(nodes=2, gpus_per_node=4, hours=1.0, end=END, seed=5))
    return out


def test_whole_recording_by_default(recording):
    frames = RecordingSource(recording).frames()
    assert frames.window == Window(END - 3585.0, END)
    assert frames.step_s == 15.0 and frames.simulated
    assert len(frames.gpu) == 8 * 240
    # Beyond the recording's columns: the time each row stands for, the allocation signal, and
    # which rank rows are a sample held over.
    extra = {"gpu": ["held_s"], "alloc": ["signal", "held_s"], "rank": ["repeated"]}
    for table, (labels, columns) in TABLES.items():
        assert list(getattr(frames, table).columns) == ["t", *columns, *labels, *extra.get(table, [])]
    assert (frames.gpu["held_s"] == 15.0).all() and (frames.alloc["signal"] == "share_ratio").all()


def test_window_cut_is_inclusive(recording):
    frames = RecordingSource(recording).frames(Window(END - 600.0, END - 300.0))
    assert frames.gpu["t"].min() == END - 600.0 and frames.gpu["t"].max() == END - 300.0
    assert frames.gpu["t"].nunique() == 21
    for table in TABLES:
        t = getattr(frames, table)["t"]
        assert t.empty or (t.between(END - 600.0, END - 300.0).all())


def test_empty_window(recording):
    frames = RecordingSource(recording).frames(Window(0.0, 100.0))
    assert all(getattr(frames, t).empty for t in TABLES) and frames.missing == ()


def test_agent_recording_without_training_names_what_is_missing(tmp_path):
    snap = fixed_snapshot()
    snap = snap.__class__(**{**snap.__dict__, "ranks": ()})
    recorder = Recorder(str(tmp_path))
    for k in range(3):
        recorder.write(snap.__class__(**{**snap.__dict__, "time": snap.time + 10.0 * k}))
    recorder.close()
    frames = RecordingSource(str(tmp_path)).frames()
    assert frames.step_s == 10.0 and frames.missing == ("training telemetry",)


def test_not_a_recording(tmp_path):
    with pytest.raises(RecordingError, match="not a burnrate recording"):
        RecordingSource(str(tmp_path))


def test_selector_escapes_values():
    assert selector("up", job="a") == 'up{job="a"}'
    assert selector(training_job='x"} or vector(1) #') == '{training_job="x\\"} or vector(1) #"}'
    assert selector(pod="a\\b\nc") == '{pod="a\\\\b\\nc"}'
    with pytest.raises(ValueError, match="label name"):
        selector(**{"bad-name": "x"})
    with pytest.raises(ValueError, match="metric name"):
        selector("up} or vector(1")


@pytest.mark.parametrize("text, seconds", [("90m", 5400), ("2h", 7200), ("7d", 604800), ("1h30m", 5400),
                                           ("500ms", 0.5), ("1w", 604800)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "h", "2x", "-1h", "0s", "1.5h", "1001y", "100000y"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_times():
    assert parse_time("2026-11-21T03:00:00Z") == 1795230000.0
    assert parse_time("2026-11-21T04:00:00+01:00") == 1795230000.0
    assert parse_time("2026-11-21T03:00:00") == 1795230000.0
    assert parse_time("1795230000") == parse_time("1795230000.0") == 1795230000.0
    assert format_time(1795230000.0) == "2026-11-21T03:00:00Z"
    with pytest.raises(ValueError, match="invalid time 'soon'"):
        parse_time("soon")
    for text in ("nan", "inf", "-5", "1e300", "1969-12-31T23:59:59Z"):
        with pytest.raises(ValueError, match="outside 1970-01-01 to 9999-12-31"):
            parse_time(text)
    assert parse_time("9999-12-31T23:59:59Z") == 253402300799.0


def test_windows():
    now = 1795230000.0
    assert resolve_window(now=now) is None
    assert resolve_window(since="2h", now=now) == Window(now - 7200, now)
    assert resolve_window(start="1795220000", now=now) == Window(1795220000.0, now)
    assert resolve_window(start="1795220000", end="2026-11-21T03:00:00Z", now=now) == Window(1795220000.0, now)
    with pytest.raises(ValueError, match="either --since or --start"):
        resolve_window(since="1h", start="1795220000", now=now)
    with pytest.raises(ValueError, match="before it starts"):
        resolve_window(start="1795230000", end="1795220000", now=now)
    with pytest.raises(ValueError, match="--end needs --start"):
        resolve_window(end="1795220000", now=now)
