"""`burnrate dashboard`: serve the team dashboard over Prometheus or a recording."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from burnrate.analyzer.options import ALL_CLUSTERS, SourceOptions, add_source_arguments, source_options
from burnrate.exporter.errors import UserError
from burnrate.exporter.listen import ensure_free, listen_address

DEFAULT_LISTEN = "127.0.0.1:8050"
# Callbacks that wait on Prometheus hold a thread each; a page fires several at once.
_THREADS = 8
# A callback's request names a page's filters: kilobytes. Waitress' default is 1 GiB.
_MAX_REQUEST_BYTES = 1 << 20


def _prometheus(options: SourceOptions):
    """The store, or each of its clusters (name -> source, picked in the header) where it
    holds several and none is named: two clusters' jobs and nodes of the same name never add up."""
    from burnrate.analyzer.grid.frames import Window

    now = time.time()
    every = replace(options, cluster=options.cluster or ALL_CLUSTERS)
    found = every.clusters(Window(now - 7 * 86400.0, now))      # the clusters seen in the last week
    if len(found) == 1:
        return options.open(found[0])
    return {name: options.open(name) for name in found}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from burnrate.analyzer.cli import add_fleet_arguments

    add_source_arguments(parser, "without it, each cluster is picked in the header")
    add_fleet_arguments(parser)
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"where to serve the dashboard (default {DEFAULT_LISTEN})")
    # The dashboard's own visitors, not Prometheus (--basic-auth-user): `--basic-auth` is its older name.
    parser.add_argument("--ui-basic-auth", "--basic-auth", dest="ui_basic_auth", metavar="USER:PASSWORD|FILE",
                        help="require HTTP basic auth of the dashboard's visitors; a file holding USER:PASSWORD "
                             "keeps it out of `ps` (the store's own credentials are --basic-auth-user and "
                             "--basic-auth-password-file)")
    parser.add_argument("--refresh", type=float, default=60.0, metavar="S",
                        help="seconds between live refreshes of a page (default 60)")
    parser.add_argument("--cache-ttl", type=float, default=30.0, metavar="S",
                        help="seconds an analysis is reused before it is recomputed (default 30)")
    parser.add_argument("--budgets", metavar="FILE",
                        help="YAML budgets per team: the Cost page shows each team's spend and forecast against "
                             "its budget (docs/budgets.md)")


def run(args: argparse.Namespace) -> int:
    import waitress

    from . import auth
    from .app import create_app
    from .ui import SERVICE_KEY

    from burnrate.analyzer.cli import check_fleet_arguments, forced_by

    options = source_options(args)
    check_fleet_arguments(args, options)
    host, port = listen_address(args.listen, default_host=None)
    ensure_free(host, port, "--listen")
    if args.refresh <= 0 or args.cache_ttl <= 0:
        raise UserError("--refresh and --cache-ttl must be positive")
    try:
        credentials = auth.credentials(args.ui_basic_auth) if args.ui_basic_auth is not None else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    budgets = None
    if args.budgets is not None:
        from burnrate.analyzer.output.budget_report import read
        budgets = read(args.budgets)
    catalog, config = options.catalog(), options.detectors()
    if options.recording is not None:
        source, where = options.open(), f"recording {options.recording}"
    else:
        source, where = _prometheus(options), f"Prometheus {options.prometheus}"
    app = create_app(source, catalog, ttl_s=args.cache_ttl, refresh_s=args.refresh, basic_auth=credentials,
                     config=config, forced_by=forced_by(args), rollup_interval_s=args.rollup_interval)
    if budgets is not None:
        from .budgets import install
        install(app.server, budgets)
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
