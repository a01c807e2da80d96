"""The HTTP face: /metrics (cached bytes, gzip when asked) and /healthz.

Each connection is handled on its own thread and TLS is negotiated there, so a slow
or broken client never holds up a scrape. Threads are capped and a request's line and
headers must arrive by a deadline, so slow clients cannot pile them up.
"""
from __future__ import annotations

import io
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .exposition import CONTENT_TYPE
from .render import Exposition
from .webconfig import Verdict, WebConfig

# A request line and its headers, however slowly they drip, arrive within this or the
# connection is closed; it also bounds a TLS handshake and an idle keep-alive connection.
_HEADER_DEADLINE_S = 10.0
# An answer is written within this (a client that stops reading lets its thread go).
_WRITE_TIMEOUT_S = 10.0
# Connections served at once, one thread each: as many as the listen queue holds, so a
# burst of scrapes is served together; beyond it a new connection is closed at once.
_CONNECTIONS_AT_ONCE = 128

Health = Callable[[], tuple[bool, str]]

_INDEX = """<html><head><title>{title}</title></head><body>
<h1>{title}</h1><p><a href="/metrics">Metrics</a> &middot; <a href="/healthz">Health</a></p>
</body></html>
"""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver listens with a backlog of 5: a burst of scrapes (several Prometheus
    # replicas, a federation, an HA pair at the same second) overflows it into time-outs.
    request_queue_size = 128
    tls: ssl.SSLContext | None = None

    def __init__(self, *args, **kwargs) -> None:
        self._slots = threading.BoundedSemaphore(_CONNECTIONS_AT_ONCE)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:   # no thread started to give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        # A client that hung up or timed out mid-answer is its own business, not a
        # traceback in the agent's log; anything else is still reported.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def finish_request(self, request, client_address) -> None:
        request.settimeout(_HEADER_DEADLINE_S)     # a whole handshake, not each read of it
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                request.close()
                return
        super().finish_request(request, client_address)


class _ReadsByDeadline(io.RawIOBase):
    """A socket's reads, each given only the time left until `until` (a monotonic time):
    a client that sends a byte now and then cannot stretch a per-read timeout for ever."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock, self.until = sock, 0.0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.until - time.monotonic()
        if left <= 0:
            raise TimeoutError("no request within the header deadline")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class MetricsServer:
    def __init__(self, host: str, port: int, exposition: Exposition, health: Health,
                 web_config: WebConfig | None = None, title: str = "burnrate agent") -> None:
        web = web_config or WebConfig()
        handler = _handler(exposition, health, web, _INDEX.format(title=title).encode())
        server_class = type("Server", (_Server,), {
            "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET, "tls": web.tls})
        self._httpd = server_class((host, port), handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():     # shutdown() waits for a loop that never started
            self._httpd.shutdown()
        self._httpd.server_close()


def _handler(exposition: Exposition, health: Health, web: WebConfig, index: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "burnrate"

        def log_message(self, fmt: str, *args) -> None:  # scrapes are not news
            pass

        def setup(self) -> None:
            super().setup()
            self.rfile.close()
            self._reads = _ReadsByDeadline(self.connection)
            self.rfile = io.BufferedReader(self._reads)

        def handle_one_request(self) -> None:
            # Waiting for the next request on a kept-alive connection counts too.
            self._reads.until = time.monotonic() + _HEADER_DEADLINE_S
            super().handle_one_request()

        def parse_request(self) -> bool:
            parsed = super().parse_request()        # reads the headers; nothing more is read
            self.connection.settimeout(_WRITE_TIMEOUT_S)
            return parsed

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            header = self.headers.get("Authorization")
            # A liveness probe carries no password: it is answered, and learns only
            # whether the server is healthy (docs/security.md).
            probe = path == "/healthz" and header is None and bool(web.users)
            verdict = Verdict.ALLOWED if probe else web.authorize(header, self.client_address[0])
            if verdict is Verdict.REFUSED:
                self._send(401, b"Unauthorized\n", extra={"WWW-Authenticate": 'Basic realm="burnrate"',
                                                          "Connection": "close"})
            elif verdict is Verdict.BUSY:
                self._send(429, b"Too many password checks at once; retry\n",
                           extra={"Retry-After": "1", "Connection": "close"})
            elif path == "/metrics":
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    self._send(200, exposition.gzipped(), CONTENT_TYPE, {"Content-Encoding": "gzip"})
                else:
                    self._send(200, exposition.plain(), CONTENT_TYPE)
            elif path == "/healthz":
                ok, why = health()
                if probe:
                    why = "ok" if ok else "unhealthy"
                self._send(200 if ok else 503, (why + "\n").encode())
            elif path == "/":
                self._send(200, index, "text/html; charset=utf-8")
            else:
                self._send(404, b"Not found\n")

        do_HEAD = do_GET

    return Handler
