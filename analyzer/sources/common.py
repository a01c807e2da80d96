"""What both sources share: the signals a window may lack, where a window's data
begins and ends, column order, and the simulated-GPU marker."""
from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd

from burnrate.exporter.labels import SIMULATED
from burnrate.exporter.recording import TABLES

from ..grid.frames import Window
from ..grid.resample import step_for
from ..grid.series import distinct_text

TRAINING_TELEMETRY = "training telemetry"
NODE_PRICING_LABELS = "node pricing labels"
GPU_LOST_SIGNAL = "GPU lost signal (burnrate_gpu_up)"
XID_EVENT_COUNTS = "XID event counts"
POD_CPU = "pod CPU"
# What a cluster running dcgm-exporter without the burnrate agent cannot give.
DCGM_ONLY_MISSING = (GPU_LOST_SIGNAL, XID_EVENT_COUNTS, POD_CPU)
DEFAULT_STEP_S = 15.0
Progress = Callable[[int, int], None]    # (done, total): how far a source is in reading a window


def missing_signals(gpu: pd.DataFrame, rank: pd.DataFrame, node: pd.DataFrame,
                    dcgm_nodes: Sequence[str] = (), nodes: int = 0) -> tuple[str, ...]:
    """The signals absent from a window that has any data at all; what only some
    nodes lack (dcgm-exporter beside the agent) names them."""
    if gpu.empty and rank.empty and node.empty:
        return ()
    missing = []
    if rank.empty:
        missing.append(TRAINING_TELEMETRY)
    if node.empty:
        missing.append(NODE_PRICING_LABELS)
    if dcgm_nodes and len(dcgm_nodes) >= nodes:
        missing += DCGM_ONLY_MISSING
    elif dcgm_nodes:
        where = ", ".join(dcgm_nodes[:5]) + (" …" if len(dcgm_nodes) > 5 else "")
        missing += [f"{signal} on {len(dcgm_nodes)} of {nodes} nodes ({where})" for signal in DCGM_ONLY_MISSING]
    return tuple(missing)


def within(window: Window | None, data: Window | None, min_step_s: float) -> Window:
    """The window, cut to the part that holds data where that gives it a finer step:
    a year's query over a day of samples is read at the day's resolution, so a job
    costs the same whatever window holds it."""
    if data is None or data.end < data.start:
        return window or Window(0.0, 0.0)
    if window is None:
        return data
    start, end = max(window.start, data.start), min(window.end, data.end)
    if start > end:
        return window
    cut = Window(start, end)
    return cut if step_for(cut, min_step_s) < step_for(window, min_step_s) else window


def column_order(table: str, columns: Sequence[str] | None = None) -> list[str]:
    """Columns in the order load_table gives them: time, values, labels."""
    labels, every = TABLES[table]
    return ["t", *(every if columns is None else columns), *labels]


def is_simulated(gpu: pd.DataFrame) -> bool:
    return any(isinstance(model, str) and SIMULATED in model for model in distinct_text(gpu["modelName"]))
