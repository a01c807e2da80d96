"""The chart's webConfig values (docs/deploy.md#tls-and-basic-auth): the agent and `analyze
--serve` get --web-config from a Secret mounted read-only, their probes ask HTTPS, and the
ServiceMonitors scrape https with the Secret's CA and basic auth. Then the real agent, given
the rendered argument and the files such a Secret holds, is scraped by a real Prometheus set
up as the ServiceMonitor says: with the password over TLS it is up, without either it is
not, and a probe as the kubelet sends it (no password, no certificate check) is answered."""
import os
import shutil
import ssl
import urllib.request

import pytest
import yaml

from tests import kube_tools
from tests.processes import agent, prometheus
from tests.test_helm import CHART, HELMS, container, helm_template, run, validate, values_file
from tests.test_manifests import _command_parser
from tests.tls import self_signed, trusting, web_config

AGENT, ANALYZER = "DaemonSet/burnrate-node/burnrate-agent", "Deployment/burnrate/burnrate-analyzer"
MONITORS = {AGENT: "ServiceMonitor/burnrate-node/burnrate-agent", ANALYZER: "ServiceMonitor/burnrate/burnrate-analyzer"}
POLICIES = ("NetworkPolicy/burnrate-node/burnrate-agent", "NetworkPolicy/burnrate/burnrate-analyzer")
SECURED = {"agent": {"webConfig": {"secretName": "agent-web", "basicAuthSecretName": "agent-scrape"}},
           "analyzer": {"webConfig": {"secretName": "analyzer-web", "basicAuthSecretName": "analyzer-scrape"}},
           # the analyzer's --pricing ConfigMap at /etc/burnrate beside the web config's Secret
           "pricing": "instance_types: {}\n"}


def render(tmp_path, name: str, values: dict) -> dict[str, dict]:
    """helm_template caches by its arguments, so each set of values gets a file of its own."""
    os.makedirs(tmp_path / name)
    return helm_template("--values", values_file(tmp_path / name, values))


def probes(c: dict) -> list[dict]:
    return [c[name]["httpGet"] for name in ("readinessProbe", "livenessProbe")]


def web_config_path(c: dict, pod: dict) -> tuple[str, str, str]:
    """--web-config as the command parses it, checked to lie in a read-only mount of the
    part's Secret: (its path in the container, the mount's directory, the Secret's name)."""
    _, parser = _command_parser(c["args"])
    path = parser.parse_args(c["args"][1:]).web_config
    [mount] = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return path, mount["mountPath"], volume["secret"]["secretName"]


def test_web_config_values_secure_both_endpoints_and_their_scrapes(tmp_path):
    default = render(tmp_path, "plain", {"pricing": SECURED["pricing"]})
    chart = render(tmp_path, "secured", SECURED)
    for obj in chart.values():
        validate(obj)
    for key, part in ((AGENT, "agent"), (ANALYZER, "analyzer")):
        pod = chart[key]["spec"]["template"]["spec"]
        c = container(chart[key]["spec"]["template"])
        path, directory, secret = web_config_path(c, pod)
        assert (path, secret) == ("/etc/burnrate-web/web-config.yml", f"{part}-web")
        assert c["args"] == container(default[key]["spec"]["template"])["args"] + [f"--web-config={path}"]
        assert all(p["scheme"] == "HTTPS" and p["path"] == "/healthz" for p in probes(c))
        [endpoint] = chart[MONITORS[key]]["spec"]["endpoints"]
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": f"{part}-web", "key": "ca.crt"}},
                                         "serverName": f"burnrate-{part}.{chart[key]['metadata']['namespace']}.svc"}
        assert endpoint["basicAuth"] == {"username": {"name": f"{part}-scrape", "key": "username"},
                                         "password": {"name": f"{part}-scrape", "key": "password"}}
        # Nothing else about the scrape changes.
        [before] = default[MONITORS[key]]["spec"]["endpoints"]
        assert {k: v for k, v in endpoint.items() if k not in ("scheme", "tlsConfig", "basicAuth")} == before
    analyzer = container(chart[ANALYZER]["spec"]["template"])
    assert {m["mountPath"] for m in analyzer["volumeMounts"] if m.get("readOnly")} == {"/etc/burnrate",
                                                                                       "/etc/burnrate-web"}
    for key in POLICIES:
        assert chart[key] == default[key]


@pytest.mark.parametrize("helm", HELMS)
def test_helm_lint_passes_with_web_config_values(tmp_path, helm):
    proc = run(kube_tools.tool(helm), "lint", "--strict", CHART, "--values", values_file(tmp_path, SECURED))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_basic_auth_alone_keeps_plain_http(tmp_path):
    """tls: false is a web-config.yml with users and no certificate: probes and scrapes stay
    http, and Prometheus still sends the password."""
    chart = render(tmp_path, "basic", {"agent": {"webConfig": {
        "secretName": "agent-web", "tls": False, "basicAuthSecretName": "agent-scrape"}}})
    c = container(chart[AGENT]["spec"]["template"])
    assert "--web-config=/etc/burnrate-web/web-config.yml" in c["args"]
    assert all("scheme" not in p for p in probes(c))
    [endpoint] = chart[MONITORS[AGENT]]["spec"]["endpoints"]
    assert "scheme" not in endpoint and "tlsConfig" not in endpoint
    assert endpoint["basicAuth"]["password"] == {"name": "agent-scrape", "key": "password"}
    assert "--web-config" not in str(chart[ANALYZER])


@pytest.mark.parametrize("setting, where", [
    ("agent.webConfig.basicAuthSecretName=scrape", "agent.webConfig"),
    ("analyzer.webConfig.secretName=Web_Config", "analyzer.webConfig.secretName"),
    ("agent.webConfig.tls=yes", "agent.webConfig.tls"),
])
@pytest.mark.parametrize("helm", HELMS)
def test_bad_web_config_values_are_refused_naming_them(setting, where, helm):
    proc = run(kube_tools.tool(helm), "template", "burnrate", CHART, "--set", setting)
    assert proc.returncode != 0 and proc.stdout == ""
    # Helm 4 names a value by JSON pointer, Helm 3 by path.
    named = "/" + where.replace(".", "/") if helm == "helm" else where
    assert any(line.startswith("- ") and named in line for line in proc.stderr.splitlines()), proc.stderr


def secret_files(directory, user: str, password: str, server_name: str) -> None:
    """What the agent's Secret holds: web-config.yml naming tls.crt and tls.key relative to
    itself, and ca.crt (the self-signed certificate is its own CA)."""
    os.makedirs(directory)
    cert, key = self_signed(directory, server_name)
    shutil.copy(cert, directory / "ca.crt")
    os.rename(cert, directory / "tls.crt")
    os.rename(key, directory / "tls.key")
    (directory / "web-config.yml").write_text(web_config("tls.crt", "tls.key", user, password))


@pytest.mark.slow
def test_the_rendered_agent_serves_what_its_servicemonitor_scrapes(tmp_path):
    chart = render(tmp_path, "secured", SECURED)
    c = container(chart[AGENT]["spec"]["template"])
    path, directory, _ = web_config_path(c, chart[AGENT]["spec"]["template"]["spec"])
    [endpoint] = chart[MONITORS[AGENT]]["spec"]["endpoints"]
    server_name = endpoint["tlsConfig"]["serverName"]
    mounted = tmp_path / directory.strip("/")
    secret_files(mounted, "prometheus", "s3cret", server_name)
    (tmp_path / "password").write_text("s3cret")

    with agent(tmp_path, f"--web-config={mounted / os.path.relpath(path, directory)}",
               context=trusting(str(mounted / "ca.crt"))) as (url, _, _):
        # The kubelet's HTTPS probe: no certificate check, no password.
        unchecked = ssl.create_default_context()
        unchecked.check_hostname, unchecked.verify_mode = False, ssl.CERT_NONE
        probe = {p["path"] for p in probes(c)}.pop()
        with urllib.request.urlopen(url + probe, timeout=5, context=unchecked) as answer:
            assert answer.read() == b"ok\n"
        target = url.removeprefix("https://")
        as_monitored = {"scheme": endpoint["scheme"], "metrics_path": endpoint["path"],
                        "tls_config": {"ca_file": str(mounted / endpoint["tlsConfig"]["ca"]["secret"]["key"]),
                                       "server_name": server_name},
                        "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / "password")}}
        jobs = {"monitored": as_monitored,
                "no-password": {k: v for k, v in as_monitored.items() if k != "basic_auth"},
                "plain": {}}
        scrape = yaml.safe_dump({"scrape_configs": [{"job_name": name, **job, "static_configs": [{"targets": [target]}]}
                                                    for name, job in jobs.items()]})
        with prometheus(tmp_path, scrape=scrape) as prom:
            prom.wait_for('DCGM_FI_DEV_GPU_UTIL{job="monitored"}')
            prom.wait_for('up{job="no-password"} == 0')
            prom.wait_for('up{job="plain"} == 0')
            assert [r["value"][1] for r in prom.query('up{job="monitored"}')] == ["1"]
            assert prom.query('DCGM_FI_DEV_GPU_UTIL{job=~"no-password|plain"}') == []
            errors = {t["labels"]["job"]: t["lastError"] for t in prom.get("/api/v1/targets")["activeTargets"]}
            assert "401" in errors["no-password"] and errors["monitored"] == ""
