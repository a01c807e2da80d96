"""The roll-up recording rules over back-filled history, evaluated by each engine's own tool:
Prometheus's (`promtool tsdb create-blocks-from rules`, which queries a running Prometheus and
writes the results as blocks) and VictoriaMetrics' (`vmalert -replay`, which writes them back
through remote write). The fleet is hand-written with tests/contract_fleet.py (from the contract
and docs/metrics.md's counter definitions, not from the agent): 15, 30 and 60 s scrapes, a missed
scrape, an agent restart, a time-sliced GPU, GPU Operator's label layout on one node. Per job,
namespace and node, the roll-ups summed over the window give the truth, on both engines; so do
the ledger's records (the burnrate-ledger group) per job and namespace, and the job's goodput.
A job drawn by tests/contract_ledger.py whose rank 0 alone saves and evaluates holds the
records' blocking rule (docs/ledger.md, item 6) over back-filled history on both engines."""
from __future__ import annotations

import os
import re

import pytest

from burnrate.exporter import ledger_rules as LR
from tests.conftest import ROOT
from tests.contract_fleet import BASE_TIME, Node, Workload, backfill_prometheus, generate, import_victoria
from tests.contract_ledger import JobSpec, LedgerCase, RunSpec, edge_s
from tests.contract_ledger import generate as generate_job
from tests.processes import prometheus, victoria_metrics
from tests.rollup_stores import AFTER_S, EVAL_S, evaluate_in_prometheus, replay_in_victoria, rollup_rules

pytestmark = pytest.mark.slow

START = BASE_TIME + 200 * 86400.0   # in the past: VictoriaMetrics keeps no future samples
END = START + 3 * 3600.0
EVALUATED_TO = END + AFTER_S

JOB = "cluster_hostname_namespace_training_job:burnrate_gpu_{}_seconds:rate5m"
NODE = "cluster_hostname:burnrate_gpu_observed_seconds:rate5m"
NAMESPACE = "cluster_namespace:burnrate_gpu_{}_seconds:rate5m"
# The ledger's categories the fleet's ranks report (no checkpoint or evaluation counters), and
# the share of each rank's held time in each: steps back to back, 85% compute
# (contract_fleet._sample_training), the workload's data wait, the rest waiting on the others.
LEDGER = ("productive", "data_wait", "sync_wait")


def ledger_shares(w: Workload) -> dict[str, float]:
    return {"productive": 0.85, "data_wait": w.data_wait, "sync_wait": 1.0 - 0.85 - w.data_wait, "gpu": 1.0}


def fleet():
    nodes = (Node("gpu-a", 8, "agent", 15.0, jitter_s=1.5, phase_s=3.0, missed=(START + 3600.0,)),
             Node("gpu-b", 4, "agent", 60.0, phase_s=20.0, restarts=(START + 5400.0,),
                  instance_type="g5.12xlarge", gpu_model="NVIDIA A10G"),
             Node("gpu-c", 8, "agent", 30.0, phase_s=7.0, scrape_profile="exported",
                  instance_type="p5.48xlarge", gpu_model="NVIDIA H100 80GB HBM3"))
    workloads = (
        Workload("ml", "llm", "training", "PyTorchJob", (("gpu-a", (0, 1, 2, 3)), ("gpu-c", (0, 1, 2, 3))),
                 START + 1200.0, START + 8400.0, telemetry=True, tokens_per_step=1e5),
        Workload("research", "nb", "interactive", "Notebook", (("gpu-a", (4,)),), START + 600.0, START + 10200.0,
                 util_pct=0.0),
        Workload("inference", "chat-api", "serving", "Deployment", (("gpu-b", (0,)),), START + 900.0,
                 START + 9900.0, share=0.5),
        Workload("inference", "rerank", "serving", "Deployment", (("gpu-b", (0,)),), START + 900.0,
                 START + 9900.0, share=0.5, util_pct=0.0),
        Workload("data", "embed", "batch", "Job", (("gpu-c", (4, 5)),), START + 1800.0, START + 7200.0),
    )
    return generate(nodes, workloads, START, END, seed=11)


def integrals(server, names: dict[str, str], by: str, start: float = START,
              to: float = EVALUATED_TO) -> dict[str, dict[tuple, float]]:
    """Each roll-up summed over the window, times the evaluation interval: seconds."""
    out = {}
    window = f"{int(to - start + 3600)}s"
    for key, name in names.items():
        result = server.get("/api/v1/query", query=f"sum by ({by}) (sum_over_time({name}[{window}])) * {EVAL_S}",
                            time=str(to))["result"]
        out[key] = {tuple(r["metric"].get(label, "") for label in by.split(", ")): float(r["value"][1])
                    for r in result}
    return out


def goodput(server) -> dict[tuple, float]:
    """Each job's goodput record, its median over the window: its share of compute while it runs."""
    window = f"{int(EVALUATED_TO - START + 3600)}s"
    result = server.get("/api/v1/query", query=f"quantile_over_time(0.5, {LR.goodput_record()}[{window}])",
                        time=str(EVALUATED_TO))["result"]
    return {(r["metric"]["namespace"], r["metric"]["training_job"]): float(r["value"][1]) for r in result}


def readme_job_hours(server) -> dict[str, dict[tuple, float]]:
    """docs/alerts.md's two queries for each job's GPU-hours and idle GPU-hours, over this window
    instead of a week, in seconds."""
    with open(os.path.join(ROOT, "docs", "alerts.md")) as fh:
        [block] = re.findall(r"```promql\n(.*?)```", fh.read(), flags=re.S)
    window = f"{int(EVALUATED_TO - START + 3600)}s"
    out = {}
    for key, query in zip(("job_allocated", "job_idle"), block.strip().splitlines()):
        assert "[7d]" in query
        result = server.get("/api/v1/query", query=query.replace("[7d]", f"[{window}]"),
                            time=str(EVALUATED_TO))["result"]
        out[key] = {(r["metric"].get("namespace", ""), r["metric"].get("training_job", "")): 3600 * float(r["value"][1])
                    for r in result}
    return out


def figures(server) -> dict[str, dict[tuple, float]]:
    def ledger_names(level):
        return {**{f"{prefix}_{c}": LR.category_record(c, level) for c in LEDGER},
                f"{prefix}_gpu": LR.gpu_record(level)}

    prefix = "ledger_job"
    job = ledger_names(LR.JOB)
    prefix = "ledger_namespace"
    namespace = ledger_names(LR.NAMESPACE)
    return {**readme_job_hours(server),
            **integrals(server, job, "namespace, training_job"),
            **integrals(server, namespace, "namespace"),
            **integrals(server, {"node_observed": NODE, "node_allocated": JOB.format("allocated"),
                                 "node_idle": JOB.format("idle")}, "Hostname"),
            **integrals(server, {"namespace_allocated": NAMESPACE.format("allocated"),
                                 "namespace_idle": NAMESPACE.format("idle")}, "namespace")}


def ledgered(f) -> list[Workload]:
    return [w for w in f.workloads if w.kind == "training" and w.telemetry]


def ledger_figures(f, jobs: dict[tuple, float]) -> dict[str, dict[tuple, float]]:
    """The ledger's records summed, from each job's GPU-seconds (or their margin): one rank per
    whole GPU, so a training job's rank-seconds are its GPU-seconds, each category its share.
    Every holder's GPUs count per job; a namespace's over its jobs that report steps."""
    out: dict[str, dict[tuple, float]] = {"ledger_job_gpu": dict(jobs)}
    for w in ledgered(f):
        for part, share in ledger_shares(w).items():
            seconds = jobs[(w.namespace, w.name)] * share
            if part != "gpu":
                out.setdefault(f"ledger_job_{part}", {})[(w.namespace, w.name)] = seconds
            by_ns = out.setdefault(f"ledger_namespace_{part}", {})
            by_ns[(w.namespace,)] = by_ns.get((w.namespace,), 0.0) + seconds
    return out


def truth(f) -> dict[str, dict[tuple, float]]:
    jobs = {(w.namespace, w.name): f.truth.job_gpu_hours[(w.namespace, w.name)] * 3600 for w in f.workloads}
    ledger = ledger_figures(f, jobs)
    idle = {(w.namespace, w.name): jobs[(w.namespace, w.name)] * (not w.busy) for w in f.workloads}
    namespaces: dict[tuple, float] = {}
    namespace_idle: dict[tuple, float] = {}
    for (ns, _), seconds in jobs.items():
        namespaces[(ns,)] = namespaces.get((ns,), 0.0) + seconds
    for (ns, _), seconds in idle.items():
        namespace_idle[(ns,)] = namespace_idle.get((ns,), 0.0) + seconds
    per_node = f.truth.per_node
    return {"job_allocated": jobs, "job_idle": idle,
            "node_observed": {(n,): v["observed_gpu_hours"] * 3600 for n, v in per_node.items()},
            "node_allocated": {(n,): v["allocated_gpu_hours"] * 3600 for n, v in per_node.items()},
            "node_idle": {(n,): v["idle_gpu_hours"] * 3600 for n, v in per_node.items()},
            "namespace_allocated": namespaces, "namespace_idle": namespace_idle, **ledger}


def margins(f) -> dict[str, dict[tuple, float]]:
    """What the roll-ups may miss or add, in GPU-seconds: at each edge of a holding (a job's,
    or the window's for the GPUs themselves) one scrape interval, and one for each missed
    scrape or agent restart inside it. Tight enough to fail a rate() that VictoriaMetrics
    computes over a series' start or end (2% of a job)."""
    nodes = {n.name: n for n in f.nodes}

    def edge(node: Node) -> float:
        return 2 * (node.scrape_interval_s + node.jitter_s) + \
            (len(node.missed) + len(node.restarts)) * node.scrape_interval_s

    jobs, nss, node_held = {}, {}, {}
    for w in f.workloads:
        m = sum(w.share * len(g) * edge(nodes[n]) for n, g in w.placements)
        jobs[(w.namespace, w.name)] = m
        nss[(w.namespace,)] = nss.get((w.namespace,), 0.0) + m
        for n, g in w.placements:
            node_held[(n,)] = node_held.get((n,), 0.0) + w.share * len(g) * edge(nodes[n])
    observed = {(n.name,): n.gpus * edge(n) for n in f.nodes}
    ledger = ledger_figures(f, jobs)
    return {"job_allocated": jobs, "job_idle": jobs, "node_observed": observed, "node_allocated": node_held,
            "node_idle": node_held, "namespace_allocated": nss, "namespace_idle": nss, **ledger}


def assert_near_truth(got: dict, f, engine: str) -> None:
    want, margin = truth(f), margins(f)
    for key, expected in want.items():
        # Rows with nothing in them may be absent (no idle holder on a node): zero.
        assert set(got[key]) - set(expected) == set(), (engine, key, got[key])
        for labels, seconds in expected.items():
            assert got[key].get(labels, 0.0) == pytest.approx(seconds, abs=margin[key][labels] + 1e-6), \
                (engine, key, labels)


def test_the_rollups_give_the_truth_on_prometheus_and_on_victoria_metrics(tmp_path):
    f = fleet()
    rules = rollup_rules(tmp_path, groups=("burnrate-rollups", LR.GROUP))
    # Prometheus: the fleet back-filled, the rules evaluated over it by promtool into blocks of
    # their own, then both read by a Prometheus started on them.
    data = backfill_prometheus(f, tmp_path)
    evaluate_in_prometheus(tmp_path, data, rules, START, END)
    with prometheus(tmp_path, storage=data) as prom:
        from_prometheus = figures(prom)
        prometheus_goodput = goodput(prom)

    # VictoriaMetrics: the fleet imported, the rules replayed by vmalert into it.
    with victoria_metrics(tmp_path) as vm:
        import_victoria(f, vm.url)
        replay_in_victoria(tmp_path, vm.url, rules, START, END)
        from_victoria = figures(vm)
        victoria_goodput = goodput(vm)

    assert_near_truth(from_prometheus, f, "prometheus")
    assert_near_truth(from_victoria, f, "victoria-metrics")
    for engine, got in (("prometheus", prometheus_goodput), ("victoria-metrics", victoria_goodput)):
        assert got == pytest.approx({(w.namespace, w.name): 0.85 for w in ledgered(f)}, rel=0.01), engine


# The categories the ledger's records count, and the steps' three of them.
COUNTED = ("productive", "data_wait", "sync_wait", "checkpoint", "evaluation")
STEPS = ("productive", "data_wait", "sync_wait")


def saving_job() -> LedgerCase:
    """One run on two GPUs of two nodes, 2,400 steps of about 1.5 s, whose rank 0 alone saves
    (90 s every 400 steps, five times) and evaluates (120 s every 700) while the other rank waits for it in
    its next step, as nanoGPT's `if master_process:` block does."""
    run = RunSpec(steps=2400, step_s=1.5, startup_s=120.0, compute=(0.7, 0.62), data_wait=(0.1, 0.12))
    return generate_job(JobSpec(nodes=(("gpu-node-a", 1), ("gpu-node-b", 1)), interval_s=15.0, runs=(run,),
                                checkpoint_every=400, checkpoint_s=90.0, eval_every=700, eval_s=120.0,
                                alloc_start=START + 600.0, before_s=600.0, after_s=600.0, jitter_s=1.0,
                                phase_s=4.0, saves_on_rank0=True, evals_on_rank0=True, seed=3))


def job_records(server, case: LedgerCase) -> dict[str, float]:
    """The job's ledger records summed over its window, in rank-seconds."""
    names = {c: LR.category_record(c, LR.JOB) for c in COUNTED}
    got = integrals(server, names, "namespace, training_job", case.start, case.end + AFTER_S)
    return {c: got[c].get((case.spec.namespace, case.spec.name), 0.0) for c in COUNTED}


def test_a_job_whose_rank_0_alone_saves_reads_its_truth_on_prometheus_and_on_victoria_metrics(tmp_path):
    case = saving_job()
    truth = {c: sum(rank[c] for rank in case.truth.per_rank) for c in COUNTED}
    assert truth["checkpoint"] == pytest.approx(2 * 5 * 90.0) and truth["evaluation"] == pytest.approx(2 * 3 * 120.0)
    rules = rollup_rules(tmp_path, groups=(LR.GROUP,))
    data = backfill_prometheus(case, tmp_path)
    evaluate_in_prometheus(tmp_path, data, rules, case.start, case.end)
    with prometheus(tmp_path, storage=data) as prom:
        engines = {"prometheus": job_records(prom, case)}
    with victoria_metrics(tmp_path) as vm:
        import_victoria(case, vm.url)
        replay_in_victoria(tmp_path, vm.url, rules, case.start, case.end)
        engines["victoria-metrics"] = job_records(vm, case)

    # Each of the run's two edges, on each GPU, is known to a scrape interval and a step.
    edges = 2 * case.spec.world_size * edge_s(case)
    # The waiting rank's wait is in no save of its own: the rules book it as the save's, on
    # both GPUs, and take it back out of the steps.
    waited = truth["checkpoint"] / 2 + truth["evaluation"] / 2
    # VictoriaMetrics' increase() starts from the sample before its window; Prometheus's
    # extrapolates to the window's edges, at most a scrape interval in its 5 minutes.
    saves = {"prometheus": case.spec.interval_s / 300, "victoria-metrics": 0.0}
    for engine, got in engines.items():
        for c in ("checkpoint", "evaluation"):
            assert got[c] == pytest.approx(truth[c], rel=saves[engine], abs=1.0), (engine, c)
        assert sum(got[c] for c in STEPS) == pytest.approx(sum(truth[c] for c in STEPS), abs=edges), engine
        # The wait swelled the waiting rank's sync wait alone; the rules take it out of all
        # three in proportion (docs/ledger.md, In the store), so each reads within the wait
        # of its truth, and productive never above it.
        for c in STEPS:
            assert abs(got[c] - truth[c]) <= waited + edges, (engine, c, got[c], truth[c])
        assert truth["productive"] - waited - edges <= got["productive"] <= truth["productive"] + edges, engine
