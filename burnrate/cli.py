"""`burnrate <command>`: dispatches to the part that owns the command.

Only the chosen command's module is imported, so that `burnrate agent` on a GPU node
never loads pandas, Dash or torch.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from burnrate.exporter.errors import UserError, printable

# command -> (module with add_arguments(parser) and run(args) -> int, the extra it needs, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("burnrate.demo", "demo", "the embedded demo: agent, real training with faults, analyzer, dashboard"),
    "agent": ("burnrate.agent.cli", "agent", "the node agent: GPU metrics, pod attribution, training telemetry"),
    "train": ("burnrate.trainer.cli", "trainer", "the instrumented reference DDP trainer"),
    "simulate": ("burnrate.simulator.simulate", "simulator", "write a synthetic fleet recording with ground-truth faults"),
    "analyze": ("burnrate.analyzer.cli", "analyzer", "findings and per-job cost from Prometheus or a recording"),
    "dashboard": ("burnrate.dashboard.cli", "dashboard", "the team dashboard: fleet, jobs, findings, cost"),
    "rules": ("burnrate.analyzer.output.thresholds", "analyzer",
              "render the alert rules and Grafana thresholds from the detectors' thresholds"),
}


class MissingExtra(Exception):
    """A command's third-party dependency is not installed."""


@contextlib.contextmanager
def _needs(command: str):
    """Turn a missing third-party module into the one line that says what to install."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.split(".")[0] == "burnrate":
            raise
        extra = COMMANDS[command][1]
        raise MissingExtra(f"needs the {extra!r} extra (no module named {exc.name!r}): "
                           f"pip install 'burnrate[{extra}]'") from None


def _version() -> str:
    """The installed distribution's version; a source tree that is not installed says so."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("burnrate")
    except PackageNotFoundError:
        return "(not installed)"


def _parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="burnrate", description="GPU cost and waste, per training job.")
    parser.add_argument("--version", action="version", version=f"burnrate {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, _, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            with _needs(name):
                importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        args = _parser(command if command in COMMANDS else None).parse_args(argv)
        with _needs(args.command):
            return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except (MissingExtra, UserError) as exc:
        print(f"burnrate {command}: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
