"""The documents the project promises its users live in the repository, and say what the code does.

The README is a front page that links every page of docs/; every link and every `docs/…md`
a file cites resolves, anchors included; docs/cli.md lists exactly the flags each command
takes; docs/report.md names every field a real report has, and its CSV columns in order;
docs/findings.md names every finding kind and every setting `--detector-config` takes, with
its default. The README's own checks (commands run as written, tables generated) are in
tests/test_readme.py.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import json
import os
import re
import subprocess

import pytest

from burnrate import cli
from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.detectors.findings import KINDS
from tests.conftest import PYTHON, ROOT
from tests.test_readme import PAGES, TEXT, read

FRONT_PAGE_LINES = 300
# Where citations can be: everything of ours that is text, not what tools build or install.
CITING = (".py", ".md", ".yaml", ".yml", ".toml", ".json", ".tpl", ".txt", ".cfg", ".sh", "Makefile", "Dockerfile")
SKIPPED_DIRS = {".git", ".venv", "build", "dist", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis"}
# Documents that live outside the repository, which no file may cite; spelt in two halves so
# that this file does not cite them itself.
OUTSIDE = re.compile("CONT" + r"RACT\b|DES" + r"IGN\.md|\.\./shar" + "ed/|shar" + "ed/[A-Z]")
DOC_CITATION = re.compile(r"docs/([\w-]+\.md)(?:#([a-z0-9][\w-]*))?")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", PAGES[page], flags=re.M | re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def citing_files() -> list[str]:
    out = []
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        out += [os.path.relpath(os.path.join(directory, f), ROOT) for f in sorted(files) if f.endswith(CITING)]
    return out


# --- the front page ------------------------------------------------------------------------------

def test_the_readme_is_a_front_page():
    lines = TEXT.count("\n")
    assert lines < FRONT_PAGE_LINES, f"README.md has {lines} lines: move a section to a page of docs/"


def test_every_page_of_docs_is_reachable_from_the_readme():
    seen, todo = set(), ["README.md"]
    while todo:
        page = todo.pop()
        seen.add(page)
        for target in LINK.findall(PAGES[page]):
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if path in PAGES and path not in seen:
                todo.append(path)
    assert set(PAGES) - seen == set(), "link these pages from the README's Read on table"


# --- links and citations -------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES)
def test_every_link_resolves(page):
    for target in LINK.findall(PAGES[page]):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        assert os.path.exists(os.path.join(ROOT, resolved)), f"{page}: {target} is not in the repository"
        if fragment and resolved.endswith(".md"):
            assert fragment in anchors(resolved), f"{page}: {resolved} has no heading for #{fragment}"


def test_nothing_cites_a_document_outside_the_repository():
    cited = [f"{path}:{n}: {line.strip()}" for path in citing_files()
             for n, line in enumerate(read(os.path.join(ROOT, path)).splitlines(), 1) if OUTSIDE.search(line)]
    assert cited == [], "cite the page of docs/ that holds it instead:\n" + "\n".join(cited)


def test_every_cited_docs_page_exists():
    missing = []
    for path in citing_files():
        for page, fragment in DOC_CITATION.findall(read(os.path.join(ROOT, path))):
            if f"docs/{page}" not in PAGES:
                missing.append(f"{path}: docs/{page}")
            elif fragment and fragment not in anchors(f"docs/{page}"):
                missing.append(f"{path}: docs/{page}#{fragment}")
    assert missing == []


# --- the command line ----------------------------------------------------------------------------

def documented_flags() -> dict[str, set[str]]:
    """Command -> the flags in the first column of its table in docs/cli.md."""
    out = {}
    for command, section in re.findall(r"^## `burnrate (\w+)`\n(.*?)(?=^## |\Z)", PAGES["docs/cli.md"], re.M | re.S):
        rows = [re.split(r"(?<!\\)\|", line)[1] for line in section.splitlines() if line.startswith("| `")]
        out[command] = {flag for row in rows for flag in re.findall(r"`(--?[\w-]+)", row)}
    return out


def flags(command: str) -> set[str]:
    parser = argparse.ArgumentParser()
    importlib.import_module(cli.COMMANDS[command][0]).add_arguments(parser)
    return {option for action in parser._actions for option in action.option_strings} - {"-h", "--help"}


def test_the_cli_page_has_every_command():
    assert sorted(documented_flags()) == sorted(cli.COMMANDS)


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_the_cli_page_lists_exactly_the_flags_a_command_takes(command):
    documented, real = documented_flags().get(command, set()), flags(command)
    assert documented == real, (f"docs/cli.md, `burnrate {command}`: document {sorted(real - documented)}, "
                                f"remove {sorted(documented - real)}")


def test_the_cli_page_names_the_time_formats_the_commands_read():
    from burnrate.analyzer.sources.timeparse import parse_duration, parse_time
    page = PAGES["docs/cli.md"]
    for example in ("2026-11-21T03:00:00Z", "1795230000"):
        assert f"`{example}`" in page and parse_time(example) > 0
    for example in ("90m", "2h", "7d", "1h30m", "1000y"):
        assert f"`{example}`" in page and parse_duration(example) > 0


# --- the report ----------------------------------------------------------------------------------

# Maps whose keys are data (host names, finding kinds, evidence figures), not fields.
DATA_KEYED = {"nodes", "waste_dollars", "evidence"}


def field_names(value, into: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            into.add(key)
            if key == "nodes":
                for figures in inner.values():
                    field_names(figures, into)
            elif key not in DATA_KEYED:
                field_names(inner, into)
    elif isinstance(value, list):
        for inner in value:
            field_names(inner, into)
    return into


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A real report of a simulated fleet with every fault, as JSON and as CSV."""
    work = tmp_path_factory.mktemp("report")
    fleet = str(work / "fleet")
    run = [PYTHON, "-m", "burnrate"]
    subprocess.run(run + ["simulate", "--out", fleet, "--nodes", "2", "--hours", "2"], check=True,
                   capture_output=True, timeout=300)
    out = {fmt: subprocess.run(run + ["analyze", "--recording", fleet, "--format", fmt], check=True,
                               capture_output=True, text=True, timeout=300).stdout for fmt in ("json", "csv")}
    return json.loads(out["json"]), out["csv"]


def test_the_report_page_names_every_field(report):
    doc, _ = report
    assert doc["findings"] and doc["jobs"] and any(j["ledger"] for j in doc["jobs"])
    page = PAGES["docs/report.md"]
    undocumented = sorted(name for name in field_names(doc, set()) if f"`{name}`" not in page)
    assert undocumented == [], f"docs/report.md does not name {undocumented}"


def test_the_report_page_lists_the_csv_columns_in_order(report):
    _, text = report
    header = next(csv.reader([text.splitlines()[0]]))
    section = PAGES["docs/report.md"].split("\n## CSV\n", 1)[1]
    listed = re.findall(r"`([\w]+)`", section.split("\n\n")[1])
    assert listed == header


# --- the findings --------------------------------------------------------------------------------

def test_the_findings_page_has_every_kind():
    table = re.findall(r"^\| `(\w+)` \|", PAGES["docs/findings.md"].split("\n## Settings\n")[0], re.M)
    assert sorted(table) == sorted(KINDS)


@pytest.mark.parametrize("section", [f.name for f in dataclasses.fields(DetectorConfig)])
def test_the_findings_page_has_every_setting_with_its_default(section):
    settings = PAGES["docs/findings.md"].split("\n## Settings\n", 1)[1]
    found = re.search(rf"^### `{section}`\n(.*?)(?=^### |\Z)", settings, re.M | re.S)
    assert found, f"docs/findings.md has no settings for `{section}`"
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", found.group(1), re.M))
    config = getattr(DetectorConfig(), section)
    assert {name: float(value) for name, value in rows.items()} == \
        {f.name: float(getattr(config, f.name)) for f in dataclasses.fields(config)}
