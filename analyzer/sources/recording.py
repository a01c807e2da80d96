"""Frames from a local recording (`burnrate agent --record`, `burnrate simulate`)."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from agent.recording import TABLES

from ..frames import Frames, Window
from ..recording import check, load_table
from . import DEFAULT_STEP_S, column_order, is_simulated, missing_signals

SIMULATED_MARKER = "simulated.json"


def infer_step(t: pd.Series) -> float:
    """The sample interval: the median gap between distinct sample times."""
    times = np.unique(t.to_numpy())
    return float(np.median(np.diff(times))) if len(times) > 1 else DEFAULT_STEP_S


class RecordingSource:
    def __init__(self, root: str) -> None:
        check(root)
        self.root = root

    def frames(self, window: Window | None = None) -> Frames:
        """Every table cut to `window` (inclusive); the whole recording when None."""
        tables = {name: load_table(self.root, name)[column_order(name)] for name in TABLES}
        if window is None:
            times = pd.concat([f["t"] for f in tables.values()])
            window = Window(float(times.min()), float(times.max())) if len(times) else Window(0.0, 0.0)
        else:
            tables = {name: _cut(frame, window) for name, frame in tables.items()}
        gpu, rank, node = tables["gpu"], tables["rank"], tables["node"]
        step = infer_step(node["t"] if len(node) else gpu["t"])
        simulated = os.path.exists(os.path.join(self.root, SIMULATED_MARKER)) or is_simulated(gpu)
        return Frames(window=window, step_s=step, missing=missing_signals(gpu, rank, node),
                      simulated=simulated, **tables)


def _cut(frame: pd.DataFrame, window: Window) -> pd.DataFrame:
    # Rows are sorted by time: two binary searches instead of a mask over every row.
    t = frame["t"].to_numpy()
    lo, hi = np.searchsorted(t, window.start, "left"), np.searchsorted(t, window.end, "right")
    return frame.iloc[lo:hi].reset_index(drop=True)
