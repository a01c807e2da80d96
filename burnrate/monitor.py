"""`from burnrate.monitor import Monitor`: the instrumentation for any training loop,
from the core install. It needs the standard library, and torch only when it is
handed a model, a GPU or a DDP model to watch."""
from burnrate.exporter.telemetry import TelemetrySink
from burnrate.trainer.monitor import Monitor
from burnrate.trainer.telemetry import Identity

__all__ = ["Identity", "Monitor", "TelemetrySink"]
