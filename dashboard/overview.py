"""A page's first paint: its window read at the display's resolution, while the full
per-GPU analysis of the window (findings, ledgers, costs) runs in the background.

A heatmap of a day is at most `aggregate.MAX_BUCKETS` columns wide, so the overview asks
Prometheus for each GPU's utilization and holders reduced to one point per column
(`avg_over_time` over the column's step, PrometheusSource's own step-reduced queries),
a few hundred points per series instead of thousands. GPU-hours come from the samples'
held seconds (analyzer.grid.holding), so they are the full analysis's to the sample; what
is averaged over a column (utilization, busy and idle counts) says so on the page.
"""
from __future__ import annotations

import math

import pandas as pd
from dataclasses import dataclass
from functools import cached_property

from burnrate.analyzer.costing.accounting import Accounting, account
from burnrate.analyzer.costing.cost import GpuPrices, gpu_prices, job_costs
from burnrate.analyzer.costing.pricing import Catalog
from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.fleet.rollups import RollUpReader
from burnrate.analyzer.grid.frames import Frames, Window
from burnrate.analyzer.grid.views import Views
from burnrate.analyzer.output.report import Report
from burnrate.analyzer.sources import PrometheusSource

from . import aggregate

# What the Fleet page draws: each GPU's utilization and who holds it; nodes for their prices.
COLUMNS = {"gpu": ("gpu_util",), "alloc": ("share",), "node": ()}


def display_step(window: Window, min_step_s: float) -> float:
    """One heatmap column's seconds: the window over MAX_BUCKETS, rounded up to whole
    minutes past one, so the basis reads as "5-minute means", never "288-second means"."""
    step = max(min_step_s, (window.end - window.start) / aggregate.MAX_BUCKETS)
    return float(math.ceil(step / 60.0) * 60.0) if step > 60.0 else float(math.ceil(step))


@dataclass
class Overview:
    """The window at `step`: the Fleet page's aggregates and the GPU-hours, no findings."""

    frames: Frames
    catalog: Catalog
    config: DetectorConfig

    @property
    def step(self) -> float:
        return self.frames.step_s

    @property
    def empty(self) -> bool:
        return self.frames.gpu.empty

    @property
    def simulated(self) -> bool:
        return self.frames.simulated

    @cached_property
    def views(self) -> Views:
        return Views(self.frames)

    @cached_property
    def prices(self) -> GpuPrices:
        return gpu_prices(self.views, self.catalog)

    @cached_property
    def fleet(self) -> aggregate.Fleet:
        return aggregate.fleet(self.views, self.prices, self.config.idle_gpu)

    @cached_property
    def accounting(self) -> Accounting:
        return account(self.views, self.config.idle_gpu)

    @cached_property
    def report(self) -> Report:
        """The jobs' GPU-hours and dollars as a report with no findings, for the pages' tables
        (aggregate.job_table, aggregate.cost_summary): the held seconds the full analysis
        counts, priced alike, so the same to the sample; no MFU or tokens (no rank series read)."""
        jobs, _ = job_costs(self.views, self.catalog, accounting=self.accounting, prices=self.prices)
        return Report(self.frames.window, [], jobs, accounting=self.accounting, views=self.views,
                      prices=self.prices, simulated=self.simulated)

    @cached_property
    def jobs(self) -> pd.DataFrame:
        return aggregate.job_table(self.report, self.views)

    @property
    def step_text(self) -> str:
        """"5-minute", "15-second": what the read's figures are means over."""
        step = self.step
        return f"{step / 60:g}-minute" if step >= 60 and step % 60 == 0 else f"{step:g}-second"

    @property
    def basis(self) -> str:
        return f"utilization at {self.step_text} means"

    def warm(self) -> Overview:
        if not self.empty:
            _ = self.fleet, self.accounting
        return self


def read(source: PrometheusSource, window: Window, catalog: Catalog, config: DetectorConfig) -> Overview:
    # Where the store's ruler counted reporting GPUs, the data's range is read at its edges
    # only: one query over every step of a day of 1,024 GPUs took 0.7 s before the rest began.
    seen = RollUpReader(source).reported(window)
    frames = source.frames(window, COLUMNS, step=display_step(window, source.min_step_s), seen=seen)
    return Overview(frames, catalog, config).warm()
