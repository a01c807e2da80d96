"""The analysis `burnrate analyze --start --end` runs, asked for one calendar period of a
showback or budgets report: the same sources, thresholds and prices, with the period's window."""
from __future__ import annotations

import argparse

from ..grid.frames import Window


def period_report(args: argparse.Namespace, options, source, window: Window, key: str | None, fmt: str):
    """The report of `window`, or None where it holds no GPU sample at all. Teams by a pod
    label (`key`) need every pod's GPU-hours: per GPU, never from the roll-ups. `fmt` is the
    format whose notes it takes (a table's: the store's notes go into the report)."""
    from ..cli import NothingFound, overrides_of, report_of
    from ..costing.cost import AdviceConfig

    asked = argparse.Namespace(**{**vars(args), "since": None, "start": repr(window.start), "end": repr(window.end),
                                  "fleet": False, "per_gpu": key and f"--by {args.by}", "serve": False,
                                  "format": fmt, "checkpoint_seconds": None, "rollup_interval": None})
    try:
        return report_of(asked, options, source, options.catalog(), options.detectors(), AdviceConfig(),
                         overrides_of(args))
    except NothingFound:
        return None
