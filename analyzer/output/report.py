"""One analysis (findings + job costs over a window) and its three renderings:
a readable table, the JSON document of docs/report.md, and CSV.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
import sys
import textwrap
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from ..costing.accounting import COVERAGE_WARNING, Accounting, account, added
from ..costing.cost import AdviceConfig, GpuPrices, JobCost, gpu_prices, job_costs, job_prior_mtbf
from ..detectors import DetectorConfig, detect_all, ended_with_their_processes, order
from ..costing import ledger_findings
from ..detectors.findings import Finding, iso
from ..detectors.oversized_serving import serving_blocks, serving_lines
from ..grid.frames import Frames, Window
from ..costing.ledger import job_ledgers
from ..grid.workloads import TRAINING
from burnrate.exporter.ledger import BADPUT, NAMES, PRODUCTIVE
from ..costing.pricing import Catalog
from ..grid.views import Views, invalid_mfu_note
from burnrate.exporter.errors import printable

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
TABLE_WIDTH = 120      # the widest a table is drawn where the terminal's width is unknown (a pipe, a file)


@dataclass(frozen=True)
class Report:
    window: Window
    findings: list[Finding]
    jobs: list[JobCost]
    missing: tuple[str, ...] = ()
    simulated: bool = False
    notes: list[str] = field(default_factory=list)
    accounting: Accounting | None = None
    unpriced_jobs: list[dict[str, str]] = field(default_factory=list)
    # What the analysis was computed from, for whoever draws it (the dashboard) to read
    # rather than build again: the views of the frames and each GPU row's prices.
    views: Views | None = field(default=None, repr=False, compare=False)
    prices: GpuPrices | None = field(default=None, repr=False, compare=False)
    unpriced_nodes: dict[str, str] = field(default_factory=dict, repr=False, compare=False)   # host -> why
    dropped_mfu: dict[tuple[str, str], int] = field(default_factory=dict, repr=False, compare=False)


def analyze(frames: Frames, catalog: Catalog, config: DetectorConfig = DetectorConfig(),
            advice: AdviceConfig = AdviceConfig(), class_overrides: Mapping[str, str] | None = None,
            release_frames: bool = False) -> Report:
    """`release_frames`: the frames are the analysis's to take apart (Views' `release`)."""
    views = Views(frames, class_overrides, release=release_frames)
    findings = detect_all(views, config)
    accounting = account(views, config.idle_gpu)
    prices = gpu_prices(views, catalog)
    ledgers = job_ledgers(views, accounting, config.stalled)
    ends = ledger_findings.process_ends(ledgers, config.ledger)
    findings = ended_with_their_processes(views, findings, ends, ledger_findings.held_after_exit(ledgers, ends), config)
    findings = sorted(findings + ledger_findings.detect(ledgers, job_prior_mtbf(views, ledgers, advice, prices),
                                                        config.ledger), key=order)
    jobs, priced = job_costs(views, catalog, findings, advice, accounting, prices, ledgers)
    _state_prices(accounting, views, prices)
    reasons = unpriced_nodes(views, catalog)
    unpriced = [{"namespace": j.namespace, "training_job": j.training_job,
                 "reason": _unpriced_reason(views, j, reasons)} for j in jobs if j.cost_dollars is None]
    return Report(frames.window, priced, jobs, tuple(frames.missing), frames.simulated,
                  report_notes(reasons, accounting, views.dropped_mfu), accounting, unpriced, views, prices, reasons,
                  dict(views.dropped_mfu))


def combine(frames: Frames, reports: list[Report]) -> Report:
    """One report of the analyses of parts of `frames` that no detector relates
    (analyzer.fleet.partition): their findings, jobs and GPU-hours together. A job analysed in
    several parts is listed once for each."""
    if len(reports) == 1:
        return replace(reports[0], window=frames.window)
    accounting = added([r.accounting for r in reports if r.accounting is not None])
    reasons = {host: why for r in reports for host, why in r.unpriced_nodes.items()}
    dropped: dict[tuple[str, str], int] = {}
    for r in reports:
        for job, n in r.dropped_mfu.items():
            dropped[job] = dropped.get(job, 0) + n
    return Report(frames.window, sorted((f for r in reports for f in r.findings), key=order),
                  sorted((j for r in reports for j in r.jobs), key=lambda j: (j.namespace, j.training_job)),
                  tuple(frames.missing), frames.simulated, report_notes(reasons, accounting, dropped), accounting,
                  [u for r in reports for u in r.unpriced_jobs], unpriced_nodes=reasons, dropped_mfu=dropped)


def report_notes(reasons: dict[str, str], accounting: Accounting | None,
                 dropped_mfu: Mapping[tuple[str, str], int] = {}) -> list[str]:
    """What a report says of its figures' basis: the nodes without a price (host -> why),
    where samples cover too little of the GPUs' time, how much they cover, and the jobs
    whose MFU samples no GPU can reach were dropped."""
    notes = []
    if reasons:
        hosts = sorted(reasons)
        notes.append(f"no price for nodes {', '.join(hosts[:5])}{' …' if len(hosts) > 5 else ''}: "
                     "their dollars are null (add them to a --pricing file)")
    if accounting is not None and accounting.coverage is not None and accounting.coverage < COVERAGE_WARNING:
        notes.append(f"samples cover {accounting.coverage:.1%} of the GPUs' time: dollars and hours "
                     "are for the covered part only")
    return notes + invalid_mfu_note(dropped_mfu)


def _state_prices(accounting: Accounting, views: Views, prices: GpuPrices) -> None:
    """Each node's $ per GPU-hour and where it came from, beside its hours."""
    hosts = views.gpu.keys["Hostname"].to_numpy()
    for host, figures in accounting.per_node.items():
        mine = np.flatnonzero(hosts == host)
        rates = prices.actual[mine]
        figures["gpu_hour_dollars"] = float(np.mean(rates)) if len(mine) and np.isfinite(rates).all() else None
        figures["price_basis"] = str(prices.basis[mine[0]]) or None if len(mine) else None


def unpriced_nodes(views: Views, catalog: Catalog) -> dict[str, str]:
    """Hostname -> why its GPUs have no price, for every node the catalog cannot price."""
    nodes = views.nodes
    out = {}
    for host, model in zip(views.gpu.keys["Hostname"], views.gpu.keys["modelName"]):
        if host in views.frames.gpu_hour_prices:
            continue
        itype = nodes.loc[host, "instance_type"] if host in nodes.index else ""
        model = model or (nodes.loc[host, "gpu_model"] if host in nodes.index else "")
        why = catalog.why_unpriced(host, itype, model)
        if why is not None:
            out[str(host)] = why
    return out


def _unpriced_reason(views: Views, job: JobCost, reasons: dict[str, str]) -> str:
    rows = views.job_rows(views.alloc).get((job.namespace, job.training_job))
    if rows is None or not len(rows):
        return "the job holds no GPU in this window (only its training telemetry was seen)"
    hosts = sorted({str(h) for h in views.alloc.keys["Hostname"].to_numpy()[rows]} & set(reasons))
    return "; ".join(f"{h}: {reasons[h]}" for h in hosts) or "its GPUs' prices are unknown"


def to_document(report: Report) -> dict[str, Any]:
    """The document of docs/report.md, with `missing_signals` and `simulated` so a reader knows what
    the figures could not see."""
    return {
        "window": {"start": iso(report.window.start), "end": iso(report.window.end)},
        "findings": [f.to_dict() for f in report.findings],
        "jobs": [j.to_dict() for j in report.jobs],
        "serving": serving_blocks(report.findings, report.jobs),
        "accounting": {**(report.accounting.to_dict() if report.accounting else {}),
                       **fleet_ledger(report.jobs), "unpriced_jobs": report.unpriced_jobs},
        "missing_signals": list(report.missing),
        "notes": list(report.notes),
        "simulated": report.simulated,
    }


def fleet_ledger(jobs: list[JobCost]) -> dict[str, Any]:
    """The training jobs' ledgers added up, and the fleet's goodput over the GPU-hours they
    cover. A category unknown for some job is added over the jobs that know it, and says so."""
    kept = [j for j in jobs if j.ledger is not None]
    unledgered = sum(1 for j in jobs if j.ledger is None and j.workload_class == TRAINING and j.gpu_hours > 0)
    if not kept:
        return {"ledger": None, "goodput": None, "ledger_jobs": 0, "training_jobs_without_ledger": unledgered}
    ledger: dict[str, dict[str, float | None]] = {}
    for name in NAMES:
        known = [j for j in kept if j.ledger.gpu_hours[name] is not None]
        dollars = [j.ledger_dollars(j.ledger.gpu_hours[name]) for j in known]
        ledger[name] = {"gpu_hours": round(sum(j.ledger.gpu_hours[name] for j in known), 4),
                        "dollars": round(sum(dollars), 4) if None not in dollars else None,
                        "jobs_unknown": len(kept) - len(known)}
    hours = sum(j.gpu_hours for j in kept)
    return {"ledger": ledger, "goodput": round(ledger[PRODUCTIVE]["gpu_hours"] / hours, 4) if hours > 0 else None,
            "ledger_jobs": len(kept), "training_jobs_without_ledger": unledgered}


def render_json(report: Report) -> str:
    return json.dumps(to_document(report), indent=2, allow_nan=False) + "\n"


FINDING_COLUMNS = ("kind", "severity", "namespace", "training_job", "Hostname", "gpu", "pod", "rank", "start", "end",
                   "wasted_gpu_hours", "wasted_dollars", "evidence", "recommendation")
JOB_COLUMNS = ("namespace", "training_job", "class", "gpus", "gpu_hours", "capacity_type", "cost_dollars",
               "on_demand_cost_dollars", "steps", "tokens", "cost_per_step", "cost_per_billion_tokens", "mfu",
               "waste_dollars", "advice", "class_basis", "cost_basis", "goodput", "ledger", "ledger_basis", "runs")


def render_clusters(reports: dict[str, Report], format: str, width: int = TABLE_WIDTH) -> str:
    """One report per cluster (`--cluster all`): headed tables, a JSON object by cluster,
    or one CSV whose first column names the cluster."""
    if format == "json":
        doc = {"clusters": {name: to_document(report) for name, report in reports.items()}}
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    if format == "table":
        return "\n".join(f"== cluster {name or '(no label)'} ==\n{render_table(report, width)}"
                         for name, report in reports.items())
    out = io.StringIO()
    for i, (name, report) in enumerate(reports.items()):
        rows = list(csv.reader(io.StringIO(render_csv(report))))
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows(([["cluster", *rows[0]]] if i == 0 else []) + [[name, *row] for row in rows[1:]])
    return out.getvalue()


def render_csv(report: Report) -> str:
    """One table, `record` telling findings from jobs; nested fields as JSON text."""
    out = io.StringIO()
    columns = ("record",) + FINDING_COLUMNS + tuple(c for c in JOB_COLUMNS if c not in FINDING_COLUMNS)
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    doc = to_document(report)
    for record, rows in (("finding", doc["findings"]), ("job", doc["jobs"])):
        for row in rows:
            writer.writerow({"record": record, **{k: _cell(v) for k, v in row.items()}})
    return out.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else value


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _num(value: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def table_width() -> int:
    """The terminal's width where stdout is one and wider than TABLE_WIDTH, else TABLE_WIDTH."""
    if not sys.stdout.isatty():
        return TABLE_WIDTH
    return max(TABLE_WIDTH, shutil.get_terminal_size((TABLE_WIDTH, 24)).columns)


def _widths(headers: list[str], rows: list[list[str]]) -> list[int]:
    return [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]


def _table(headers: list[str], rows: list[list[str]], right: set[int], width: int | None = None) -> list[str]:
    """Aligned columns; where they are wider than `width`, the columns that do not fit are drawn
    in further blocks below, each led by the first column again (the row's name)."""
    rows = [[printable(c) for c in r] for r in rows]     # a label's control characters, escaped before measuring
    widths = _widths(headers, rows)
    blocks, block = [], [0]
    for i in range(1, len(headers)):
        if width is not None and len(block) > 1 and sum(widths[c] + 2 for c in block) + widths[i] > width:
            blocks.append(block)
            block = [0]
        block.append(i)
    lines: list[str] = []
    for cols in blocks + [block]:
        def line(cells: list[str]) -> str:
            return "  ".join(cells[i].rjust(widths[i]) if i in right else cells[i].ljust(widths[i])
                             for i in cols).rstrip()
        lines += ([""] if lines else []) + [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]
    return lines


def _wrapped(text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


def where(f: Finding) -> str:
    """Where a finding is, in a few words: the node and GPU, the rank or the pod."""
    parts = []
    if f.hostname:
        parts.append(f.hostname + (f":gpu{f.gpu}" if f.gpu is not None else ""))
    if f.rank is not None:
        parts.append(f"rank {f.rank}")
    elif f.pod and f.kind not in ("unallocated_gpu",):
        parts.append(f.pod)
    return " ".join(parts) or "-"


def _stalled_for(minutes: float) -> str:
    """In seconds under a minute: thresholds of seconds (the demo's) make stalls that short."""
    return f"stalled for {minutes:.0f} min" if minutes >= 1 else f"stalled for {minutes * 60:.0f} s"


def headline(f: Finding) -> str:
    """A finding's key figure in a few words ("data wait 40%"), and where its waste is counted
    where another finding's waste holds some or all of it (its own is then what is left)."""
    said, elsewhere = _key_figure(f.evidence), f.evidence.get("waste_counted_under")
    if elsewhere:
        said += (("; " if said else "") + ("some of its waste" if f.wasted_gpu_hours else "its waste")
                 + " counted under " + ", ".join(elsewhere))
    return said


def _held_after(minutes: float, e: dict) -> str:
    gpus = e.get("gpus_held")
    held = f"{gpus:g} GPU{'' if gpus == 1 else 's'} held" if isinstance(gpus, (int, float)) else "held"
    return f"{held} {minutes:.0f} min after its last process ended"


def _key_figure(e: dict) -> str:
    for key, fmt in (("data_wait_share", "data wait {:.0%}"), ("low_util_share", "GPU idle {:.0%} of samples"),
                     ("slowdown", "{:.2f}x slower compute"),
                     ("stalled_minutes", lambda minutes, _: _stalled_for(minutes)),
                     ("clock_ratio", "clock at {:.0%}"), ("mfu", "MFU {:.1%}"),
                     ("peak_replicas", "peak needs {:d} of {fleet_replicas} replicas"),
                     ("held_gpu_hours", "GPU at {mean_util_pct:.0f}% over {held_gpu_hours:.1f} GPU-h"), ("idle_hours", "idle {:.1f} GPU-h"),
                     ("held_minutes", _held_after),
                     ("unallocated_hours", "free {:.1f} GPU-h")):
        if isinstance(e.get(key), (int, float)):
            return fmt(e[key], e) if callable(fmt) else fmt.format(e[key], **e)
    if "signals" in e:
        return ", ".join(e["signals"])
    if "xid_events" in e:
        xids = ", ".join(f"XID {c}×{n}" for c, n in e["xid_events"].items())
        return (xids + ("; " if xids and e.get("down_minutes") else "")
                + (f"down {e['down_minutes']:.0f} min" if e.get("down_minutes") else ""))
    return ""


def render_table(report: Report, width: int = TABLE_WIDTH) -> str:
    """The report as tables no wider than `width` where it can: a finding's place and evidence
    go on a line of their own below it, long advice wraps, and job columns that do not fit
    follow in a second block."""
    lines = [f"burnrate analysis  {iso(report.window.start)} → {iso(report.window.end)}"
             + ("  (simulated data)" if report.simulated else "")]
    if report.missing:
        lines.append("missing signals: " + ", ".join(report.missing) + " (detectors that need them were skipped)")
    lines += [f"note: {n}" for n in report.notes]
    findings = sorted(report.findings, key=lambda f: (SEVERITY_ORDER[f.severity], -(f.wasted_dollars or 0)))
    lines += ["", f"FINDINGS ({len(findings)})"]
    if findings:
        lines += _findings_table(findings, width)
        lines += ["", "WHAT TO DO"]
        seen = set()
        for f in findings:
            if f.kind not in seen:
                seen.add(f.kind)
                lines += _wrapped(f"{f.kind}: {f.recommendation}", width, "  ")
    else:
        lines.append("  none")
    jobs = sorted(report.jobs, key=lambda j: -(j.cost_dollars or 0))
    lines += ["", f"JOBS ({len(jobs)})"]
    if jobs:
        # What a job costs comes first; its cost per unit of work follows in a block of its own
        # where the terminal is too narrow for both.
        rows = [[f"{j.namespace}/{j.training_job}", j.workload_class, _num(j.gpus, "{:g}"), _num(j.gpu_hours), j.capacity_type,
                 _money(j.cost_dollars), _money(j.on_demand_cost_dollars),
                 _money(sum(j.waste_dollars.values()) if j.waste_dollars else None),
                 str(j.advice.get("capacity") or "-"), _num(j.cost_per_step, "{:.4f}"),
                 _money(j.cost_per_billion_tokens), _num(j.mfu, "{:.1%}")] for j in jobs]
        lines += _table(["JOB", "CLASS", "GPUS", "GPU-H", "CAPACITY", "COST $", "ON-DEMAND $", "WASTE $", "ADVISED",
                         "$/STEP", "$/B TOKENS", "MFU"], rows, {2, 3, 5, 6, 7, 9, 10, 11}, width)
        total = sum(j.cost_dollars or 0 for j in jobs)
        in_jobs = sum(f.wasted_dollars or 0 for f in findings if f.job is not None)
        free = sum(f.wasted_dollars or 0 for f in findings if f.job is None)
        unpriced = f" ({len(report.unpriced_jobs)} unpriced jobs not included)" if report.unpriced_jobs else ""
        lines += [""] + _wrapped(f"jobs' cost ${total:,.2f}{unpriced}, of which waste found ${in_jobs:,.2f}; "
                                 f"beyond the jobs, unallocated GPUs and other capacity ${free:,.2f}", width, "")
    else:
        lines.append("  none")
    serving = serving_lines(report.findings, report.jobs)
    lines += ["", f"SERVING ({len(serving)})"] + [w for s in serving for w in _wrapped(s, width, "  ")] if serving else []
    lines += _ledger_lines(jobs, width)
    lines += _accounting_lines(report)
    return printable("\n".join(lines), keep="\n") + "\n"


def _findings_table(findings: list[Finding], width: int) -> list[str]:
    """One row per finding; where the row with its place and evidence is wider than `width`,
    those two go on an indented line (or more) of their own below it."""
    rows = [[f.severity, f.kind, f"{f.namespace}/{f.training_job}" if f.job else "-",
             iso(f.start)[:16].replace("T", " "), _num((f.end - f.start) / 3600), _num(f.wasted_gpu_hours),
             _money(f.wasted_dollars), where(f), headline(f)] for f in findings]
    headers = ["SEVERITY", "KIND", "JOB", "START (UTC)", "HOURS", "WASTED GPU-H", "WASTED $", "WHERE", "EVIDENCE"]
    right = {4, 5, 6}
    full = _table(headers, rows, right)
    if max(len(line) for line in full) <= width:
        return full
    table = _table(headers[:-2], [r[:-2] for r in rows], right)
    indent = " " * (_widths(headers, rows)[0] + 2)      # under KIND
    lines = [table[0], indent + "WHERE: EVIDENCE", table[1]]
    for line, row in zip(table[2:], rows):
        place = printable(row[-2])
        said = (f"{place}: " if place != "-" else "") + printable(row[-1])
        lines += [line] + (_wrapped(said, width, indent) if said else [])
    return lines


def _ledger_lines(jobs: list[JobCost], width: int) -> list[str]:
    """One line per training job: its goodput and where most of the rest went."""
    kept = [j for j in jobs if j.ledger is not None]
    if not kept:
        return []
    rows = []
    for j in kept:
        hours = j.ledger.gpu_hours
        worst = max((n for n in BADPUT if hours[n]), key=lambda n: hours[n], default=None)
        unknown = [n for n in NAMES if hours[n] is None]
        rows.append([f"{j.namespace}/{j.training_job}", _num(j.goodput, "{:.1%}"), _num(j.gpu_hours),
                     _money(j.ledger_dollars(hours[PRODUCTIVE])),
                     f"{worst} {_num(hours[worst], '{:,.2f}')} GPU-h ${_money(j.ledger_dollars(hours[worst]))}"
                     if worst else "-", str(len(j.ledger.runs)), ", ".join(unknown) or "-"])
    return ["", f"LEDGER ({len(kept)} training jobs: where their GPU-hours went)"] + _table(
        ["JOB", "GOODPUT", "GPU-H", "PRODUCTIVE $", "LARGEST BADPUT", "RUNS", "UNKNOWN"], rows, {1, 2, 3, 5}, width)


def _accounting_lines(report: Report) -> list[str]:
    a = report.accounting
    if a is None:
        return []
    coverage = "-" if a.coverage is None else f"{a.coverage:.1%}"
    lines = ["", "GPU-HOURS",
             f"  observed {a.observed_gpu_hours:,.1f} = allocated {a.allocated_gpu_hours:,.1f}"
             f" + unallocated {a.unallocated_gpu_hours:,.1f}",
             f"  allocated {a.allocated_gpu_hours:,.1f} = busy {a.busy_gpu_hours:,.1f} + idle {a.idle_gpu_hours:,.1f}"
             + (f" (utilization unknown for {a.util_unknown_gpu_hours:,.1f}, counted busy)"
                if a.util_unknown_gpu_hours > 0.05 else ""),
             f"  coverage {coverage} of the GPUs' time had samples"
             + ("  WARNING: below 99%" if a.coverage is not None and a.coverage < COVERAGE_WARNING else "")]
    lines += [f"  unpriced {j['namespace']}/{j['training_job']}: {j['reason']}" for j in report.unpriced_jobs]
    return lines
