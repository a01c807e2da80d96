"""A damaged recording is read as far as it can be, and the report names what was cut:
a recording written by `burnrate simulate`, damaged one way, analyzed by `burnrate
analyze --recording` as a user runs it, in a child limited to 4 GiB of address space so
that an allocation sized by damage fails instead of filling the machine."""
import json
import resource
import shutil
import subprocess

import numpy as np
import pytest

from tests.conftest import PYTHON, ROOT

SAMPLES, GPUS, STEP = 240, 4, 15.0          # 1 node x 4 GPUs x 1 h at 15 s, ending 2027-01-15T08:00:00Z
SAMPLE_HOURS = STEP / 3600


def run(*args):
    def four_gib():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    return subprocess.run([PYTHON, "-m", "burnrate", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=four_gib)


def analyze(root):
    out = run("analyze", "--recording", str(root), "--format", "json")
    assert out.returncode == 0 and not out.stderr, out.stderr
    report = json.loads(out.stdout)
    return report["accounting"], [m for m in report["missing_signals"] if m.startswith("recording")]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole") / "rec"
    out = run("simulate", "--out", str(root), "--nodes", "1", "--gpus-per-node", str(GPUS), "--hours", "1",
              "--seed", "3", "--end", "1800000000")
    assert out.returncode == 0, out.stderr
    return root, analyze(root)[0]


@pytest.fixture
def copy(whole, tmp_path):
    shutil.copytree(whole[0], tmp_path / "rec")
    return tmp_path / "rec", tmp_path / "rec" / "gpu" / "simulated", whole[1]


def test_a_value_column_cut_short_reads_as_no_value_and_is_named(copy):
    """Cut to a tenth, gpu_util once made its GPU-hours "utilization unknown" with no word why."""
    root, gpu, whole = copy
    kept = SAMPLES // 10 * GPUS
    with open(gpu / "gpu_util.f4", "r+b") as fh:
        fh.truncate(kept * 4)
    accounting, notes = analyze(root)
    assert notes == [f"recording gpu/simulated: gpu_util cut short, {GPUS * SAMPLES - kept:,} rows from "
                     "2027-01-15T07:06:15Z to 2027-01-15T08:00:00Z read as no value"]
    assert accounting["observed_gpu_hours"] == whole["observed_gpu_hours"] == GPUS
    assert accounting["allocated_gpu_hours"] == whole["allocated_gpu_hours"]
    # Only the first tenth of each GPU's samples has a utilization: the rest is unknown (counted busy).
    assert whole["util_unknown_gpu_hours"] == 0
    assert accounting["util_unknown_gpu_hours"] == pytest.approx(0.9 * whole["allocated_gpu_hours"],
                                                                 abs=SAMPLE_HOURS * GPUS)


def test_an_impossible_time_drops_its_row_only_and_is_named(copy):
    """A time of year 33658 in the middle once hid half the hours, silently."""
    root, gpu, whole = copy
    t = np.fromfile(gpu / "t.f8", "<f8")
    t[len(t) // 2] = 1.0e12
    t.tofile(gpu / "t.f8")
    accounting, notes = analyze(root)
    assert notes == ["recording gpu/simulated: 1 row with an impossible time (before 2000 or after 2100) dropped"]
    assert accounting["observed_gpu_hours"] == pytest.approx(whole["observed_gpu_hours"], abs=SAMPLE_HOURS)
    assert accounting["allocated_gpu_hours"] == pytest.approx(whole["allocated_gpu_hours"], abs=SAMPLE_HOURS)


def test_times_out_of_order_drop_their_rows_and_are_named(copy):
    root, gpu, whole = copy
    t = np.fromfile(gpu / "t.f8", "<f8")
    t[len(t) // 2:len(t) // 2 + GPUS] -= 3600.0   # one sample's rows dated an hour back, still possible
    t.tofile(gpu / "t.f8")
    accounting, notes = analyze(root)
    assert notes == [f"recording gpu/simulated: {GPUS} rows out of time order dropped"]
    assert accounting["observed_gpu_hours"] == pytest.approx(whole["observed_gpu_hours"], abs=SAMPLE_HOURS * GPUS)


def test_absurd_and_unreadable_keys_are_dropped_and_named(copy):
    """{"key": 4000000000} once sized an array by it: a 29.8 GiB allocation and a traceback."""
    root, gpu, whole = copy
    labels = json.loads((gpu / "keys.jsonl").read_text().splitlines()[0])["labels"]
    with open(gpu / "keys.jsonl", "a") as fh:
        fh.write(json.dumps({"key": 4_000_000_000, "labels": labels}) + "\n")
        fh.write('{"key": 9, "labels": {"gpu": 0}}\n')
        fh.write("not json\n")
    accounting, notes = analyze(root)
    assert notes == ["recording gpu/simulated: 3 unreadable lines in keys.jsonl, the rows of their series dropped"]
    assert accounting == whole


def test_a_time_column_cut_short_strands_the_rows_past_it_and_says_so(copy):
    root, gpu, whole = copy
    with open(gpu / "t.f8", "r+b") as fh:
        fh.truncate(SAMPLES // 2 * GPUS * 8)
    accounting, notes = analyze(root)
    assert notes == [f"recording gpu/simulated: {SAMPLES // 2 * GPUS:,} rows past the end of its time or key "
                     "column cannot be placed in time"]
    # The held GPUs stay observed through their holders' rows (the alloc table); the one held
    # by nobody is seen for the first half hour only.
    assert whole["unallocated_gpu_hours"] == 1
    assert accounting["observed_gpu_hours"] == pytest.approx(whole["observed_gpu_hours"] - 0.5, abs=SAMPLE_HOURS)
    assert accounting["unallocated_gpu_hours"] == pytest.approx(0.5, abs=SAMPLE_HOURS)
