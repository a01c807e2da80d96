"""Who may import whom (docs/architecture.md, "Who may import whom"), held by walking every module's imports.

Floors, bottom up: `exporter` (nothing of ours) -> `agent`, `analyzer`, `trainer` (peers,
none imports another) -> `simulator` (agent, analyzer), `dashboard` (analyzer) ->
`burnrate` (the CLI, which imports any part; no part imports it back). No module takes
part in an import cycle, and every import of ours goes through the installed namespace
(`burnrate.agent`, never a bare `agent`).

Every import counts, also one inside a function: a lazy import is still an arrow.
"""
from __future__ import annotations

import ast
import os
from collections.abc import Iterator

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


def modules() -> dict[str, str]:
    """Installed module name -> source file (relative to the repository), for every part."""
    out = {}
    for part in PARTS:
        for directory, _, files in os.walk(os.path.join(ROOT, part)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.relpath(os.path.join(directory, name), ROOT)
                    dotted = path[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    out[dotted if part == CLI else f"burnrate.{dotted}"] = path
    return out


def part_of(module: str) -> str | None:
    """The part an installed module name belongs to; None for anything not ours."""
    head, _, rest = module.partition(".")
    if head != CLI:
        return None
    inner = rest.split(".")[0]
    return inner if inner in PARTS and inner != CLI else CLI


def imports(path: str, module: str, known: dict[str, str]) -> Iterator[str]:
    """The modules a file imports, relative imports resolved; `from pkg import mod` names the
    module `pkg.mod` where that is one."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in known else base


def graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports."""
    known = modules()
    return {module: {m for m in imports(path, module, known) if m in known or part_of(m) or m.split(".")[0] in PARTS}
            for module, path in known.items()}


def forbidden(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, import) for every arrow the rules forbid, and every bare top-level import of a part."""
    out = set()
    for module, targets in edges.items():
        source = part_of(module)
        for target in targets:
            to = part_of(target)
            if to is None or (to != source and to not in ALLOWED[source]):
                out.add((module, target))
    return out


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges.get(v, ()):
                found.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def private_imports() -> set[tuple[str, str]]:
    """(module, imported name) for every private name (`_x`) one part takes from another."""
    known = modules()
    out = set()
    for module, path in known.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and part_of(node.module or "") not in (None, part_of(module)):
                out |= {(module, f"{node.module}.{a.name}") for a in node.names if a.name.startswith("_")}
    return out


def test_no_part_takes_another_parts_private_names():
    assert private_imports() == set()


def test_no_part_imports_what_the_design_forbids():
    assert forbidden(graph()) == set()


def test_no_module_takes_part_in_an_import_cycle():
    assert cycles(graph()) == []


def test_the_walk_sees_imports_as_written():
    """The walk itself: forbidden arrows, bare names and cycles are caught, and the real
    tree's known arrows are seen, relative imports resolved."""
    assert forbidden({
        "burnrate.exporter.x": {"burnrate.agent.snapshot"},
        "burnrate.dashboard.y": {"burnrate.analyzer.grid.views", "burnrate.exporter.catalog"},
        "burnrate.agent.z": {"exporter.catalog"},
        "burnrate.trainer.m": {"burnrate.cli"},
        "burnrate.cli": {"burnrate.dashboard.app"},
    }) == {("burnrate.exporter.x", "burnrate.agent.snapshot"), ("burnrate.agent.z", "exporter.catalog"),
           ("burnrate.trainer.m", "burnrate.cli")}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}) == [{"a", "b", "c"}, {"e"}]
    edges = graph()
    assert "burnrate.analyzer.output.report" in edges["burnrate.dashboard.data"]
    assert "burnrate.exporter.server" in edges["burnrate.agent.cli"]
    assert "burnrate.agent.sampler" in edges["burnrate.agent.cli"]   # written `from .sampler import`


# The analyzer's stages, in the order it runs them (docs/architecture.md): reading (`sources`)
# onto the common grid (`grid`), detection (`detectors`), accounting and prices (`costing`),
# the report (`output`); `fleet` runs them over the roll-ups. A stage imports only the stages
# below it in STAGES and only their public names; the command line (`cli` and the `options`
# it reads a store with) sits above them all and may import any.
STAGES = ("grid", "sources", "detectors", "costing", "output", "fleet")


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["burnrate", "analyzer"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in STAGES else None


def stage_violations(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, import) for every arrow from a stage to a later one."""
    out = set()
    for module, targets in edges.items():
        source = stage_of(module)
        for target in targets:
            to = stage_of(target)
            if source and to and STAGES.index(to) > STAGES.index(source):
                out.add((module, target))
    return out


def private_stage_imports() -> set[tuple[str, str]]:
    """(module, imported name) for every private name one stage takes from another."""
    known = modules()
    out = set()
    for module, path in known.items():
        source = stage_of(module)
        if source is None:
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                if stage_of(base) not in (None, source):
                    out |= {(module, f"{base}.{a.name}") for a in node.names if a.name.startswith("_")}
    return out


def test_every_analyzer_module_but_the_command_line_belongs_to_a_stage():
    loose = {m for m in modules() if m.startswith("burnrate.analyzer.") and stage_of(m) is None}
    assert loose == {"burnrate.analyzer.cli", "burnrate.analyzer.options"}


def test_no_stage_imports_a_later_one():
    assert stage_violations({
        "burnrate.analyzer.grid.views": {"burnrate.analyzer.detectors.findings", "burnrate.analyzer.grid.frames"},
        "burnrate.analyzer.costing.cost": {"burnrate.analyzer.detectors"},
        "burnrate.analyzer.cli": {"burnrate.analyzer.fleet.mode"},
    }) == {("burnrate.analyzer.grid.views", "burnrate.analyzer.detectors.findings")}
    assert stage_violations(graph()) == set()


def test_no_stage_takes_another_stages_private_names():
    assert private_stage_imports() == set()
