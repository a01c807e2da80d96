"""`burnrate <command>`: dispatches to the part that owns the command.

Only the chosen command's module is imported, so that `burnrate agent` on a GPU node
never loads pandas, Dash or torch.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import re
import sys

from burnrate.exporter.errors import UserError, printable

# command -> (module with add_arguments(parser) and run(args) -> int, the extra it needs, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("burnrate.demo", "demo", "the embedded demo: agent, real training with faults, analyzer, dashboard"),
    "agent": ("burnrate.agent.cli", "agent", "the node agent: GPU metrics, pod attribution, training telemetry"),
    "train": ("burnrate.trainer.cli", "trainer", "the instrumented reference DDP trainer"),
    "simulate": ("burnrate.simulator.simulate", "simulator", "write a synthetic fleet recording with ground-truth faults"),
    "analyze": ("burnrate.analyzer.cli", "analyzer", "findings and per-job cost from Prometheus or a recording"),
    "report": ("burnrate.analyzer.output.showback_command", "analyzer",
               "showback: each team's GPU-hours, dollars, waste and goodput per month, week or day"),
    "dashboard": ("burnrate.dashboard.cli", "dashboard", "the team dashboard: fleet, jobs, findings, cost"),
    "rules": ("burnrate.analyzer.output.thresholds", "analyzer",
              "render the alert rules and Grafana thresholds from the detectors' thresholds"),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser that takes no abbreviation (`--sinc 2h` would silently be
    `--since 2h`), and whose every error is one line saying what to give instead: an
    unknown flag is named, with the real flag it is closest to, before any other error
    it would cause."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self._given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extra = super().parse_known_args(args, namespace)
        if self._unknown_flag():
            self.error("")
        return parsed, extra

    def error(self, message: str):
        unknown = self._unknown_flag()
        if unknown:
            near = difflib.get_close_matches(unknown, list(self._option_string_actions), n=1)
            message = f"unrecognized argument {unknown}" + (f" (did you mean {near[0]}?)" if near else "")
        else:
            message = self._no_value(message) or self._no_command(message) or message
        self.exit(2, f"{self.prog}: error: {message}\n")

    @staticmethod
    def _no_command(message: str) -> str | None:
        """A misspelt command, named with the one it is closest to."""
        choice = re.fullmatch(r"argument COMMAND: invalid choice: '(.*)' \(choose from .*\)", message)
        if not choice:
            return None
        near = difflib.get_close_matches(choice.group(1), list(COMMANDS), n=1)
        return (f"no command {choice.group(1)!r}" + (f" (did you mean {near[0]}?)" if near else "")
                + f"; the commands: {', '.join(COMMANDS)}")

    def _unknown_flag(self) -> str | None:
        """The first flag given that this parser does not take (the command's own flags are
        its subparser's to judge)."""
        after_value = False
        for arg in self._given:
            if arg == "--" or (self._subparsers is not None and not arg.startswith("-")):
                return None
            name = arg.split("=", 1)[0]
            if arg.startswith("-") and not after_value and not self._negative_number_matcher.match(arg) \
                    and name not in self._option_string_actions:
                return name
            action = self._option_string_actions.get(name)
            after_value = action is not None and action.nargs is None and "=" not in arg
        return None

    def _no_value(self, message: str) -> str | None:
        """A flag's value that looks like a flag: most often a negative duration."""
        missing = re.fullmatch(r"argument (\S+?)(?:/\S+)?: expected one argument", message)
        if not missing or missing.group(1) not in self._given:
            return None
        flag = missing.group(1)
        at = self._given.index(flag) + 1
        if at == len(self._given):
            return None
        if self._option_string_actions[flag].metavar == "DURATION":
            return f"{flag} wants a duration like 2h; {self._given[at]} is not one (durations are positive)"
        return f"{flag} wants a value; {self._given[at]} is not one"


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
    parser = _Parser(prog="burnrate", description="GPU cost and waste, per training job.")
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
        return getattr(exc, "exit_code", 2)
    except KeyboardInterrupt:
        return 130
