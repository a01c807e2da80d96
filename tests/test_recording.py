"""The recording: what the agent writes, pandas reads back; a crash loses nothing already written."""
import json
import os
import subprocess

import numpy as np
import pandas as pd
import pytest

from burnrate.agent.recording import Recorder
from burnrate.analyzer.sources import recording_tables
from burnrate.analyzer.sources.recording_tables import RecordingError, Span, load_table
from tests.conftest import PYTHON, ROOT
from tests.snapshots import fixed_snapshot


def record(root, snaps):
    recorder = Recorder(str(root))
    for snap in snaps:
        recorder.write(snap)
    recorder.close()


def shifted(snap, dt):
    return snap.__class__(**{**snap.__dict__, "time": snap.time + dt})


def test_round_trip(tmp_path):
    snap = fixed_snapshot()
    record(tmp_path, [shifted(snap, i * 15.0) for i in range(4)])
    gpu = load_table(str(tmp_path), "gpu")
    assert len(gpu) == 8
    assert list(gpu["t"].unique()) == [snap.time + i * 15.0 for i in range(4)]
    first = gpu[gpu["gpu"] == "0"].iloc[0]
    assert first["gpu_util"] == snap.gpus[0].fields["gpu_util"]
    assert first["energy_mj"] == snap.gpus[0].fields["energy_mj"]   # counters kept at f8 precision
    assert first["training_job"] == "llm" and first["Hostname"] == "gpu-node-1"
    assert gpu[gpu["gpu"] == "1"]["training_job"].iloc[0] == ""
    ranks = load_table(str(tmp_path), "rank", ["steps", "loss"])
    assert list(ranks.columns[:1]) == ["t"] and set(ranks["rank"]) == {"0", "1"}
    assert ranks["steps"].iloc[0] == 120
    alloc = load_table(str(tmp_path), "alloc")
    assert len(alloc) == 4 and set(alloc["pod"]) == {"llm-worker-0"}
    xid = load_table(str(tmp_path), "xid")
    assert set(xid["xid"]) == {"79"}
    node = load_table(str(tmp_path), "node")
    assert node["capacity_type"].iloc[0] == "spot"


def test_crash_mid_write_keeps_every_complete_row(tmp_path):
    snap = fixed_snapshot()
    record(tmp_path, [shifted(snap, i) for i in range(5)])
    segment = os.path.join(tmp_path, "gpu", os.listdir(tmp_path / "gpu")[0])
    # a crash: one column got half a value more, another a torn float, keys a torn line
    with open(os.path.join(segment, "gpu_util.f4"), "ab") as fh:
        fh.write(b"\x00\x00")
    with open(os.path.join(segment, "t.f8"), "ab") as fh:
        fh.write(np.array([snap.time + 99], "<f8").tobytes() + b"\x01\x02\x03")
    with open(os.path.join(segment, "keys.jsonl"), "a") as fh:
        fh.write('{"key": 7, "labe')
    gpu = load_table(str(tmp_path), "gpu")
    assert len(gpu) == 10
    assert gpu["t"].max() == snap.time + 4


def mapped_paths_under(root):
    with open("/proc/self/maps", encoding="utf-8") as fh:
        return [line.split()[-1] for line in fh if str(root) in line]


@pytest.mark.parametrize("span", [None, Span(0.0, 4e9, first=0.0, step=60.0)], ids=["as sampled", "reduced"])
def test_a_table_read_in_chunks_at_any_row_is_the_table_read_at_once(tmp_path, monkeypatch, span):
    """Columns are mapped a chunk at a time (recording_tables._mapped_rows): chunks of 7 rows
    start off every page boundary, a 60 s point holds 8 rows (2 GPUs × 4 samples) and is
    never split between chunks, and each chunk's mapping goes with it."""
    snap = fixed_snapshot()
    record(tmp_path, [shifted(snap, i * 15.0) for i in range(40)])
    whole = load_table(str(tmp_path), "gpu", span=span)
    monkeypatch.setattr(recording_tables, "CHUNK_ROWS", 7)
    chunked = load_table(str(tmp_path), "gpu", span=span)
    points = len(np.unique(np.ceil((snap.time + np.arange(40) * 15.0) / 60.0)))
    assert len(whole) == 2 * (40 if span is None else points)
    pd.testing.assert_frame_equal(chunked, whole)
    assert mapped_paths_under(tmp_path) == []


def test_rows_whose_key_was_lost_are_dropped(tmp_path):
    snap = fixed_snapshot()
    record(tmp_path, [snap])
    segment = tmp_path / "gpu" / os.listdir(tmp_path / "gpu")[0]
    keys = (segment / "keys.jsonl").read_text().splitlines(keepends=True)
    (segment / "keys.jsonl").write_text(keys[0])
    assert len(load_table(str(tmp_path), "gpu")) == 1


def test_every_start_opens_a_new_segment(tmp_path):
    snap = fixed_snapshot()
    record(tmp_path, [snap])
    record(tmp_path, [shifted(snap, 1)])
    assert len(os.listdir(tmp_path / "gpu")) == 2
    assert len(load_table(str(tmp_path), "gpu")) == 4


def test_not_a_recording(tmp_path):
    with pytest.raises(RecordingError, match="not a burnrate recording"):
        load_table(str(tmp_path), "gpu")
    record(tmp_path, [fixed_snapshot()])
    with pytest.raises(RecordingError, match="unknown table"):
        load_table(str(tmp_path), "nope")


def test_agent_records(tmp_path):
    out = tmp_path / "rec"
    subprocess.run([PYTHON, "-m", "burnrate", "agent", "--backend", "simulated", "--gpus", "3", "--once",
                    "--telemetry-socket", "", "--record", str(out)], cwd=ROOT, check=True, capture_output=True)
    assert json.loads((out / "burnrate.json").read_text())["format"] == "burnrate-recording"
    assert len(load_table(str(out), "gpu")) == 3


@pytest.fixture
def damaged(tmp_path):
    """A recording, read whole, then with one column file lost from its GPU table."""
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze
    from burnrate.analyzer.sources import RecordingSource
    from burnrate.simulator.simulate import Spec, simulate

    root = tmp_path / "rec"
    simulate(str(root), Spec(nodes=1, gpus_per_node=4, hours=1.0, seed=3, end=1_800_000_000.0))

    def read():
        return analyze(RecordingSource(str(root)).frames(), load_catalog(None))
    return root, read


def test_a_lost_column_reads_as_no_value_and_is_named(damaged):
    """Losing gpu_util.f4 once made the whole GPU table vanish: every job cost $0.00,
    exit 0. Its rows stay (the cost with them) and the report says what is lost."""
    from burnrate.dashboard.aggregate import fleet

    root, read = damaged
    whole = read()
    (root / "gpu" / "simulated" / "gpu_util.f4").unlink()
    hurt = read()
    assert whole.accounting.observed_gpu_hours > 0
    assert hurt.accounting.observed_gpu_hours == pytest.approx(whole.accounting.observed_gpu_hours)
    assert sum(j.cost_dollars for j in hurt.jobs) == pytest.approx(sum(j.cost_dollars for j in whole.jobs))
    assert [m for m in hurt.missing if m.startswith("recording")] == [
        "recording gpu/simulated: gpu_util lost, 960 rows from 2027-01-15T07:00:15Z to 2027-01-15T08:00:00Z "
        "read as no value"]
    # Nothing is called idle or busy on a utilization nobody measured.
    assert hurt.accounting.allocated_gpu_hours > 0
    assert hurt.accounting.util_unknown_gpu_hours == pytest.approx(hurt.accounting.allocated_gpu_hours)
    shown = fleet(hurt.views, hurt.prices)
    assert not shown.busy.any() and not shown.idle.any() and shown.util_unknown.max() > 0


def test_a_lost_time_column_is_named_with_the_rows_it_strands(damaged):
    root, read = damaged
    (root / "alloc" / "simulated" / "t.f8").write_bytes(b"")
    hurt = read()
    assert [m for m in hurt.missing if m.startswith("recording")] == [
        "recording alloc/simulated: no readable time or key column, 720 rows cannot be placed in time"]
    assert hurt.accounting.allocated_gpu_hours == 0 and hurt.accounting.unallocated_gpu_hours > 0
