import atexit
import fcntl
import os
import shutil
import socket
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.tools import TOOLS, install_line  # noqa: E402  (after ROOT is on the path)
PYTHON = sys.executable
# Hypothesis keeps caches in a storage directory: one of this run's own, removed when the
# process that made it exits (after every pytest hook, some of which write there), so that
# the tests leave nothing behind. Test modules import this file again as `tests.conftest`,
# and subprocesses inherit the variable: one directory per run.
if "BURNRATE_TEST_HYPOTHESIS_HOME" not in os.environ:
    os.environ["BURNRATE_TEST_HYPOTHESIS_HOME"] = tempfile.mkdtemp(prefix="burnrate-hypothesis-")
    atexit.register(shutil.rmtree, os.environ["BURNRATE_TEST_HYPOTHESIS_HOME"], ignore_errors=True)
os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = os.environ["BURNRATE_TEST_HYPOTHESIS_HOME"]


def pytest_configure(config):
    """tmp_path directories under one of this run's own, removed when it exits, rather than
    pytest's /tmp/pytest-of-USER, which outlives the run."""
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="burnrate-pytest-")
        atexit.register(shutil.rmtree, config.option.basetemp, ignore_errors=True)


# Modules whose assertions rest on time measured under real load (an alert's `for:`, a ledger
# read at the agent's interval, a thread or memory bound under a flood): `make test` runs them
# alone after the others, which share the cores two at a time. A module whose other tests do
# not time anything marks its timed tests `serial` one by one instead (test_trainer_ddp).
SERIAL = {"test_demo", "test_alert_delivery", "test_ledger_torchrun", "test_trainer_agent",
          "test_server_slow_clients", "test_agent_memory", "test_recording_full_disk", "test_budgets_serve",
          "test_huggingface_ledger"}


def pytest_ignore_collect(collection_path, config):
    """`-m serial` alone (make test's second run) imports only the modules that hold serial
    tests: collecting the others, torch and Dash among their imports, took it ten seconds."""
    if config.option.markexpr != "serial" or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py" or collection_path.stem in SERIAL:
        return None
    return None if "pytest.mark.serial" in collection_path.read_text() else True


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rpartition(".")[2] in SERIAL:
            item.add_marker(pytest.mark.serial)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require(tool: str) -> str:
    """The path of a Debian tool the test needs (tests/tools.py): missing, the test fails
    naming the package, since a skipped test proves nothing (`make test` checks them all first)."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed: {install_line([TOOLS[tool]])}")
    return path


@pytest.fixture(scope="session", autouse=True)
def _every_report_keeps_its_waste_within_its_cost():
    from tests.invariants import every_report_checked
    with every_report_checked():
        yield


def built_once(tmp_path_factory, name: str, build) -> str:
    """A directory `build(dir)` fills, built once per `make test` rather than once per worker:
    under pytest-xdist the workers' temporary directories share a parent, and the first worker
    to get there builds it while the others wait. Read-only for its users: copy before writing."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / f"built-{name}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shared.exists():
            building = shared.with_name(shared.name + ".partial")
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir()
            build(building)
            building.rename(shared)
    return str(shared)


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """The showback tests' fleet in a real Prometheus (tests/test_showback.py), built once for
    the modules that read it."""
    from tests.test_showback import serve_fleet
    yield from serve_fleet(tmp_path_factory)
