"""The node agent: GPU readers, pod attribution, the telemetry inbox and the sampler.

It imports neither pandas nor torch: it runs on every GPU node."""
