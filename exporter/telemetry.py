"""The trainer-to-agent telemetry contract (CONTRACT §3) that both ends share: the
schema version and where the socket is. Plain data, standard library only, so that
a training image needs nothing more to send."""

SCHEMA_VERSION = 1
DEFAULT_SOCKET_PATH = "/run/burnrate/telemetry.sock"
SOCKET_ENV = "BURNRATE_TELEMETRY_SOCKET"
