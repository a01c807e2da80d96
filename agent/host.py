"""Host signals that explain a starving GPU: node CPU busy share and per-pod CPU time.

In a DaemonSet pod, mount the host's /proc and /sys/fs/cgroup (hostPath) and pass their
mount points here: with cgroup namespaces the container's own view shows only itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from burnrate.exporter.snapshot import HostReading, PodRef, frozen

# The kubelet's QoS classes; Guaranteed pods sit directly under the kubepods root.
_QOS = ("", "burstable", "besteffort")
# Where a cgroup v1 host mounts the cpuacct controller (often co-mounted with cpu).
_V1_CONTROLLERS = ("cpuacct", "cpu,cpuacct", "cpu")


class HostReader:
    """Reads /proc/stat deltas and pod cgroups; anything unreadable is simply absent."""

    def __init__(self, proc_root: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> None:
        self._proc = Path(proc_root)
        self._cgroup = Path(cgroup_root)
        self._last_cpu: tuple[int, int] | None = None
        self._pod_dirs: dict[str, Path] = {}

    def read(self, pods: Iterable[PodRef]) -> HostReading:
        seconds = {}
        uids = set()
        for ref in pods:
            if not ref.uid or (ref.namespace, ref.pod) in seconds:
                continue
            uids.add(ref.uid)
            used = self._pod_cpu_seconds(ref.uid)
            if used is not None:
                seconds[(ref.namespace, ref.pod)] = used
        # Forget the cgroup paths of pods that are gone, so the cache stays bounded.
        self._pod_dirs = {u: d for u, d in self._pod_dirs.items() if u in uids}
        return HostReading(cpu_utilization=self._cpu_utilization(), pod_cpu_seconds=frozen(seconds))

    def _cpu_utilization(self) -> float | None:
        """Busy share of all CPUs since the previous read; None on the first."""
        sample = self._cpu_times()
        previous, self._last_cpu = self._last_cpu, sample
        if sample is None or previous is None:
            return None
        busy, total = sample[0] - previous[0], sample[1] - previous[1]
        if total <= 0:
            return None
        return min(1.0, max(0.0, busy / total))

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies from the aggregate `cpu` line of /proc/stat."""
        try:
            with open(self._proc / "stat") as f:
                for line in f:
                    if line.startswith("cpu "):
                        # user nice system idle iowait irq softirq steal [guest guest_nice]:
                        # guest time is already counted in user and nice, so it is left out.
                        values = [int(v) for v in line.split()[1:9]]
                        break
                else:
                    return None
        except (OSError, ValueError):
            return None
        if len(values) < 4:
            return None
        total = sum(values)
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return total - idle, total

    def _pod_cpu_seconds(self, uid: str) -> float | None:
        cached = self._pod_dirs.get(uid)
        if cached is not None:
            used = _cpu_seconds(cached)
            if used is not None:
                return used
        for directory in self._candidates(uid):
            used = _cpu_seconds(directory)
            if used is not None:
                self._pod_dirs[uid] = directory
                return used
        return None

    def _candidates(self, uid: str) -> Iterable[Path]:
        escaped = uid.replace("-", "_")
        for base in (self._cgroup,) + tuple(self._cgroup / c for c in _V1_CONTROLLERS):
            for qos in _QOS:
                # systemd driver: kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice
                prefix = f"kubepods-{qos}" if qos else "kubepods"
                parent = base / "kubepods.slice" / (f"{prefix}.slice" if qos else "")
                yield parent / f"{prefix}-pod{escaped}.slice"
                # cgroupfs driver: kubepods/<qos>/pod<uid>
                yield base / "kubepods" / qos / f"pod{uid}"


def _cpu_seconds(directory: Path) -> float | None:
    """Cumulative CPU seconds of a cgroup: v2 cpu.stat usage_usec, else v1 cpuacct.usage."""
    try:
        with open(directory / "cpu.stat") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
    except (OSError, ValueError):
        pass
    try:
        return int((directory / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None
