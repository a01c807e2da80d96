"""`burnrate analyze`: findings and per-job cost for a window, from Prometheus or a
recording; `--serve` keeps re-evaluating and exports the results as metrics."""
from __future__ import annotations

import argparse
import sys
import threading
import time

from burnrate.exporter.errors import UserError

from .cost import AdviceConfig
from .detectors import DetectorConfig
from .detectors.config_file import DetectorConfigError, load_detector_config
from .frames import Frames, Window
from .pricing import Catalog, PricingError, load_catalog
from .timeparse import parse_duration, resolve_window
from .workloads import WorkloadError, parse_overrides

FORMATS = ("table", "json", "csv")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="Prometheus (or Thanos/Mimir) base URL")
    src.add_argument("--recording", metavar="DIR", help="a recording from `burnrate agent --record` or `simulate`")
    parser.add_argument("--since", metavar="DURATION", help="window up to now, e.g. 90m, 2h, 7d (default 24h; "
                        "a recording defaults to all of it)")
    parser.add_argument("--start", metavar="T", help="window start: ISO-8601 or unix seconds")
    parser.add_argument("--end", metavar="T", help="window end (default: now)")
    parser.add_argument("--pricing", metavar="FILE", help="YAML price overrides per instance type, GPU model or node")
    parser.add_argument("--detector-config", metavar="FILE",
                        help="YAML thresholds per detector, e.g. `idle_gpu: {min_minutes: 60}` (default: built in)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--workload-class", action="append", default=[], metavar="NAMESPACE=CLASS",
                        help="treat every workload in NAMESPACE as CLASS (training, serving, interactive, batch); "
                             "repeatable")
    parser.add_argument("--scrape-interval", type=float, metavar="S",
                        help="the shortest scrape interval of the GPU exporters: no step is finer (default: "
                             "from Prometheus' targets, else 15); any interval reads true, this only saves work")
    parser.add_argument("--checkpoint-seconds", type=float, metavar="S",
                        help="time to write one checkpoint; enables checkpoint-interval advice (Daly's interval; "
                             "a job's ledger measures it where the job reports its saves)")
    parser.add_argument("--cluster", metavar="NAME",
                        help="one cluster of a store that holds several (its --cluster-label value); "
                        "`all` for one report per cluster")
    parser.add_argument("--cluster-label", default="cluster", metavar="LABEL",
                        help="the label naming each series' cluster (default cluster)")
    fleet = parser.add_argument_group("fleet mode (a store whose ruler keeps the shipped roll-ups)")
    fleet.add_argument("--fleet", action="store_true",
                       help="read the roll-ups for the whole fleet and per-GPU series only for the jobs and "
                            "nodes they flag (Prometheus only)")
    fleet.add_argument("--rollup-interval", type=float, metavar="S",
                       help="the roll-up group's evaluation interval (default: from the store's rules API, else 60)")
    auth = parser.add_argument_group("Prometheus connection")
    auth.add_argument("--bearer-token-file", metavar="FILE", help="send the token in this file as a bearer token")
    auth.add_argument("--basic-auth-user", metavar="USER", help="HTTP basic auth user")
    auth.add_argument("--basic-auth-password-file", metavar="FILE", help="HTTP basic auth password file")
    auth.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify Prometheus' TLS certificate")
    auth.add_argument("--insecure-skip-verify", action="store_true", help="do not verify the TLS certificate")
    auth.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per-request timeout (default 30)")
    serve = parser.add_argument_group("long-running mode")
    serve.add_argument("--serve", action="store_true",
                       help="re-evaluate every --interval and export findings and costs on /metrics")
    serve.add_argument("--listen", default="0.0.0.0:9401", metavar="HOST:PORT",
                       help="where --serve listens (default 0.0.0.0:9401)")
    serve.add_argument("--interval", type=float, default=300.0, metavar="S",
                       help="seconds between evaluations in --serve (default 300)")


def _read_secret(path: str | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None


def _source(args: argparse.Namespace, cluster: str | None = None):
    from .recording import RecordingError
    from .sources import PrometheusSource, RecordingSource

    if args.recording is not None:
        try:
            return RecordingSource(args.recording)
        except RecordingError as exc:
            raise UserError(str(exc)) from None
    if args.basic_auth_password_file and not args.basic_auth_user:
        raise UserError("--basic-auth-password-file needs --basic-auth-user")
    if args.timeout <= 0:
        raise UserError("--timeout must be positive")
    if args.scrape_interval is not None and args.scrape_interval <= 0:
        raise UserError("--scrape-interval must be positive")
    try:
        return PrometheusSource(
            args.prometheus, timeout_s=args.timeout,
            bearer_token=_read_secret(args.bearer_token_file, "bearer token file"),
            basic_auth=(args.basic_auth_user, _read_secret(args.basic_auth_password_file, "password file") or "")
            if args.basic_auth_user else None,
            ca_file=args.ca_file, insecure=args.insecure_skip_verify,
            min_step_s=args.scrape_interval, scope={args.cluster_label: cluster} if cluster is not None else None)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot use Prometheus at {args.prometheus}: {exc}") from None


def window_of(args: argparse.Namespace, now: float | None = None) -> Window | None:
    """The requested window; a Prometheus query defaults to the last 24 hours, a
    recording to everything in it (None)."""
    try:
        window = resolve_window(args.since, args.start, args.end, now=now)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if window is None and args.prometheus is not None:
        now = time.time() if now is None else now
        window = Window(now - parse_duration("24h"), now)
    return window


def load_frames(args: argparse.Namespace, source=None) -> Frames:
    from .views import ANALYSIS_COLUMNS
    from .sources import PrometheusError

    source = source or _source(args)
    window = window_of(args)
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


def catalog_of(args: argparse.Namespace) -> Catalog:
    try:
        return load_catalog(args.pricing)
    except PricingError as exc:
        raise UserError(str(exc)) from None


def detector_config_of(args: argparse.Namespace) -> DetectorConfig:
    if args.detector_config is None:
        return DetectorConfig()
    try:
        return load_detector_config(args.detector_config)
    except DetectorConfigError as exc:
        raise UserError(str(exc)) from None


def overrides_of(args: argparse.Namespace) -> dict[str, str]:
    try:
        return parse_overrides(args.workload_class)
    except WorkloadError as exc:
        raise UserError(str(exc)) from None


def clusters_of(args: argparse.Namespace, store=None, window: Window | None = None) -> list[str | None]:
    """The clusters to report on, one report each: the one named, every one for `all`, or
    the store as a whole where it holds one. A store holding several is never merged into
    one report unasked: jobs and nodes of the same name in two clusters would add up."""
    if args.prometheus is None:
        if args.cluster is not None:
            raise UserError("--cluster chooses among the clusters of a Prometheus store; a recording is one cluster's")
        return [None]
    from .sources import PrometheusError
    try:
        found = (store or _source(args)).clusters(window or window_of(args), args.cluster_label)
    except (PrometheusError, OSError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    named = ", ".join(repr(c) if c else "(no label)" for c in found)
    if args.cluster == "all":
        return found or [None]
    if args.cluster is not None:
        if args.cluster not in found:
            raise UserError(f"no GPU series of cluster {args.cluster!r} (label {args.cluster_label!r}) in the window; "
                            f"the store holds {named or 'none'}")
        return [args.cluster]
    if len(found) > 1:
        raise UserError(f"the store holds {len(found)} clusters by label {args.cluster_label!r}: {named}; "
                        "choose one with --cluster NAME, or --cluster all for one report each")
    return [None]


def one_source(args: argparse.Namespace):
    """The source of the one report asked for: a recording, or the store scoped to the
    cluster named (or to none, where it holds one)."""
    (cluster,) = clusters_of(args)
    return _source(args, cluster)


def report_of(args: argparse.Namespace, source, catalog: Catalog, config: DetectorConfig, advice: AdviceConfig,
              overrides: dict[str, str]):
    """One analysis: per GPU, or in fleet mode from the roll-ups and the series they flag."""
    from .report import analyze
    from .sources import PrometheusError

    if not args.fleet:
        return analyze(load_frames(args, source), catalog, config, advice, overrides)
    from .fleet import analyze_fleet
    try:
        return analyze_fleet(source, window_of(args), catalog, config, advice, overrides, args.rollup_interval)
    except (PrometheusError, OSError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def run(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    """`stop` ends `--serve` (the command runs until interrupted without it)."""
    from .report import render_clusters, render_csv, render_json, render_table

    if args.checkpoint_seconds is not None and args.checkpoint_seconds <= 0:
        raise UserError("--checkpoint-seconds must be positive")
    if args.fleet and args.prometheus is None:
        raise UserError("--fleet reads a store's roll-ups: it needs --prometheus URL")
    if args.rollup_interval is not None and args.rollup_interval <= 0:
        raise UserError("--rollup-interval must be positive")
    catalog = catalog_of(args)
    advice = AdviceConfig(checkpoint_seconds=args.checkpoint_seconds)
    overrides = overrides_of(args)
    config = detector_config_of(args)
    if args.serve:
        from .serve import serve
        if args.interval <= 0:
            raise UserError("--interval must be positive")
        if args.cluster == "all":
            raise UserError("--serve exports one report: name its cluster with --cluster NAME")
        return serve(lambda: report_of(args, one_source(args), catalog, config, advice, overrides),
                     args.listen, args.interval, stop)
    render = {"table": render_table, "json": render_json, "csv": render_csv}[args.format]
    if args.cluster != "all":
        sys.stdout.write(render(report_of(args, one_source(args), catalog, config, advice, overrides)))
        return 0
    reports = {cluster or "": report_of(args, _source(args, cluster or ""), catalog, config, advice, overrides)
               for cluster in clusters_of(args)}
    sys.stdout.write(render_clusters(reports, args.format))
    return 0
