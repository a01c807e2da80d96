"""dcgm-exporter's counters: its default set is exported, and a counters file in its format
(`--collectors`) chooses the DCGM series, through the real `burnrate agent --once`.

tests/data/dcgm-exporter-default-counters.csv holds the enabled rows of dcgm-exporter 4.8's
own etc/default-counters.csv: the expectations come from that file, not from burnrate's
catalog."""
import os
import re
import subprocess

import pytest

from tests.conftest import PYTHON, ROOT

DEFAULT_COUNTERS = os.path.join(ROOT, "tests", "data", "dcgm-exporter-default-counters.csv")


def rows(path: str) -> list[tuple[str, str]]:
    out = []
    with open(path) as fh:
        for line in fh:
            if line.strip() and not line.lstrip().startswith("#"):
                field, type_, _ = (part.strip() for part in line.split(",", 2))
                out.append((field, type_))
    return out


def agent_once(tmp_path, *args):
    return subprocess.run([PYTHON, "-m", "burnrate", "agent", "--backend", "simulated", "--gpus", "2", "--once",
                           "--telemetry-socket", str(tmp_path / "t.sock"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def series(exposition: str) -> dict[str, list[str]]:
    """Series name -> the label sets of its samples."""
    out: dict[str, list[str]] = {}
    for line in exposition.splitlines():
        m = re.match(r"([A-Za-z_:][\w:]*)(\{[^}]*\})? ", line)
        if m and not line.startswith("#"):
            out.setdefault(m[1], []).append(m[2] or "")
    return out


@pytest.mark.parametrize("args", [(), ("--collectors", DEFAULT_COUNTERS)], ids=["no file", "the default file"])
def test_a_simulated_node_exports_every_field_of_dcgm_exporters_default_set(tmp_path, args):
    proc = agent_once(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    exported = series(proc.stdout)
    for field, type_ in rows(DEFAULT_COUNTERS):
        if type_ == "label":
            continue
        assert len(exported.get(field, [])) == 2, f"{field}: {exported.get(field)}"
        # dcgm-exporter's label, on each of its series: the simulated driver's version.
        assert all('DCGM_FI_DRIVER_VERSION="580.95.05"' in labels for labels in exported[field]), field
    assert "DCGM_FI_DRIVER_VERSION" not in "".join(exported["burnrate_gpu_up"])
    # Fields outside the default set are not exported without a file asking for them.
    assert "DCGM_FI_PROF_SM_ACTIVE" not in exported and "DCGM_FI_DEV_FB_TOTAL" not in exported


def test_a_counters_file_turns_fields_on_and_off(tmp_path):
    chosen = tmp_path / "counters.csv"
    chosen.write_text("# our own set\n"
                      "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
                      "DCGM_FI_DEV_FB_TOTAL, gauge, Framebuffer memory total (in MiB).\n"
                      "DCGM_FI_PROF_SM_ACTIVE,          gauge, The ratio of cycles an SM has at least 1 warp assigned.\n"
                      "DCGM_FI_PROF_NVLINK_TX_BYTES, gauge, NVLink transmit bytes per second.\n"
                      "DCGM_FI_DEV_POWER_VIOLATION, counter, Throttling duration due to power constraints (in ns).\n")
    proc = agent_once(tmp_path, "--collectors", str(chosen))
    assert proc.returncode == 0, proc.stderr
    exported = series(proc.stdout)
    assert {n for n in exported if n.startswith("DCGM_")} == {
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_DEV_POWER_VIOLATION"}
    total = [float(line.rsplit(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("DCGM_FI_DEV_FB_TOTAL{")]
    assert total == [81559.0, 81559.0]
    # No label row in the file: no driver version label.
    assert not any("DCGM_FI_DRIVER_VERSION" in labels for labels in exported["DCGM_FI_DEV_GPU_UTIL"])
    # burnrate's own series do not depend on the file.
    assert len(exported["burnrate_gpu_up"]) == 2 and "burnrate_node_info" in exported
    # The file leaves out fields burnrate's findings read: one warning names them.
    warning = [line for line in proc.stderr.splitlines() if "leaves out" in line]
    assert len(warning) == 1 and "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" in warning[0]
    assert "DCGM_FI_DEV_GPU_UTIL," not in warning[0].split("leaves out", 1)[1]


@pytest.mark.parametrize("text,says", [
    ("DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_NOT_A_FIELD, gauge, nope\n",
     "counters.csv:2: DCGM_FI_DEV_NOT_A_FIELD is not a field burnrate reads"),
    ("\n# comment\nDCGM_FI_DEV_GPU_UTIL gauge no commas\n", "counters.csv:3: expected `field, type, help` (two commas)"),
    ("DCGM_FI_DEV_GPU_UTIL, gague, typo\n", "counters.csv:1: 'gague' is not a Prometheus type"),
    ("DCGM_FI_DEV_SERIAL, label, Device Serial Number\n", "counters.csv:1: DCGM_FI_DEV_SERIAL is not a label burnrate can add"),
], ids=["unknown field", "too few commas", "unknown type", "unknown label"])
def test_a_bad_counters_file_is_one_line_naming_the_line(tmp_path, text, says):
    (tmp_path / "counters.csv").write_text(text)
    proc = agent_once(tmp_path, "--collectors", str(tmp_path / "counters.csv"))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert says in line and line.startswith("burnrate agent: error: "), line


def test_a_missing_counters_file_is_one_line(tmp_path):
    proc = agent_once(tmp_path, "--collectors", str(tmp_path / "nowhere.csv"))
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert "nowhere.csv: cannot read the counters file" in line
