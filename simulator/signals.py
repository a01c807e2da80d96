"""Per-sample signals of a simulated fleet, whole (time × GPU) and (time × rank)
arrays per chunk of samples, with the counters carried from one chunk to the next.

The physics follows the simulated GPU backend (agent.gpu.simulated): power between
idle and TDP following utilization, temperature lagging power, clocks and throttle
bits from NVML's bitmask. Training counters follow a DDP step: every rank waits
for the slowest rank's compute, so a straggler lengthens everyone's step while
only its own `compute_s` grows, and a starving loader shows as data wait and a
bursty GPU.
"""
from __future__ import annotations

import numpy as np

from burnrate.exporter import throttle
from burnrate.exporter.telemetry import FORGET_AFTER_S

from . import fleet as F

XID_LOST = 79          # GPU has fallen off the bus
XID_TRANSIENT = 13     # graphics engine exception


def _ffill(values: np.ndarray, valid: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Forward-fill rows where `valid` is false, down each column, starting from `carry`."""
    rows = np.arange(len(values))[:, None]
    idx = np.maximum.accumulate(np.where(valid, rows, -1), axis=0)
    filled = np.take_along_axis(values, np.maximum(idx, 0), axis=0)
    return np.where(idx >= 0, filled, carry[None, :])


class Signals:
    """Static per-GPU, per-rank and per-job arrays, plus the counters carried between chunks."""

    def __init__(self, fleet: F.Fleet, seed: int, step_s: float, t0: float) -> None:
        self.fleet, self.step_s, self.t0 = fleet, step_s, t0
        rng = np.random.default_rng([seed, 1])
        gpus, nodes = fleet.gpus, fleet.nodes
        n_g = len(gpus)
        model = [nodes[g.node].instance_type.model for g in gpus]
        pick = lambda attr: np.array([getattr(m, attr) for m in model], dtype=np.float64)  # noqa: E731
        self.idle_w, self.tdp_w = pick("idle_w"), pick("tdp_w")
        self.sm_max, self.sm_idle = pick("sm_clock_max_mhz"), pick("sm_clock_idle_mhz")
        self.mem_clock, self.memory = pick("mem_clock_mhz"), pick("memory_mib")
        self.link, self.slowdown, self.peak = pick("nvlink_bytes_per_s"), pick("slowdown_temp_c"), pick("peak_flops")
        self.thermal = pick("thermal_c_per_w") * rng.uniform(0.95, 1.05, n_g)
        self.ambient = rng.uniform(26.0, 32.0, n_g)
        self.gpu_node = np.array([g.node for g in gpus])

        training = [j for j in fleet.jobs if j.training]
        self.jobs = training
        self.rank_job = np.array([k for k, j in enumerate(training) for _ in j.gpus], dtype=np.int64)
        self.rank_gpu = np.array([g for j in training for g in j.gpus], dtype=np.int64)
        self.job_first = np.cumsum([0] + [len(j.gpus) for j in training])[:-1].astype(np.int64)
        jf = lambda attr, none=np.inf: np.array(  # noqa: E731
            [none if getattr(j, attr) is None else getattr(j, attr) for j in training], dtype=np.float64)
        self.T, self.c0, self.w0, self.mfu = jf("step_s"), jf("compute_share"), jf("wait_share"), jf("mfu")
        self.extra, self.period = jf("extra_wait"), jf("sawtooth_period")
        self.stall_at, self.diverge_at, self.nan_at = jf("stall_at"), jf("diverge_at"), jf("nan_at")
        self.exit_at = jf("exit_at")
        self.ckpt_every = jf("checkpoint_every_s")
        self.ckpt_phase = rng.uniform(0, self.ckpt_every)
        self.loss_floor = rng.uniform(1.6, 2.4, len(training))
        self.loss_scale = rng.uniform(2.0, 4.0, len(training))
        self.size = np.array([len(j.gpus) for j in training], dtype=np.float64)
        self.spb = jf("samples_per_step")
        self.tps = jf("tokens_per_sample")
        self.mem_frac = rng.uniform(0.55, 0.92, len(training))
        self.saw_offset = rng.integers(0, 8, len(training))
        self.starving = self.extra > 0

        n_r = len(self.rank_job)
        self.factor = np.ones(n_r)
        self.lost = np.zeros(n_r, dtype=bool)
        self.thermal_from = np.full(n_r, np.inf)
        self.thermal_to = np.full(n_r, -np.inf)
        # (GPU, XID code, sample indexes of its events)
        self.xid_series: list[tuple[int, int, tuple[int, ...]]] = []
        for k, j in enumerate(training):
            first = self.job_first[k]
            if j.straggler_rank is not None:
                self.factor[first + j.straggler_rank] = j.straggler_factor
            if j.lost_rank is not None:
                self.lost[first + j.lost_rank] = True
                self.xid_series.append((j.gpus[j.lost_rank], XID_LOST, (j.stall_at,)))
            if j.thermal_rank is not None:
                self.thermal_from[first + j.thermal_rank] = j.thermal_from
                self.thermal_to[first + j.thermal_rank] = j.thermal_to
            if j.xid_rank is not None:
                self.xid_series.append((j.gpus[j.xid_rank], XID_TRANSIENT, j.xid_at))
        self.hung = np.array([j.scenario == F.STALL_HUNG for j in training])

        # GPU -> its rank (or -1), and the non-training holders.
        self.gpu_rank = np.full(n_g, -1, dtype=np.int64)
        self.gpu_rank[self.rank_gpu] = np.arange(n_r)
        self.idle_gpu = np.zeros(n_g, dtype=bool)
        self.shared_gpu = np.zeros(n_g, dtype=bool)
        for j in fleet.jobs:
            if j.scenario == F.IDLE:
                self.idle_gpu[j.gpus] = True
            elif j.scenario == F.SHARED:
                self.shared_gpu[j.gpus] = True
        self.held = self.gpu_rank >= 0
        self.held[self.idle_gpu | self.shared_gpu] = True
        self.multi = np.zeros(n_g, dtype=bool)
        self.multi[self.rank_gpu] = self.size[self.rank_job] > 1
        self.shared_phase = rng.uniform(0, 2 * np.pi, n_g)

        # Pods (for pod CPU): one per holder.
        self.pods = [(h, j) for j in fleet.jobs for h in j.holders]

        # Counters carried between chunks.
        job_steps0 = np.array([j.start_steps for j in training], dtype=np.float64)
        steps0 = job_steps0[self.rank_job]
        T_r = self.T[self.rank_job]
        self.c_steps = steps0.copy()
        self.c_step_s = steps0 * T_r
        self.c_wait = steps0 * T_r * self.w0[self.rank_job]
        self.c_compute = steps0 * T_r * self.c0[self.rank_job] * self.factor
        self.c_samples = steps0 * self.spb[self.rank_job]
        self.c_tokens = self.c_samples * self.tps[self.rank_job]
        self.c_flops = steps0 * self.mfu[self.rank_job] * self.peak[self.rank_gpu] * T_r
        self.started = t0 - job_steps0 * self.T      # when each job's processes started
        self.c_gauges = np.full((5, n_r), np.nan)       # mfu, loss, grad_norm, last_step_time, last checkpoint
        self.c_gauges[3] = t0
        self.c_energy = rng.uniform(1e9, 5e9, n_g)
        self.c_tx = rng.uniform(1e12, 1e14, n_g) * self.multi
        self.c_rx = self.c_tx * 1.0
        self.c_power = self.idle_w.copy()
        self.c_pod_cpu = rng.uniform(1e3, 1e6, len(self.pods))
        self.mfu_sum = np.zeros(len(training))
        self.mfu_count = np.zeros(len(training))

    # --- training ranks ------------------------------------------------------------
    def training(self, i: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        S, rj = self.step_s, self.rank_job
        n_t, n_j = len(i), len(self.jobs)
        col = i[:, None].astype(np.float64)
        thermal = (col >= self.thermal_from) & (col < self.thermal_to)
        factor = self.factor * np.where(thermal, 1.0 / 0.7, 1.0)
        compute = (self.c0 * self.T)[rj] * factor                                   # per step, own compute
        slowest = np.maximum.reduceat(compute, self.job_first, axis=1)
        jitter = np.exp(rng.normal(0.0, 0.03, (n_t, n_j)))
        wait = (self.w0 + self.extra) * self.T * np.exp(rng.normal(0.0, 0.1, (n_t, n_j)) * (self.extra > 0))
        comm = (1.0 - self.c0 - self.w0) * self.T
        wall = (wait + slowest + comm) * jitter
        # An exiting trainer steps until it exits: the sample it exits at counts its last steps.
        running = (col < self.stall_at) & (col <= self.exit_at)
        sawtooth, burst = self._burst(i)
        job_steps = np.where(running, S / wall * burst, 0.0)
        steps, wall_r = job_steps[:, rj], wall[:, rj]
        # Ranks differ a little in their own compute and loader wait, as real ranks do.
        d_compute = steps * compute * jitter[:, rj] * np.exp(rng.normal(0.0, 0.01, steps.shape))
        d_wait = steps * wait[:, rj] * np.exp(rng.normal(0.0, 0.02, steps.shape))
        flops_step = (self.mfu * self.T)[rj] * self.peak[self.rank_gpu]
        cum = {name: carry + np.cumsum(delta, axis=0) for name, carry, delta in (
            ("steps", self.c_steps, steps), ("step_s", self.c_step_s, steps * wall_r),
            ("data_wait_s", self.c_wait, d_wait), ("compute_s", self.c_compute, d_compute),
            ("samples", self.c_samples, steps * self.spb[rj]),
            ("tokens", self.c_tokens, steps * (self.spb * self.tps)[rj]),
            ("flops", self.c_flops, steps * flops_step))}
        self.c_steps, self.c_step_s, self.c_wait, self.c_compute = (cum[k][-1] for k in
                                                                    ("steps", "step_s", "data_wait_s", "compute_s"))
        self.c_samples, self.c_tokens, self.c_flops = cum["samples"][-1], cum["tokens"][-1], cum["flops"][-1]

        t = self.t0 + col * S
        run_r = running[:, rj]
        mfu = steps * flops_step / (S * self.peak[self.rank_gpu])
        loss, grad = self._loss(i, cum["steps"], rng)
        done = np.floor(cum["steps"])
        last_step = t - (cum["steps"] - done) * wall_r
        gauges = np.stack([mfu, loss, grad, last_step])
        gauges = np.stack([_ffill(g, run_r, c) for g, c in zip(gauges, self.c_gauges[:4])])
        ckpt = self.ckpt_phase[rj] + np.floor((gauges[3] - self.ckpt_phase[rj]) / self.ckpt_every[rj]) \
            * self.ckpt_every[rj]
        self.c_gauges = np.concatenate([gauges[:, -1], ckpt[-1:]])
        np.add.at(self.mfu_sum, rj, np.where(run_r, mfu, 0.0).sum(axis=0))
        np.add.at(self.mfu_count, rj, run_r.sum(axis=0))
        # NCCL kernels keep the GPU partly busy during the all-reduce; a rank waiting on
        # a straggler idles. A starving GPU runs flat out only while batches are queued.
        busy = np.clip((compute + 0.5 * comm[rj]) * jitter[:, rj] / wall_r, 0.0, 0.99)
        busy = np.where(self.starving[rj], 0.95 * sawtooth[:, rj], busy)
        return {"steps": done, "step_s": cum["step_s"], "data_wait_s": cum["data_wait_s"],
                "compute_s": cum["compute_s"], "samples": cum["samples"], "tokens": cum["tokens"],
                "flops": cum["flops"], "mfu": gauges[0], "loss": gauges[1], "grad_norm": gauges[2],
                "last_step_time": gauges[3], "world_size": np.broadcast_to(self.size[rj], steps.shape),
                # A simulated process reports at least every KEEPALIVE_S while it lives, a hung one
                # too: the agent heard each rank as the sample was taken, or last as it ended.
                "last_report_time": np.minimum(t, self.t0 + self.exit_at * S)[:, rj],
                # An ended process's monitor closed as it exited, and said so in its last message.
                "closed_time": np.where(col >= self.exit_at, self.t0 + self.exit_at * S, np.nan)[:, rj],
                "last_checkpoint_time": ckpt, "global_step": done,
                # Simulated processes began before the history, fresh (resumed from step 0),
                # and their loop spends no time saving or evaluating (checkpoints are instants).
                "start_time": np.broadcast_to(self.started[rj], steps.shape),
                "resumed_from": np.zeros(steps.shape), "checkpoint_s": np.zeros(steps.shape),
                "eval_s": np.zeros(steps.shape),
                "_running": run_r,
                # The agent keeps an ended rank's series for --forget-after, then drops them.
                "_reported": (col < self.exit_at + FORGET_AFTER_S / S)[:, rj],
                "_busy": busy, "_thermal": thermal}

    def _burst(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per job: the sawtooth of a draining prefetch queue (1 when batches are queued,
        ramping down to 5%) and the step-rate weights, 1 except for starving jobs,
        whose steps follow the sawtooth at the same average rate."""
        phase = ((i[:, None] + self.saw_offset) % self.period) / self.period
        shape = np.maximum(1.0 - 2.0 * phase, 0.05)
        k = np.arange(int(self.period.max(initial=1)))[:, None]
        mean = np.nanmean(np.where(k < self.period, np.maximum(1.0 - 2.0 * k / self.period, 0.05), np.nan), axis=0)
        return shape, np.where(self.starving, shape / mean, 1.0)

    def _loss(self, i: np.ndarray, steps: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        rj = self.rank_job
        shape = steps.shape
        loss = self.loss_floor[rj] + self.loss_scale[rj] * (1.0 + steps / 2000.0) ** -0.35
        loss = loss * np.exp(rng.normal(0.0, 0.012, shape))
        grad = (0.25 + 0.6 * (1.0 + steps / 5000.0) ** -0.3) * np.exp(rng.normal(0.0, 0.08, shape))
        col = i[:, None].astype(np.float64)
        since = (col - self.diverge_at[rj]).clip(min=0.0)
        diverging = col >= self.diverge_at[rj]
        spike = diverging & (rng.random(shape) < 0.35)
        loss_spike = np.where(spike, rng.uniform(2.5, 6.0, shape), 1.0)
        grad_spike = np.where(spike, rng.uniform(20, 150, shape), 1.0)
        loss = np.where(diverging, loss * (1.0 + 0.08 * since) * loss_spike, loss)
        grad = np.where(diverging, grad * (1.0 + 0.5 * since) * grad_spike, grad)
        broken = col >= self.nan_at[rj]
        loss = np.where(broken, np.nan, loss)
        grad = np.where(broken, np.where(rng.random(shape) < 0.5, np.inf, np.nan), grad)
        return loss, grad

    # --- devices -------------------------------------------------------------------
    def devices(self, i: np.ndarray, train: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        S = self.step_s
        n_t, n_g = len(i), len(self.fleet.gpus)
        col = i[:, None].astype(np.float64)
        has_rank = self.gpu_rank >= 0
        r = np.where(has_rank, self.gpu_rank, 0)
        running = has_rank & train["_running"][:, r]
        hung = has_rank & self.hung[self.rank_job][r] & ~running
        util = np.where(running, train["_busy"][:, r], np.where(hung, 1.0, 0.0))
        # A notebook's GPU: nothing, bar the odd cell run.
        blips = np.where(rng.random((n_t, n_g)) < 0.03, rng.uniform(0.01, 0.03, (n_t, n_g)), 0.0)
        util = np.where(self.idle_gpu, blips, util)
        wave = 0.45 + 0.2 * np.sin(2 * np.pi * col / (3600.0 / S) + self.shared_phase)
        util = np.where(self.shared_gpu, wave, util)
        active = util > 0.02
        util = np.clip(util + rng.normal(0.0, 0.012, util.shape) * (active & ~hung), 0.0, 1.0)

        lost = has_rank & self.lost[r] & (col >= self.stall_at[self.rank_job][r])
        thermal = has_rank & train["_thermal"][:, r]
        xid_counts = np.zeros((n_t, n_g))
        last_xid = np.zeros((n_t, n_g))
        for (g, code, _), count in zip(self.xid_series, self.xid_counts(i).T):
            xid_counts[:, g] += count
            last_xid[:, g] = np.where(count > 0, code, last_xid[:, g])

        # Spinning NCCL kernels read as 100% utilization but draw little power.
        load = np.where(hung, 0.3, util)
        power = self.idle_w + (self.tdp_w - self.idle_w) * load ** 0.9 + rng.normal(0.0, 4.0, util.shape)
        power = np.where(thermal, power * 0.78, power)
        power = np.clip(power, self.idle_w, self.tdp_w)
        previous = np.vstack([self.c_power[None, :], power[:-1]])
        self.c_power = power[-1]
        temp = self.ambient + self.thermal * (0.55 * power + 0.45 * previous) + rng.normal(0.0, 0.4, util.shape)
        temp = np.where(thermal, self.slowdown + rng.integers(0, 4, util.shape), np.round(temp))

        idle = util < 0.01
        sm = np.where(idle, self.sm_idle, self.sm_max - rng.choice([0.0, 15.0, 30.0], util.shape))
        sm = np.where(thermal, np.round(self.sm_max * 0.7 / 15.0) * 15.0, sm)
        reasons = np.where(idle, throttle.GPU_IDLE, 0) | np.where(power >= 0.98 * self.tdp_w, throttle.SW_POWER_CAP, 0)
        reasons = reasons | np.where(thermal, throttle.SW_THERMAL | throttle.HW_THERMAL, 0)

        # An ended trainer's memory is freed with its process.
        ended = has_rank & (col >= self.exit_at[self.rank_job][r])
        mem = np.where(has_rank & ~ended, self.mem_frac[self.rank_job][r], np.where(self.held & ~ended, 0.2, 0.006))
        mem = np.where(self.shared_gpu, 0.35, mem) * np.where(self.held, 1.0 + rng.normal(0, 0.004, util.shape), 1.0)
        used = np.round(self.memory * np.clip(mem, 0.0, 1.0))

        self.c_energy = self.c_energy + np.cumsum(power * S * 1000.0, axis=0)
        energy = np.round(self.c_energy)
        link = np.where(self.multi & ~hung, 0.2 * self.link * util, 0.0) * S
        tx = self.c_tx + np.cumsum(link, axis=0)
        rx = self.c_rx + np.cumsum(link * (1.0 + rng.uniform(-0.01, 0.01, util.shape)), axis=0)
        bandwidth = np.diff(np.vstack([np.stack([self.c_tx + self.c_rx]), tx + rx]), axis=0) / S / 1e6
        self.c_tx, self.c_rx, self.c_energy = tx[-1], rx[-1], energy[-1]
        clock_ratio = sm / self.sm_max
        tensor_per_util = np.where(has_rank, np.minimum(1.0, self.mfu[self.rank_job][r] * 1.4), 0.3)
        fields = {
            "up": np.where(lost, 0.0, 1.0),
            "gpu_util": np.round(util * 100.0), "mem_copy_util": np.round(util * 35.0),
            "fb_used_mib": used, "fb_free_mib": self.memory - used, "power_w": np.round(power, 3),
            "energy_mj": energy, "temp_c": temp, "sm_clock_mhz": sm,
            "mem_clock_mhz": np.broadcast_to(self.mem_clock, util.shape),
            "nvlink_bandwidth_mbps": np.round(bandwidth, 3),
            "tensor_active": np.round(np.where(hung, 0.0, util * tensor_per_util * clock_ratio), 4),
            "gr_engine_active": np.round(util * 0.97, 4),
            "dram_active": np.round(np.where(hung, 0.02, util * 0.4), 4),
            "throttle_reasons": reasons.astype(np.float64),
            "nvlink_tx_bytes": np.round(tx), "nvlink_rx_bytes": np.round(rx),
        }
        for zero in ("ecc_sbe_volatile", "ecc_dbe_volatile", "remapped_rows_correctable",
                     "remapped_rows_uncorrectable", "row_remap_failure"):
            fields[zero] = np.zeros(util.shape)
        # A lost GPU answers nothing: its fields are absent, as the agent records them.
        for name in list(fields):
            if name != "up":
                fields[name] = np.where(lost, np.nan, fields[name])
        fields["last_xid"] = last_xid
        fields["xid_total"] = xid_counts
        fields["_lost"], fields["_hung"], fields["_running"] = lost, hung, running
        return fields

    def xid_counts(self, i: np.ndarray) -> np.ndarray:
        """Cumulative events of each XID series, (time × series)."""
        return np.stack([(i[:, None] >= np.array(at)).sum(axis=1) for _, _, at in self.xid_series], axis=1) \
            if self.xid_series else np.zeros((len(i), 0))

    def node_cpu(self, i: np.ndarray, dev: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
        n_nodes = len(self.fleet.nodes)
        busy = np.zeros((len(i), n_nodes))
        np.add.at(busy.T, self.gpu_node, (dev["gpu_util"] / 100.0).T * 0.04)
        starving_nodes = np.zeros(n_nodes)
        for k, j in enumerate(self.jobs):
            if self.starving[k]:
                starving_nodes[self.gpu_node[j.gpus]] = 0.55
        return np.clip(0.08 + np.nan_to_num(busy) + starving_nodes + rng.normal(0, 0.02, busy.shape), 0.0, 1.0)

    def pod_cpu(self, i: np.ndarray, train: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
        S = self.step_s
        cores = []
        rank_of = {(j.name, h.pod): self.job_first[k] + h.rank for k, j in enumerate(self.jobs) for h in j.holders}
        for holder, job in self.pods:
            if job.scenario == F.IDLE:
                cores.append(np.full(len(i), 0.05))
            elif job.scenario == F.SHARED:
                cores.append(np.full(len(i), 2.0))
            else:
                rank = rank_of[(job.name, holder.pod)]
                k = self.rank_job[rank]
                working = 14.0 if self.starving[k] else 4.0
                stalled = 1.0 if self.hung[k] else 0.05
                cores.append(np.where(train["_running"][:, rank], working, stalled))
        used = np.stack(cores, axis=1) * np.exp(rng.normal(0, 0.05, (len(i), len(self.pods)))) * S
        cumulative = self.c_pod_cpu + np.cumsum(used, axis=0)
        self.c_pod_cpu = cumulative[-1]
        return cumulative
