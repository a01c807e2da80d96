"""The HTTP server: cached /metrics (gzip too), /healthz, TLS and basic auth from a web config."""
import base64
import dataclasses
import gzip
import http.client
import select
import socket
import ssl
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import bcrypt
import pytest
from prometheus_client import CollectorRegistry

from burnrate.exporter import webconfig
from burnrate.exporter.collector import SnapshotCollector
from burnrate.exporter.errors import UserError
from burnrate.exporter.listen import listen_address
from burnrate.exporter.render import Exposition
from burnrate.exporter.server import MetricsServer
from tests.conftest import require
from tests.snapshots import fixed_snapshot


@pytest.fixture
def exposition():
    snap = fixed_snapshot()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snap))
    return Exposition(registry, version=lambda: snap)


def serve(exposition, web=None, health=lambda: (True, "ok")):
    server = MetricsServer("127.0.0.1", 0, exposition, health, web)
    server.start()
    return server


def get(url, headers=None, context=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def ask(port: int, path: str = "/metrics", headers=None, source: str = "127.0.0.1"):
    """(status, headers, body, seconds) of one GET from `source`, one of loopback's addresses."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        start = time.perf_counter()
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, dict(resp.headers), body, time.perf_counter() - start
    finally:
        conn.close()


def test_metrics_plain_and_gzip(exposition):
    server = serve(exposition)
    try:
        base = f"http://127.0.0.1:{server.port}"
        status, headers, body = get(base + "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert body == exposition.plain() and b"DCGM_FI_DEV_GPU_UTIL{" in body
        status, headers, packed = get(base + "/metrics", {"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip" and gzip.decompress(packed) == body
        assert get(base + "/nope")[0] == 404
    finally:
        server.stop()


class CountingCollector(SnapshotCollector):
    def __init__(self, source):
        super().__init__(source)
        self.renders = 0

    def collect(self):
        self.renders += 1
        return super().collect()


def test_each_snapshot_is_rendered_once_on_the_first_scrape_that_needs_it():
    snaps = [fixed_snapshot()]
    collector = CountingCollector(lambda: snaps[-1])
    registry = CollectorRegistry()
    registry.register(collector)
    exp = Exposition(registry, version=lambda: snaps[-1])
    assert collector.renders == 0  # nothing is rendered before a scrape asks
    first = exp.plain()
    packed = exp.gzipped()
    assert gzip.decompress(packed) == first
    assert exp.plain() is first and exp.gzipped() is packed  # later scrapes reuse both
    assert collector.renders == 1
    snaps.append(dataclasses.replace(snaps[0], time=snaps[0].time + 1))
    second = exp.gzipped()
    assert gzip.decompress(second) == exp.plain() != first
    assert collector.renders == 2


def test_a_snapshot_taken_during_a_render_is_rendered_by_the_next_scrape():
    snaps = [fixed_snapshot()]

    class SamplerMidRender(SnapshotCollector):
        def collect(self):
            yield from super().collect()
            if len(snaps) == 1:  # the sampler publishes a newer snapshot while this one renders
                snaps.append(dataclasses.replace(snaps[0], time=snaps[0].time + 1))

    registry = CollectorRegistry()
    registry.register(SamplerMidRender(lambda: snaps[-1]))
    exp = Exposition(registry, version=lambda: snaps[-1])
    first = exp.plain()
    assert exp.plain() != first  # not served from cache as if it were the newer snapshot


def test_healthz_reports_staleness(exposition):
    server = serve(exposition, health=lambda: (False, "last snapshot is 99s old"))
    try:
        status, _, body = get(f"http://127.0.0.1:{server.port}/healthz")
        assert status == 503 and b"99s old" in body
    finally:
        server.stop()


class CountingBcrypt:
    """bcrypt.checkpw as it is, counting its calls and how many ran at once."""

    def __init__(self, real):
        self.real, self.calls, self.running, self.most = real, [], 0, 0
        self.lock = threading.Lock()

    def __call__(self, password, hashed):
        with self.lock:
            self.calls.append(hashed)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            return self.real(password, hashed)
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture
def guarded(tmp_path, exposition, monkeypatch):
    """An agent whose /metrics needs prometheus:s3cret, on a real socket."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
    web = webconfig.load(write_config(tmp_path, f"basic_auth_users:\n  prometheus: '{hashed}'\n"))
    counting = CountingBcrypt(bcrypt.checkpw)
    monkeypatch.setattr(webconfig.bcrypt, "checkpw", counting)
    server = serve(exposition, web)
    yield f"http://127.0.0.1:{server.port}/metrics", counting
    server.stop()


def _basic(user: bytes, password: bytes) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(user + b":" + password).decode()}


def test_an_unknown_user_costs_what_a_wrong_password_does(guarded):
    """Each runs one full bcrypt check (an unknown user against a stand-in hash), so the
    time of a refusal does not tell which user names exist."""
    url, counting = guarded
    assert get(url, _basic(b"prometheus", b"wrong"))[0] == 401
    assert get(url, _basic(b"nobody", b"wrong"))[0] == 401
    assert len(counting.calls) == 2 and all(h.startswith(b"$2") and len(h) == 60 for h in counting.calls)
    assert counting.calls[1] != counting.calls[0] and counting.calls[1][:7] == counting.calls[0][:7]   # same cost


def test_a_password_longer_than_bcrypt_takes_is_refused_not_a_crash(guarded):
    url, _ = guarded
    assert get(url, _basic(b"prometheus", b"x" * 73))[0] == 401
    assert get(url, _basic(b"prometheus", b"s3cret"))[0] == 200


def test_a_flood_of_wrong_passwords_checks_one_at_a_time(guarded):
    url, counting = guarded
    port = int(url.split(":")[2].split("/")[0])
    # From 16 addresses (each may have one check going), 4 at once: none waits 2 s for its turn.
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda i: ask(port, "/metrics", _basic(b"prometheus", b"guess"), f"127.0.2.{i}")[0],
                              range(1, 17)))
    assert codes == [401] * 16 and len(counting.calls) == 16 and counting.most == 1


def test_verified_credentials_cost_one_bcrypt_check(guarded):
    url, counting = guarded
    for _ in range(5):
        assert get(url, _basic(b"prometheus", b"s3cret"))[0] == 200
    assert len(counting.calls) == 1


def write_config(tmp_path, text):
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


def test_basic_auth(tmp_path, exposition):
    # htpasswd writes $2y$ hashes; bcrypt reads them as $2b$
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)
    web = webconfig.load(write_config(tmp_path, f"basic_auth_users:\n  prometheus: '{hashed}'\n"))
    server = serve(exposition, web)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        status, headers, _ = get(url)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        bad = base64.b64encode(b"prometheus:wrong").decode()
        assert get(url, {"Authorization": f"Basic {bad}"})[0] == 401
        good = base64.b64encode(b"prometheus:s3cret").decode()
        for _ in range(3):  # verified once, then served from the cache
            assert get(url, {"Authorization": f"Basic {good}"})[0] == 200
    finally:
        server.stop()


def test_tls(tmp_path, exposition):
    openssl = require("openssl")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)
    web = webconfig.load(write_config(
        tmp_path, "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS12\n"))
    server = serve(exposition, web)
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        status, _, body = get(f"https://127.0.0.1:{server.port}/metrics", context=ctx)
        assert status == 200 and b"DCGM_FI_DEV_GPU_UTIL" in body
        with pytest.raises(OSError):  # plain HTTP to a TLS port gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=3).read()
    finally:
        server.stop()


@pytest.mark.parametrize("text, message", [
    ("tls_server_config:\n  cert_file: nope.pem\n  key_file: nope.pem\n", "cert_file: no file at .*nope.pem"),
    ("tls_server_config: 5\n", "tls_server_config must be a mapping"),
    ("basic_auth_users:\n  alice: '$2y$10$not-a-hash'\n", "the hash of 'alice' is not a valid bcrypt hash"),
    ("tls_server_config:\n  cert_file: a\n", "needs cert_file and key_file"),
    ("basic_auth_users:\n  alice: plaintext\n", "bcrypt hashes"),
    ("surprise: 1\n", "unknown web config keys: surprise"),
    ("- a list\n", "must be a mapping"),
])
def test_bad_web_config_is_a_clear_error(tmp_path, text, message):  # one line, at startup
    with pytest.raises(webconfig.WebConfigError, match=message):
        webconfig.load(write_config(tmp_path, text))


@pytest.mark.parametrize("text, default, expected", [
    ("127.0.0.1:9400", "0.0.0.0", ("127.0.0.1", 9400)),
    (":9400", "0.0.0.0", ("0.0.0.0", 9400)),
    ("[::1]:8050", None, ("::1", 8050)),
    ("localhost:0", None, ("localhost", 0)),
])
def test_one_listen_parser_for_every_command(text, default, expected):
    assert listen_address(text, default) == expected


@pytest.mark.parametrize("text, default", [("nowhere", "0.0.0.0"), (":8050", None), ("h:65536", None), ("h:x", None)])
def test_a_bad_listen_address_is_one_line(text, default):
    with pytest.raises(UserError, match=r"^--listen wants HOST:PORT, got "):
        listen_address(text, default)


def test_a_burst_of_scrapes_is_queued_not_refused(exposition):
    """100 scrapers connect while the server has not accepted yet (as when every thread is
    busy): the listen queue holds them all, where socketserver's default of 5 let the
    rest hang in SYN_SENT until they timed out. Then every one is answered."""
    server = MetricsServer("127.0.0.1", 0, exposition, lambda: (True, "ok"))
    clients = []
    try:
        for _ in range(100):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", server.port))
            clients.append(c)
        _, writable, _ = select.select([], clients, [], 3.0)
        connected = [c for c in writable if c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]
        assert len(connected) == 100
        server.start()
        for c in clients:
            c.setblocking(True)
            c.settimeout(10)
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert all(c.recv(64).startswith(b"HTTP/1.1 200") for c in clients)
    finally:
        for c in clients:
            c.close()
        server.stop()


def test_a_client_that_hangs_up_mid_answer_leaves_no_traceback(exposition, capfd):
    server = serve(exposition)
    try:
        for _ in range(30):
            c = socket.create_connection(("127.0.0.1", server.port))
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # RST on close
            c.close()
        assert get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    finally:
        server.stop()
    assert "Traceback" not in capfd.readouterr().err
