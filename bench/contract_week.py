"""A training fleet of N GPUs over a week at 15 s, from the contract's generator
(tests/contract_fleet.py: written from the contract alone, not from the simulator), imported
into VictoriaMetrics node group by node group, with the roll-ups evaluated over it by vmalert.

Jobs of 8 to 64 GPUs run one after another on their nodes for 2 to 12 hours each, to
within half an hour of the window's end, waiting 1% of each step for data; a few hold their GPUs idle and a few
starve for data (45% of each step): the planted faults. The store's data
directory is kept in the cache: once with the raw series, and once per rule file with the
roll-ups added.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from tests import contract_fleet as cf
from tests.rollup_stores import replay_in_victoria

NODES_PER_GROUP = 8
GPUS_PER_NODE = 8
START = cf.BASE_TIME
# (nodes per job) partitions of a group of eight nodes
SHAPES = ((8,), (4, 4), (4, 2, 2), (2, 2, 2, 2), (2, 2, 1, 1, 1, 1))
IDLE, STARVING = 0.02, 0.02


def group(index: int, days: float, seed: int = 0) -> tuple[list[cf.Node], list[cf.Workload]]:
    """Group `index`: its eight nodes and the jobs on them."""
    rng = np.random.default_rng([seed, index])
    end = START + days * 86400.0
    nodes = [cf.Node(f"gpu-{index * NODES_PER_GROUP + i:05d}", GPUS_PER_NODE, "agent", 15.0, jitter_s=0.5,
                     phase_s=float(rng.uniform(0, 15)), instance_type="p5.48xlarge",
                     gpu_model="NVIDIA H100 80GB HBM3") for i in range(NODES_PER_GROUP)]
    jobs: list[cf.Workload] = []
    first = 0
    for size in SHAPES[int(rng.integers(len(SHAPES)))]:
        mine = nodes[first:first + size]
        first += size
        t = START + float(rng.uniform(0, 1800))
        while t < end - 1800:   # what is left stays free: less than the hour a finding needs
            hours, fault = float(rng.uniform(2, 12)), rng.random()
            name = f"run-{index:03d}-{len(jobs):03d}"
            jobs.append(cf.Workload(
                f"team-{index % 12}", name, "training", "PyTorchJob",
                tuple((n.name, tuple(range(GPUS_PER_NODE))) for n in mine), t, min(t + hours * 3600, end),
                util_pct=0.0 if fault < IDLE else 92.0, telemetry=True, tokens_per_step=4e6, step_s=2.0,
                data_wait=0.45 if IDLE <= fault < IDLE + STARVING else 0.01))
            # the scheduler starts the next job within minutes
            t = jobs[-1].end + float(rng.uniform(60, 900))
    return nodes, jobs


def stored_week(cache: str, gpus: int, days: float, rules: str, vm) -> tuple[Path, dict]:
    """The store's data directory with the roll-ups of `rules`, and the fleet's truth:
    {"start", "end", "job_gpu_hours", "observed_gpu_hours", "jobs", "idle", "starving"}. `vm(data)` starts
    VictoriaMetrics on a data directory as a context manager yielding its URL."""
    raw = Path(cache) / f"victoria-contract-{gpus}gpus-{days:g}d"
    truth_file = raw / "truth.json"
    if not truth_file.exists():
        shutil.rmtree(raw, ignore_errors=True)
        raw.mkdir(parents=True)
        began, points = time.monotonic(), 0
        truth = {"start": START, "end": START + days * 86400.0, "job_gpu_hours": 0.0, "observed_gpu_hours": 0.0,
                 "jobs": 0, "idle": [], "starving": []}
        with vm(raw / "data") as url:
            for index in range(gpus // (NODES_PER_GROUP * GPUS_PER_NODE)):
                nodes, jobs = group(index, days)
                fleet = cf.generate(nodes, jobs, truth["start"], truth["end"], seed=index)
                for k in range(0, len(fleet.series), 200):
                    _post(url, cf.import_lines(fleet.series[k:k + 200]))
                points += sum(s.t.size for s in fleet.series)
                truth["job_gpu_hours"] += sum(fleet.truth.job_gpu_hours.values())
                truth["observed_gpu_hours"] += fleet.truth.observed_gpu_hours
                truth["jobs"] += len(jobs)
                truth["idle"] += [j.name for j in jobs if not j.busy]
                truth["starving"] += [j.name for j in jobs if j.data_wait > 0.3]
            _get(f"{url}/internal/force_flush")
        print(f"  imported {points:,} points in {time.monotonic() - began:.0f} s", file=sys.stderr)
        truth_file.write_text(json.dumps(truth))
    truth = json.loads(truth_file.read_text())
    digest = hashlib.sha256(Path(rules).read_bytes()).hexdigest()[:12]
    rolled = Path(cache) / f"{raw.name}-rollups-{digest}"
    if not (rolled / "ready").exists():
        shutil.rmtree(rolled, ignore_errors=True)
        shutil.copytree(raw / "data", rolled / "data")
        began = time.monotonic()
        with vm(rolled / "data") as url:
            replay_in_victoria(rolled, url, rules, truth["start"], truth["end"], timeout_s=3600)
        print(f"  roll-ups replayed by vmalert in {time.monotonic() - began:.0f} s", file=sys.stderr)
        (rolled / "ready").touch()
    return rolled / "data", truth


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(f"{url}/api/v1/import", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=600) as resp:
        resp.read()


def _get(url: str) -> None:
    with urllib.request.urlopen(url, timeout=600) as resp:
        resp.read()
