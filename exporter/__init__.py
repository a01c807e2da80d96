"""The Prometheus face of burnrate: the metric catalog, the collector and /metrics."""
