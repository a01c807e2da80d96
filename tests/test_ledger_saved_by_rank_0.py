"""The ledger of a loop that saves from rank 0 alone, as nanoGPT's `if master_process:` does.

Two ranks under the real torchrun with gloo run a loop shaped like nanoGPT's (DDP, gradients
accumulated over micro-batches) that nobody here wrote the ledger for. Every `SAVE_EVERY`
steps rank 0 alone saves, inside `mon.checkpoint()`, while rank 1 goes on to its next step and
waits in DDP's collectives until rank 0 comes back: rank 1 reports that wait as its step's
compute. A real `burnrate agent` records (local attribution: each GPU held from its rank's first
message until its process ends), and `burnrate analyze` must book every save on both GPUs, as
long as rank 0 measured it, none of it as a stall (under thresholds that call 1 s without a step
one), and the steps' compute as what rank 0 computed: rank 1's wait taken back out of it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.detectors.config_file import detector_config
from burnrate.analyzer.output.report import analyze
from burnrate.analyzer.sources import RecordingSource
from tests.conftest import ROOT
from tests.processes import agent

pytestmark = pytest.mark.slow

JOB, INTERVAL_S = "saved-by-rank-0", 0.5
ITERS, ACCUM, BATCH, SEQ, SAVE_EVERY, SAVE_S = 50, 2, 2, 32, 12, 1.5
CONFIG = dict(vocab_size=256, block_size=SEQ, n_layer=2, n_head=4, n_embd=64)
THRESHOLDS = "stalled: {interval_factor: 5.0, floor_minutes: 0.0167}\n"
# A category is off by less than a grid step (1 s) at each end of the run, per GPU.
EDGES_S = 1.0

LOOP = textwrap.dedent(f"""
    import json, os, sys, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from burnrate.monitor import Monitor
    from burnrate.trainer.model import GPT, GPTConfig

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    master_process = rank == 0
    torch.manual_seed(0)
    model = DDP(GPT(GPTConfig(**{CONFIG!r})))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    own = {{"compute_s": 0.0, "saves_s": []}}

    def get_batch():
        x = torch.randint(0, {CONFIG['vocab_size']}, ({BATCH}, {SEQ}))
        return x, x

    with Monitor(model, seq_len={SEQ}) as mon:
        with mon.data_wait():
            X, Y = get_batch()
        for it in range(1, {ITERS} + 1):
            began = time.perf_counter()
            with mon.compute():
                for micro_step in range({ACCUM}):
                    model.require_backward_grad_sync = micro_step == {ACCUM} - 1
                    loss = model(X, Y)
                    mon.micro_batch(samples=len(X), loss=loss)
                    with mon.data_wait():
                        X, Y = get_batch()
                    (loss / {ACCUM}).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            own["compute_s"] += time.perf_counter() - began
            mon.step()
            if it % {SAVE_EVERY} == 0 and master_process:
                began = time.perf_counter()
                with mon.checkpoint():
                    torch.save(model.module.state_dict(), os.path.join(sys.argv[1], "ckpt.pt"))
                    time.sleep({SAVE_S})
                own["saves_s"].append(time.perf_counter() - began)
    with open(os.path.join(sys.argv[1], f"rank{{rank}}.json"), "w") as fh:
        json.dump(own, fh)
    dist.destroy_process_group()
    os._exit(0)   # skips torch 2.13's gloo teardown abort (tests/test_monitor_in_a_users_loop.py)
""")


def test_a_save_from_rank_0_alone_is_booked_on_every_gpu_and_no_stall(tmp_path):
    recording, script = tmp_path / "recording", tmp_path / "train.py"
    script.write_text(LOOP)
    (tmp_path / "thresholds.yaml").write_text(THRESHOLDS)
    with agent(tmp_path, "--interval", str(INTERVAL_S), "--attribution", "local", "--record", str(recording)) \
            as (_, sock, _proc):
        began = time.time()
        env = {"BURNRATE_TELEMETRY_SOCKET": sock, "BURNRATE_TRAINING_JOB": JOB, "POD_NAMESPACE": "ml",
               "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "PYTHONPATH": ROOT}
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script), str(tmp_path)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        time.sleep(3 * INTERVAL_S)       # the GPUs let go, and written
    analyzed = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--recording", str(recording),
                               "--start", repr(began - 5), "--end", repr(time.time()),
                               "--detector-config", str(tmp_path / "thresholds.yaml"), "--format", "json"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    doc = json.loads(analyzed.stdout)
    (priced,) = [j for j in doc["jobs"] if j["training_job"] == JOB]
    # The same figures from the analyzer's API, not rounded: the document's 1e-4 GPU-hours are
    # 0.36 s, as much as the steps' compute here.
    (exact,) = [j for j in analyze(RecordingSource(str(recording)).frames(), load_catalog(),
                                   detector_config(yaml.safe_load(THRESHOLDS))).jobs if j.training_job == JOB]
    ledger = {name: hours * 3600 for name, hours in exact.ledger.gpu_hours.items()}
    own = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    saves = own[0]["saves_s"]
    figures = f"ledger (GPU-s) {json.dumps({k: round(v, 2) for k, v in ledger.items()})}\nranks' own {own}"
    assert priced["gpus"] == 2 and len(saves) == ITERS // SAVE_EVERY and own[1]["saves_s"] == [], figures
    # Rank 1 waited for each save in its steps' compute: its own clock says so.
    assert own[1]["compute_s"] - own[0]["compute_s"] > 0.8 * sum(saves), figures
    # Every save blocked both GPUs for as long as rank 0 took.
    assert ledger["checkpoint"] == pytest.approx(2 * sum(saves), abs=2 * EDGES_S), figures
    # (A save read as a stall would be 3 GPU-seconds; the run's edges are known to a grid step.)
    assert ledger["stalled"] < EDGES_S, figures
    # The steps computed what rank 0 computed on each GPU; rank 1's wait is the saves'.
    assert ledger["productive"] == pytest.approx(2 * own[0]["compute_s"], rel=0.25), figures
    assert [f["kind"] for f in doc["findings"] if f.get("training_job") == JOB and f["kind"] == "stalled"] == []
