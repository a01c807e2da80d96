import os
import shutil
import socket
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PYTHON = sys.executable
# Hypothesis keeps caches in a storage directory: one of this session's own, removed at
# its end, so that the tests leave nothing behind in the tree.
# Test modules import this file again as `tests.conftest`: one directory per process.
HYPOTHESIS_HOME = os.environ.get("BURNRATE_TEST_HYPOTHESIS_HOME") or tempfile.mkdtemp(prefix="burnrate-hypothesis-")
os.environ["BURNRATE_TEST_HYPOTHESIS_HOME"] = os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = HYPOTHESIS_HOME


@pytest.fixture(scope="session", autouse=True)
def _no_hypothesis_home_left():
    yield
    shutil.rmtree(HYPOTHESIS_HOME, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require(tool: str) -> str:
    """The path of a Debian tool the test needs; .ci/run installs them, so in CI this never skips."""
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed (.ci/run installs it)")
        pytest.skip(f"{tool} is not installed (apt-get install prometheus)")
    return path
