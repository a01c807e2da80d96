"""HostReader against fixture /proc/stat files and cgroup trees laid out as the kubelet
lays them out: systemd and cgroupfs drivers, cgroup v1 and v2."""
from pathlib import Path

import pytest

from burnrate.agent.host import HostReader
from burnrate.exporter.snapshot import PodRef

UID = "6f1c2a4e-90b2-4f4e-9a51-1d2e3f4a5b6c"
UID_ESCAPED = UID.replace("-", "_")
# cpu  user nice system idle iowait irq softirq steal guest guest_nice
STAT_HEAD = "cpu  {} 0 {} {} {} 0 0 0 {} 0\ncpu0 1 0 1 1 0 0 0 0 0 0\nctxt 123\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_stat(proc: Path, user: int, system: int, idle: int, iowait: int, guest: int = 0) -> None:
    write(proc / "stat", STAT_HEAD.format(user, system, idle, iowait, guest))


def pod(uid: str = UID, name: str = "llm-7b-worker-0") -> PodRef:
    return PodRef(namespace="ml", pod=name, container="pytorch", training_job="llm-7b", uid=uid)


def test_cpu_utilization_is_none_first_then_the_busy_share_of_the_interval(tmp_path):
    reader = HostReader(proc_root=tmp_path, cgroup_root=tmp_path / "cgroup")
    write_stat(tmp_path, user=1000, system=500, idle=8000, iowait=500)
    assert reader.read([]).cpu_utilization is None

    # +300 user, +100 system, +500 idle, +100 iowait: 400 busy out of 1000.
    write_stat(tmp_path, user=1300, system=600, idle=8500, iowait=600)
    assert reader.read([]).cpu_utilization == pytest.approx(0.4)


def test_guest_time_is_not_counted_twice(tmp_path):
    reader = HostReader(proc_root=tmp_path, cgroup_root=tmp_path / "cgroup")
    write_stat(tmp_path, user=100, system=0, idle=100, iowait=0, guest=0)
    reader.read([])
    # The 100 guest jiffies are part of the +100 user already.
    write_stat(tmp_path, user=200, system=0, idle=200, iowait=0, guest=100)
    assert reader.read([]).cpu_utilization == pytest.approx(0.5)


def test_cpu_utilization_absent_when_proc_stat_unreadable_or_unchanged(tmp_path):
    reader = HostReader(proc_root=tmp_path / "missing", cgroup_root=tmp_path)
    assert reader.read([]).cpu_utilization is None
    assert reader.read([]).cpu_utilization is None

    reader = HostReader(proc_root=tmp_path, cgroup_root=tmp_path)
    write_stat(tmp_path, user=1, system=1, idle=1, iowait=1)
    reader.read([])
    assert reader.read([]).cpu_utilization is None


V2_CPU_STAT = "usage_usec 12500000\nuser_usec 10000000\nsystem_usec 2500000\nnr_periods 0\n"
V1_CPU_STAT = "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n"


@pytest.mark.parametrize("relative, files, seconds", [
    # cgroup v2, systemd driver, Burstable and BestEffort.
    (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_ESCAPED}.slice",
     {"cpu.stat": V2_CPU_STAT}, 12.5),
    (f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_ESCAPED}.slice",
     {"cpu.stat": V2_CPU_STAT}, 12.5),
    # cgroup v2, systemd driver, Guaranteed: directly under kubepods.slice.
    (f"kubepods.slice/kubepods-pod{UID_ESCAPED}.slice", {"cpu.stat": V2_CPU_STAT}, 12.5),
    # cgroup v2, cgroupfs driver.
    (f"kubepods/burstable/pod{UID}", {"cpu.stat": V2_CPU_STAT}, 12.5),
    (f"kubepods/pod{UID}", {"cpu.stat": V2_CPU_STAT}, 12.5),
    # cgroup v1, cpu and cpuacct co-mounted, systemd driver (v1 cpu.stat has no usage).
    (f"cpu,cpuacct/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_ESCAPED}.slice",
     {"cpu.stat": V1_CPU_STAT, "cpuacct.usage": "7250000000\n"}, 7.25),
    (f"cpu,cpuacct/kubepods.slice/kubepods-pod{UID_ESCAPED}.slice",
     {"cpuacct.usage": "7250000000\n"}, 7.25),
    # cgroup v1, separate cpuacct hierarchy, cgroupfs driver.
    (f"cpuacct/kubepods/besteffort/pod{UID}", {"cpuacct.usage": "3000000000\n"}, 3.0),
    (f"cpuacct/kubepods/pod{UID}", {"cpuacct.usage": "3000000000\n"}, 3.0),
])
def test_pod_cpu_seconds_found_by_uid_for_each_driver_and_version(tmp_path, relative, files, seconds):
    cgroup = tmp_path / "cgroup"
    for name, text in files.items():
        write(cgroup / relative / name, text)
    reading = HostReader(proc_root=tmp_path, cgroup_root=cgroup).read([pod()])
    assert dict(reading.pod_cpu_seconds) == {("ml", "llm-7b-worker-0"): pytest.approx(seconds)}


def test_pod_cpu_seconds_follow_the_counter_and_forget_finished_pods(tmp_path):
    cgroup = tmp_path / "cgroup"
    stat = cgroup / f"kubepods.slice/kubepods-pod{UID_ESCAPED}.slice/cpu.stat"
    write(stat, "usage_usec 1000000\n")
    reader = HostReader(proc_root=tmp_path, cgroup_root=cgroup)
    # Two containers of one pod are one entry.
    both = [pod(), PodRef("ml", "llm-7b-worker-0", "sidecar", "llm-7b", UID)]
    assert dict(reader.read(both).pod_cpu_seconds) == {("ml", "llm-7b-worker-0"): 1.0}

    write(stat, "usage_usec 4000000\n")
    assert dict(reader.read([pod()]).pod_cpu_seconds) == {("ml", "llm-7b-worker-0"): 4.0}

    stat.unlink()
    assert dict(reader.read([pod()]).pod_cpu_seconds) == {}


def test_unreadable_or_unknown_pods_are_absent_not_errors(tmp_path):
    cgroup = tmp_path / "cgroup"
    write(cgroup / f"kubepods/pod{UID}/cpuacct.usage", "not-a-number\n")
    other = "0a0b0c0d-0000-4000-8000-000000000000"
    reading = HostReader(proc_root=tmp_path, cgroup_root=cgroup).read([
        pod(),                                   # garbage counter
        pod(uid=other, name="ghost"),            # no cgroup at all
        pod(uid="", name="unenriched"),          # uid not known yet
    ])
    assert dict(reading.pod_cpu_seconds) == {}
    assert reading.cpu_utilization is None
