"""Alerts delivered end to end, with no mock in the path: Debian's Alertmanager routing with
the configuration in docs/alerts.md, a Prometheus loaded with the chart's rules (made fast only by the
chart's documented values) and scraping a real `burnrate agent`, and real two-rank CPU
training runs, one hung and one diverging. The only stand-in is the receiving end: each
receiver is a webhook this test serves, where a team would have Slack or PagerDuty."""
from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import subprocess
import threading
import time
from datetime import datetime

import pytest
import yaml

from tests import kube_tools
from tests.conftest import PYTHON, ROOT, free_port, require
from tests.processes import Prometheus, agent, prometheus, stop, wait_http

ALERTS_DOC = os.path.join(ROOT, "docs", "alerts.md")
CHART = os.path.join(ROOT, "charts", "burnrate")
RUNBOOKS = "https://wiki.example/ml-platform/burnrate-runbooks"
FLOOR_S = 10
FAST = (f"prometheusRule.interval=2s,prometheusRule.for=4s,prometheusRule.trainingStalledFloor={FLOOR_S},"
        f"prometheusRule.runbookURL={RUNBOOKS}")
NAMESPACE = "ml-research"
# A rank silent this long is forgotten, and with it the last loss a finished run reported.
FORGET_AFTER_S = 10


def readme_alertmanager_config() -> dict:
    with open(ALERTS_DOC) as fh:
        blocks = re.findall(r"```yaml\n(.*?)```", fh.read(), flags=re.S)
    [config] = [b for b in blocks if b.startswith("route:")]
    return yaml.safe_load(config)


def test_the_readme_alertmanager_config_is_valid(tmp_path):
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(readme_alertmanager_config()))
    proc = subprocess.run([require("amtool"), "check-config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 receivers" in proc.stdout


class Webhook:
    """The receivers' end: every notification Alertmanager posts, by receiver."""

    def __init__(self) -> None:
        self.notifications: list[dict] = []
        lock = threading.Lock()
        received = self.notifications

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    received.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def alerts(self, name: str, job: str, status: str) -> list[tuple[dict, dict]]:
        """(notification, alert) for each delivered alert of that name, job and status."""
        return [(n, a) for n in list(self.notifications) for a in n["alerts"]
                if a["labels"].get("alertname") == name and a["labels"].get("training_job") == job
                and a["status"] == status]

    def wait(self, name: str, job: str, status: str, timeout: float, why) -> tuple[dict, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.alerts(name, job, status)
            if found:
                return found[0]
            time.sleep(0.2)
        pytest.fail(f"no {status} {name} for {job} within {timeout} s\n{why()}")


@contextlib.contextmanager
def webhook():
    hook = Webhook()
    hook.thread.start()
    try:
        yield hook
    finally:
        hook.server.shutdown()
        hook.server.server_close()


@contextlib.contextmanager
def alertmanager(tmp_path, hook: Webhook):
    """Debian's Alertmanager with docs/alerts.md's route, its waits cut to seconds so that a
    resolution is delivered at once, and every receiver a webhook of `hook`'s."""
    config = readme_alertmanager_config()
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    config["receivers"] = [{"name": r["name"], "webhook_configs": [{"url": f"{hook.url}/{r['name']}",
                                                                   "send_resolved": True}]}
                           for r in config["receivers"]]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "alertmanager.log", "wb")
    proc = subprocess.Popen([require("prometheus-alertmanager"), f"--config.file={path}",
                             f"--storage.path={tmp_path / 'alertmanager'}", f"--web.listen-address=127.0.0.1:{port}",
                             # no peers: an empty address turns the gossip listener off
                             "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", proc=proc)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc, 20)
        log.close()


def fast_rules(tmp_path) -> str:
    """The chart's PrometheusRule with the documented fast values, as the file the Prometheus
    operator would write from it."""
    proc = subprocess.run([kube_tools.tool("helm"), "template", "burnrate", CHART, "--set", FAST,
                           "-s", "templates/prometheusrule.yaml"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "burnrate-rules.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load(proc.stdout)["spec"]))
    return str(path)


def train(sock: str, job: str, *args: str, log) -> subprocess.Popen:
    # TMPDIR in the test's own directory: a launcher killed past stop()'s wait leaves its log
    # directory there, not in /tmp.
    env = {**os.environ, "BURNRATE_TELEMETRY_SOCKET": sock, "BURNRATE_TRAINING_JOB": job,
           "POD_NAMESPACE": NAMESPACE, "POD_NAME": f"{job}-worker-0", "TMPDIR": os.path.dirname(sock)}
    return subprocess.Popen([PYTHON, "-m", "burnrate", "train", "--nproc", "2", "--steps", "100000",
                             "--report-every-steps", "1", *args],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def stop_training(run: subprocess.Popen) -> float:
    """SIGTERM, as Kubernetes stops a pod; when it has exited."""
    stop(run, 60)
    return time.time()


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp.replace("Z", "+00:00"))).timestamp()


def last_step(prom: Prometheus, job: str) -> float:
    [sample] = prom.query(f'max(max_over_time(burnrate_train_last_step_timestamp_seconds{{training_job="{job}"}}[1h]))')
    return float(sample["value"][1])


def check_delivered(notification: dict, alert: dict, name: str, job: str) -> None:
    # docs/alerts.md's route pages for critical training alerts, grouped per job and problem.
    assert notification["receiver"] == "ml-platform-pager"
    assert notification["groupLabels"] == {"alertname": name, "namespace": NAMESPACE, "training_job": job}
    assert alert["labels"]["namespace"] == NAMESPACE and alert["labels"]["severity"] == "critical"
    assert f"Training job {NAMESPACE}/{job} " in alert["annotations"]["summary"]
    assert alert["annotations"]["runbook_url"] == f"{RUNBOOKS}#{name.lower()}"


@pytest.mark.slow
def test_a_stalled_and_a_diverging_run_are_paged_and_resolved(tmp_path):
    with open(tmp_path / "training.log", "wb") as log, webhook() as hook, alertmanager(tmp_path, hook) as am, \
            agent(tmp_path, "--interval", "1", "--forget-after", str(FORGET_AFTER_S)) as (url, sock, _), \
            prometheus(tmp_path, [url.removeprefix("http://")],
                       config=f"rule_files: [{fast_rules(tmp_path)}]\n"
                              f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n") as prom:
        def why() -> str:
            return "\n".join(f"--- {name} ---\n" + (tmp_path / name).read_text(errors="replace")[-2500:]
                             for name in ("training.log", "agent.log", "prometheus.log", "alertmanager.log")) + \
                f"\n--- delivered ---\n{json.dumps(hook.notifications)[-3000:]}"

        # Two runs at once: one whose ranks hang before step 20 (alive, holding their GPUs,
        # silent), one with a learning rate far too high for it, whose loss turns NaN.
        runs = {"llm-stalls": train(sock, "llm-stalls", "--fault", "stall:at=20", log=log),
                "llm-diverges": train(sock, "llm-diverges", "--lr", "1", "--fault", "diverge:at=5", log=log)}
        stopped: dict[str, float] = {}
        try:
            fired = {}
            for name, job in (("TrainingDiverging", "llm-diverges"), ("TrainingStalled", "llm-stalls")):
                fired[job] = hook.wait(name, job, "firing", 150, why)
                stopped[job] = stop_training(runs[job])
        finally:
            for job, run in runs.items():
                if job not in stopped:
                    stop_training(run)

        notification, firing = fired["llm-stalls"]
        check_delivered(notification, firing, "TrainingStalled", "llm-stalls")
        # It fired because the steps stopped: not before the floor had passed since the last one.
        assert seconds(firing["startsAt"]) >= last_step(prom, "llm-stalls") + FLOOR_S
        assert re.search(r"made no step for \d+(\.\d+)?s\.", firing["annotations"]["summary"])
        notification, firing = fired["llm-diverges"]
        check_delivered(notification, firing, "TrainingDiverging", "llm-diverges")
        assert firing["labels"]["signal"] == "non_finite"
        assert "non-finite loss or gradient norm on 2 rank(s)" in firing["annotations"]["summary"]

        notification, resolved = hook.wait("TrainingStalled", "llm-stalls", "resolved", 60, why)
        check_delivered(notification, resolved, "TrainingStalled", "llm-stalls")
        assert seconds(resolved["endsAt"]) >= stopped["llm-stalls"] - 1
        notification, resolved = hook.wait("TrainingDiverging", "llm-diverges", "resolved", FORGET_AFTER_S + 60, why)
        check_delivered(notification, resolved, "TrainingDiverging", "llm-diverges")
        assert seconds(resolved["endsAt"]) >= stopped["llm-diverges"]
        # Neither run was ever paged for the other's problem.
        assert not hook.alerts("TrainingDiverging", "llm-stalls", "firing")
        assert not hook.alerts("TrainingStalled", "llm-diverges", "firing")
