"""The HTTP face: /metrics (cached bytes, gzip when asked) and /healthz.

Each connection is handled on its own thread and TLS is negotiated there, so a slow
or broken client never holds up a scrape.
"""
from __future__ import annotations

import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .exposition import CONTENT_TYPE
from .render import Exposition
from .webconfig import WebConfig

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

    def handle_error(self, request, client_address) -> None:
        # A client that hung up or timed out mid-answer is its own business, not a
        # traceback in the agent's log; anything else is still reported.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def finish_request(self, request, client_address) -> None:
        request.settimeout(10.0)
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                request.close()
                return
        super().finish_request(request, client_address)


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
            if not web.authorized(self.headers.get("Authorization")):
                self._send(401, b"Unauthorized\n", extra={"WWW-Authenticate": 'Basic realm="burnrate"'})
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    self._send(200, exposition.gzipped(), CONTENT_TYPE, {"Content-Encoding": "gzip"})
                else:
                    self._send(200, exposition.plain(), CONTENT_TYPE)
            elif path == "/healthz":
                ok, why = health()
                self._send(200 if ok else 503, (why + "\n").encode())
            elif path == "/":
                self._send(200, index, "text/html; charset=utf-8")
            else:
                self._send(404, b"Not found\n")

        do_HEAD = do_GET

    return Handler
