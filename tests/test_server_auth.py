"""Basic auth on the metrics server under abuse: a probe without a password, floods of wrong
passwords and the timing of refusals, on real sockets with real bcrypt."""
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import bcrypt
import pytest

from burnrate.exporter import webconfig
from burnrate.exporter.server import MetricsServer
from tests.test_manifests import one
from tests.test_server import ask, exposition, write_config  # noqa: F401 (a fixture)
from tests.tls import basic


def secured(tmp_path, **costs: int) -> webconfig.WebConfig:
    """A web config whose users' passwords are `<user>-pw`, each hashed at its bcrypt cost."""
    lines = "".join(f"  {user}: '{bcrypt.hashpw(f'{user}-pw'.encode(), bcrypt.gensalt(rounds=cost)).decode()}'\n"
                    for user, cost in costs.items())
    return webconfig.load(write_config(tmp_path, "basic_auth_users:\n" + lines))


@pytest.fixture
def serving(exposition):  # noqa: F811 (the fixture above)
    """serving(web, health) starts a server on a free loopback port; all are stopped after."""
    servers = []

    def start(web, health=lambda: (True, "ok")):
        server = MetricsServer("127.0.0.1", 0, exposition, health, web)
        server.start()
        servers.append(server)
        return server.port

    yield start
    for server in servers:
        server.stop()


def test_a_liveness_probe_needs_no_password_and_learns_only_healthy_or_not(tmp_path, serving):
    state = {"health": (True, "ok (GPUs down: [3])")}
    port = serving(secured(tmp_path, prometheus=4), lambda: state["health"])
    assert ask(port, "/healthz")[::2] == (200, b"ok\n")
    state["health"] = (False, "last snapshot is 99s old")
    assert ask(port, "/healthz")[::2] == (503, b"unhealthy\n")
    # whoever holds the password learns why; a wrong one is refused as on any path
    assert ask(port, "/healthz", basic("prometheus", "prometheus-pw"))[::2] == (503, b"last snapshot is 99s old\n")
    assert ask(port, "/healthz", basic("prometheus", "wrong"))[0] == 401
    for path in ("/metrics", "/"):
        status, headers, body, _ = ask(port, path)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic") and b"DCGM" not in body


def test_a_correct_login_is_answered_at_once_while_another_address_floods(tmp_path, serving):
    """120 wrong passwords at once from 127.0.0.2 hold one bcrypt check, not a queue of 120
    (8 s of cost-10 checks) that the right password from 127.0.0.1 would wait behind."""
    port = serving(secured(tmp_path, prometheus=10))
    with ThreadPoolExecutor(121) as pool:
        flood = [pool.submit(ask, port, "/metrics", basic("prometheus", f"guess{i}"), "127.0.0.2")
                 for i in range(120)]
        time.sleep(0.3)
        status, _, body, seconds = ask(port, "/metrics", basic("prometheus", "prometheus-pw"))
        answers = [f.result() for f in flood]
    assert status == 200 and b"DCGM_FI_DEV_GPU_UTIL" in body and seconds < 1.0, seconds
    busy = [headers for code, headers, *_ in answers if code == 429]
    assert sorted({code for code, *_ in answers}) == [401, 429] and len(busy) >= 60
    assert all(headers["Retry-After"] == "1" for headers in busy)


def test_no_request_waits_long_for_a_password_check(tmp_path, serving):
    """120 addresses each send a wrong password at once: before, the last waited behind all
    the others' cost-10 checks (~9 s); now a request that cannot start its check within 2 s
    is answered 429, and a login verified before the flood is answered from the cache."""
    port = serving(secured(tmp_path, prometheus=10))
    assert ask(port, "/metrics", basic("prometheus", "prometheus-pw"))[0] == 200
    with ThreadPoolExecutor(120) as pool:
        flood = [pool.submit(ask, port, "/metrics", basic("prometheus", "guess"), f"127.0.1.{i}")
                 for i in range(1, 121)]
        time.sleep(0.3)
        cached = ask(port, "/metrics", basic("prometheus", "prometheus-pw"))
        answers = [f.result() for f in flood]
    assert cached[0] == 200 and cached[3] < 0.5, cached[3]
    codes = [code for code, *_ in answers]
    assert set(codes) == {401, 429} and codes.count(429) >= 60, codes
    assert max(seconds for *_, seconds in answers) < 4.0


def test_a_refusals_timing_tells_no_user_name_apart(tmp_path, serving):
    """Users hashed at costs 4, 8 and 10: a wrong password for each, and an unknown user,
    all take what one cost-10 check takes (before, the cost-4 user's refusal took 1 ms and
    an unknown name's 70 ms)."""
    port = serving(secured(tmp_path, cheap=4, middling=8, dear=10))
    names = ("cheap", "middling", "dear", "nobody")
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(7):
        for name in names:
            status, *_, seconds = ask(port, "/metrics", basic(name, "wrong"))
            assert status == 401
            times[name].append(seconds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    assert max(medians.values()) < 2 * min(medians.values()), medians


@pytest.mark.parametrize("kind, name", [("DaemonSet", "burnrate-agent"), ("Deployment", "burnrate-analyzer")])
def test_the_shipped_probes_ask_the_path_that_needs_no_password(kind, name):
    """A kubelet probe carries no secret: with --web-config's users set, only /healthz answers it."""
    [container] = one(kind, name)["spec"]["template"]["spec"]["containers"]
    assert {container[probe]["httpGet"]["path"] for probe in ("livenessProbe", "readinessProbe")} == {"/healthz"}
