"""`burnrate report`: showback per team and calendar period (docs/showback.md), from the
same stores and the same analysis as `burnrate analyze`, run once per period."""
from __future__ import annotations

import argparse
import re
import sys
import time

from burnrate.exporter.errors import UserError

from ..grid.frames import Window
from .showback import (NAMESPACE, PERIODS, Period, PeriodFigures, add_changes, beyond_jobs_waste_dollars,
                       period_start, periods, team_by_label, team_figures)
from .showback_render import render_csv, render_html, render_json, render_table, to_document
from . import budget_report
from .period_analysis import period_report

FORMATS = ("table", "json", "csv")
LABEL = "label:"
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


def label_key(by: str) -> str | None:
    """The kube-state-metrics label (`label_<KEY>`, KEY sanitized as kube-state-metrics does) of
    `--by label:KEY`, or None for `--by namespace`."""
    if by == NAMESPACE:
        return None
    if not by.startswith(LABEL) or not by[len(LABEL):]:
        raise UserError(f"--by wants namespace or label:KEY (e.g. label:team), not {by!r}")
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", by[len(LABEL):])


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


def pod_labels(source, key: str, period: Window) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> the pod's label value, from kube_pod_labels over the period."""
    scope = "".join(f',{k}=~"{re.escape(v)}|"' for k, v in getattr(source, "scope", {}).items())
    seconds = max(int(period.end - period.start), 1)
    promql = f'max by (namespace, pod, {key}) (last_over_time(kube_pod_labels{{{key}!=""{scope}}}[{seconds}s]))'
    return {(r["metric"].get("namespace", ""), r["metric"].get("pod", "")): r["metric"][key]
            for r in source.query(promql, period.end)}


def period_figures(period: Period, report, notes: list[str], source, key: str | None) -> tuple[PeriodFigures, int]:
    """One period's figures from its analysis (None where it found no GPU samples), its teams
    by the pods' label `key` (None: by namespace); and how many pods carried the label."""
    team_of, labelled = {}, 0
    if key is not None and report is not None:
        labels = pod_labels(source, key, period.window)
        labelled, team_of = len(labels), team_by_label(report, labels)
    teams, dollars = team_figures(report, team_of)
    return PeriodFigures(period, teams, dollars, beyond_jobs_waste_dollars(report), notes), labelled


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
    budgets = None if args.budgets is None else budget_report.read(args.budgets)
    now = time.time()
    whole = window(args, options, now)
    source = one_source(args, options)
    figures, notes, labelled = [], [], 0
    for period in periods(whole, args.period, now):
        # the very analysis `burnrate analyze --start --end` runs for the period's window; as for
        # its table, what it notes (a window older than the store's data) goes into the notes.
        # Teams by a pod label need every pod's GPU-hours: per GPU, not from the roll-ups.
        report = period_report(args, options, source, period.window, key, "table")
        period_notes = [NO_SAMPLES] if report is None else list(report.notes)
        try:
            figure, labels = period_figures(period, report, period_notes, source, key)
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
            lambda day: budget_report.day_dollars(args, options, source, key, day, pod_labels))
    if args.html is not None:
        try:
            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(budget_report.add_to_html(render_html(doc), doc))
        except OSError as exc:
            raise UserError(f"cannot write --html {args.html}: {exc.strerror}") from None
    text = {"table": render_table, "json": render_json, "csv": render_csv}[args.format](doc)
    sys.stdout.write(budget_report.add_to_table(text, doc) if args.format == "table" else text)
    return 0

