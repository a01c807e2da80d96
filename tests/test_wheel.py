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
import re
import textwrap
import zipfile

import pytest

from burnrate.agent.telemetry.inbox import TelemetryInbox
from tests.conftest import PYTHON, ROOT
from tests.test_import_rules import modules

pytestmark = pytest.mark.slow

DATA = ("burnrate/analyzer/costing/prices.yaml", "burnrate/dashboard/assets/style.css", "burnrate/dashboard/assets/links.js",
        "burnrate/agent/attribution/podresources/v1/api.proto")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> str:
    """A copy of the tree as a clone has it: setuptools writes build/ and egg-info into it."""
    src = tmp_path_factory.mktemp("checkout")
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if os.path.exists(os.path.join(ROOT, name)):
            os.makedirs(src / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), src / name)
    return str(src)


@pytest.fixture(scope="module")
def wheel(checkout, tmp_path_factory) -> str:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), checkout],
                   check=True, capture_output=True)
    (built,) = dist.iterdir()
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


def test_the_readmes_install_line_adds_the_monitor_to_a_training_environment_and_nothing_else(checkout, tmp_path):
    """The README's line for an existing training environment, run as written in the checkout
    with a fresh venv's pip (build isolation fetches setuptools, as for a user): burnrate is all
    it installs, so no torch build, dash or pandas is pulled, and the monitor reports to a real
    agent inbox from that venv."""
    (line,) = re.findall(r"`(pip install [^`]*)` in this repository", open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    venv = tmp_path / "training-env"
    subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", PIP_NO_CACHE_DIR="1")
    env.pop("PYTHONPATH", None)
    python = str(venv / "bin" / "python")
    listed = [python, "-c", "import importlib.metadata as m; print(*(f'{d.name}=={d.version}' for d in m.distributions()))"]
    before = set(subprocess.run(listed, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split())
    installed = subprocess.run(["bash", "-c", line], cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    after = set(subprocess.run(listed, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split())
    assert after - before == {"burnrate==0.1.0"} and before <= after
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        sent = subprocess.run([python, "-c", textwrap.dedent("""
            import sys
            from burnrate.monitor import Monitor
            with Monitor(seq_len=8) as mon:
                for batch in mon.wrap([[1, 2, 3]] * 5):
                    with mon.compute():
                        pass
                    mon.step(samples=len(batch), loss=0.5)
            print(sorted(m for m in ("torch", "numpy", "pandas", "dash") if m in sys.modules))
        """)], cwd=tmp_path, env=dict(env, BURNRATE_TELEMETRY_SOCKET=str(inbox.path), BURNRATE_TRAINING_JOB="mine"),
                              capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.strip() == "[]"
        assert inbox.wait_idle(5)
        (rank,) = inbox.ranks()
    assert (rank.key.training_job, rank.values["steps"], rank.values["samples"], rank.values["tokens"]) == ("mine", 5, 15, 120)
