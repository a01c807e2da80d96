"""Slow clients against the metrics server: a thousand connections that drip their headers
hold a bounded number of threads and are dropped at the header deadline."""
import errno
import socket
import threading
import time

from burnrate.exporter import server as metrics_server
from tests.test_server import exposition, get, serve  # noqa: F401 (a fixture)


def still_open(conn: socket.socket) -> bool:
    """False once the server has closed its end (EOF or reset); `conn` does not block."""
    try:
        return conn.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except ConnectionError:
        return False


def drip(conn: socket.socket) -> None:
    try:
        conn.send(b"X-Drip: 1\r\n")
    except OSError as exc:      # the server has hung up
        assert exc.errno in (errno.EPIPE, errno.ECONNRESET), exc


def test_a_thousand_slow_clients_hold_bounded_threads_and_are_dropped(exposition, monkeypatch):  # noqa: F811
    """Each client starts a request and adds a header line every 0.3 s, never finishing: a
    timeout per read never fires, so before, each held a thread for good (1,000 threads)."""
    monkeypatch.setattr(metrics_server, "_HEADER_DEADLINE_S", 1.5)
    before = threading.active_count()
    server = serve(exposition)
    clients = []
    try:
        for _ in range(1000):
            conn = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            conn.setblocking(False)
            clients.append(conn)
        most, start = 0, time.monotonic()
        while time.monotonic() - start < 3.0:
            for conn in clients:
                if still_open(conn):
                    drip(conn)
            most = max(most, threading.active_count())
            time.sleep(0.3)
        assert most - before <= 128 + 2, most - before
        assert not any(still_open(conn) for conn in clients)
        assert get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    finally:
        for conn in clients:
            conn.close()
        server.stop()
