"""`burnrate report`: showback per team and calendar period (docs/showback.md), from the
same stores and the same analysis as `burnrate analyze`, run once per period."""
from __future__ import annotations

import argparse
import sys
import time

from burnrate.exporter.errors import UserError

from ..grid.frames import Window
from .showback import (NAMESPACE, PERIODS, Period, PeriodFigures, add_changes, beyond_jobs_waste_dollars,
                       period_start, periods, team_by_label, team_figures)
from .showback_render import render_csv, render_html, render_json, render_table, to_document
from . import budget_report
from ..cli import period_report
from .pod_labels import label_key, pod_labels
from .showback_summaries import kept_jobs, kept_runs, parts_of, store_begins

FORMATS = ("table", "json", "csv")
NO_SAMPLES = "no GPU samples in the period"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..options import add_source_arguments
    add_source_arguments(parser, "the store must hold one")
    parser.add_argument("--by", default=NAMESPACE, metavar="namespace|label:KEY",
                        help="a team is a namespace, or the value of the pods' Kubernetes label KEY "
                             "(kube-state-metrics' kube_pod_labels; Prometheus only) (default namespace)")
    parser.add_argument("--period", choices=PERIODS, default="month",
                        help="calendar periods in UTC; weeks are ISO weeks (default month)")
    parser.add_argument("--since", metavar="DURATION", help="window up to now, e.g. 30d (default: from the start "
                        "of the previous period; a recording defaults to all of it)")
    parser.add_argument("--start", metavar="T", help="window start: ISO-8601 or unix seconds")
    parser.add_argument("--end", metavar="T", help="window end (default: now)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page to FILE")
    parser.add_argument("--workload-class", action="append", default=[], metavar="NAMESPACE=CLASS",
                        help="treat every workload in NAMESPACE as CLASS, as `burnrate analyze` does; repeatable")
    parser.add_argument("--budgets", metavar="FILE", help="YAML budgets per team: add each team's spend, forecast "
                        "and status in the period holding the window's end (docs/budgets.md)")
    parser.add_argument("--summaries", metavar="FILE", help="job summaries kept by `burnrate analyze --serve "
                        "--keep-summaries`: count the periods, or their parts, before the store's data begins from "
                        "them (docs/showback.md)")



def window(args: argparse.Namespace, options, now: float) -> Window:
    from ..cli import window_of
    from ..sources.recording import time_range

    if args.since is None and args.start is None and args.end is not None:
        raise UserError("--end needs --start")
    asked = window_of(args, options, now) if (args.since or args.start) else None
    if asked is not None:
        return asked
    if options.recording is not None:
        held = time_range(options.recording)
        if held.end <= 0:
            raise UserError(f"the recording {options.recording} holds no samples")
        return held
    # by default the current period and the one before it, so that it has a change
    return Window(period_start(period_start(now, args.period) - 1, args.period), now)



def period_figures(period: Period, report, notes: list[str], source, key: str | None,
                   kept: list = (), parts: list = ()) -> tuple[PeriodFigures, int]:
    """One period's figures from its analysis (None where it found no GPU samples) and the
    jobs `kept` in summaries, its teams by the pods' label `key` (None: by namespace), its
    `parts` by where their figures came from; and how many pods carried the label."""
    team_of, labelled = {}, 0
    if key is not None and report is not None:
        labels = pod_labels(source, key, period.window)
        labelled, team_of = len(labels), team_by_label(report, labels)
    teams, dollars = team_figures(report, team_of, list(kept))
    return PeriodFigures(period, teams, dollars, beyond_jobs_waste_dollars(report), notes, list(parts)), labelled


def unlabelled_note(key: str) -> str:
    return (f"no kube_pod_labels series carry {key} in the window: every job is '(no label)' "
            "(kube-state-metrics exports only the labels its --metric-labels-allowlist names)")


def run(args: argparse.Namespace) -> int:
    from ..cli import one_source
    from ..options import ALL_CLUSTERS, source_options
    from ..sources import PrometheusError

    options = source_options(args)
    if options.cluster == ALL_CLUSTERS:
        raise UserError("--cluster all: a report is of one cluster; name it with --cluster NAME")
    key = label_key(args.by)
    if key is not None and options.recording is not None:
        raise UserError(f"--by {args.by} reads kube-state-metrics' kube_pod_labels from Prometheus; a recording "
                        "does not carry pod labels: use --by namespace, or --prometheus URL")
    if key is not None and args.summaries is not None:
        raise UserError(f"--by {args.by} with --summaries: kept job summaries carry no pod labels; use --by namespace")
    budgets = None if args.budgets is None else budget_report.read(args.budgets)
    now = time.time()
    whole = window(args, options, now)
    source = one_source(args, options)
    figures, notes, labelled = [], [], 0
    kept = None
    if args.summaries is not None:
        try:
            kept = kept_runs(args.summaries, store_begins(options, source, whole), whole)
        except (PrometheusError, OSError) as exc:
            raise UserError(f"--summaries {args.summaries}: {str(exc).splitlines()[0] or type(exc).__name__}") from None
        if kept.torn:
            notes.append(f"{args.summaries}: skipped {kept.torn} torn line(s)")
    reports: dict[Window, object] = {}

    def analysed(part: Window):
        """A part's report, analysed once: with `--period day`, the budgets' days are the periods'."""
        if part not in reports:
            reports[part] = period_report(args, options, source, part, key, "table")
        return reports[part]

    for period in periods(whole, args.period, now):
        before, held = (None, period.window) if kept is None else kept.split(period.window)
        # the very analysis `burnrate analyze --start --end` runs for the period's window (its
        # part in the store); as for its table, what it notes goes into the notes. Teams by a
        # pod label need every pod's GPU-hours: per GPU, not from the roll-ups.
        report = None if held is None else analysed(held)
        period_notes = list(report.notes) if report is not None else [NO_SAMPLES] if held is not None else []
        runs = [] if before is None else kept.ended_in(before)
        if before is not None and not runs:
            period_notes.append(kept.none_note(before))
        in_store = 0 if held is None or kept is None else kept.from_store_in(held)
        if in_store:
            period_notes.append(f"{in_store} kept run(s) ending in the store's span are counted from the store, "
                                "not from their summaries")
        try:
            figure, labels = period_figures(period, report, period_notes, source, key,
                                            kept_jobs(args.summaries, runs), parts_of(before, held))
        except (PrometheusError, OSError, ValueError) as exc:
            raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        labelled += labels
        figures.append(figure)
    if key is not None and not labelled:
        notes.append(unlabelled_note(key))
    add_changes(figures)
    doc = to_document(args.by, args.period, figures, notes)
    if budgets is not None:
        doc["budgets"] = budget_report.budget_block(
            budgets, args.by, args.period, whole.end, now,
            lambda day: budget_report.report_dollars(analysed(day), source, key, day, pod_labels))
    if args.html is not None:
        try:
            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(budget_report.add_to_html(render_html(doc), doc))
        except OSError as exc:
            raise UserError(f"cannot write --html {args.html}: {exc.strerror}") from None
    text = {"table": render_table, "json": render_json, "csv": render_csv}[args.format](doc)
    sys.stdout.write(budget_report.add_to_table(text, doc) if args.format == "table" else text)
    return 0

