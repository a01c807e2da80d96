"""A disk that refuses writes part-way through a batch, then takes them again: the recording
loses nothing it could hold, duplicates nothing, and never pairs a value with another
sample's time.

The disk is refused for real: RLIMIT_FSIZE makes write() past a file size fail with
EFBIG (SIGXFSZ ignored) after writing what fits, exactly as ENOSPC does on a full
filesystem, with no root needed for a small filesystem. Limits are per process, so the
writer runs in a child."""
import json
import os
import re
import resource
import signal
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

from burnrate.analyzer.sources.recording_tables import load_table
from burnrate.exporter.recording import TABLES
from tests.conftest import PYTHON, ROOT, free_port
from tests.processes import stop, wait_http

START = 1_700_000_000.0
WRITER = r"""
import json, logging, os, resource, signal, sys
from burnrate.agent.attribution.static import StaticAttributor
from burnrate.agent.gpu.simulated import SimulatedReader
from burnrate.agent.recording import Recorder
from burnrate.agent.sampler import Sampler
from burnrate.exporter.snapshot import Allocation, NodeInfo, PodRef

root, start, (before, during, after, max_pending) = sys.argv[1], float(sys.argv[2]), map(int, sys.argv[3:])
logging.basicConfig(level=logging.INFO, format="%(message)s")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() past the limit fails with EFBIG instead
now = [0.0]
reader = SimulatedReader(2, seed=3, clock=lambda: now[0])
uuid = reader.read()[0].identity.uuid
holder = [Allocation(uuid, uuid, PodRef("ml", "w-0", "trainer", "llm"))]
sampler = Sampler(node_name="n", reader=reader, attribution=StaticAttributor(NodeInfo("n"), lambda: holder),
                  clock=lambda: now[0])
recorder = Recorder(root, max_pending_rows=max_pending)
sampled, failed = [], 0
for k in range(before + during + after):
    if k == before:  # the disk fills: room for 12 more bytes, a row and a half of a counter column
        size = os.path.getsize(os.path.join(root, "gpu", os.listdir(os.path.join(root, "gpu"))[0], "t.f8"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 12, resource.RLIM_INFINITY))
    if k == before + during:  # and is freed
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    now[0] = start + 15.0 * k
    snap = sampler.collect()
    sampled += [[snap.time, g.identity.uuid, g.fields["gpu_util"], g.fields["energy_mj"]] for g in snap.gpus]
    try:
        recorder.write(snap)
    except OSError:
        failed += 1
recorder.close()
print(json.dumps({"sampled": sampled, "failed": failed, "dropped": recorder.dropped}))
"""


def write_through_full_disk(root, before, during, after, max_pending):
    out = subprocess.run([PYTHON, "-c", WRITER, str(root), str(START), str(before), str(during), str(after), str(max_pending)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def assert_columns_in_lockstep(root):
    """Every column file of every segment holds the same number of whole rows."""
    for table, (_labels, columns) in TABLES.items():
        for segment in os.listdir(root / table):
            rows = {c: os.path.getsize(root / table / segment / f"{c}.{d}") / int(d[1])
                    for c, d in {"t": "f8", "key": "u4", **columns}.items()}
            assert len(set(rows.values())) == 1, (table, rows)


def recorded(root):
    gpu = load_table(str(root), "gpu", ["gpu_util", "energy_mj"])
    return [[r.t, r.UUID, r.gpu_util, r.energy_mj] for r in gpu.itertuples()]


def expected(sampled, samples):
    """The sampled rows of the sample numbers given, as the recording holds them (gpu_util is f4)."""
    times = {START + 15.0 * k for k in samples}
    return [[t, uuid, float(np.float32(util)), energy] for t, uuid, util, energy in sampled if t in times]


def test_a_full_disk_loses_no_row_and_pairs_every_value_with_its_time(tmp_path):
    """Once, each retry wrote the rows again: t.f8 ended with 546 rows and every other
    column 436, one time written 22 times, every later value paired with a time
    ~5.5 s early."""
    root = tmp_path / "rec"
    result, log = write_through_full_disk(root, before=20, during=10, after=5, max_pending=1000)
    assert result["failed"] == 10 and result["dropped"] == 0
    assert_columns_in_lockstep(root)
    assert recorded(root) == expected(result["sampled"], range(35))
    assert "failing (File too large): rows are held in memory, the newest 1,000 per table" in log
    assert "resumed: " in log and ", 0 dropped while it failed" in log


def test_rows_held_past_the_bound_drop_the_oldest_and_say_so(tmp_path):
    root = tmp_path / "rec"
    result, log = write_through_full_disk(root, before=20, during=10, after=5, max_pending=6)
    # 2 GPUs a sample: 6 rows keep the last 3 failed samples, the other 7 samples' rows are
    # dropped. The tables of one row a sample have room left for those 10 samples.
    assert result["failed"] == 10 and result["dropped"] == 7 * 2
    assert_columns_in_lockstep(root)
    assert recorded(root) == expected(result["sampled"], [*range(20), *range(27, 35)])
    assert "still failing: rows beyond 6 per table are dropped, the oldest first" in log
    assert ", 14 dropped while it failed" in log


def test_rows_still_refused_at_close_are_logged_as_lost(tmp_path):
    root = tmp_path / "rec"
    result, log = write_through_full_disk(root, before=20, during=5, after=0, max_pending=1000)
    assert result["failed"] == 5
    assert_columns_in_lockstep(root)
    assert recorded(root) == expected(result["sampled"], range(20))
    assert "10 rows never written (File too large)" in log


@pytest.mark.slow
def test_the_agent_counts_and_logs_a_refusing_disk_and_resumes(tmp_path):
    """`burnrate agent --record` on a disk that fills, then is freed: the error counter
    and the log say so, and the recording stays whole."""
    root, port = tmp_path / "rec", free_port()

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))

    # The log goes to a pipe: the file-size limit would refuse a log file too.
    proc = subprocess.Popen([PYTHON, "-m", "burnrate", "agent", "--backend", "simulated", "--gpus", "2",
                             "--listen", f"127.0.0.1:{port}", "--telemetry-socket", "", "--interval", "0.05",
                             "--record", str(root)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=small_disk)
    lines: list[str] = []
    drain = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    drain.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        errors = wait_for(lambda: record_errors(port) or None)
        assert any("failing (File too large)" in line for line in lines)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        wait_for(lambda: any("resumed:" in line for line in lines) or None)
        assert record_errors(port) >= errors
    finally:
        stop(proc, 10)
        drain.join(10)
    assert_columns_in_lockstep(root)
    gpu = load_table(str(root), "gpu", ["gpu_util"])
    per_gpu = gpu.groupby("gpu", observed=True)["t"]
    assert per_gpu.is_monotonic_increasing.all() and (per_gpu.count() == per_gpu.nunique()).all()
    assert (per_gpu.count() > 2048 // 16).all()  # rows past the limit were written after it was lifted


def record_errors(port) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(r'burnrate_agent_collection_errors_total\{[^}]*collector="record"[^}]*\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def wait_for(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value is not None:
            return value
        time.sleep(0.1)
    raise TimeoutError("condition not met in time")
