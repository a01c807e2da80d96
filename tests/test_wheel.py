"""The built wheel, as a user's environment gets it: everything under the one `burnrate`
namespace, every module and data file of the tree in it, nothing else at the top of
site-packages, and a user's own `trainer.py` beside `from burnrate.monitor import Monitor`.

The wheel is built from a copy of the tree (setuptools writes build/ and egg-info beside
the sources) and unpacked into a directory ahead of the test venv's site-packages: what
pip does with a pure-Python wheel, without touching the venv.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from tests.conftest import PYTHON, ROOT
from tests.test_import_rules import modules

pytestmark = pytest.mark.slow

DATA = ("burnrate/analyzer/costing/prices.yaml", "burnrate/dashboard/assets/style.css", "burnrate/dashboard/assets/links.js",
        "burnrate/agent/attribution/podresources/v1/api.proto")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    work = tmp_path_factory.mktemp("wheel")
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout
    src = work / "src"
    for name in filter(None, tracked.decode().split("\0")):
        if os.path.exists(os.path.join(ROOT, name)):
            os.makedirs(src / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), src / name)
    subprocess.run([PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
                    str(src)], check=True, capture_output=True)
    (built,) = (work / "dist").iterdir()
    return str(built)


def test_the_wheel_holds_the_whole_tree_under_burnrate_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"burnrate"}
    expected = {path.replace(os.sep, "/") if path.startswith("burnrate" + os.sep) else "burnrate/" + path.replace(os.sep, "/")
                for path in modules().values()}
    assert expected - names == set(), "modules missing from the wheel: list their packages in pyproject.toml"
    assert set(DATA) - names == set()
    assert "burnrate/monitor.py" in names and "burnrate/simulator/simulate.py" in names


def test_an_installed_wheel_serves_a_user_with_a_trainer_module_of_their_own(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    repo = tmp_path / "users-repo"
    repo.mkdir()
    # The most common name a training repository gives its own code.
    (repo / "trainer.py").write_text("NAME = 'the user\\'s trainer'\n")
    (repo / "train.py").write_text(textwrap.dedent("""
        import importlib, sys
        import trainer
        from burnrate.monitor import Monitor
        import burnrate

        print(trainer.NAME)
        print(burnrate.__file__)
        mon = Monitor(seq_len=4, socket_path="no-agent.sock")
        mon.step(samples=3)
        print(mon.report()["tokens"])
        mon.close()
        for name in sys.argv[1:]:
            importlib.import_module(name)
    """))
    env = dict(os.environ, PYTHONPATH=str(site))
    # -S: no site-packages, so nothing but the standard library and the wheel: the core install.
    core = subprocess.run([PYTHON, "-S", "train.py"], cwd=repo, env=env, capture_output=True, text=True)
    assert core.returncode == 0, core.stderr
    assert core.stdout.splitlines() == ["the user's trainer", str(site / "burnrate" / "__init__.py"), "12"]
    # With the extras (the test venv has them all), every module imports from the wheel.
    # __main__ modules run programs; Dash loads the pages itself, once an app exists.
    every = sorted(m for m in modules() if not m.endswith("__main__") and ".pages." not in m)
    full = subprocess.run([PYTHON, "train.py", *every], cwd=repo, env=env, capture_output=True, text=True)
    assert full.returncode == 0, full.stderr
    assert full.stdout.splitlines()[1] == str(site / "burnrate" / "__init__.py")   # the wheel's, not the checkout's
    version = subprocess.run([PYTHON, "-S", "-m", "burnrate", "--version"], cwd=repo, env=env, capture_output=True,
                             text=True)
    assert version.stdout.strip() == "burnrate 0.1.0"
    for bare in ("agent", "exporter", "analyzer", "dashboard", "simulator"):
        found = subprocess.run([PYTHON, "-c", f"import {bare}"], cwd=repo, env=env, capture_output=True, text=True)
        assert f"No module named '{bare}'" in found.stderr


@pytest.mark.parametrize("command, extra", [("agent", "agent"), ("analyze", "analyzer"), ("train", "trainer")])
def test_a_command_without_its_extra_says_what_to_install(wheel, tmp_path, command, extra):
    zipfile.ZipFile(wheel).extractall(tmp_path)
    done = subprocess.run([PYTHON, "-S", "-m", "burnrate", command, "--help"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True, text=True)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"burnrate {command}: error: needs the {extra!r} extra (no module named ")
    assert line.endswith(f"pip install 'burnrate[{extra}]'")
