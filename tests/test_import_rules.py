"""Who may import whom (shared/DESIGN.md), held by walking every module's imports.

Floors, bottom up: `exporter` (nothing of ours) -> `agent`, `analyzer`, `trainer` (peers,
none imports another) -> `simulator` (agent, analyzer), `dashboard` (analyzer) ->
`burnrate` (the CLI, which imports any part; no part imports it back).

The arrows the code still draws against those rules are listed below, one per file and
module. A new one fails this test; so does a listed one that is gone, so that the list
is struck off as the arrows are fixed and only ever shrinks.
"""
from __future__ import annotations

import ast
import os

from tests.conftest import ROOT

EXPORTER, AGENT, ANALYZER, TRAINER = "exporter", "agent", "analyzer", "trainer"
SIMULATOR, DASHBOARD, CLI = "simulator", "dashboard", "burnrate"
PARTS = (EXPORTER, AGENT, ANALYZER, TRAINER, SIMULATOR, DASHBOARD, CLI)
ALLOWED = {
    EXPORTER: set(),
    AGENT: {EXPORTER}, ANALYZER: {EXPORTER}, TRAINER: {EXPORTER},
    SIMULATOR: {EXPORTER, AGENT, ANALYZER},
    DASHBOARD: {EXPORTER, ANALYZER},
    CLI: set(PARTS) - {CLI},
}
KNOWN = {
    # The simulator, still inside the analyzer, borrows the agent's simulated GPU model and
    # its recording writer.
    ("analyzer/fleet.py", "agent.gpu.simulated"), ("analyzer/signals.py", "agent.gpu.simulated"),
    ("analyzer/simulate.py", "agent.recording"),
    # The Snapshot records live in the agent, which the exporter renders.
    ("exporter/collector.py", "agent.snapshot"),
}


def arrows() -> set[tuple[str, str]]:
    """(file, imported module) for every import of another part."""
    out = set()
    for part in PARTS:
        for directory, _, files in os.walk(os.path.join(ROOT, part)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        modules = [alias.name for alias in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        modules = [node.module]
                    else:
                        continue
                    out |= {(os.path.relpath(path, ROOT), m) for m in modules
                            if m.split(".")[0] in PARTS and m.split(".")[0] != part}
    return out


def forbidden(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return {(path, module) for path, module in edges
            if module.split(".")[0] not in ALLOWED[path.split("/")[0]]}


def test_no_part_imports_what_the_design_forbids():
    found = forbidden(arrows())
    assert found - KNOWN == set(), "new imports against shared/DESIGN.md's rules"
    assert KNOWN - found == set(), "these are fixed: strike them off KNOWN"


def test_the_walk_sees_imports_as_written():
    """The walk itself: a module that imports the agent from the exporter is caught."""
    assert forbidden({("exporter/x.py", "agent.snapshot"), ("dashboard/y.py", "analyzer.views"),
                      ("agent/z.py", "exporter.catalog"), ("burnrate/cli.py", "dashboard.app")}) == \
        {("exporter/x.py", "agent.snapshot")}
    assert {("dashboard/data.py", "analyzer.report"), ("agent/cli.py", "exporter.server")} <= arrows()
