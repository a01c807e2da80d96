"""`burnrate agent --once` on NVML: the real command, its NvmlReader over the NVML stand-in
(tests/nvml_standin.py), since no GPU is here. GPM activity and rates cover the time between
two reads, so one read alone would print none of them (as it did on an H200)."""
from __future__ import annotations

import pynvml

from burnrate import cli
from burnrate.agent import cli as agent_cli
from burnrate.agent.gpu.nvml import NvmlReader
from tests.nvml_standin import FakeGpu, StandInNvml


def test_once_prints_what_needs_two_reads(monkeypatch, tmp_path, capsysbinary) -> None:
    nvml = StandInNvml([FakeGpu(gpm={pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 61.0,
                                     pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 97.0,
                                     pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 20.0})])
    monkeypatch.setattr(agent_cli, "_reader", lambda args, telemetry: NvmlReader(nvml=nvml, event_wait_ms=20))
    assert cli.main(["agent", "--backend", "nvml", "--once", "--attribution", "local",
                     "--telemetry-socket", str(tmp_path / "t.sock")]) == 0
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
              for line in capsysbinary.readouterr().out.decode().splitlines() if line.startswith("DCGM_FI_PROF")}
    assert values == {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.61, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.97,
                      "DCGM_FI_PROF_DRAM_ACTIVE": 0.20}
