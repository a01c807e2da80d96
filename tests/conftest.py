import os
import shutil
import socket
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PYTHON = sys.executable


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
