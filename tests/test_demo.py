"""`burnrate demo` end to end: real agent, real 2-rank training with faults, the analyzer naming them."""
import contextlib
import json
import os
import re
import signal
import subprocess
import time

import psutil

import pytest

from burnrate.analyzer.detectors.config_file import load_detector_config
from burnrate.analyzer.pricing import load_catalog
from burnrate.analyzer.sources import RecordingSource
from burnrate.dashboard.data import DataService
from burnrate.dashboard.filters import FindingFilters
from burnrate.dashboard.timerange import ALL, from_query
from burnrate.demo import CHECKPOINT_EVERY, JOBS, MIN_DURATION_S, NAMESPACE
from tests.conftest import PYTHON, ROOT, free_port

pytestmark = pytest.mark.slow

# finding kind -> the one job the demo injects it into
INJECTED = {"straggler": "demo/llm-pretrain", "dataloader_starvation": "demo/llm-finetune",
            "diverging": "demo/llm-unstable"}


def test_demo_names_the_injected_faults_at_its_shortest_duration(tmp_path):
    proc = subprocess.run([PYTHON, "-m", "burnrate", "demo", "--duration", f"{MIN_DURATION_S:g}", "--no-browser",
                           "--dir", str(tmp_path / "demo"), "--port", str(free_port()),
                           "--agent-port", str(free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    live = proc.stdout.split("=== live training on this machine")[1].split("=== simulated fleet ===")[0]
    findings = [line.split() for line in live.splitlines() if line.startswith(("critical", "warning", "info"))]
    assert {(f[1], f[2]) for f in findings if f[1] in INJECTED} == set(INJECTED.items()), live
    straggler = next(f for f in findings if f[1] == "straggler")
    assert "demo-node:gpu1 rank 1" in " ".join(straggler), live
    diverging = next(f for f in findings if f[1] == "diverging")
    assert diverging[0] == "critical" and "non_finite" in diverging, live
    assert "=== simulated fleet ===" in proc.stdout
    # The job that crashed and resumed from its last checkpoint: two runs, and a ledger that
    # shows what the crash cost (the steps computed again, the restart), in the summary and in
    # the JSON the analyzer wrote beside the recording.
    (crashed,) = [job for job in JOBS if job.crash_at]
    resumed_from = (crashed.crash_at - 1) // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    summary = live.split(f"ledger of {NAMESPACE}/{crashed.name}: ", 1)[1].splitlines()[:2]
    assert summary[0].startswith(f"2 runs (resumed from step {resumed_from}), goodput "), live
    assert re.fullmatch(r"  largest badput: [a-z_]+ \$\d+\.\d{4}(, [a-z_]+ \$\d+\.\d{4})*", summary[1]), live
    doc = json.loads((tmp_path / "demo" / "live-analysis.json").read_text())
    (job,) = [j for j in doc["jobs"] if (j["namespace"], j["training_job"]) == (NAMESPACE, crashed.name)]
    assert [r["resumed_from"] for r in job["runs"]] == [0, resumed_from], job["runs"]
    assert job["runs"][0]["last_step_number"] == crashed.crash_at - 1, job["runs"]
    assert job["ledger"]["restart"]["gpu_hours"] > 0 and job["ledger"]["lost_progress"]["gpu_hours"] > 0, job
    assert sum(c["gpu_hours"] for c in job["ledger"].values()) == pytest.approx(job["gpu_hours"], abs=1e-3)
    # The dashboard the demo opened: the same page, range and thresholds show the same faults.
    url = next(line.split("dashboard: ", 1)[1] for line in proc.stdout.splitlines() if "dashboard: http" in line)
    path, _, search = url.partition("?")
    assert path.endswith("/findings")
    service = DataService(RecordingSource(str(tmp_path / "demo" / "recording")), load_catalog(),
                          config=load_detector_config(str(tmp_path / "demo" / "live-thresholds.yaml")))
    keep = FindingFilters.from_query(search).keeps
    shown = [f for f in service.analysis(from_query(search, ALL)).report.findings if keep(f)]
    assert {(f.kind, f"{f.namespace}/{f.training_job}") for f in shown} >= set(INJECTED.items())


@pytest.mark.parametrize("how", ["ctrl-c", "ctrl-c, started in the background", "sigterm", "sigkill"])
def test_stopping_the_demo_stops_everything_it_started(tmp_path, how):
    """Ctrl-C in a terminal signals the whole foreground process group (a shell that started
    the demo in the background hands it SIGINT ignored); kill, timeout, systemd and container
    runtimes send SIGTERM to the demo alone; and the demo may die outright (SIGKILL). Each
    way, its agent, dashboard, launchers and ranks end with it, and where it could, it says
    where the recording is and how to replay it."""
    work = tmp_path / "demo"
    proc = subprocess.Popen([PYTHON, "-m", "burnrate", "demo", "--duration", "600", "--no-browser", "--dir", str(work),
                             "--port", str(free_port()), "--agent-port", str(free_port())],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if "background" in how else None)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("dashboard:" in line for line in lines):
            lines.append(proc.stdout.readline())
        time.sleep(5)                                       # the first trainer is running
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 5, "the demo's agent, dashboard, launcher and two ranks are not all running"
        if how.startswith("ctrl-c"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if how != "sigkill":
        assert proc.returncode == 130, "".join(lines) + rest
        assert f"recording: {work / 'recording'}" in rest
        assert "dashboard --recording" in rest and "Traceback" not in rest
    gone, alive = psutil.wait_procs(family, timeout=45)
    left = [p.cmdline() for p in alive]
    for p in alive:         # a failure here must not leave them running either
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert left == []
