"""Fleet mode against real stores: the roll-ups evaluated by each engine's own tool over
back-filled history (tests/rollup_stores.py), then `analyze --fleet` beside the per-GPU path on
the same store. The findings are the same; the jobs read per GPU are the same to the last
digit; the jobs costed from roll-ups are the same within what counters and samples may differ
by at the edges of a holding (one scrape interval each).

Two fleets: one hand-written from the contract (tests/contract_fleet.py: quiet and faulty
jobs, a dcgm-exporter-only node and a job across it and an agent's node, GPU Operator's label
layout, 15 to 60 s scrapes, an agent restart, a missed scrape, a ruler that missed evaluations),
and one from `burnrate simulate`, whose GPU-second counters are
the agent's own counting replayed over its samples (tests/recorded_counters.py)."""
from __future__ import annotations

import json
import re
from dataclasses import replace
import subprocess
import sys

import pytest

from burnrate.analyzer.fleet import partition
from burnrate.analyzer.fleet.choice import choose
from burnrate.analyzer.fleet.mode import NODE_KINDS, analyze_fleet, costed_from_rollups, drill_plan, read_whole
from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.sources.openmetrics import write_openmetrics
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import Report, analyze, to_document
from burnrate.analyzer.sources import PrometheusSource
from burnrate.analyzer.fleet.rollups import RollUpReader, RollUps
from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS
from burnrate.simulator.simulate import Spec, simulate
from tests.contract_fleet import BASE_TIME, Node, Workload, backfill_prometheus, generate, import_victoria
from tests.processes import prometheus, promtool_backfill, victoria_metrics
from tests.recorded_counters import write_gpu_time
from tests.rollup_stores import evaluate_in_prometheus, miss_evaluations, replay_in_victoria, rollup_rules

START = BASE_TIME + 210 * 86400.0   # in the past: VictoriaMetrics keeps no future samples
END = START + 4 * 3600.0
WINDOW = Window(START - 3600.0, END + 3600.0)
GPUS = tuple(range(8))
# Where each store's ruler missed evaluations: three in a row, and one alone.
MISSED = ((START + 3600.0, 3), (START + 9000.0, 1))


def hand_written():
    nodes = tuple(Node(f"gpu-{i}", 8, "agent", 15.0, phase_s=float(i)) for i in range(4)) + (
        Node("gpu-4", 8, "agent", 30.0, phase_s=7.0, scrape_profile="exported", jitter_s=2.0,
             instance_type="p5.48xlarge", gpu_model="NVIDIA H100 80GB HBM3"),
        Node("gpu-5", 4, "agent", 60.0, phase_s=20.0, restarts=(START + 5400.0,), missed=(START + 7200.0,),
             instance_type="g5.12xlarge", gpu_model="NVIDIA A10G"),
        Node("gpu-6", 8, "agent", 15.0, capacity_type="spot"),
        Node("gpu-7", 8, "agent", 15.0, phase_s=3.0),
        Node("gpu-8", 8, "agent", 15.0, phase_s=9.0),
        Node("gpu-9", 8, "agent", 15.0, phase_s=5.0),
        Node("dcgm-0", 8, "dcgm-4.8.3", 30.0))
    quiet = {"telemetry": True, "tokens_per_step": 1e5, "data_wait": 0.01}
    workloads = (
        # Quiet training jobs: costed from roll-ups.
        Workload("ml", "pretrain", "training", "PyTorchJob", (("gpu-0", GPUS), ("gpu-1", GPUS)),
                 START + 600.0, END - 600.0, **quiet),
        Workload("ml", "finetune", "training", "PyTorchJob", (("gpu-4", GPUS),), START + 900.0, END - 300.0,
                 **quiet),
        Workload("ml", "sweep", "training", "PyTorchJob", (("gpu-5", (0, 1, 2, 3)),), START + 300.0, END - 900.0,
                 **quiet),
        Workload("ml", "spot-run", "training", "PyTorchJob", (("gpu-6", GPUS),), START, END, **quiet),
        # 40 minutes free between two jobs, around a whole 27-minute step of the free-GPU flag's
        # first look (START is a multiple of 27 minutes): that look names the node, a finding needs an hour.
        Workload("ml", "before", "training", "PyTorchJob", (("gpu-7", GPUS),), START + 300.0, START + 6300.0,
                 **quiet),
        Workload("ml", "after", "training", "PyTorchJob", (("gpu-7", GPUS),), START + 8700.0, END - 300.0,
                 **quiet),
        # A starving job, an idle notebook beside free GPUs, a server on a dcgm-exporter-only node.
        Workload("ml", "starved", "training", "PyTorchJob", (("gpu-2", GPUS),), START + 600.0, END - 600.0,
                 telemetry=True, tokens_per_step=1e5, data_wait=0.3),
        Workload("research", "nb", "interactive", "Notebook", (("gpu-3", (0,)),), START + 600.0, END - 600.0,
                 util_pct=0.0),
        Workload("inference", "api", "serving", "Deployment", (("dcgm-0", (0, 1)),), START + 600.0, END - 600.0),
        # A quiet job across an agent's node and the dcgm-exporter-only one: its roll-ups see half of it.
        Workload("ml", "mixed", "training", "PyTorchJob", (("gpu-8", GPUS), ("dcgm-0", (4, 5, 6, 7))),
                 START + 1200.0, END - 1200.0, **quiet),
        # A quiet job on two GPUs of the notebook's node, which is read per GPU, and on a node
        # that is not: read over part of its life, costed from roll-ups, its ranks not analysed.
        Workload("ml", "beside", "training", "PyTorchJob", (("gpu-3", (4, 5)), ("gpu-9", GPUS)),
                 START + 600.0, END - 600.0, **quiet),
    )
    return generate(nodes, workloads, START, END, seed=5)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The hand-written fleet in Prometheus (rules loaded, so its rules API names the roll-ups'
    interval) and in VictoriaMetrics (no rules API: the interval is given), each with a ruler
    that missed evaluations."""
    tmp = tmp_path_factory.mktemp("fleet")
    f = hand_written()
    rules = rollup_rules(tmp)
    data = backfill_prometheus(f, tmp)
    evaluate_in_prometheus(tmp, data, rules, START, END)
    (tmp / "vm").mkdir()
    with prometheus(tmp, storage=data, config=f"rule_files: [{rules!r}]\n",
                    extra_args=("--web.enable-admin-api",)) as prom, victoria_metrics(tmp / "vm") as vm:
        miss_evaluations(prom.url, MISSED)
        import_victoria(f, vm.url)
        replay_in_victoria(tmp / "vm", vm.url, rules, START, END, missed=MISSED)
        yield prom.url, vm.url


def both(url: str, interval_s: float | None = None) -> tuple[Report, Report]:
    source = PrometheusSource(url, min_step_s=15.0)
    catalog = load_catalog()
    return (analyze(source.frames(WINDOW, ANALYSIS_COLUMNS), catalog),
            analyze_fleet(source, WINDOW, catalog, interval_s=interval_s))


def from_rollups(report: Report) -> set[tuple[str, str]]:
    """The jobs the fleet report costed from roll-ups, as each job's basis says."""
    return {(j.namespace, j.training_job) for j in report.jobs if costed_from_rollups(j)}


def assert_same(per_gpu: Report, fleet: Report, edge_s: float) -> None:
    """`edge_s`: GPU-seconds counters and samples may differ by per GPU and holding edge."""
    a, b = to_document(per_gpu), to_document(fleet)
    assert b["findings"] == a["findings"]
    assert a["findings"], "a fleet without findings proves nothing"
    assert b["missing_signals"] == a["missing_signals"]
    assert b["simulated"] == a["simulated"]
    jobs_a = {(j["namespace"], j["training_job"]): j for j in a["jobs"]}
    jobs_b = {(j["namespace"], j["training_job"]): j for j in b["jobs"]}
    assert set(jobs_b) == set(jobs_a)
    rolled = from_rollups(fleet)
    assert rolled and rolled != set(jobs_a), "both ways of reading must be exercised"
    for key, want in jobs_a.items():
        got = jobs_b[key]
        if key not in rolled:
            assert got == want, key
            continue
        margin = 2 * want["gpus"] * edge_s / 3600
        assert got["gpu_hours"] == pytest.approx(want["gpu_hours"], abs=margin), key
        # The same edges, as a share of the job's time, bound its dollars, steps and tokens.
        for field in ("cost_dollars", "on_demand_cost_dollars", "steps", "tokens"):
            expected = want[field] if want[field] is None else pytest.approx(want[field], rel=margin / want["gpu_hours"] + 1e-4)
            assert got[field] == expected, (key, field)
        assert got["mfu"] == (want["mfu"] if want["mfu"] is None else pytest.approx(want["mfu"], abs=0.005)), key
        for field in ("gpus", "capacity_type", "class", "class_basis", "waste_dollars"):
            assert got[field] == want[field], (key, field)
        # The roll-ups see a checkpoint each minute and take the mean interval; the rest follows.
        assert set(got["advice"]) == set(want["advice"]), key
        for name, value in want["advice"].items():
            close = value if not isinstance(value, float) else pytest.approx(value, rel=0.02)
            assert got["advice"][name] == close, (key, name)
    acc_a, acc_b = a["accounting"], b["accounting"]
    gpus = sum(j["gpus"] for j in a["jobs"])
    for field in ("observed_gpu_hours", "allocated_gpu_hours", "idle_gpu_hours", "unallocated_gpu_hours"):
        assert acc_b[field] == pytest.approx(acc_a[field], abs=2 * gpus * edge_s / 3600 + 1e-3), field
    assert acc_b["coverage"] == pytest.approx(acc_a["coverage"], abs=0.01)
    assert set(acc_b["nodes"]) == set(acc_a["nodes"])
    for host, figures in acc_a["nodes"].items():
        for field in ("gpu_hour_dollars", "price_basis"):
            assert acc_b["nodes"][host][field] == figures[field], (host, field)


def assert_filled(fleet: Report) -> None:
    """Each missed evaluation was filled on each of the 10 nodes with roll-ups (promtool may miss
    more of its own: its blocks end on whole seconds, which drops an evaluation at a 2-hour
    boundary when the group's phase falls in a minute's last second)."""
    [missed] = [n for n in fleet.notes if n.startswith("the ruler missed")]
    count, nodes = map(int, re.fullmatch(r"the ruler missed (\d+) evaluations of the roll-ups on (\d+) nodes: "
                                         r"each was filled with the evaluation before it", missed).groups())
    assert nodes == 10 and count >= 10 * sum(n for _, n in MISSED), missed


def test_fleet_mode_finds_and_costs_what_the_per_gpu_path_does_on_prometheus(stores, monkeypatch):
    analysed = []

    def analyze_part(frames, *args):
        report = analyze(frames, *args)
        analysed.append(report.views)
        return report

    monkeypatch.setattr(partition, "analyze", analyze_part)
    read = []
    frames = PrometheusSource.frames

    def frames_read(source, *args, **kwargs):
        read.append(frames(source, *args, **kwargs))
        return read[-1]

    monkeypatch.setattr(PrometheusSource, "frames", frames_read)
    per_gpu, fleet = both(stores[0])
    assert_same(per_gpu, fleet, edge_s=60.0)
    assert from_rollups(fleet) == {("ml", n) for n in ("pretrain", "finetune", "sweep", "spot-run", "before", "after",
                                                       "beside")}
    # The job beside the notebook sent telemetry from the node read per GPU; its cost is its
    # roll-ups', so fleet mode neither reads nor analyses its ranks (the report is the same).
    assert ("ml", "beside") in per_gpu.views.telemetry_jobs
    # Left out by the store: its ranks' series are not asked for.
    assert read[0].rank["training_job"].eq("beside").any()
    assert len(read) == 3 and not any(f.rank["training_job"].eq("beside").any() for f in read[1:])
    # What was read, analysed in parts that no job or detector relates: the dcgm-exporter
    # node with the job beside it, the notebook's node, the starving job's nodes; twice,
    # as the job beside the dcgm-exporter node has the plan read again.
    assert len(analysed) == 6
    assert all(("ml", "beside") not in views.telemetry_jobs and not views.rank.keys["training_job"].eq("beside").any()
               for views in analysed)
    assert sum(len(views.frames.rank) for views in analysed) > 0
    # Samples cover the fleet's GPUs: no part's lifetimes say otherwise.
    assert fleet.accounting.coverage > 0.99 and not any("samples cover" in n for n in fleet.notes)
    [basis] = [n for n in fleet.notes if n.startswith("fleet mode:")]
    # Not gpu-7: its GPUs were free for 40 minutes, which the free-GPU flag's first look
    # (half its stretch at steps of half) names, and its second (evaluation by evaluation) clears.
    assert basis.startswith("fleet mode: 4 of 11 nodes read per GPU, over ")
    # The dcgm-exporter node and the notebook's (free GPUs beside it) over the whole 6-hour
    # window of 11 nodes; the starving job's over its life, about 4 hours, and the node of the
    # job beside the dcgm-exporter node over its, about 3.5.
    share = float(basis.split(", over ")[1].split("%")[0])
    assert (6 + 6 + 3.5 + 3.3) / 66 * 100 < share < (6 + 6 + 5 + 4.5) / 66 * 100, basis
    assert "of the fleet's node-hours for " in basis
    assert "every 60 s (the store's rules API)" in basis
    assert_filled(fleet)
    # Where the data begins and ends, read only near the ends of the roll-ups' count.
    source = PrometheusSource(stores[0], min_step_s=15.0)
    seen = RollUpReader(source).reported(WINDOW)
    assert seen is not None and START < seen.start < seen.end < END
    assert source.data_range(WINDOW, seen) == source.data_range(WINDOW)
    for reason in ("GPUs without roll-ups", "idle GPUs", "data wait", "no trainer telemetry",
                   "also on nodes without roll-ups (1)"):
        assert reason in basis


def test_reads_analysed_apart_equal_one_analysis_and_a_hole_is_no_missing_sample(stores):
    """analyzer.fleet.partition on the hand-written fleet's per-GPU frames: every node over the whole
    window, in groups by the jobs across nodes, is the one analysis to the last figure; every
    node read but for 70 minutes in the middle (more than the reach), every job read over part of its life (so no job
    joins the pieces), has the one analysis's node findings and hours, but the hole is time
    not read, not samples missing from the GPUs' lifetimes."""
    frames = PrometheusSource(stores[0], min_step_s=15.0).frames(WINDOW, ANALYSIS_COLUMNS)
    catalog = load_catalog()
    hosts = set(frames.gpu["Hostname"].astype(str))
    whole = {host: [WINDOW] for host in hosts}
    # Three jobs span two nodes each (pretrain, mixed, beside): 11 nodes in 8 groups.
    assert partition.reach_s(DetectorConfig()) == 3600.0    # a free GPU's shortest finding, XIDs' merge
    assert len(partition.split(frames, whole, partition.reach_s(DetectorConfig()), set())) == 8
    assert to_document(partition.analyze_apart(frames, whole, catalog)) == to_document(analyze(frames, catalog))

    cut = (START + 4000.0, START + 4000.0 + 70 * 60.0)
    ends = [Window(WINDOW.start, cut[0]), Window(cut[1], WINDOW.end)]
    outside = {name: (lambda t: t[(t["t"] <= cut[0]) | (t["t"] >= cut[1])])(getattr(frames, name))
               for name in partition.TABLES}
    read = replace(frames, **outside)
    jobs = set(zip(frames.alloc["namespace"].astype(str), frames.alloc["training_job"].astype(str)))
    together = analyze(read, catalog)
    apart = partition.analyze_apart(read, {host: ends for host in hosts}, catalog, unjoined=jobs)
    a, b = to_document(together), to_document(apart)

    def of_nodes(doc):
        return [f for f in doc["findings"] if f["kind"] in NODE_KINDS]

    assert of_nodes(b) == of_nodes(a) and of_nodes(a)
    assert together.accounting.coverage < 0.9 and any("samples cover" in n for n in together.notes)
    assert apart.accounting.coverage > 0.99 and not any("samples cover" in n for n in apart.notes)
    for field in ("observed_gpu_hours", "allocated_gpu_hours", "idle_gpu_hours", "busy_gpu_hours"):
        assert b["accounting"][field] == pytest.approx(a["accounting"][field], abs=1e-6), field


def test_on_victoria_metrics_fleet_mode_equals_prometheus(stores):
    """The second engine: vmalert's roll-ups read from VictoriaMetrics give Prometheus's report."""
    per_gpu, fleet = both(stores[1], interval_s=60.0)
    assert_same(per_gpu, fleet, edge_s=60.0)
    _, on_prometheus = both(stores[0])
    assert to_document(fleet)["findings"] == to_document(on_prometheus)["findings"]
    assert from_rollups(fleet) == from_rollups(on_prometheus)
    for ours, theirs in zip(fleet.jobs, on_prometheus.jobs):
        assert ours.gpu_hours == pytest.approx(theirs.gpu_hours, abs=2 * theirs.gpus * 60.0 / 3600), ours.training_job
    assert any("every 60 s (given)" in n for n in fleet.notes)
    assert_filled(fleet)
    # Without the interval and without a rules API, the assumption is stated.
    assumed = analyze_fleet(PrometheusSource(stores[1], min_step_s=15.0), WINDOW, load_catalog())
    assert any("not found in the store's rules API: 60 s, the shipped rules', assumed" in n for n in assumed.notes)


def test_per_gpu_series_are_checked_only_where_the_ruler_wrote_nothing(stores):
    """Coverage comes from the ruler's count of reporting GPUs; the per-GPU series are read
    only for the buckets it did not write (here the hour either side of the data). A bucket
    of a fraction of a second (a long window's 500th) lines up with the store's answers."""
    for url in stores:
        source = PrometheusSource(url, min_step_s=15.0)
        asked: list[tuple[str, float, float]] = []
        query_range = source.query_range
        source.query_range = lambda promql, a, b, step: asked.append((promql, a, b)) or query_range(promql, a, b, step)
        rollups = RollUpReader(source, interval_s=60.0).read(WINDOW, 401.1)
        assert {h for h, why in rollups.flagged_nodes.items() if "GPUs without roll-ups" in why} == {"dcgm-0"}, url
        raw = [(a, b) for promql, a, b in asked if "DCGM_FI_DEV_GPU_UTIL" in promql]
        assert raw and all(b < START + 401.1 or a > END for a, b in raw), (url, raw)


def test_the_cli_reads_a_fleet_as_a_user_types_it(stores):
    proc = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--prometheus", stores[0], "--fleet",
                           "--start", str(WINDOW.start), "--end", str(WINDOW.end), "--scrape-interval", "15"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "note: fleet mode: 4 of 11 nodes read per GPU" in proc.stdout
    assert "ml/pretrain" in proc.stdout and "dataloader_starvation" in proc.stdout


def analyzed(url: str, *flags: str) -> dict:
    """`burnrate analyze` over the hand-written fleet's window, as JSON."""
    proc = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--prometheus", url, *flags, "--format", "json",
                           "--start", str(WINDOW.start), "--end", str(WINDOW.end), "--scrape-interval", "15"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_store_with_roll_ups_is_read_by_them_unasked_and_per_gpu_when_asked(stores):
    """No flag: the report --fleet gives, saying why; --per-gpu: every GPU's series, every job
    costed from them."""
    unasked, fleet, per_gpu = (analyzed(stores[0], *flags) for flags in ((), ("--fleet",), ("--per-gpu",)))
    # after the store's note that the window starts an hour before its data
    assert unasked["notes"][1] == ("read the roll-ups (fleet mode): the store's ruler kept them over the window; "
                                   "--per-gpu reads every GPU's series")
    assert unasked["notes"][2].startswith("fleet mode: 4 of 11 nodes read per GPU")
    assert fleet["notes"][1] == "read the roll-ups (fleet mode), as --fleet asks"
    for part in ("findings", "jobs", "accounting"):
        assert unasked[part] == fleet[part], part
    assert sum(j["cost_dollars"] for j in unasked["jobs"]) > 0
    assert {j["cost_basis"] for j in unasked["jobs"]} >= {"per-GPU series", "roll-ups every 60 s"}
    assert per_gpu["notes"][1] == "read every GPU's series, as --per-gpu asks"
    assert not any(n.startswith("fleet mode:") for n in per_gpu["notes"])
    assert {j["cost_basis"] for j in per_gpu["jobs"]} == {"per-GPU series"}
    assert per_gpu["findings"] == fleet["findings"]


def test_showback_takes_the_same_way_and_a_pod_label_reads_per_gpu(stores):
    """`burnrate report` over one period, the hand-written fleet's window: by namespace from the
    roll-ups, to the cent of the dollars `analyze` reports with no flag; by a pod label per GPU."""
    def report(by: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "burnrate", "report", "--prometheus", stores[0], "--by", by,
                               "--start", str(WINDOW.start), "--end", str(WINDOW.end), "--scrape-interval", "15",
                               "--period", "month", "--format", "json"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        [period] = json.loads(proc.stdout)["periods"]
        return period

    by_namespace, by_label = report("namespace"), report("label:team")
    assert ("read the roll-ups (fleet mode): the store's ruler kept them over the window; "
            "--per-gpu reads every GPU's series") in by_namespace["notes"]
    unasked = analyzed(stores[0])
    assert by_namespace["dollars"] == round(sum(j["cost_dollars"] for j in unasked["jobs"]), 2) > 0
    assert "read every GPU's series, as --by label:team asks" in by_label["notes"]


def test_fleet_and_per_gpu_are_one_or_the_other():
    proc = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--prometheus", "http://127.0.0.1:1",
                           "--fleet", "--per-gpu"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["burnrate analyze: error: argument --per-gpu: not allowed with "
                                                "argument --fleet"]


def test_fleet_needs_a_store():
    proc = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--recording", ".", "--fleet"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["burnrate analyze: error: --fleet reads a store's roll-ups: "
                                                "it needs --prometheus URL"]


def simulated_store(tmp_path, nodes: int, end: float, ruler_from: float) -> tuple[str, str]:
    """Three simulated hours of `nodes` 8-GPU nodes at 15 s up to `end`, with the agent's
    GPU-second counters, back-filled into a TSDB, and the roll-ups a ruler running since
    `ruler_from` kept there: the TSDB's path and the rules file's."""
    recording = str(tmp_path / "rec")
    simulate(recording, Spec(nodes=nodes, gpus_per_node=8, hours=3.0, step_s=15.0, seed=7, end=end))
    text = tmp_path / "fleet.om"
    with open(text, "w", encoding="utf-8") as fh:
        write_openmetrics(recording, fh, columns=ANALYSIS_COLUMNS, end=False)
        write_gpu_time(recording, fh, 15.0)
        fh.write("# EOF\n")
    data = str(tmp_path / "tsdb")
    promtool_backfill(text, data)
    rules = rollup_rules(tmp_path)
    evaluate_in_prometheus(tmp_path, data, rules, ruler_from, end)
    return data, rules


def test_a_simulated_fleet_is_found_and_costed_alike(tmp_path):
    end = START + 3 * 3600.0
    data, rules = simulated_store(tmp_path, 8, end, end - 3 * 3600.0)
    with prometheus(tmp_path, storage=data, config=f"rule_files: [{rules!r}]\n") as prom:
        source = PrometheusSource(prom.url, min_step_s=15.0)
        window = Window(end - 4 * 3600.0, end + 600.0)
        per_gpu = analyze(source.frames(window, ANALYSIS_COLUMNS), load_catalog())
        fleet = analyze_fleet(source, window, load_catalog())
    assert_same(per_gpu, fleet, edge_s=15.0)


@pytest.mark.slow
def test_roll_ups_over_part_of_the_data_are_read_only_by_a_window_they_cover(tmp_path):
    """A ruler that began an hour and a half before the data's end: a window over all the data
    is read per GPU (fleet mode would read every node per GPU for the hours before), the
    last hour by the roll-ups."""
    end = START + 3 * 3600.0
    data, rules = simulated_store(tmp_path, 2, end, end - 5400.0)
    with prometheus(tmp_path, storage=data, config=f"rule_files: [{rules!r}]\n") as prom:
        source = PrometheusSource(prom.url, min_step_s=15.0)
        whole = choose(source, Window(end - 4 * 3600.0, end + 600.0))
        covered = choose(source, Window(end - 3600.0, end + 600.0))
    assert not whole.fleet and whole.note.startswith("read every GPU's series: burnrate's roll-ups cover ")
    assert "fleet mode would read every node they miss per GPU over the whole window" in whole.note
    assert covered.fleet and covered.note.startswith("read the roll-ups (fleet mode): the store's ruler kept them")


def test_flagged_jobs_are_read_whole_and_flagged_nodes_around_their_flags():
    """A flagged job's nodes over its whole life; a flagged node around where its flag held,
    the detectors' context either side; a job beside it read whole only where that happens."""
    h, bucket, context = 3600.0, 300.0, 1800.0
    window = Window(0.0, 24 * h)
    rollups = RollUps(60.0, "given", bucket_s=bucket)
    for job, hosts, span in ((("ml", "a"), ("n1", "n2"), (0.0, 4 * h)), (("ml", "b"), ("n2", "n3"), (3 * h, 10 * h)),
                             (("ml", "c"), ("n1",), (12 * h, 20 * h)), (("ml", "d"), ("n5", "n6"), (6 * h, 8 * h))):
        for host in hosts:
            rollups.allocated[(job, host, "A100")] = span[1] - span[0]
        rollups.job_spans[job] = span
    rollups.flagged_nodes["n1"] = {"XID errors"}
    rollups.node_spans["n1"] = [(h, h + bucket)]
    rollups.flagged_jobs[("ml", "d")] = {"data wait"}
    d = Window(6 * h - bucket, 8 * h + bucket)
    plan = drill_plan(rollups, window, context)
    assert plan == {"n1": [Window(h - bucket - context, h + 2 * bucket + context)], "n5": [d], "n6": [d]}
    # a ran on n1 from the window's start but also on n2, which is not read: a is costed from roll-ups.
    assert read_whole(rollups, plan, window) == {("ml", "d")}
    # A flag on n2 too, over a's life: a is read whole; b, beside it, is not.
    rollups.flagged_jobs[("ml", "a")] = {"idle GPUs"}
    plan = drill_plan(rollups, window, context)
    assert plan["n2"] == [Window(0.0, 4 * h + bucket)]
    assert read_whole(rollups, plan, window) == {("ml", "a"), ("ml", "d")}
    # A second flag on n1, a day later: a second part, not all the hours between.
    rollups.node_spans["n1"].append((20 * h, 20 * h + bucket))
    assert drill_plan(rollups, window, context)["n1"] == [Window(0.0, 4 * h + bucket),
                                                          Window(20 * h - bucket - context, 20 * h + 2 * bucket + context)]
    # The node a job without GPU roll-ups reports from is read whole.
    assert drill_plan(rollups, window, context, {"n4"})["n4"] == [window]


def test_stretches_with_missed_evaluations_are_joined_across_their_shortest_gaps():
    """One fill query a stretch, at most so many: the closest stretches share one (the fill
    only adds where an evaluation is missing, so the buckets between cost time, not truth)."""
    from burnrate.analyzer.fleet.rollups import _fewest, _runs

    runs = _runs([300.0, 600.0, 1500.0, 1800.0, 3000.0, 9000.0], 300.0)
    assert runs == [Window(300.0, 600.0), Window(1500.0, 1800.0), Window(3000.0, 3000.0), Window(9000.0, 9000.0)]
    assert _fewest(runs, 4) == runs
    assert _fewest(runs, 3) == [Window(300.0, 1800.0), Window(3000.0, 3000.0), Window(9000.0, 9000.0)]
    assert _fewest(runs, 1) == [Window(300.0, 9000.0)]


def test_every_rollup_fleet_mode_reads_is_shipped():
    import yaml
    from burnrate.analyzer.fleet.rollups import GROUP, READ
    from tests.rollup_stores import RULES

    with open(RULES) as fh:
        [group] = [g for g in yaml.safe_load(fh)["groups"] if g["name"] == GROUP]
    assert set(READ) <= {rule["record"] for rule in group["rules"]}


def test_rules_older_than_the_gpu_count_fall_back_to_the_per_gpu_series(stores):
    """A ruler without the reporting-GPU count (rules from before it): coverage is checked on
    the per-GPU series and the report does not change. Runs last: it deletes that roll-up
    from the VictoriaMetrics store."""
    from urllib.request import urlopen

    from burnrate.analyzer.fleet.rollups import REPORTING

    before = analyze_fleet(PrometheusSource(stores[1], min_step_s=15.0), WINDOW, load_catalog(), interval_s=60.0)
    with urlopen(f"{stores[1]}/api/v1/admin/tsdb/delete_series?match[]={REPORTING}", timeout=30) as resp:
        resp.read()
    assert not PrometheusSource(stores[1]).query(f"count({REPORTING})", END)
    after = analyze_fleet(PrometheusSource(stores[1], min_step_s=15.0), WINDOW, load_catalog(), interval_s=60.0)
    assert to_document(after) == to_document(before)
    assert "GPUs without roll-ups (1)" in next(n for n in after.notes if n.startswith("fleet mode:"))
