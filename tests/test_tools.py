"""`make test` names the Debian tools it lacks, with the line that installs them, before any
test runs; a test whose tool is missing fails naming its package instead of skipping."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, require
from tests.tools import TOOLS

TOOLS_PY = os.path.join(ROOT, "tests", "tools.py")
PACKAGES = sorted(set(TOOLS.values()))


def run_tools(path: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOOLS_PY, *argv], env={**os.environ, "PATH": path},
                          capture_output=True, text=True, timeout=30)


def test_on_a_machine_without_them_every_package_is_named_with_its_install_line(tmp_path):
    listed = run_tools(str(tmp_path))
    assert (listed.returncode, listed.stdout.split()) == (0, PACKAGES)
    checked = run_tools(str(tmp_path), "--check")
    assert checked.returncode == 1 and checked.stdout == ""
    [line] = checked.stderr.splitlines()
    assert line.startswith("make test runs real chromium, chromium-driver, openssl, prometheus, ")
    assert f"sudo apt-get install -y {' '.join(PACKAGES)}" in line


def test_with_them_all_installed_nothing_is_missing():
    assert run_tools(os.environ["PATH"], "--check").returncode == 0
    assert run_tools(os.environ["PATH"]).stdout.strip() == ""


def test_make_test_checks_them_before_pytest():
    with open(os.path.join(ROOT, "Makefile")) as fh:
        recipe = fh.read().split("\ntest: ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [line.strip() for line in recipe] == ["$(PY) tests/tools.py --check",
                                                 '$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial"',
                                                 "$(PY) -m pytest -q -m serial"]


def test_a_test_whose_tool_is_missing_fails_naming_its_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"vmalert is not installed: sudo apt-get install -y victoria-metrics"):
        require("vmalert")
