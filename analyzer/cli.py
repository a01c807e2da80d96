"""`burnrate analyze`: findings and per-job cost for a window, from Prometheus or a
recording; `--serve` keeps re-evaluating and exports the results as metrics."""
from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import TYPE_CHECKING

from burnrate.exporter.errors import UserError

from .costing.cost import AdviceConfig
from .detectors import DetectorConfig
from .grid.frames import Frames, Window
from .costing.pricing import Catalog
from .options import ALL_CLUSTERS, SourceOptions, add_source_arguments, source_options
from .sources.timeparse import parse_duration, resolve_window
from .grid.workloads import WorkloadError, parse_overrides

if TYPE_CHECKING:
    from burnrate.exporter.webconfig import WebConfig

FORMATS = ("table", "json", "csv")
NOTHING_FOUND = 3     # the exit code where the window holds no GPU sample at all (docs/cli.md)


class NothingFound(UserError):
    """No GPU had a sample in the window: an empty report would read as a clean fleet."""
    exit_code = NOTHING_FOUND


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser, "`all` for one report per cluster")
    parser.add_argument("--since", metavar="DURATION", help="window up to now, e.g. 90m, 2h, 7d (default 24h; "
                        "a recording defaults to all of it)")
    parser.add_argument("--start", metavar="T", help="window start: ISO-8601 or unix seconds")
    parser.add_argument("--end", metavar="T", help="window end (default: now)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--workload-class", action="append", default=[], metavar="NAMESPACE=CLASS",
                        help="treat every workload in NAMESPACE as CLASS (training, serving, interactive, batch); "
                             "repeatable")
    parser.add_argument("--checkpoint-seconds", type=float, metavar="S",
                        help="time to write one checkpoint; enables checkpoint-interval advice (Daly's interval; "
                             "a job's ledger measures it where the job reports its saves)")
    add_fleet_arguments(parser)
    serve = parser.add_argument_group("long-running mode")
    serve.add_argument("--serve", action="store_true",
                       help="re-evaluate every --interval and export findings and costs on /metrics")
    serve.add_argument("--listen", default="0.0.0.0:9401", metavar="HOST:PORT",
                       help="where --serve listens (default 0.0.0.0:9401)")
    serve.add_argument("--interval", type=float, default=300.0, metavar="S",
                       help="seconds between evaluations in --serve (default 300)")
    serve.add_argument("--keep-summaries", metavar="FILE",
                       help="append each finished job's summary to FILE (JSON Lines) once, for showback past "
                            "the store's retention (docs/retention.md)")
    serve.add_argument("--budgets", metavar="FILE",
                       help="YAML budgets per team: also export each team's spend and forecast in the current "
                            "period, for the budget alerts (docs/budgets.md)")
    serve.add_argument("--web-config", metavar="FILE",
                       help="TLS and basic auth for --serve's endpoint, exporter-toolkit format (as the agent's)")


def window_of(args: argparse.Namespace, options: SourceOptions, now: float | None = None) -> Window | None:
    """The requested window; a Prometheus query defaults to the last 24 hours, a
    recording to everything in it (None)."""
    try:
        window = resolve_window(args.since, args.start, args.end, now=now)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if window is None and options.prometheus is not None:
        now = time.time() if now is None else now
        window = Window(now - parse_duration("24h"), now)
    return window


def load_frames(args: argparse.Namespace, source, window: Window | None) -> Frames:
    from .grid.views import ANALYSIS_COLUMNS
    from .sources import PrometheusError

    bar = args.format == "table" and sys.stderr.isatty()
    if bar:
        progress_bar(0, 1)
    try:
        frames = source.frames(window, ANALYSIS_COLUMNS, progress_bar if bar else None)
    except (PrometheusError, OSError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    finally:
        if bar:
            print("\r\033[K", file=sys.stderr, end="", flush=True)
    return frames


def progress_bar(done: int, total: int, width: int = 30) -> None:
    """One line on the terminal, redrawn in place while a long window is read."""
    share = done / total if total else 1.0
    filled = int(round(share * width))
    print(f"\rburnrate analyze: reading metrics [{'#' * filled}{'.' * (width - filled)}] {share:4.0%}",
          file=sys.stderr, end="", flush=True)


def overrides_of(args: argparse.Namespace) -> dict[str, str]:
    try:
        return parse_overrides(args.workload_class)
    except WorkloadError as exc:
        raise UserError(str(exc)) from None


def one_source(args: argparse.Namespace, options: SourceOptions):
    """The source of the one report asked for: a recording, or the store scoped to the
    cluster named (or to none, where it holds one)."""
    (cluster,) = options.clusters(window_of(args, options))
    return options.open(cluster)


def report_of(args: argparse.Namespace, options: SourceOptions, source, catalog: Catalog, config: DetectorConfig,
              advice: AdviceConfig, overrides: dict[str, str]):
    """One analysis: per GPU, or in fleet mode from the roll-ups and the series they flag,
    as the flags say or else as the store holds roll-ups (analyzer.fleet.choice)."""
    from dataclasses import replace
    from .output.report import analyze
    from .sources import PrometheusError

    # One window for every step: each would otherwise end at its own "now".
    window = window_of(args, options)
    try:
        choice = None
        if options.prometheus is not None:
            from .fleet.choice import choose
            choice = choose(source, window, forced_by(args), args.rollup_interval)
        if choice is None or not choice.fleet:
            frames = load_frames(args, source, window)
            if frames.gpu.empty and not args.serve:
                raise NothingFound(nothing_found(options, source, window))
            # Nothing reads the frames' values after: their grids take them (analyzer.grid.views).
            report = analyze(frames, catalog, config, advice, overrides, release_frames=True)
        else:
            from .fleet.mode import analyze_fleet
            report = analyze_fleet(source, window, catalog, config, advice, overrides,
                                   args.rollup_interval)
        if choice is not None:
            report = replace(report, notes=[choice.note, *report.notes])
        return with_retention_note(args, options, source, report, window)
    except (PrometheusError, OSError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def period_report(args: argparse.Namespace, options: SourceOptions, source, window: Window, key: str | None,
                  fmt: str):
    """The analysis `burnrate analyze --start --end` runs, asked for one calendar period of a
    showback or budgets report (the same sources, thresholds and prices): the report of
    `window`, or None where it holds no GPU sample at all. Teams by a pod label (`key`) need
    every pod's GPU-hours: per GPU, never from the roll-ups. `fmt` is the format whose notes
    it takes (a table's: the store's notes go into the report)."""
    asked = argparse.Namespace(**{**vars(args), "since": None, "start": repr(window.start), "end": repr(window.end),
                                  "fleet": False, "per_gpu": key and f"--by {args.by}", "serve": False,
                                  "format": fmt, "checkpoint_seconds": None, "rollup_interval": None})
    try:
        return report_of(asked, options, source, options.catalog(), options.detectors(), AdviceConfig(),
                         overrides_of(args))
    except NothingFound:
        return None


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """--fleet, --per-gpu and --rollup-interval: how a store is read (analyzer.fleet.choice)."""
    fleet = parser.add_argument_group("fleet mode (a store whose ruler keeps the shipped roll-ups)")
    way = fleet.add_mutually_exclusive_group()
    way.add_argument("--fleet", action="store_true",
                     help="read the roll-ups for the whole fleet and per-GPU series only for the jobs and nodes "
                          "they flag (Prometheus only; the default where the store holds them over the window)")
    way.add_argument("--per-gpu", action="store_true",
                     help="read every GPU's series even where the store holds the roll-ups")
    fleet.add_argument("--rollup-interval", type=float, metavar="S",
                       help="the roll-up group's evaluation interval (default: from the store's rules API, else 60)")


def check_fleet_arguments(args: argparse.Namespace, options: SourceOptions) -> None:
    if args.fleet and options.prometheus is None:
        raise UserError("--fleet reads a store's roll-ups: it needs --prometheus URL")
    if args.rollup_interval is not None and args.rollup_interval <= 0:
        raise UserError("--rollup-interval must be positive")


def forced_by(args: argparse.Namespace) -> str | None:
    """The flag that sets how a store is read, None where the store decides. Commands that
    run analyze's analysis for their own (`burnrate report`) set `fleet`, and may set `per_gpu`
    to the flag of theirs that needs every GPU's series."""
    if args.fleet:
        return "--fleet"
    per_gpu = getattr(args, "per_gpu", False)
    if per_gpu:
        return per_gpu if isinstance(per_gpu, str) else "--per-gpu"
    # the summaries kept are the per-GPU path's, with each job's runs
    return "--keep-summaries" if getattr(args, "keep_summaries", None) is not None else None


def with_retention_note(args: argparse.Namespace, options: SourceOptions, source, report, window: Window | None):
    """The report, noting where the window starts before the store's data (docs/retention.md):
    in its notes, and on stderr where no table shows them."""
    from dataclasses import replace
    from .sources.retention import retention_note

    note = None if options.prometheus is None or window is None else retention_note(source, window)
    if note is None:
        return report
    if args.format != "table" or args.serve:
        print(f"burnrate analyze: {note}", file=sys.stderr)
    return replace(report, notes=[note, *report.notes])


def nothing_found(options: SourceOptions, source, window: Window | None) -> str:
    """What was looked for and not found, and where the store's data is."""
    from .sources import PrometheusError
    from .sources.prometheus import GPU_SERIES
    from .sources.recording import time_range
    from .sources.retention import GUIDE, first_data_after, store_retention
    from .sources.timeparse import format_time

    where = "" if window is None else f" from {format_time(window.start)} to {format_time(window.end)}"
    if options.recording is not None:
        held = time_range(options.recording)
        return (f"no GPU samples{where}: the recording {options.recording} holds "
                + (f"{format_time(held.start)} to {format_time(held.end)}" if held.end > 0 else "none"))
    looked = f"no GPU samples ({', '.join(GPU_SERIES)}){where}"
    try:
        held = source.query('count({__name__=~"burnrate_.+|DCGM_FI_.+"})', time.time())
        begins = None if window is None else first_data_after(source, window)
    except PrometheusError:
        return looked
    count = int(float(held[0]["value"][1])) if held else 0
    found = f"{looked}: Prometheus at {options.prometheus} holds {count} burnrate or DCGM series now"
    if begins is None:
        return found
    retention = store_retention(source)
    return (f"{found}; its GPU data begins at {format_time(begins)} ("
            + (f"retention {retention}; " if retention else "") + f"see {GUIDE})")


def run(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    """`stop` ends `--serve` (the command runs until interrupted without it)."""
    from .output.report import render_clusters, render_csv, render_json, render_table, table_width

    options = source_options(args)
    if args.checkpoint_seconds is not None and args.checkpoint_seconds <= 0:
        raise UserError("--checkpoint-seconds must be positive")
    check_fleet_arguments(args, options)
    if args.web_config is not None and not args.serve:
        raise UserError("--web-config secures the endpoint of --serve: it needs --serve")
    if args.budgets is not None and not args.serve:
        raise UserError("--budgets exports the budget gauges of --serve: it needs --serve "
                        "(`burnrate report --budgets FILE` prints them)")
    if args.keep_summaries is not None and (not args.serve or args.fleet):
        raise UserError("--keep-summaries keeps what --serve sees end, from per-GPU series: "
                        "it needs --serve, without --fleet")
    catalog = options.catalog()
    advice = AdviceConfig(checkpoint_seconds=args.checkpoint_seconds)
    overrides = overrides_of(args)
    config = options.detectors()
    if args.serve:
        from .output.serve import serve
        if args.interval <= 0:
            raise UserError("--interval must be positive")
        if options.cluster == ALL_CLUSTERS:
            raise UserError("--serve exports one report: name its cluster with --cluster NAME")
        web = _web_config(args.web_config)
        budgets = None
        if args.budgets is not None:
            from .output.budget_report import served
            budgets = served(args.budgets, options, lambda: one_source(args, options),
                             lambda by, source, day, key: period_report(argparse.Namespace(**{**vars(args), "by": by}),
                                                                        options, source, day, key, "json")).blocks
        # The store is opened anew for each evaluation: a rotated token file is read again.
        return serve(lambda: report_of(args, options, one_source(args, options), catalog, config, advice, overrides),
                     args.listen, args.interval, stop, web, _keeper(args.keep_summaries, config), budgets)
    render = {"table": lambda report: render_table(report, table_width()), "json": render_json,
              "csv": render_csv}[args.format]
    if options.cluster != ALL_CLUSTERS:
        sys.stdout.write(render(report_of(args, options, one_source(args, options), catalog, config, advice,
                                          overrides)))
        return 0
    reports = {cluster or "": report_of(args, options, options.open(cluster or ""), catalog, config, advice, overrides)
               for cluster in options.clusters(window_of(args, options))}
    sys.stdout.write(render_clusters(reports, args.format, table_width()))
    return 0


def _keeper(path: str | None, config: DetectorConfig):
    from .output.serve import SummaryKeeper
    if path is None:
        return None
    try:
        return SummaryKeeper(path, config.stalled.floor_minutes * 60)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


def _web_config(path: str | None) -> WebConfig | None:
    if path is None:
        return None
    from burnrate.exporter import webconfig     # bcrypt and YAML, only where --web-config asks for them
    try:
        return webconfig.load(path)
    except webconfig.WebConfigError as exc:
        raise UserError(str(exc)) from None
