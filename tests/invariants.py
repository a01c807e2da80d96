"""What every report must hold, whatever its data: checked on each report the tests make in
this process (tests/conftest.py), and named by the tests written for it."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

# Dollars and hours are added in floating point: a cent's billionth is not a breach.
SLACK = 1e-6


def assert_waste_within_cost(report) -> None:
    """No job wasted more than it cost or held over the report's window, whether its findings
    are added up or taken one by one."""
    held: dict[tuple[str, str], list] = {}
    for j in report.jobs:
        mine = held.setdefault((j.namespace, j.training_job), [0.0, 0.0])
        mine[0] += j.gpu_hours
        mine[1] = None if j.cost_dollars is None or mine[1] is None else mine[1] + j.cost_dollars
        if j.cost_dollars is not None:
            wasted = sum(j.waste_dollars.values())
            assert wasted <= j.cost_dollars * (1 + SLACK) + SLACK, (
                f"{j.namespace}/{j.training_job} wasted ${wasted:.6f} of ${j.cost_dollars:.6f}: {j.waste_dollars}")
    for f in report.findings:
        # A job whose GPUs the window never saw allocated (its telemetry alone, say, from a
        # recording whose allocation rows were lost) has no held time to bound its findings by.
        if f.job not in held or held[f.job][0] == 0:
            continue
        hours, dollars = held[f.job]
        assert f.wasted_gpu_hours is None or f.wasted_gpu_hours <= hours * (1 + SLACK) + SLACK, (f, hours)
        assert f.wasted_dollars is None or dollars is None or f.wasted_dollars <= dollars * (1 + SLACK) + SLACK, (
            f, dollars)


@contextmanager
def every_report_checked() -> Iterator[None]:
    """Within it, every report made (analyzed, combined, replaced) is checked as it is made."""
    from burnrate.analyzer.output.report import Report

    made = Report.__init__

    def checked(self, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        assert_waste_within_cost(self)

    Report.__init__ = checked
    try:
        yield
    finally:
        Report.__init__ = made
