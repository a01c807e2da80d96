"""`burnrate simulate`: a synthetic fleet in the recording format, with ground truth.

The fleet (nodes, jobs, faults) comes from `simulator.fleet.plan`, its signals from
`simulator.signals`, whole numpy columns at a time, in time chunks so that 1,024
GPUs × 7 days stay within a few hundred MB of memory; this module writes them with
the recorder's own TableWriter, all at once (`simulate`) or on in real time after a
history (`Simulation.follow`, as the demo's fleet reports beside its live jobs).

Outputs, besides the tables of exporter.recording.TABLES:
    DIR/ground_truth.json  the injected faults (see `simulator.fleet.ground_truth`)
    DIR/simulated.json     the parameters; its presence marks the recording simulated
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import threading
import time
from array import array
from dataclasses import dataclass

import numpy as np

from burnrate.agent.recording import TableWriter, open_recording
from burnrate.exporter.recording import TABLES

from . import fleet as F
from .signals import Signals
from burnrate.analyzer.sources.recording import SIMULATED_MARKER
from burnrate.analyzer.sources.timeparse import format_time, parse_time

GROUND_TRUTH = "ground_truth.json"
ROWS_PER_CHUNK = 400_000
_TYPECODE = {"f4": ("f", np.float32), "f8": ("d", np.float64), "u4": ("I", np.uint32)}


@dataclass(frozen=True)
class Spec:
    nodes: int = 8
    gpus_per_node: int = 8
    hours: float = 6.0
    step_s: float = 15.0
    seed: int = 0
    end: float | None = None      # unix time of the last sample; default: the last full hour
    healthy_only: bool = False

    @property
    def samples(self) -> int:
        return max(1, int(round(self.hours * 3600.0 / self.step_s)))

    def start_end(self) -> tuple[float, float]:
        end = self.end if self.end is not None else math.floor(time.time() / 3600.0) * 3600.0
        end = math.floor(end / self.step_s) * self.step_s
        return end - (self.samples - 1) * self.step_s, end


# --- writing -------------------------------------------------------------------------
def _array(values: np.ndarray, dtype: str) -> array:
    # array.extend copies another array with one memcpy; from numpy it would go value by value.
    code, np_type = _TYPECODE[dtype]
    return array(code, np.ascontiguousarray(values, dtype=np_type).tobytes())


def _write(writer: TableWriter, table: str, t: np.ndarray, keys: np.ndarray,
           columns: dict[str, np.ndarray], present: np.ndarray | None = None) -> None:
    """Rows for every (time, series) — or those `present` — from (time × series) columns."""
    dtypes = TABLES[table][1]
    rows = np.repeat(t, len(keys)), np.tile(keys, len(t))
    pick = slice(None) if present is None else np.broadcast_to(present, (len(t), len(keys))).ravel()
    writer.extend(_array(rows[0][pick], "f8"), _array(rows[1][pick], "u4"),
                  {c: _array(np.broadcast_to(v, (len(t), len(keys))).ravel()[pick], dtypes[c])
                   for c, v in columns.items()})
    writer.flush()


def _keys(fleet: F.Fleet, tables: dict[str, TableWriter], sig: Signals) -> dict[str, np.ndarray]:
    nodes, gpus = fleet.nodes, fleet.gpus

    def device(g: int) -> tuple[str, ...]:
        gpu, node = gpus[g], nodes[gpus[g].node]
        return (str(gpu.index), gpu.uuid, gpu.pci_bus_id, f"nvidia{gpu.index}", node.model_name, node.hostname)

    holders: dict[int, list[F.Holder]] = {}
    for job in fleet.jobs:
        for g, h in job.allocations():
            holders.setdefault(g, []).append(h)

    def pod(h: F.Holder) -> tuple[str, ...]:
        return (h.namespace, h.pod, h.container, h.training_job)

    gpu_keys = [tables["gpu"].key(device(g) + (pod(holders[g][0]) if len(holders.get(g, ())) == 1 else ("",) * 4))
                for g in range(len(gpus))]
    alloc = [(g, h) for g in sorted(holders) for h in holders[g]]
    rank_keys = [tables["rank"].key((h.namespace, h.pod, h.training_job, str(h.rank), nodes[gpus[g].node].hostname))
                 for j in sig.jobs for g, h in zip(j.gpus, j.holders)]
    host_of = {h.pod: nodes[gpus[g].node].hostname for j in fleet.jobs for g, h in j.allocations()}
    return {
        "gpu": np.array(gpu_keys, dtype=np.uint32),
        "alloc": np.array([tables["alloc"].key(device(g) + pod(h)) for g, h in alloc], dtype=np.uint32),
        "rank": np.array(rank_keys, dtype=np.uint32),
        "node": np.array([tables["node"].key((n.hostname, n.instance_type.name, n.capacity_type, n.zone,
                                              n.model_name, str(sum(1 for g in gpus if g.node == k))))
                          for k, n in enumerate(nodes)], dtype=np.uint32),
        "pod_cpu": np.array([tables["pod_cpu"].key((h.namespace, h.pod, host_of[h.pod])) for h, _ in sig.pods],
                            dtype=np.uint32),
        "xid": np.array([tables["xid"].key(device(g) + (str(code),)) for g, code, _ in sig.xid_series],
                        dtype=np.uint32),
        "share": np.array([h.share for _, h in alloc], dtype=np.float64),
    }


class Simulation:
    """A fleet being written: `write` adds samples, and leaves the ground truth and the
    marker describing what is written so far, so that a fleet written on in real time
    (the demo's) is a whole simulated recording at every moment."""

    def __init__(self, out: str, spec: Spec) -> None:
        self.out, self.spec = out, spec
        self.t0 = spec.start_end()[0]
        # The faults are placed within spec.samples; samples written past them carry on as
        # the fleet was at its last (a stalled job stays stalled, a diverged one NaN).
        self.fleet = F.plan(spec.seed, spec.nodes, spec.gpus_per_node, spec.samples, spec.healthy_only)
        self.sig = Signals(self.fleet, spec.seed, spec.step_s, self.t0)
        self.tables = open_recording(out, segment="simulated")
        self.keys = _keys(self.fleet, self.tables, self.sig)
        self.written = 0

    def time_of(self, sample: int) -> float:
        return self.t0 + sample * self.spec.step_s

    def write(self, until: int) -> list[dict]:
        """The samples from the last one written up to `until` (exclusive); returns the ground truth."""
        sig, keys, tables = self.sig, self.keys, self.tables
        per_chunk = max(1, ROWS_PER_CHUNK // max(len(self.fleet.gpus), len(sig.rank_job)))
        for a in range(self.written, until, per_chunk):
            i = np.arange(a, min(until, a + per_chunk))
            rng = np.random.default_rng([self.spec.seed, 2, a])
            t = self.time_of(i)
            train = sig.training(i, rng)
            dev = sig.devices(i, train, rng)
            # A hung job's ranks are written on: their processes live and report (trainer.keepalive).
            # An ended one's go once the agent has forgotten them.
            _write(tables["rank"], "rank", t, keys["rank"], {c: train[c] for c in TABLES["rank"][1]},
                   train["_reported"])
            _write(tables["gpu"], "gpu", t, keys["gpu"], {c: dev[c] for c in TABLES["gpu"][1]})
            _write(tables["alloc"], "alloc", t, keys["alloc"], {"share": keys["share"][None, :]})
            _write(tables["node"], "node", t, keys["node"],
                   {"cpu_utilization": np.round(sig.node_cpu(i, dev, rng), 4)})
            _write(tables["pod_cpu"], "pod_cpu", t, keys["pod_cpu"], {"cpu_seconds": sig.pod_cpu(i, train, rng)})
            counts = sig.xid_counts(i)
            _write(tables["xid"], "xid", t, keys["xid"], {"count": counts}, counts > 0)
        self.written = max(self.written, until)
        return self._describe()

    def _describe(self) -> list[dict]:
        spec, sig = self.spec, self.sig
        low_mfu = {job.name for job, total, count in zip(sig.jobs, sig.mfu_sum, sig.mfu_count)
                   if count and total / count < F.LOW_MFU_BELOW}
        truth = F.ground_truth(self.fleet, lambda k: format_time(self.time_of(k)), self.written, low_mfu,
                               spec.step_s)
        _dump(os.path.join(self.out, GROUND_TRUTH), truth)
        _dump(os.path.join(self.out, SIMULATED_MARKER), {
            "simulated": True, "seed": spec.seed, "nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node,
            "hours": spec.hours, "step_s": spec.step_s, "healthy_only": spec.healthy_only,
            "start": format_time(self.t0), "end": format_time(self.time_of(self.written - 1))})
        return truth

    def follow(self, stop: threading.Event) -> None:
        """Writes on each sample as the clock reaches its time, until `stop` is set."""
        while True:
            due = self.time_of(self.written)
            if stop.wait(max(due - time.time(), 0.0)):
                return
            self.write(self.written + 1)

    def close(self) -> None:
        for table in self.tables.values():
            table.close()


def simulate(out: str, spec: Spec) -> list[dict]:
    """Writes the fleet to `out`; returns the ground truth it also writes there."""
    simulation = Simulation(out, spec)
    try:
        return simulation.write(spec.samples)
    finally:
        simulation.close()


def _dump(path: str, value: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


# --- command line ----------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="recording directory to create")
    parser.add_argument("--nodes", type=int, default=8, metavar="N", help="GPU nodes (default 8)")
    parser.add_argument("--gpus-per-node", type=int, default=8, metavar="G", help="GPUs per node (default 8)")
    parser.add_argument("--hours", type=float, default=6.0, metavar="H", help="length of the recording (default 6)")
    parser.add_argument("--step", type=float, default=15.0, metavar="S",
                        help="sample interval in seconds (default 15)")
    parser.add_argument("--seed", type=int, default=0, metavar="X", help="random seed (default 0)")
    parser.add_argument("--end", metavar="T", help="time of the last sample, ISO-8601 or unix seconds "
                                                   "(default: the last full hour)")
    parser.add_argument("--healthy-only", action="store_true", help="inject no faults at all")


def run(args: argparse.Namespace) -> int:
    from burnrate.exporter.errors import UserError

    checks = ((args.nodes >= 1, "--nodes must be at least 1"),
              (1 <= args.gpus_per_node <= 64, "--gpus-per-node must be between 1 and 64"),
              (math.isfinite(args.step) and args.step > 0, "--step must be a positive number of seconds"),
              (math.isfinite(args.hours) and args.hours * 3600.0 >= args.step,
               "--hours must cover at least one --step"))
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    try:
        end = parse_time(args.end) if args.end is not None else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if os.path.exists(os.path.join(args.out, "burnrate.json")):
        # A fleet this command wrote before is replaced; anything else is somebody's data.
        if not os.path.exists(os.path.join(args.out, GROUND_TRUTH)):
            raise UserError(f"{args.out} holds a recording that `burnrate simulate` did not write; "
                            "choose a new directory")
        shutil.rmtree(args.out)
        print(f"replacing the simulated fleet in {args.out}", file=sys.stderr)
    elif os.path.isdir(args.out) and os.listdir(args.out):
        raise UserError(f"{args.out} is a directory with other files in it; choose a new one")
    spec = Spec(args.nodes, args.gpus_per_node, args.hours, args.step, args.seed, end, args.healthy_only)
    try:
        truth = simulate(args.out, spec)
    except OSError as exc:
        raise UserError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    gpus = spec.nodes * spec.gpus_per_node
    print(f"wrote {gpus} GPUs x {spec.samples} samples ({spec.hours:g} h at {spec.step_s:g} s) to {args.out}; "
          f"{len(truth)} injected faults in {os.path.join(args.out, GROUND_TRUTH)}", file=sys.stdout)
    return 0
