"""The report: one analysis rendered as a table, JSON and CSV, and `--serve`'s metrics."""
