"""Findings read from the ledger (analyzer.costing.ledger), where acting on them pays:

- `lost_progress`: restarts cost more recomputed steps than a sensible checkpoint interval
  would. The interval to use is Daly's refinement of Young's, τ = √(2·C·M) − C (Young 1974;
  Daly 2006), from the job's *measured* blocking save time C and, where it restarted, its
  measured time between failures M (else the prior of cost.checkpoint_advice: hardware
  failures at Llama 3's rate plus spot interruptions on spot nodes).
- `checkpoint_overhead`: blocking saves take a larger share of the loop than that interval's
  optimum (C/τ), by more than `Config.overhead_factor`.
- `slow_startup`: a run took longer than `Config.startup_minutes` from its start to its first
  step.
- `held_after_exit`: the job held GPUs longer than `Config.held_after_exit_minutes` after its
  last process ended, with no run after it: its `no_process` time, all of it waste. Its process
  end is also where the job's `stalled` finding ends (detectors.ended_with_their_processes):
  a stall is a living process that makes no step.

The thresholds are the detectors' (analyzer/detectors/ledger_thresholds.py).
"""
from __future__ import annotations

from ..detectors.findings import Finding, iso
from ..detectors.ledger_thresholds import (CHECKPOINT_OVERHEAD, HELD_AFTER_EXIT, KINDS, LOST_PROGRESS, SLOW_STARTUP,
                                           Config, advised_interval)
from .ledger import Ledger

__all__ = ["KINDS", "Config", "advised_interval", "detect", "held_after_exit", "mtbf", "process_ends"]

def detect(ledgers: dict[tuple[str, str], Ledger], prior_mtbf_s: dict[tuple[str, str], float | None],
           config: Config = Config()) -> list[Finding]:
    """`prior_mtbf_s`: each job's expected time between interruptions where it has none of its
    own to measure (cost.checkpoint_advice)."""
    out: list[Finding] = []
    for job, ledger in ledgers.items():
        out += _lost_progress(job, ledger, prior_mtbf_s.get(job), config)
        out += _checkpoint_overhead(job, ledger, prior_mtbf_s.get(job), config)
        out += _slow_startup(job, ledger, config)
    return out


def process_ends(ledgers: dict[tuple[str, str], Ledger], config: Config = Config()) -> dict[tuple[str, str], float]:
    """When each job's last process ended, for the jobs that held GPUs over
    `config.held_after_exit_minutes` after it (those `held_after_exit` names). A shorter tail
    stays in the job's stall: a last sample held past the last report, where a window reaches
    past the data, would otherwise cut a stall short in one window and not in the next."""
    return {job: end for job, ledger in ledgers.items() if (end := ledger.process_end()) is not None
            and ledger.end - end > config.held_after_exit_minutes * 60}


def held_after_exit(ledgers: dict[tuple[str, str], Ledger], ends: dict[tuple[str, str], float]) -> list[Finding]:
    """The jobs of `ends` (`process_ends`): from when their last process ended to the job's
    last held sample, wasting its whole `no_process` time. They take part in detection (they
    explain idle GPUs, as a stall does), so they are not among `detect`'s."""
    out = []
    for job, ended in ends.items():
        ledger = ledgers[job]
        gpus = ledger.gpus_after_exit()
        evidence = {"process_ended": iso(ended), "held_minutes": (ledger.end - ended) / 60, "gpus_held": gpus,
                    "no_process_gpu_hours": ledger.gpu_hours["no_process"]}
        last = ledger.runs[-1].last_step if ledger.runs else None
        if last is not None:
            evidence["last_step"] = iso(last)
        out.append(Finding(HELD_AFTER_EXIT, "critical", ended, ledger.end, namespace=job[0], training_job=job[1],
                           wasted_gpu_hours=ledger.gpu_hours["no_process"] or 0.0, evidence=evidence,
                           recommendation=f"No training process has run since {iso(ended)}, yet the job's pods "
                                          f"held {gpus:.3g} GPUs {_span(ledger.end - ended)} more. Delete the "
                                          "finished pods, or have the job clean them up when it ends or fails "
                                          "(PyTorchJob runPolicy.cleanPodPolicy: All, ttlSecondsAfterFinished; "
                                          "no sidecar or shell that outlives the trainer)."))
    return out


def mtbf(ledger: Ledger, prior: float | None) -> tuple[float | None, str]:
    """The job's time between failures: measured from its restarts, else the prior."""
    if ledger.restarts:
        return (ledger.end - ledger.start) / ledger.restarts, f"measured: {ledger.restarts} restarts in this window"
    return prior, "no restart in this window: the expected rate of hardware failures and spot interruptions"


def _finding(kind: str, job: tuple[str, str], ledger: Ledger, wasted: float, evidence: dict,
             recommendation: str, severity: str = "warning") -> Finding:
    return Finding(kind, severity, ledger.start, ledger.end, namespace=job[0], training_job=job[1],
                   wasted_gpu_hours=max(wasted, 0.0), evidence=evidence, recommendation=recommendation)


def _lost_progress(job: tuple[str, str], ledger: Ledger, prior: float | None, config: Config) -> list[Finding]:
    lost = ledger.gpu_hours["lost_progress"]
    if not ledger.restarts or not lost or ledger.gpus <= 0:
        return []
    per_restart_s = lost * 3600 / ledger.gpus / ledger.restarts
    evidence = {"restarts": ledger.restarts, "lost_progress_gpu_hours": lost,
                "lost_minutes_per_restart": per_restart_s / 60,
                "restart_gpu_hours": ledger.gpu_hours["restart"] or 0.0, "saves": ledger.saves}
    if ledger.save_seconds is None:
        return [_finding(LOST_PROGRESS, job, ledger, lost, evidence,
                         "Each restart recomputed the steps since the run began: no checkpoint was seen. "
                         "Save checkpoints and resume from the newest (--resume).")]
    m, basis = mtbf(ledger, prior)
    tau = advised_interval(ledger.save_seconds, m)
    expected_s = tau / 2
    if per_restart_s <= config.lost_factor * expected_s:
        return []
    evidence.update(save_seconds=ledger.save_seconds, mtbf_hours=m / 3600, mtbf_basis=basis,
                    advised_interval_s=tau)
    wasted = (per_restart_s - expected_s) * ledger.restarts * ledger.gpus / 3600
    return [_finding(LOST_PROGRESS, job, ledger, wasted, evidence,
                     f"Restarts lost {_span(per_restart_s)} of steps each; checkpoint every {_span(tau)} "
                     f"(Daly's interval for a {_span(ledger.save_seconds)} save and {_span(m)} between "
                     "failures) to lose half that.")]


def _checkpoint_overhead(job: tuple[str, str], ledger: Ledger, prior: float | None, config: Config) -> list[Finding]:
    hours = ledger.gpu_hours
    saving = hours["checkpoint"]
    loop = sum(hours[n] or 0.0 for n in ("productive", "data_wait", "sync_wait", "checkpoint", "evaluation",
                                           "lost_progress"))
    if not saving or loop <= 0 or ledger.save_seconds is None:
        return []
    m, basis = mtbf(ledger, prior)
    if not m:
        return []
    tau = advised_interval(ledger.save_seconds, m)
    optimum = ledger.save_seconds / (tau + ledger.save_seconds)
    share = saving / loop
    if share <= max(config.overhead_factor * optimum, config.overhead_min_share):
        return []
    evidence = {"checkpoint_share": share, "optimal_share": optimum, "save_seconds": ledger.save_seconds,
                "saves": ledger.saves, "mtbf_hours": m / 3600, "mtbf_basis": basis, "advised_interval_s": tau}
    return [_finding(CHECKPOINT_OVERHEAD, job, ledger, saving - optimum * loop, evidence,
                     f"Blocking saves took {share:.0%} of the loop: save asynchronously "
                     f"(torch.distributed.checkpoint.async_save) or every {_span(tau)}, which costs "
                     f"{optimum:.1%} against failures every {_span(m)}.")]


def _span(seconds: float) -> str:
    """A duration in the unit a person reads it in."""
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _slow_startup(job: tuple[str, str], ledger: Ledger, config: Config) -> list[Finding]:
    if ledger.gpus <= 0:
        return []
    limit_h = config.startup_minutes / 60
    minutes = [r.gpu_hours["startup"] * 60 / ledger.gpus for r in ledger.runs]
    slow = [m for m in minutes if m > config.startup_minutes]
    if not slow:
        return []
    wasted = sum(m / 60 - limit_h for m in slow) * ledger.gpus
    evidence = {"startup_minutes": minutes, "slow_runs": len(slow), "runs": len(minutes)}
    return [_finding(SLOW_STARTUP, job, ledger, wasted, evidence,
                     f"{len(slow)} of {len(minutes)} runs took over {config.startup_minutes:.0f} min to their first "
                     "step: pre-pull the image on the nodes, cache the model and data locally, restore checkpoints "
                     "from local or parallel storage.")]
