"""`burnrate <command>`: dispatches to the part that owns the command.

Only the chosen command's module is imported, so that `burnrate agent` on a GPU node
never loads pandas, Dash or torch.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from exporter.errors import UserError

# command -> (module with add_arguments(parser) and run(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("burnrate.demo", "the embedded demo: agent, real training with faults, analyzer, dashboard"),
    "agent": ("agent.cli", "the node agent: GPU metrics, pod attribution, training telemetry"),
    "train": ("trainer.cli", "the instrumented reference DDP trainer"),
    "simulate": ("analyzer.simulate", "write a synthetic fleet recording with ground-truth faults"),
    "analyze": ("analyzer.cli", "findings and per-job cost from Prometheus or a recording"),
    "dashboard": ("dashboard.cli", "the team dashboard: fleet, jobs, findings, cost"),
}


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
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = _parser(command if command in COMMANDS else None).parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"burnrate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
