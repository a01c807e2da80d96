"""`burnrate demo` end to end: real agent, real 2-rank training with faults, the analyzer naming them."""
import subprocess

import pytest

from tests.conftest import PYTHON, ROOT, free_port

pytestmark = pytest.mark.slow


def test_demo_names_the_injected_faults(tmp_path):
    proc = subprocess.run([PYTHON, "-m", "burnrate", "demo", "--duration", "60", "--no-browser",
                           "--dir", str(tmp_path / "demo"), "--port", str(free_port()),
                           "--agent-port", str(free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    live = proc.stdout.split("=== live training on this machine")[1].split("=== simulated fleet ===")[0]
    findings = [line.split() for line in live.splitlines() if line.startswith(("critical", "warning", "info"))]
    straggler = [f for f in findings if f[1] == "straggler"]
    assert straggler and straggler[0][2] == "demo/llm-pretrain" and "rank 1" in " ".join(straggler[0])
    assert any(f[1] == "dataloader_starvation" and f[2] == "demo/llm-finetune" for f in findings)
    assert not any(f[1] == "straggler" and f[2] != "demo/llm-pretrain" for f in findings)
    assert "=== simulated fleet ===" in proc.stdout
