"""bench/gpu/run: the one line where no GPU is, and its pure parts on nvidia-smi's recorded
output (tests/data/nvidia-smi/query-gpu.csv: `--format=csv,noheader,nounits`, the order of
bench/gpu/smi.py's query)."""
import os
import subprocess
import sys

import pytest

from tests.conftest import PYTHON, ROOT
from tests.test_counters import agent_once

sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
import dcgm_defaults  # noqa: E402
import smi  # noqa: E402

SAMPLE = os.path.join(ROOT, "tests", "data", "nvidia-smi", "query-gpu.csv")


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    # A PATH with no nvidia-smi on it, whatever this machine has.
    proc = subprocess.run([PYTHON, os.path.join(ROOT, "bench", "gpu", "run")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["no NVIDIA GPU here (nvidia-smi is missing or lists none): nothing to measure"]
    assert proc.stderr == ""


def sample():
    with open(SAMPLE) as fh:
        return smi.parse(fh.read())


def test_nvidia_smi_rows_are_read_in_the_query_order_and_unsupported_values_are_none():
    first, second = sample()
    assert first["uuid"] == "GPU-5a2c9e3e-1f0b-4e52-9a7d-0c1f8f3b2d11"
    assert (first["utilization.gpu"], first["memory.used"], first["power.draw"], first["clocks.sm"]) == (
        87.0, 40962.0, 512.34, 1980.0)
    assert second["utilization.encoder"] is None and second["temperature.memory"] is None
    assert second["temperature.gpu"] == 31.0


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="gave 3 values where 15 were asked"):
        smi.parse("0, GPU-x, 87\n")


def reader_fields(**changed):
    """What the reader would give for the sample's first GPU, a moment later."""
    fields = {"gpu_util": 84.0, "mem_copy_util": 43.0, "enc_util": 0.0, "dec_util": 0.0, "fb_used_mib": 40962.0,
              "fb_free_mib": 39119.0, "fb_total_mib": 81559.0, "fb_reserved_mib": 478.0, "power_w": 498.7,
              "sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0, "temp_c": 62.0, "memory_temp_c": 70.0}
    return {**fields, **changed}


def test_readings_within_what_a_moment_can_move_agree_field_by_field():
    checks = smi.compare(reader_fields(), sample()[0])
    assert [c.verdict for c in checks] == ["ok"] * len(smi.PAIRS)
    assert {c.field for c in checks} == {p.field for p in smi.PAIRS}


def test_a_field_that_differs_or_that_one_side_lacks_is_named():
    fields = reader_fields(power_w=300.0, sm_clock_mhz=1410.0)
    del fields["memory_temp_c"]
    verdicts = {c.field: c.verdict for c in smi.compare(fields, sample()[0])}
    assert verdicts["power_w"] == "DIFFERS" and verdicts["sm_clock_mhz"] == "DIFFERS"
    assert verdicts["memory_temp_c"] == "nvidia-smi only"
    verdicts = {c.field: c.verdict for c in smi.compare(reader_fields(), sample()[1])}
    assert verdicts["enc_util"] == "reader only" and verdicts["memory_temp_c"] == "reader only"
    assert verdicts["gpu_util"] == "DIFFERS"   # 84% read against 0%


def test_the_checks_print_as_a_results_table():
    lines = smi.rows(smi.compare(reader_fields(power_w=300.0), sample()[0]))
    assert lines[0].startswith("| GPU | reader field | nvidia-smi |") and len(lines) == 2 + len(smi.PAIRS)
    assert "| GPU-5a2c9e3e | power_w | power.draw | 300.0 | 512.3 | 51.234 | DIFFERS |" in lines


def test_a_simulated_agent_exports_the_whole_default_set_and_a_missing_series_is_named(tmp_path):
    defaults = dcgm_defaults.default_series()
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE"} <= defaults
    assert "DCGM_FI_DRIVER_VERSION" not in defaults   # a label row
    proc = agent_once(tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = dcgm_defaults.exported(proc.stdout)
    result = dcgm_defaults.compare(defaults, names)
    assert result["missing"] == [] and result["exported"] == sorted(defaults)
    result = dcgm_defaults.compare(defaults, names - {"DCGM_FI_DEV_MEM_CLOCK"})
    assert result["missing"] == ["DCGM_FI_DEV_MEM_CLOCK"]
    assert f"| dcgm-exporter default series exported, on 2 GPU(s) | {len(defaults) - 1} of {len(defaults)} |" in \
        dcgm_defaults.rows(result, 2)


# Recorded on one NVIDIA H200 (driver 580.159.04): `nvidia-smi -q -x` under a bf16 matrix load,
# the agent's NvmlReader on the same GPU a moment before it, and `--query-gpu` on another
# H200 under the same load (bench/RESULTS.md, "GPU").
H200 = os.path.join(ROOT, "tests", "data", "nvidia-smi")


def test_the_detailed_fields_are_read_from_a_real_h200s_xml():
    import smi_xml

    with open(os.path.join(H200, "h200-q.xml")) as fh:
        (uuid, values), = smi_xml.parse(fh.read()).items()
    assert uuid == "GPU-02aecaaf-0ddc-d055-54cd-dced9167d30d"
    assert values == {
        "max_clocks/sm_clock": 1980.0, "max_clocks/mem_clock": 3201.0,
        "gpu_power_readings/current_power_limit": 700.0,
        "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_power_cap": 168_480_000.0,   # ns
        "clocks_event_reasons": 4.0,   # "SW Power Cap: Active", NVML's nvmlClocksEventReasonSwPowerCap
        "ecc_errors/volatile (correctable)": 0.0, "ecc_errors/volatile (uncorrectable)": 0.0,
        "remapped_rows/remapped_row_corr": 0.0, "remapped_rows/remapped_row_unc": 0.0,
        "remapped_rows/remapped_row_failure": 0.0, "pci/replay_counter": 0.0}


def test_the_readers_fixed_fields_agree_with_that_xml():
    import json
    import smi_xml

    with open(os.path.join(H200, "h200-q.xml")) as fh:
        theirs = smi_xml.parse(fh.read())
    with open(os.path.join(H200, "h200-reader-fields.json")) as fh:
        ours = json.load(fh)
    checks = smi.compare(ours["fields"], theirs[ours["uuid"]], smi_xml.PAIRS, ours["uuid"])
    verdicts = {c.field: c.verdict for c in checks}
    # The reader read before the load began (power 144 W), nvidia-smi after (SW power cap
    # active): the event reasons differ by when, not by what; everything else agrees.
    assert verdicts.pop("throttle_reasons") == "DIFFERS"
    assert set(verdicts.values()) == {"ok"}, verdicts


def test_a_real_h200s_query_row_is_read_in_the_query_order():
    with open(os.path.join(H200, "h200-query-gpu-under-load.csv")) as fh:
        (row,) = smi.parse(fh.read())
    assert (row["uuid"], row["utilization.gpu"], row["memory.reserved"], row["power.draw"], row["clocks.sm"],
            row["temperature.memory"]) == ("GPU-f53a57c1-ba66-3d67-8dcd-7c80979db7ac", 100.0, 616.0, 691.54,
                                           1485.0, 48.0)


def gpu_run_module():
    """bench/gpu/run, a script without a .py suffix, as a module."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("bench_gpu_run", os.path.join(ROOT, "bench", "gpu", "run"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_the_energy_counter_is_compared_over_the_seconds_between_two_fresh_reads_of_it():
    # A card ramping from 400 W to 600 W over 10 s draws 5,000 J; the reader holds the counter
    # between fresh reads (at 0 s and 10 s), and samples after the second read, at another
    # power, must not enter the window.
    start_mj = 9_000_000.0
    ramp = [(float(t), 400.0 + 20.0 * t, start_mj) for t in range(10)]
    after = [(10.0, 600.0, start_mj + 5_000_000.0), (11.0, 100.0, start_mj + 5_000_000.0)]
    stalled = [(float(t), 300.0, start_mj) for t in range(12)]
    rows = gpu_run_module().energy_rows({"GPU-ramping-card": ramp + after, "GPU-stalled-card": stalled})
    assert rows[-2] == "| GPU-ramping- | 10.00 | 5,000.0 | 5,000.0 | +0.0% |"
    assert rows[-1] == "| GPU-stalled- | – | the counter did not move in 11.0 s | – | – |"


def test_a_counter_that_reads_3_percent_high_shows_so():
    run = gpu_run_module()
    rows = run.energy_rows({"GPU-a": [(0.0, 500.0, 0.0), (5.0, 500.0, 0.0), (10.0, 500.0, 5_150_000.0)]})
    assert rows[-1] == "| GPU-a | 10.00 | 5,150.0 | 5,000.0 | +3.0% |"


# The reference trainer on one H200 (driver 580.159.04, torch 2.11.0+cu130), its monitor's
# own records (`--telemetry-jsonl`): gpt2-124m in bf16 with torch.compile, batch 16 fed by
# the synthetic stream and starved by 50 ms a batch, with the monitor that counts a wait as
# far as the GPU waited; and, before it, batch 32 fed, stopped by SIGTERM and resumed, with
# the monitor that counted the host's whole wait (bench/RESULTS.md, "GPU").
TRAINER = os.path.join(ROOT, "tests", "data", "h200-trainer")


def trainer_records(name: str) -> list[dict]:
    import json

    with open(os.path.join(TRAINER, f"{name}.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def test_the_trainers_step_time_splits_by_its_records_on_a_real_h200():
    rows = gpu_run_module().split_rows([(name, trainer_records(name))
                                        for name in ("before-fed-batch32", "fed", "starved")])
    assert rows[2:] == [
        # The host's 3.1% wait for batches ran beside the GPU's queued steps: counted in full,
        # compute and wait exceed the step time.
        "| before-fed-batch32 | 443 | 27.07 | 100.4% | 3.1% | -3.5% | 46.3% |",
        "| fed | 199 | 6.43 | 100.1% | 0.2% | -0.2% | 43.8% |",
        # The GPU waited 55% of the time: the host's 50 ms a batch less the queued steps' work.
        "| starved | 59 | 4.10 | 45.3% | 55.0% | -0.3% | 20.4% |"]


def test_the_first_report_of_each_process_is_left_out():
    records = trainer_records("before-fed-batch32")
    starts = [r for r in records if r["steps"] and r["step"] - r["steps"] == (r["resumed_from"] or 0)]
    assert [(r["step"], r["resumed_from"]) for r in starts] == [(1, 0), (406, 405)]
    assert all(r["step_s"] > 2.0 for r in starts)   # compilation, in each process


def test_the_revision_names_the_files_tree_where_they_differ_from_the_commit(tmp_path):
    """A GPU machine may get a copy of the tree whose git metadata is older than its files."""
    import tree

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True,
                              env={**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
                                   "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}).stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-q", "-m", "first")
    first = git("rev-parse", "--short", "HEAD")
    assert tree.revision(str(tmp_path)) == first
    (tmp_path / "code.py").write_text("x = 2\n")
    (tmp_path / "new.py").write_text("y = 1\n")
    copied = tree.revision(str(tmp_path))
    assert git("status", "--porcelain") == "M code.py\n?? new.py"       # its staging left as it was
    git("add", "-A")
    git("commit", "-q", "-m", "second")
    assert copied == f"{first} with changes (the files' tree {git('rev-parse', 'HEAD^{tree}')[:12]})"



def test_the_revision_outside_a_repository_is_unknown(tmp_path):
    import tree

    assert tree.revision(str(tmp_path)) == "unknown"
