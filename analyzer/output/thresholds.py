"""`burnrate rules [--detector-config FILE] [--check] [FILE ...]`: the generated parts of a
rules file and of the Grafana dashboards, from the detectors' thresholds (docs/thresholds.md).

Each FILE is a rules file (YAML: its groups between `# BEGIN` and `# END` markers are
rendered again) or one of burnrate's Grafana dashboards (JSON: its thresholds are set), and
is rewritten in place; `--check` writes nothing and fails naming each file that differs.
Without a FILE, the detectors' rule groups are printed. With `--detector-config`, the figures
are a team's overrides rather than the defaults, so that the rules it deploys fire where its
`burnrate analyze --detector-config` finds the problems.
"""
from __future__ import annotations

import argparse
import sys

from burnrate.exporter import ledger_rules
from burnrate.exporter.errors import UserError
from burnrate.exporter import rules_yaml as Y

from . import alert_rules
from ..detectors import DetectorConfig
from ..detectors.config_file import DetectorConfigError, load_detector_config
from .grafana_thresholds import DashboardError, dashboard_text


def rules_text(text: str, config: DetectorConfig = DetectorConfig()) -> str:
    """A rules file's text with every rendered group rendered again."""
    for name in alert_rules.GROUPS:
        text = Y.splice(text, name, alert_rules.render(name, config))
    text = Y.splice(text, alert_rules.BUDGETS, alert_rules.render_budgets())
    return Y.splice(text, ledger_rules.GROUP, ledger_rules.render())


def regenerated(path: str, text: str, config: DetectorConfig = DetectorConfig()) -> str:
    return dashboard_text(text, config) if path.endswith(".json") else rules_text(text, config)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="a rules file (.yaml) or a burnrate Grafana dashboard (.json), rewritten in place")
    parser.add_argument("--detector-config", metavar="FILE",
                        help="YAML thresholds per detector, as `burnrate analyze --detector-config` reads them")
    parser.add_argument("--check", action="store_true", help="write nothing; fail naming each FILE that differs")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_detector_config(args.detector_config) if args.detector_config else DetectorConfig()
    except DetectorConfigError as exc:
        raise UserError(str(exc)) from None
    if not args.files:
        print("".join(alert_rules.render(name, config) for name in alert_rules.GROUPS), end="")
        return 0
    stale = []
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            new = regenerated(path, text, config)
        except (OSError, UnicodeDecodeError, Y.MarkerError, DashboardError) as exc:
            raise UserError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        if new == text:
            continue
        if args.check:
            stale.append(path)
            continue
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
        print(f"rewrote {path}", file=sys.stderr)
    if stale:
        print(f"not as rendered: {', '.join(stale)} (run without --check to rewrite)", file=sys.stderr)
        return 1
    return 0
