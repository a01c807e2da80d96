"""`burnrate dashboard`: serve the team dashboard over Prometheus or a recording."""
from __future__ import annotations

import argparse
import sys
import time

from burnrate.exporter.errors import UserError
from burnrate.exporter.listen import ensure_free, listen_address

DEFAULT_LISTEN = "127.0.0.1:8050"
# Callbacks that wait on Prometheus hold a thread each; a page fires several at once.
_THREADS = 8
# A callback's request names a page's filters: kilobytes. Waitress' default is 1 GiB.
_MAX_REQUEST_BYTES = 1 << 20


def _prometheus(args: argparse.Namespace):
    """The store, or each of its clusters (name -> source, picked in the header) where it
    holds several and none is named: two clusters' jobs and nodes of the same name never add up."""
    from burnrate.analyzer.cli import clusters_of
    from burnrate.analyzer.frames import Window
    from burnrate.analyzer.sources import PrometheusSource

    now = time.time()
    found = clusters_of(argparse.Namespace(**{**vars(args), "cluster": args.cluster or "all"}),
                        PrometheusSource(args.prometheus, timeout_s=args.timeout),
                        Window(now - 7 * 86400.0, now))    # the clusters seen in the last week

    def scoped(cluster: str | None):
        scope = {args.cluster_label: cluster} if cluster is not None else None
        return PrometheusSource(args.prometheus, timeout_s=args.timeout, scope=scope)

    if len(found) == 1:
        return scoped(found[0])
    return {name: scoped(name) for name in found}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="Prometheus (or Thanos/Mimir) base URL")
    src.add_argument("--recording", metavar="DIR", help="a recording from `burnrate agent --record` or `simulate`")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"where to serve the dashboard (default {DEFAULT_LISTEN})")
    parser.add_argument("--basic-auth", metavar="USER:PASSWORD|FILE",
                        help="require HTTP basic auth; a file holding USER:PASSWORD keeps it out of `ps`")
    parser.add_argument("--cluster", metavar="NAME",
                        help="one cluster of a store that holds several (its --cluster-label value); "
                        "without it, each cluster is picked in the header")
    parser.add_argument("--cluster-label", default="cluster", metavar="LABEL",
                        help="the label naming each series' cluster (default cluster)")
    parser.add_argument("--pricing", metavar="FILE", help="YAML price overrides per instance type, GPU model or node")
    parser.add_argument("--detector-config", metavar="FILE",
                        help="YAML thresholds per detector, as `burnrate analyze --detector-config` reads them")
    parser.add_argument("--refresh", type=float, default=60.0, metavar="S",
                        help="seconds between live refreshes of a page (default 60)")
    parser.add_argument("--cache-ttl", type=float, default=30.0, metavar="S",
                        help="seconds an analysis is reused before it is recomputed (default 30)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="per-request Prometheus timeout (default 30)")


def run(args: argparse.Namespace) -> int:
    from burnrate.analyzer.detectors import DetectorConfig
    from burnrate.analyzer.detectors.config_file import DetectorConfigError, load_detector_config
    from burnrate.analyzer.pricing import PricingError, load_catalog
    from burnrate.analyzer.recording import RecordingError
    from burnrate.analyzer.sources import PrometheusSource, RecordingSource

    import waitress

    from . import auth
    from .app import create_app
    from .ui import SERVICE_KEY

    host, port = listen_address(args.listen, default_host=None)
    ensure_free(host, port, "--listen")
    if args.refresh <= 0 or args.cache_ttl <= 0 or args.timeout <= 0:
        raise UserError("--refresh, --cache-ttl and --timeout must be positive")
    try:
        credentials = auth.credentials(args.basic_auth) if args.basic_auth is not None else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        catalog = load_catalog(args.pricing)
        config = load_detector_config(args.detector_config) if args.detector_config else DetectorConfig()
    except (PricingError, DetectorConfigError) as exc:
        raise UserError(str(exc)) from None
    try:
        if args.recording is not None:
            source, where = RecordingSource(args.recording), f"recording {args.recording}"
        else:
            source, where = _prometheus(args), f"Prometheus {args.prometheus}"
    except (RecordingError, ValueError) as exc:
        raise UserError(str(exc)) from None
    app = create_app(source, catalog, ttl_s=args.cache_ttl, refresh_s=args.refresh, basic_auth=credentials,
                     config=config)
    app.server.extensions[SERVICE_KEY].warm_up()
    print(f"burnrate dashboard: http://{args.listen}/ ({where})", file=sys.stderr, flush=True)
    try:
        server = waitress.create_server(app.server, host=host, port=port, threads=_THREADS, ident="burnrate",
                                        max_request_body_size=_MAX_REQUEST_BYTES)
    except OSError as exc:
        raise UserError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
    try:
        server.run()
    finally:
        server.close()
    return 0
