"""What every command that reads a store is told about it: the store (a Prometheus URL or
a recording), how to reach it (credentials, TLS, timeout, scrape interval), which of its
clusters, and the price and detector files its figures need. `burnrate analyze` and
`burnrate dashboard` take the same flags (docs/sources.md), added by
`add_source_arguments` and read back by `source_options`; a user's mistake is one line
before anything is read."""
from __future__ import annotations

import argparse
import os
import urllib.parse
from dataclasses import dataclass

from burnrate.exporter.errors import UserError
from burnrate.exporter.labels import not_a_cluster_label

from .detectors import DetectorConfig
from .detectors.config_file import DetectorConfigError, load_detector_config
from .grid.frames import Window
from .costing.pricing import Catalog, PricingError, load_catalog
from .sources.recording_tables import RecordingError
from .sources.prometheus import PrometheusError, PrometheusSource
from .sources.promhttp import MAX_POINTS, MAX_SERIES, Limits
from .sources.recording import RecordingSource

ALL_CLUSTERS = "all"
# The flags that only a Prometheus store takes, by the option's attribute.
_CONNECTION = {"bearer_token_file": "--bearer-token-file", "basic_auth_user": "--basic-auth-user",
               "basic_auth_password_file": "--basic-auth-password-file", "ca_file": "--ca-file",
               "insecure_skip_verify": "--insecure-skip-verify", "max_series": "--max-series",
               "max_points": "--max-points"}


@dataclass(frozen=True)
class SourceOptions:
    """Checked as it is made: a SourceOptions names exactly one store, positive times, and
    credential files that can be read. The files are read again by each `open()`, so a
    long-running command that opens the store anew picks up a rotated token."""

    prometheus: str | None = None
    recording: str | None = None
    bearer_token_file: str | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 30.0
    scrape_interval_s: float | None = None
    cluster: str | None = None
    cluster_label: str = "cluster"
    pricing: str | None = None
    detector_config: str | None = None
    max_series: int | None = None
    max_points: int | None = None

    def __post_init__(self) -> None:
        if (self.prometheus is None) == (self.recording is None):
            raise UserError("give one store: --prometheus URL or --recording DIR")
        if self.recording is not None:
            given = [flag for name, flag in _CONNECTION.items() if getattr(self, name)]
            if given:
                raise UserError(f"{', '.join(given)}: for --prometheus only; a recording is read from disk")
            if self.cluster is not None:
                raise UserError("--cluster chooses among the clusters of a Prometheus store; "
                                "a recording is one cluster's")
            return
        _check_url(self.prometheus)
        if self.timeout_s <= 0:
            raise UserError("--timeout must be positive")
        for flag, limit in (("--max-series", self.max_series), ("--max-points", self.max_points)):
            if limit is not None and limit <= 0:
                raise UserError(f"{flag} must be positive")
        problem = not_a_cluster_label(self.cluster_label)
        if problem:
            raise UserError(problem)
        if self.scrape_interval_s is not None and self.scrape_interval_s <= 0:
            raise UserError("--scrape-interval must be positive")
        if self.basic_auth_password_file and not self.basic_auth_user:
            raise UserError("--basic-auth-password-file needs --basic-auth-user")
        if self.bearer_token_file and self.basic_auth_user:
            raise UserError("give --bearer-token-file or --basic-auth-user, not both: a request carries one")
        if (self.ca_file or self.insecure_skip_verify) and not self.prometheus.startswith("https:"):
            raise UserError(f"--ca-file and --insecure-skip-verify are for an https:// URL, not {self.prometheus}")
        if self.ca_file is not None and not os.path.isfile(self.ca_file):
            raise UserError(f"cannot read CA file {self.ca_file}: no such file")
        if self.bearer_token_file and not _read_secret(self.bearer_token_file, "bearer token file"):
            raise UserError(f"bearer token file {self.bearer_token_file} is empty")
        _read_secret(self.basic_auth_password_file, "basic auth password file")

    def open(self, cluster: str | None = None) -> PrometheusSource | RecordingSource:
        """The store: the recording, or Prometheus, scoped to `cluster` (its `cluster_label`
        value) where one is named."""
        if self.recording is not None:
            try:
                return RecordingSource(self.recording)
            except RecordingError as exc:
                raise UserError(str(exc)) from None
        basic_auth = None
        if self.basic_auth_user:
            basic_auth = (self.basic_auth_user,
                          _read_secret(self.basic_auth_password_file, "basic auth password file") or "")
        try:
            return PrometheusSource(
                self.prometheus, timeout_s=self.timeout_s,
                bearer_token=_read_secret(self.bearer_token_file, "bearer token file"), basic_auth=basic_auth,
                ca_file=self.ca_file, insecure=self.insecure_skip_verify, min_step_s=self.scrape_interval_s,
                scope={self.cluster_label: cluster} if cluster is not None else None,
                limits=Limits(self.max_series or MAX_SERIES, self.max_points or MAX_POINTS))
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot use Prometheus at {self.prometheus}: {exc}") from None

    def clusters(self, window: Window, store: PrometheusSource | None = None) -> list[str | None]:
        """The clusters to report on, one report each: the one named, every one for `all`, or
        the store as a whole where it holds one. A store holding several is never merged into
        one report unasked: jobs and nodes of the same name in two clusters would add up."""
        if self.prometheus is None:
            return [None]
        try:
            found = (store or self.open()).clusters(window, self.cluster_label)
        except (PrometheusError, OSError, ValueError) as exc:
            raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        named = ", ".join(repr(c) if c else "(no label)" for c in found)
        if self.cluster == ALL_CLUSTERS:
            return found or [None]
        if self.cluster is not None:
            if self.cluster not in found:
                raise UserError(f"no GPU series of cluster {self.cluster!r} (label {self.cluster_label!r}) in the "
                                f"window; the store holds {named or 'none'}")
            return [self.cluster]
        if len(found) > 1:
            raise UserError(f"the store holds {len(found)} clusters by label {self.cluster_label!r}: {named}; "
                            "choose one with --cluster NAME, or --cluster all for one report each")
        return [None]

    def catalog(self) -> Catalog:
        try:
            return load_catalog(self.pricing)
        except PricingError as exc:
            raise UserError(str(exc)) from None

    def detectors(self) -> DetectorConfig:
        if self.detector_config is None:
            return DetectorConfig()
        try:
            return load_detector_config(self.detector_config)
        except DetectorConfigError as exc:
            raise UserError(str(exc)) from None


def add_source_arguments(parser: argparse.ArgumentParser, cluster_help: str) -> None:
    """The store's flags, the same for every command that reads one; `cluster_help` says
    what the command does without --cluster."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="Prometheus (or Thanos/Mimir) base URL")
    src.add_argument("--recording", metavar="DIR", help="a recording from `burnrate agent --record` or `simulate`")
    parser.add_argument("--pricing", metavar="FILE", help="YAML price overrides per instance type, GPU model or node")
    parser.add_argument("--detector-config", metavar="FILE",
                        help="YAML thresholds per detector, e.g. `idle_gpu: {min_minutes: 60}` (default: built in)")
    parser.add_argument("--cluster", metavar="NAME",
                        help=f"one cluster of a store that holds several (its --cluster-label value); {cluster_help}")
    parser.add_argument("--cluster-label", default="cluster", metavar="LABEL",
                        help="the label naming each series' cluster (default cluster)")
    parser.add_argument("--scrape-interval", type=float, metavar="S",
                        help="the shortest scrape interval of the GPU exporters: no step is finer (default: "
                             "from Prometheus' targets, else 15); any interval reads true, this only saves work")
    conn = parser.add_argument_group("Prometheus connection (the store's credentials, docs/sources.md)")
    conn.add_argument("--bearer-token-file", metavar="FILE", help="send the token in this file as a bearer token")
    conn.add_argument("--basic-auth-user", metavar="USER", help="HTTP basic auth user at Prometheus")
    conn.add_argument("--basic-auth-password-file", metavar="FILE", help="that user's password, in a file")
    conn.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify Prometheus' TLS certificate")
    conn.add_argument("--insecure-skip-verify", action="store_true", help="do not verify the TLS certificate")
    conn.add_argument("--timeout", type=float, default=30.0, metavar="S",
                      help="the most one request may take, connecting, headers and answer together (default 30)")
    limits = parser.add_argument_group("Prometheus answers (what one read may hold, docs/sources.md)")
    limits.add_argument("--max-series", type=int, metavar="N",
                        help=f"series in the answers of one read, each time piece counted (default {MAX_SERIES:,})")
    limits.add_argument("--max-points", type=int, metavar="N",
                        help=f"points in the answers of one read (default {MAX_POINTS:,})")


def source_options(args: argparse.Namespace) -> SourceOptions:
    """The options `add_source_arguments` put on `args`, checked (UserError: one line)."""
    return SourceOptions(
        prometheus=args.prometheus, recording=args.recording, bearer_token_file=args.bearer_token_file,
        basic_auth_user=args.basic_auth_user, basic_auth_password_file=args.basic_auth_password_file,
        ca_file=args.ca_file, insecure_skip_verify=args.insecure_skip_verify, timeout_s=args.timeout,
        scrape_interval_s=args.scrape_interval, cluster=args.cluster, cluster_label=args.cluster_label,
        pricing=args.pricing, detector_config=args.detector_config, max_series=args.max_series,
        max_points=args.max_points)


def _check_url(url: str) -> None:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port      # a port that is not a number is a ValueError here, not mid-query
    except ValueError as exc:
        raise UserError(f"--prometheus {url!r}: {exc}") from None
    if "://" not in url:
        raise UserError(f"--prometheus {url!r} has no scheme: give the URL with it, e.g. http://{url}")
    if "/api/v1" in parts.path:
        base = f"{parts.scheme}://{parts.netloc}{parts.path[:parts.path.index('/api/v1')]}"
        raise UserError(f"--prometheus wants the server's base URL, without /api/v1: {base}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--prometheus wants an http:// or https:// URL such as http://prometheus:9090, "
                        f"got {url!r}")


def _read_secret(path: str | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"cannot read {what} {path}: not UTF-8 text") from None
