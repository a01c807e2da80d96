"""What `make demo` and `make test` install into a fresh virtualenv, in either order (dry runs
of the real Makefile): the demo only its extra, which reaches none of the packages only the
tests use; the tests everything, without building the venv twice."""
from __future__ import annotations

import os
import re
import subprocess
import tomllib

import pytest

from tests.conftest import ROOT

ONLY_FOR_TESTS = {"transformers", "accelerate", "pytorch-lightning", "torchtitan", "triton", "pytest", "selenium"}


def dry_run(target: str, venv) -> list[str]:
    done = subprocess.run(["make", "-n", "-C", ROOT, target, f"VENV={venv}"], capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if not line.startswith(("#", "make"))]


def installs(lines: list[str]) -> list[str]:
    return [m for line in lines for m in re.findall(r"-e '(\.\[\w+\])'", line)]


def extra(name: str) -> set[str]:
    """The projects an extra of pyproject.toml reaches, its burnrate[...] references followed."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    out = set()
    for requirement in extras[name]:
        project = re.match(r"[\w.-]+", requirement).group(0).lower()
        inner = re.search(r"\[(.+)\]", requirement)
        out |= set().union(*(extra(e) for e in inner[1].split(","))) if project == "burnrate" else {project}
    return out


def test_the_demo_extra_reaches_nothing_only_the_tests_use():
    assert extra("demo") & ONLY_FOR_TESTS == set()
    assert ONLY_FOR_TESTS <= extra("all")


def test_make_demo_on_a_fresh_machine_installs_the_demo_extra_only(tmp_path):
    lines = dry_run("demo", tmp_path / "venv")
    assert installs(lines) == [".[demo]"]
    assert lines[-1].endswith("-m burnrate demo --duration 120")


@pytest.mark.parametrize("demo_first", [False, True], ids=["make test alone", "make demo, then make test"])
def test_make_test_installs_everything_the_tests_use(tmp_path, demo_first):
    venv = tmp_path / "venv"
    if demo_first:
        venv.mkdir()
        (venv / ".installed-demo").touch()   # newer than pyproject.toml: what `make demo` left
    lines = dry_run("test", venv)
    assert installs(lines) == ([".[all]"] if demo_first else [".[demo]", ".[all]"])
    assert sum(" -m venv " in line for line in lines) == (0 if demo_first else 1)
    # the suite on two workers, then the timed modules alone
    assert [line.split(" -m pytest ", 1)[1] for line in lines[-2:]] == ['-q -n 2 --dist loadfile -m "not serial"',
                                                                         "-q -m serial"]
    venv.mkdir(exist_ok=True)
    for stamp in (".installed-demo", ".installed"):   # both built: neither target installs again
        (venv / stamp).touch()
    assert installs(dry_run("test", venv)) == installs(dry_run("demo", venv)) == []
