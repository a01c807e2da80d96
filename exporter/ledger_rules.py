"""The recording rules of the ledger's counted part, and the alert on goodput, rendered from the
ledger's definitions (exporter/ledger.py) and the catalog's names: the `burnrate-ledger` group of
manifests/alerts/burnrate-rules.yaml. Rendered, not written by hand, so that the rules and the
analyzer count the same counters with the same signs; tests/test_ledger_rules.py fails while
the rules file holds another group than this renders.

`python -m burnrate.exporter.ledger_rules` prints the group, as an item of the file's `groups:`;
`burnrate rules FILE` renders it again in a rules file, with the
detectors' groups (docs/thresholds.md).
"""
from __future__ import annotations

from . import catalog as C
from . import ledger
from . import labels as L
from . import rules_yaml as Y

GROUP = "burnrate-ledger"
SOURCE = "exporter/ledger_rules.py (`python -m burnrate.exporter.ledger_rules`)"

GOODPUT_LOW = 0.5
"""Below this share of its held GPU-time in its ranks' compute, a job warns. Under a half,
more GPU-time goes elsewhere (waiting for data or for other ranks, checkpoints, evaluation,
start-up, stalls) than into the steps: well past what any one of those costs in a healthy
run, and the point where fixing the job buys back more than the compute it runs. Each cause
has its own alert at its own threshold; this one catches several smaller ones adding up."""
GOODPUT_LOW_FOR = "30m"
"""How long goodput must stay below GOODPUT_LOW. Longer than a usual start-up (scheduling,
image pull, model load and restore take minutes) plus the 5-minute window catching up, and
than one checkpoint save or evaluation pass, so that the warning is about a steady state,
not a pause the job recovers from; the same 30 minutes as GPUIdleWhileAllocated's warning."""

WINDOW = "5m"
WINDOW_S = 300  # the roll-ups' rate5m: increase() over it, which VictoriaMetrics sums like Prometheus
JOB = ("cluster", L.NAMESPACE, L.TRAINING_JOB)
NAMESPACE = ("cluster", L.NAMESPACE)
ALLOCATED = C.BY_NAME["burnrate_gpu_allocated_seconds_total"].sample_name


def record(level: tuple[str, ...], metric: str) -> str:
    return f"{'_'.join(level)}:{metric}"


def category_record(name: str, level: tuple[str, ...] = JOB) -> str:
    return record(level, f"burnrate_ledger_{name}_seconds:rate{WINDOW}")


def gpu_record(level: tuple[str, ...] = JOB) -> str:
    return record(level, f"burnrate_ledger_gpu_seconds:rate{WINDOW}")


def goodput_record(level: tuple[str, ...] = JOB) -> str:
    return record(level, "burnrate_goodput:ratio")


def rank_counter(field: str) -> str:
    [spec] = [m for m in C.CATALOG if m.source == C.RANK and m.field == field]
    return spec.sample_name


def _by(level: tuple[str, ...]) -> str:
    return ", ".join(level)


def _rate(sample: str, over: str = "sum") -> str:
    """Per job, a counter's rate5m over its ranks (`over`: sum, max or count), the workload's
    namespace taken from exported_namespace where the exported-labels profile put it."""
    return (f"{over} by ({_by(JOB)}) (label_replace(increase({sample}[{WINDOW}]) / {WINDOW_S}, "
            f'"{L.NAMESPACE}", "$1", "exported_namespace", "(.+)"))')


def _counted(category: ledger.Category) -> str:
    """The category's counters summed over the job's ranks, with their signs."""
    terms = [("- " if sign < 0 else "+ ") + _rate(rank_counter(field)) for field, sign in category.counters]
    if len(terms) == 1 and category.counters[0][1] > 0:
        return terms[0][2:]
    # Summed per job before the clamp: the timers are read apart, so a rank's parts can
    # exceed its step by noise, and per job that noise still cancels in the categories' sum.
    inner = "\n  ".join([terms[0].removeprefix("+ ")] + terms[1:])
    return f"clamp_min(\n  {inner},\n  0\n)"


def _blocked(category: ledger.Category) -> str:
    """A blocking category (a save, an evaluation): every rank of the job for as long as its
    slowest rank reported it in the window."""
    [(field, _)] = category.counters
    return f"{_rate(rank_counter(field), 'max')}\n* {_rate(rank_counter(field), 'count')}"


STEP_S = _rate(rank_counter("step_s"))


def _waited() -> str:
    """Rank-seconds per second the job's ranks waited for saves and evaluations of others and
    reported as step time; 0 for a job whose ranks export no such counter."""
    terms = [f"(\n  {_indent(_blocked(c))}\n  - {_counted(c)}\n  or\n  0 * {STEP_S}\n)" for c in ledger.BLOCKING]
    return "\n+ ".join(terms)


def job_category(category: ledger.Category) -> str:
    if category.blocks:
        return _blocked(category)
    # A 5-minute rule has no run to learn the steps' usual mix from, as the analyzer does: the
    # wait comes out of each of the steps' categories in proportion to it. (A window without
    # step time has nothing to take it from: the clamp keeps its categories at 0, not absent.)
    return (f"{_counted(category)}\n* clamp_min(\n  1 - (\n    {_indent(_indent(_waited()))}\n  )\n"
            f"  / clamp_min({STEP_S}, 1e-9),\n  0\n)")


# A job's GPUs, share-weighted: the ledger's whole. GPUs of pods the agent could not name a job
# for (training_job empty) are no job's.
JOB_GPU = _rate(f'{ALLOCATED}{{{L.TRAINING_JOB}!=""}}')


def _and(expr: str, condition: str) -> str:
    """Per job, `expr` where `condition` has a value."""
    return f"(\n  {_indent(expr)}\n)\nand on ({_by(JOB)})\n(\n  {_indent(condition)}\n)"


def _per_namespace(expr: str) -> str:
    return f"sum by ({_by(NAMESPACE)}) (\n  {_indent(expr)}\n)"


def _indent(expr: str) -> str:
    return expr.replace("\n", "\n  ")


def rules() -> list[tuple[str, dict]]:
    """(why, rule) for each rule of the group, in evaluation order. Each record is written from
    the raw counters, none from another record, so that back-filling tools (promtool tsdb
    create-blocks-from rules, vmalert -replay), which cannot see a rule's results in the same
    pass, compute them too."""
    productive = job_category({c.name: c for c in ledger.COUNTED}[ledger.PRODUCTIVE])
    held = f"{JOB_GPU} > 0"
    out: list[tuple[str, dict]] = []
    for i, c in enumerate(ledger.COUNTED):
        why = ("Per job, each category its ranks' counters measure (ledger.COUNTED), in rank-seconds "
               "per second: the category's counters summed with their signs. A save or an evaluation "
               "blocks every rank as long as its slowest reported it (ledger.BLOCKING): the others "
               "wait for it and report the wait as step time, which comes out of the steps' "
               "categories, in proportion to each." if i == 0 else "")
        out.append((why, {"record": category_record(c.name), "expr": job_category(c)}))
    out.append(("The GPUs the job holds, share-weighted: the GPU-seconds per second that all its "
                "categories add up to.", {"record": gpu_record(), "expr": JOB_GPU}))
    out.append(("Goodput: the productive share of what the job holds, only while it holds GPUs.",
                {"record": goodput_record(), "expr": f"{productive}\n/ on ({_by(JOB)})\n({held})"}))
    for i, c in enumerate(ledger.COUNTED):
        why = ("Per namespace, over its jobs that hold GPUs and report steps: a job without telemetry "
               "has no productive time to count, and its GPU-time would read as badput." if i == 0 else "")
        out.append((why, {"record": category_record(c.name, NAMESPACE),
                          "expr": _per_namespace(_and(job_category(c), held))}))
    namespace_gpu = _per_namespace(_and(held, productive))
    out.append(("", {"record": gpu_record(NAMESPACE), "expr": namespace_gpu}))
    out.append(("", {"record": goodput_record(NAMESPACE),
                     "expr": f"{_per_namespace(_and(productive, held))}\n/ on ({_by(NAMESPACE)})\n{namespace_gpu}"}))
    out.append((f"A job whose goodput stays under {GOODPUT_LOW:g} for {GOODPUT_LOW_FOR}: GOODPUT_LOW and "
                "GOODPUT_LOW_FOR in exporter/ledger_rules.py say why (no detector of the analyzer has them).", {
        "alert": "TrainingGoodputLow",
        "expr": f"{goodput_record()} < {GOODPUT_LOW:g}",
        "for": GOODPUT_LOW_FOR,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Training job {{ $labels.namespace }}/{{ $labels.training_job }} has a goodput of "
                       "{{ $value | humanizePercentage }}.",
            "description": f"For {Y.spelled(GOODPUT_LOW_FOR)}, under {GOODPUT_LOW:.0%} of the GPU-time the job "
                           "holds has gone into its ranks' compute. The rest waits for data or for other ranks, "
                           "saves checkpoints, evaluates, or is time no counter sees (start-up, restarts, "
                           "stalls, lost progress); the training-job dashboard's Goodput row splits it.",
            "runbook_url": "docs/runbooks.md#traininggoodputlow",
        }}))
    return [(why, Y.read_back(rule)) for why, rule in out]


def group() -> dict:
    return Y.group(GROUP, rules())


def render() -> str:
    """The group as an item of a rules file's `groups:`, between the markers the test and the
    regeneration find it by."""
    return Y.render(GROUP, SOURCE,
                    "The ledger's counted part (exporter/ledger.py): where each job's GPU-time went, from "
                    "its ranks' counters, per job and per namespace, as rank-seconds (or GPU-seconds) per "
                    "second over 5 minutes, written increase(...[5m]) / 300 as the roll-ups are. The "
                    "categories measured otherwise are the analyzer's: start-up, restarts, stalls and no "
                    "process are here the gap between the categories' sum and the GPUs held; lost progress "
                    "and a blown-up model's steps (diverged) are in the steps' categories. "
                    "Regenerate with BURNRATE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_ledger_rules.py "
                    "tests/test_alert_rules.py.", rules())


if __name__ == "__main__":
    print(render(), end="")
