"""`burnrate demo` end to end: real agent, real 2-rank training with faults, the analyzer naming them."""
import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time

import psutil

import pytest

from burnrate.analyzer.detectors.config_file import load_detector_config
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.sources import RecordingSource
from burnrate.dashboard.app import create_app
from burnrate.dashboard.data import DataService
from burnrate.dashboard.filters import FindingFilters
from burnrate.dashboard.timerange import ALL, from_query
from burnrate.dashboard.ui import current_service, money
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.sources.timeparse import format_time
from burnrate.demo import (CHECKPOINT_EVERY, FLEET_GPUS_PER_NODE, FLEET_NODES, JOBS, LIVE_GPUS, MIN_DURATION_S,
                           NAMESPACE, THRESHOLDS)
from tests.conftest import PYTHON, ROOT, free_port
from tests.processes import wait_http
from tests.test_dashboard import _text

pytestmark = pytest.mark.slow

# finding kind -> the one job the demo injects it into
INJECTED = {"straggler": "demo/llm-pretrain", "dataloader_starvation": "demo/llm-finetune",
            "diverging": "demo/llm-unstable"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One run of the demo at its shortest duration: its directory and what it printed."""
    work = tmp_path_factory.mktemp("demo") / "demo"
    proc = subprocess.run([PYTHON, "-m", "burnrate", "demo", "--duration", f"{MIN_DURATION_S:g}", "--no-browser",
                           "--dir", str(work), "--port", str(free_port()), "--agent-port", str(free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, proc.stdout


def table(text: str, title: str) -> list[dict[str, str]]:
    """The rows of one of `render_table`'s tables, by its headers: the columns are where its
    dashes are."""
    lines = text.split(f"\n{title} (", 1)[1].splitlines()[1:]
    dashes = next(i for i, line in enumerate(lines) if line.startswith("-"))
    spans = [m.span() for m in re.finditer(r"-+", lines[dashes])]
    spans[-1] = (spans[-1][0], None)
    rows = []
    for line in lines[dashes + 1:]:
        if not line.strip():
            break
        if line.startswith(" "):      # a finding's "WHERE: EVIDENCE" line, below its row
            place, _, evidence = line.strip().rpartition(": ")
            rows[-1].update(WHERE=place or "-", EVIDENCE=evidence)
            continue
        rows.append({"WHERE": "-", "EVIDENCE": "", **{lines[0][a:b].strip(): line[a:b].strip() for a, b in spans}})
    return rows


def link_text(markdown: str) -> str:
    """The text of a markdown link whose punctuation is backslash-escaped (`ui.job_link`)."""
    return re.sub(r"\\(.)", r"\1", re.match(r"\[((?:\\.|[^\]])*)\]", markdown).group(1))


def printed(stdout: str, label: str) -> str:
    """What the line of `stdout` that starts with `label` says after it."""
    return next(line.split(label, 1)[1].strip() for line in stdout.splitlines() if line.lstrip().startswith(label))


def test_demo_names_the_injected_faults_at_its_shortest_duration(demo):
    work, stdout = demo
    findings = table(stdout, "FINDINGS")
    live = [f for f in findings if f["JOB"].startswith(f"{NAMESPACE}/")]
    injected = [f for f in live if INJECTED.get(f["KIND"]) == f["JOB"]]
    assert {(f["KIND"], f["JOB"]) for f in injected} == set(INJECTED.items()), stdout
    assert all(f["SEVERITY"] == "critical" for f in injected), stdout
    # The CPU ranks share two cores with everything else the demo (and a loaded machine)
    # runs: a rank 15% slower for a few seconds is real and named as a warning, while every
    # injected fault is critical and no other live finding is.
    others = [f for f in live if f["KIND"] in INJECTED and f not in injected]
    assert all(f["SEVERITY"] == "warning" for f in others), stdout
    straggler = next(f for f in injected if f["KIND"] == "straggler")
    assert straggler["WHERE"] == "demo-node:gpu1 rank 1", stdout
    diverging = next(f for f in injected if f["KIND"] == "diverging")
    assert diverging["SEVERITY"] == "critical" and "non_finite" in diverging["EVIDENCE"], stdout
    # The simulated fleet is in the same analysis, judged with the same thresholds.
    assert any(not f["JOB"].startswith(f"{NAMESPACE}/") for f in findings), stdout
    # The job that crashed and resumed from its last checkpoint: two runs, and a ledger that
    # shows what the crash cost (the steps computed again, the restart), in the summary and in
    # the JSON the analyzer wrote beside the recording.
    (crashed,) = [job for job in JOBS if job.crash_at]
    resumed_from = (crashed.crash_at - 1) // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    summary = stdout.split(f"ledger of {NAMESPACE}/{crashed.name}: ", 1)[1].splitlines()[:2]
    assert summary[0].startswith(f"2 runs (resumed from step {resumed_from}), goodput "), stdout
    assert re.fullmatch(r"  largest badput: [a-z_]+ \$\d+\.\d{4}(, [a-z_]+ \$\d+\.\d{4})*", summary[1]), stdout
    doc = json.loads((work / "analysis.json").read_text())
    (job,) = [j for j in doc["jobs"] if (j["namespace"], j["training_job"]) == (NAMESPACE, crashed.name)]
    assert [r["resumed_from"] for r in job["runs"]] == [0, resumed_from], job["runs"]
    assert job["runs"][0]["last_step_number"] == crashed.crash_at - 1, job["runs"]
    assert job["ledger"]["restart"]["gpu_hours"] > 0 and job["ledger"]["lost_progress"]["gpu_hours"] > 0, job
    assert sum(c["gpu_hours"] for c in job["ledger"].values()) == pytest.approx(job["gpu_hours"], abs=1e-3)
    # The dashboard the demo opened: the same page, range and thresholds show the same faults.
    url = printed(stdout, "dashboard:")
    path, _, search = url.partition("?")
    assert path.endswith("/findings")
    service = DataService(RecordingSource(str(work / "recording")), load_catalog(),
                          config=load_detector_config(str(work / THRESHOLDS)))
    keep = FindingFilters.from_query(search).keeps
    shown = [f for f in service.analysis(from_query(search, ALL)).report.findings if keep(f)]
    assert {(f.kind, f"{f.namespace}/{f.training_job}") for f in shown} >= set(INJECTED.items())


def test_the_summary_the_dashboard_and_the_printed_command_agree(demo):
    """The summary, the command it prints run as printed, and the dashboard it prints (its
    Fleet and Jobs pages at the printed window): the same findings, jobs and dollars."""
    work, stdout = demo
    command = shlex.split(printed(stdout, "reproduce:"))
    assert command[1] == "analyze" and command[command.index("--detector-config") + 1] == str(work / THRESHOLDS)
    ran = subprocess.run(command + ["--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)
    assert doc == json.loads((work / "analysis.json").read_text())

    def job_name(f) -> str:
        return f"{f['namespace']}/{f['training_job']}" if f["training_job"] else "-"

    def close(a: list[tuple], b: list[tuple]) -> None:
        """Row by row, the same names, and dollars within a cent."""
        assert len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            assert [u for u in x if isinstance(u, str)] == [v for v in y if isinstance(v, str)], (x, y)
            assert all(abs(u - v) <= 0.01 for u, v in zip(x, y) if not isinstance(u, str)), (x, y)

    analyzed = sorted((f["severity"], f["kind"], job_name(f), f["wasted_dollars"] or 0.0) for f in doc["findings"])
    summary = sorted((f["SEVERITY"], f["KIND"], f["JOB"], float(f["WASTED $"].replace(",", "") or 0))
                     for f in table(stdout, "FINDINGS"))
    close(summary, analyzed)
    jobs = {f"{j['namespace']}/{j['training_job']}": (j["cost_dollars"], sum(j["waste_dollars"].values()))
            for j in doc["jobs"]}
    summary_jobs = {j["JOB"]: (float(j["COST $"].replace(",", "")), float(j["WASTE $"].replace(",", "")))
                    for j in table(stdout, "JOBS")}
    close(sorted((k, *v) for k, v in summary_jobs.items()), sorted((k, *v) for k, v in jobs.items()))
    wasted = sum(f["wasted_dollars"] or 0.0 for f in doc["findings"])
    count, dollars = re.fullmatch(r"(\d+) findings, \$([\d,.]+) wasted, .*", printed(stdout, "in all:")).groups()
    assert int(count) == len(doc["findings"]) and abs(float(dollars.replace(",", "")) - wasted) <= 0.01

    # The dashboard as the summary says to open it again, at the window it prints.
    replay = shlex.split(printed(stdout, "replay:"))
    flags = dict(zip(replay[2::2], replay[3::2]))
    assert replay[1] == "dashboard" and flags["--detector-config"] == str(work / THRESHOLDS)
    search = "?" + printed(stdout, "then").partition("?")[2]
    app = create_app(RecordingSource(flags["--recording"]), config=load_detector_config(flags["--detector-config"]),
                     refresh_s=3600)
    from burnrate.dashboard.pages import fleet, jobs as jobs_page   # registered by create_app
    with app.server.test_request_context():
        report = current_service(search).analysis(from_query(search, ALL)).report
        fleet_stats = _text(fleet.update(search, 1)[0])
        rows = jobs_page.update(search, 1)[0][-1].data      # the page's content, then its table
    close(sorted((f.severity, f.kind, f"{f.namespace}/{f.training_job}" if f.job else "-", f.wasted_dollars or 0.0)
                 for f in report.findings), analyzed)
    assert f"findings {len(doc['findings'])} {money(wasted)} wasted" in fleet_stats
    shown = {f"{r['namespace']}/{link_text(r['job'])}": (r["cost_dollars"], r["waste_dollars"]) for r in rows}
    close(sorted((k, *v) for k, v in shown.items()), sorted((k, *v) for k, v in jobs.items()))
    assert all(r["waste_dollars"] <= r["cost_dollars"] + 1e-9 for r in rows), rows


def test_the_simulated_fleet_reports_beside_the_live_jobs_throughout(demo):
    """The Fleet page's "now" every 10 s of the live part, as the dashboard the demo opened
    showed it then, and at the end over the whole recording as the summary says to replay it:
    the simulated fleet's GPUs and the agent's all reporting, none stopped."""
    work, stdout = demo
    opens = from_query(printed(stdout, "dashboard:").partition("?")[2], ALL).start
    replay = printed(stdout, "then").partition("?")[2]
    end = from_query(replay, ALL).end
    source = RecordingSource(str(work / "recording"))
    gpu = source.frames(Window(opens, end), {"gpu": ["gpu_util"]}).gpu
    agent_from = gpu["t"][gpu["Hostname"] == "demo-node"].min()
    app = create_app(source, config=load_detector_config(str(work / THRESHOLDS)), refresh_s=3600)
    from burnrate.dashboard.pages import fleet   # registered by create_app
    gpus = FLEET_NODES * FLEET_GPUS_PER_NODE + LIVE_GPUS
    searches = [f"?start={format_time(opens)}&end={format_time(moment)}"
                for moment in range(math.ceil(agent_from) + 2, int(end), 10)] + ["?" + replay]
    assert len(searches) > MIN_DURATION_S / 10
    for search in searches:
        with app.server.test_request_context():
            stats = _text(fleet.update(search, 1)[0])
        assert f"of {gpus} GPUs reporting" in stats and "stopped reporting" not in stats, (search, stats)


@pytest.fixture
def scratch():
    """The demo's TMPDIR, short and the test's own: a trainer's launcher killed with the demo
    cannot remove its directory there, and a loader's worker makes sockets in it, whose paths
    hold 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="burnrate-dtmp-") as tmp:
        yield tmp


@pytest.mark.parametrize("how", ["ctrl-c", "ctrl-c, started in the background", "sigterm", "sigkill"])
def test_stopping_the_demo_stops_everything_it_started(tmp_path, scratch, how):
    """Ctrl-C in a terminal signals the whole foreground process group (a shell that started
    the demo in the background hands it SIGINT ignored); kill, timeout, systemd and container
    runtimes send SIGTERM to the demo alone; and the demo may die outright (SIGKILL). Each
    way, its agent, dashboard, launchers and ranks end with it, and where it could, it says
    where the recording is and how to replay it."""
    work, agent_port = tmp_path / "demo", free_port()
    proc = subprocess.Popen([PYTHON, "-m", "burnrate", "demo", "--duration", "600", "--no-browser", "--dir", str(work),
                             "--port", str(free_port()), "--agent-port", str(agent_port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "TMPDIR": scratch},
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if "background" in how else None)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("dashboard:" in line for line in lines):
            lines.append(proc.stdout.readline())
        family = []
        while time.monotonic() < deadline and len(family) < 5:     # the first trainer's ranks are running
            time.sleep(0.2)
            family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 5, "the demo's agent, dashboard, launcher and two ranks are not all running"
        # Every part started, the agent serving: its answer comes once it handles SIGTERM.
        wait_http(f"http://127.0.0.1:{agent_port}/healthz", timeout=60, statuses=(200, 503))
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
    # The logs of what outlived the demo go with the failure: the test's directory does not stay.
    assert left == [], "\n".join([str(left)] + [f"--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}"
                                                  for log in sorted(work.glob("*.log"))])
