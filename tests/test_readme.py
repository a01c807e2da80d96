"""The README and the pages of docs/ stay true: the README's sections in the agreed order,
the metrics and benchmark tables generated from their sources, the usage lines accepted by
the commands they show, and every shell command in them run exactly as written, here or by
.ci/run.

Shell commands are the lines of ```sh blocks. `make` targets take minutes and build
the virtualenv, so .ci/run runs them; this test runs every other one in a directory that
looks like the checkout (with the files its page names), with `docker` and `kubectl` replaced by stand-ins that record
what they are asked and are checked against the Dockerfile and the manifests. A command
whose comment names a URL is a server: it passes when that URL answers.
"""
import argparse
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest
import yaml

from bench import readme_table
from burnrate import cli
from burnrate.exporter import docs
from tests import kube_tools
from tests.conftest import ROOT

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
CI = os.path.join(ROOT, ".ci", "run")
MANIFESTS = os.path.join(ROOT, "manifests")

# The agreed order of the front page: after the title and what burnrate is, the two commands,
# deploying, instrumenting a loop, and where to read on; the rest lives in docs/.
SECTIONS = ("Try it", "Deploy to a cluster", "Instrument your own training loop", "Read on")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


TEXT = read(README)
# Every page of the documentation, by its path from the repository's root: the README first.
PAGES = {"README.md": TEXT, **{f"docs/{name}": read(os.path.join(DOCS, name))
                               for name in sorted(os.listdir(DOCS)) if name.endswith(".md")}}


def section(title: str) -> str:
    """The text under the README's `## title`, up to the next `## ` heading."""
    return TEXT.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def body(page: str) -> str:
    """A docs/ page without its `# title` line."""
    return PAGES[page].split("\n", 1)[1]


@dataclass(frozen=True)
class Block:
    language: str
    name: str       # a file name after the language (```yaml pricing.yaml): the page's commands use that file
    body: str
    page: str


def blocks(pages: tuple[str, ...] = tuple(PAGES)) -> list[Block]:
    out = []
    for page in pages:
        for m in re.finditer(r"^(?P<indent> *)```(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```", PAGES[page], re.M | re.S):
            language, _, name = m["info"].strip().partition(" ")
            out.append(Block(language, name.strip(), m["body"], page))
    return out


@dataclass(frozen=True)
class Command:
    line: str       # as written, without its comment
    comment: str
    page: str
    earlier: tuple[str, ...] = ()   # the lines before it in its block, which it may build on

    @property
    def url(self) -> str | None:
        found = re.search(r"https?://\S+", self.comment)
        return found.group(0) if found else None


def commands(pages: tuple[str, ...] = tuple(PAGES)) -> list[Command]:
    out = []
    for block in blocks(pages):
        if block.language == "sh":
            earlier: list[str] = []
            for line in block.body.splitlines():
                command, _, comment = line.partition(" #")
                if command.strip():
                    out.append(Command(command.strip(), comment.strip(), block.page, tuple(earlier)))
                    if not out[-1].url and not command.startswith("make "):
                        earlier.append(command.strip())
    return out


COMMANDS_HERE = [c for c in commands() if not c.line.startswith("make ")]


# --- what the README shows, in order ---------------------------------------------------------------

def test_the_sections_come_in_the_agreed_order():
    headings = re.findall(r"^## (.+)$", TEXT, re.M)
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS)
    title, intro = TEXT.split("\n## ", 1)[0].split("\n", 1)
    assert title == "# burnrate" and "for ML platform teams" in intro


def test_the_two_commands_come_first():
    assert [c.line for c in commands(("README.md",))][:2] == ["make demo", "make test"]
    assert "```sh\nmake demo" in section("Try it")


@pytest.mark.parametrize("page,path", [("docs/dashboard.md", "screenshots/fleet.png"),
                                       ("docs/architecture.md", "architecture.svg")])
def test_a_picture_opens_the_page(page, path):
    first = body(page).strip().split("\n", 1)[0]
    assert re.fullmatch(rf"!\[[^\]]+\]\({re.escape(path)}\)", first), first


def test_the_front_page_shows_the_dashboard():
    assert "![The fleet page of the burnrate dashboard](docs/screenshots/fleet.png)" in section("Try it")


@pytest.mark.parametrize("page", PAGES)
def test_every_picture_exists(page):
    for path in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", PAGES[page]):
        assert os.path.isfile(os.path.join(ROOT, os.path.dirname(page), path)), path


def test_the_metrics_table_is_the_catalog():
    table = [line for line in PAGES["docs/metrics.md"].splitlines() if line.startswith("|")]
    expected = [line for line in docs.render().splitlines() if line.startswith("|")]
    assert table and table == expected, "regenerate with: python -m burnrate.exporter.docs > docs/metrics.md"


def test_the_benchmark_table_is_bench_results():
    table = readme_table.between(PAGES["docs/benchmarks.md"], readme_table.BEGIN, readme_table.END)
    assert table == readme_table.render(read(readme_table.RESULTS)), "regenerate with: python bench/readme_table.py"
    assert os.path.samefile(readme_table.PAGE, os.path.join(DOCS, "benchmarks.md"))


def test_benchmark_figures_are_read_by_section_row_and_column():
    doc = ("## Agent: `bench/agent.py --seconds 30`\n\nMachine: ...\n\n"
           "| measure | idle | loaded |\n|---|---|---|\n| RSS (MB) | 63.3 | 1,064.8 |\n")
    agent = readme_table.sections(doc)["Agent"]
    assert agent.command == "bench/agent.py --seconds 30"
    assert readme_table.cell("RSS (MB)", "loaded")(agent) == 1064.8
    with pytest.raises(readme_table.Missing, match="CPU"):
        readme_table.cell("CPU", "loaded")(agent)
    with pytest.raises(readme_table.Missing, match="'## Agent'.*'scrape p99"):
        readme_table.render(doc)


def test_only_a_sections_first_table_is_read():
    doc = ("## Dashboard: `bench/dashboard.py`\n\n| what | build s |\n|---|---:|\n| fleet | 0.046 |\n\n"
           "In a browser:\n\n| page | load ms |\n|---|---:|\n| fleet | 71 |\n")
    dashboard = readme_table.sections(doc)["Dashboard"]
    assert list(dashboard.rows) == ["fleet"] and dashboard.rows["fleet"] == {"what": "fleet", "build s": "0.046"}
    assert readme_table.largest("build s")(dashboard) == 0.046


# --- usage lines ----------------------------------------------------------------------------------

def usages() -> list[str]:
    """`burnrate COMMAND ...` synopses in text blocks, their indented continuation lines joined
    (not messages such as `burnrate analyze: error: ...`)."""
    out: list[str] = []
    for block in blocks():
        if block.language == "text":
            joined = re.sub(r"\n\s+(?=\[)", " ", block.body)
            out += [line for line in joined.splitlines() if re.match(r"burnrate [a-z]+(\s|$)", line)]
    return out


def options(command: str) -> set[str]:
    parser = argparse.ArgumentParser()
    importlib.import_module(cli.COMMANDS[command][0]).add_arguments(parser)
    return {option for action in parser._actions for option in action.option_strings}


def test_every_command_has_a_usage_line():
    assert sorted({u.split()[1] for u in usages()}) == sorted(cli.COMMANDS)


@pytest.mark.parametrize("usage", usages(), ids=lambda u: u.split()[1])
def test_usage_lines_name_only_flags_the_command_takes(usage):
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage))
    assert flags and flags <= options(usage.split()[1]), flags - options(usage.split()[1])


# --- commands ------------------------------------------------------------------------------------

def test_ci_runs_the_make_targets_exactly_as_written():
    ci = read(CI).splitlines()
    for command in commands(("README.md",)):
        if command.line.startswith("make "):
            assert command.line in ci, f".ci/run must run `{command.line}`"
    assert ci.index("make test") < ci.index("make demo")


@pytest.mark.parametrize("command", [c for c in commands() if c.line.startswith("make ") and c.page != "README.md"],
                         ids=lambda c: f"{c.page}: {c.line}")
def test_make_targets_in_docs_exist(command):
    """What the docs tell a developer to `make` is a target of the Makefile (a dry run)."""
    proc = subprocess.run([*command.line.split(), "-n"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


STANDIN = """#!{python}
import hashlib, json, os, sys
args = sys.argv[1:]
with open(os.environ["README_STANDIN_LOG"], "a") as fh:
    fh.write(json.dumps({{"tool": os.path.basename(sys.argv[0]), "cwd": os.getcwd(), "args": args,
                          "registry": os.environ.get("REGISTRY")}}) + "\\n")
if "--metadata-file" in args:   # what a pushed `docker buildx bake` writes (docker's documented format)
    with open(args[args.index("--file") + 1]) as fh:
        bake = json.load(fh)
    with open(args[args.index("--metadata-file") + 1], "w") as fh:
        json.dump({{t: {{"containerimage.digest": "sha256:" + hashlib.sha256(t.encode()).hexdigest(),
                       "image.name": os.environ["REGISTRY"] + "/" + t + ":0.1.0"}}
                   for t in bake["group"]["default"]["targets"]}}, fh)
"""


def check_docker(call: dict) -> None:
    """A bake of docker-bake.json, pushed, to a registry that was named (tests/test_release.py
    checks that its targets are the Dockerfile's stages and the manifests' images)."""
    args = call["args"]
    assert args[:2] == ["buildx", "bake"] and "--push" in args, args
    assert os.path.samefile(args[args.index("--file") + 1], os.path.join(ROOT, "docker-bake.json"))
    assert call["registry"], "REGISTRY was not set"


def check_kubectl(call: dict) -> None:
    """The kustomization release/publish wrote: manifests/ with every image by its digest."""
    args, cwd = call["args"], call["cwd"]
    assert args[:2] == ["apply", "-k"] and len(args) == 3
    proc = subprocess.run([kube_tools.tool("kubectl"), "kustomize", os.path.join(cwd, args[2])],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pods = [doc["spec"]["template"]["spec"] for doc in yaml.safe_load_all(proc.stdout)
            if doc and doc["kind"] in ("Deployment", "DaemonSet")]
    assert pods and all(re.fullmatch(r"[\w.:/-]+/burnrate[\w-]*@sha256:[0-9a-f]{64}", c["image"])
                        for pod in pods for c in pod["containers"])


def check_helm(call: dict) -> None:
    """`helm install` renders what `helm template` does with the same arguments, and
    `helm template` shows what it says it does, both by the real helm."""
    args = call["args"]
    assert args[0] in ("install", "template") and args[1:3] == ["burnrate", "charts/burnrate"], args
    proc = subprocess.run([kube_tools.tool("helm"), "template", *args[1:]], cwd=call["cwd"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rendered = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    if args[0] == "install":
        assert {d["kind"] for d in rendered} >= {"DaemonSet", "Deployment", "ServiceMonitor", "PrometheusRule"}
        return
    # The fast alerts: the PrometheusRule alone, every group evaluated as often as --set says.
    settings = dict(kv.split("=", 1) for kv in args[args.index("--set") + 1].split(","))
    [rule] = rendered
    assert rule["kind"] == "PrometheusRule"
    assert {g["interval"] for g in rule["spec"]["groups"] if g["name"] != "burnrate-rollups"} == \
        {settings["prometheusRule.interval"]}
    assert {r.get("for") for g in rule["spec"]["groups"] for r in g["rules"]} == {None, settings["prometheusRule.for"]}


STANDINS = {"docker": check_docker, "kubectl": check_kubectl, "helm": check_helm}


@pytest.fixture
def checkout(tmp_path):
    """A directory that looks like the checkout, where what the commands write stays; and an
    environment with the stand-ins first on PATH. `named_files` adds a page's named files."""
    work, bin_ = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_.mkdir()
    for name in os.listdir(ROOT):
        (work / name).symlink_to(os.path.join(ROOT, name))
    for tool in STANDINS:
        (bin_ / tool).write_text(STANDIN.format(python=sys.executable))
        (bin_ / tool).chmod(0o755)
    log = tmp_path / "standins.jsonl"
    env = {**os.environ, "README_STANDIN_LOG": str(log),
           "PATH": os.pathsep.join([str(bin_), os.path.dirname(sys.executable), os.environ["PATH"]])}
    return str(work), env, log


def named_files(work: str, page: str) -> None:
    """The files a page names in its blocks (```yaml pricing.yaml), which its commands use."""
    for block in blocks((page,)):
        if block.name:
            with open(os.path.join(work, block.name), "w", encoding="utf-8") as fh:
                fh.write(block.body)


def _serve(command: Command, cwd: str, env: dict, log: str) -> None:
    url = urllib.parse.urlsplit(command.url)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((url.hostname, url.port))
        except OSError:
            pytest.skip(f"{url.netloc} is in use by another process")
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", command.line], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 240
        while proc.poll() is None and time.time() < deadline:
            try:
                with urllib.request.urlopen(command.url, timeout=5) as resp:
                    assert resp.status == 200 and "burnrate" in resp.read().decode().lower()
                    return
            except OSError:
                time.sleep(1)
        pytest.fail(f"{command.url} never answered:\n{read(log)[-2000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS_HERE, ids=[f"{c.page}: {c.line}" for c in COMMANDS_HERE])
def test_documented_command_runs_as_written(command, checkout, tmp_path):
    cwd, env, log = checkout
    named_files(cwd, command.page)
    for line in command.earlier:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"`{line}`, before it: " + proc.stderr[-2000:]
    if command.url:
        _serve(command, cwd, env, str(tmp_path / "server.log"))
        return
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command.line], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for call in calls:
        STANDINS[call["tool"]](call)
    if command.line.split()[0] in STANDINS:
        assert calls, f"{command.line.split()[0]} was not called"


def test_the_pod_wiring_shown_is_the_manifests():
    """The env, mount and volume the README tells a user to add are the example PyTorchJob's."""
    (shown,) = [yaml.safe_load(b.body) for b in blocks(("README.md",))
                if b.language == "yaml" and "BURNRATE_TELEMETRY_SOCKET" in b.body]
    job = yaml.safe_load(read(os.path.join(MANIFESTS, "trainer", "pytorchjob.yaml")))
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    (container,) = pod["containers"]
    assert shown["env"] == [e for e in container["env"] if e["name"] in {x["name"] for x in shown["env"]}]
    assert {x["name"] for x in shown["env"]} == {"BURNRATE_TELEMETRY_SOCKET", "POD_NAME", "POD_NAMESPACE",
                                               "BURNRATE_TRAINING_JOB"}
    assert shown["volumeMounts"][0] in container["volumeMounts"] and shown["volumes"][0] in pod["volumes"]
