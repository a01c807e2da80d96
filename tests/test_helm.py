"""charts/burnrate, the source of manifests/' objects (tests/test_manifests.py holds those files
to it): `helm lint` passes, the default values render what `kubectl kustomize manifests/` does,
the kustomization's own generators, labels and images included (and the exported-labels
profile what the kustomize component does), other
values land where they should and validate as the manifests do, and values.schema.json
refuses bad values with a message naming them."""
import copy
import functools
import os
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from burnrate.analyzer.costing.pricing import load_catalog
from tests import kube_tools
from tests.conftest import ROOT
from tests.test_manifests import (CUSTOM_RESOURCES, KUBERNETES_VERSION, MANIFESTS, _command_parser, _schema,
                                  ident, load_yaml)

CHART = os.path.join(ROOT, "charts", "burnrate")
RULES = os.path.join(MANIFESTS, "alerts", "burnrate-rules.yaml")
DASHBOARDS = ("burnrate-training-job.json", "burnrate-fleet-cost.json")
GRAFANA = {"ConfigMap/burnrate/burnrate-grafana-training-job", "ConfigMap/burnrate/burnrate-grafana-fleet-cost"}
# Helm's conventional labels, which the chart adds to every object's metadata and kustomize
# has no counterpart for: the one difference the equivalence tests take out.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance"}
# values.yaml leaves the reference training job off, which the kustomization includes.
AS_KUSTOMIZE = ("--set", "trainer.enabled=true")
TRAINER = {"Namespace/-/burnrate-train", "PersistentVolumeClaim/burnrate-train/burnrate-reference-checkpoints",
           "PyTorchJob/burnrate-train/burnrate-reference"}
OPERATOR = {"ServiceMonitor/burnrate-node/burnrate-agent", "ServiceMonitor/burnrate/burnrate-analyzer",
            "PrometheusRule/burnrate/burnrate"}
WORKLOADS = {"DaemonSet/burnrate-node/burnrate-agent", "Deployment/burnrate/burnrate-analyzer",
             "Deployment/burnrate/burnrate-dashboard"}
POLICIES = {"NetworkPolicy/burnrate-node/burnrate-agent", "NetworkPolicy/burnrate/burnrate-analyzer",
            "NetworkPolicy/burnrate/burnrate-dashboard"}

DIGEST = "sha256:" + "0123456789abcdef" * 4
PRICING = """\
instance_types:
  x1.big: {gpus: 4, on_demand: 12.0, spot: 4.0}
nodes:
  dgx-01: {gpu_hour: {price: 1.5, date: "2026-01", source: amortized DGX}}
"""
OTHER_VALUES = {
    "prometheus": {"url": "http://thanos-query.observability.svc:10902",
                   "networkPolicyPeers": [{"namespaceSelector": {"matchLabels": {"name": "observability"}}}]},
    "pricing": PRICING,
    "images": {name: {"repository": f"registry.example/{repo}", "digest": DIGEST, "tag": "ignored"}
               for name, repo in (("agent", "burnrate-agent"), ("burnrate", "burnrate"),
                                  ("trainer", "burnrate-trainer"))},
    "agent": {"extraArgs": ["--interval=5"], "nodeSelector": {"gpu-pool": "h100"},
              "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]},
    "analyzer": {"nodeSelector": {"pool": "system"}, "tolerations": [{"key": "system", "operator": "Exists"}]},
    "dashboard": {"nodeSelector": {"pool": "web"}, "networkPolicyPeers": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
    "serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}},
    "trainer": {"enabled": True, "storageClassName": "efs"},
}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


def objects_of(text: str) -> dict[str, dict]:
    docs = [doc for doc in yaml.safe_load_all(text) if doc]
    found = {ident(doc): doc for doc in docs}
    assert len(found) == len(docs), "two objects with one identity"
    return found


# Helm 4, and Helm 3, with which most clusters are still installed.
HELMS = ("helm", "helm3")


@functools.cache
def helm_template(*args: str, helm: str = "helm") -> dict[str, dict]:
    """`helm template` of the chart; callers copy before changing what it returns."""
    proc = run(kube_tools.tool(helm), "template", "burnrate", CHART, *args)
    assert proc.returncode == 0, proc.stderr
    return objects_of(proc.stdout)


def kustomize(path: str) -> dict[str, dict]:
    proc = run(kube_tools.tool("kubectl"), "kustomize", path)
    assert proc.returncode == 0, proc.stderr
    return objects_of(proc.stdout)


def without_helm_labels(objects: dict[str, dict]) -> dict[str, dict]:
    out = copy.deepcopy(objects)
    for key, obj in out.items():
        labels = obj["metadata"]["labels"]
        assert HELM_LABELS <= labels.keys(), key
        for name in HELM_LABELS:
            del labels[name]
    return out


def assert_same(chart: dict[str, dict], kustomized: dict[str, dict]) -> None:
    assert sorted(chart) == sorted(kustomized)
    for key in kustomized:
        assert chart[key] == kustomized[key], key


def values_file(tmp_path, values: dict) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def validate(obj: dict) -> None:
    if obj["kind"] in CUSTOM_RESOURCES:
        jsonschema.Draft202012Validator(_schema(obj["kind"])).validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def container(template: dict) -> dict:
    [only] = template["spec"]["containers"]
    return only


# --- the chart against the kustomization --------------------------------------------------------

@pytest.mark.parametrize("helm", HELMS)
def test_helm_lint_passes_with_default_and_other_values(tmp_path, helm):
    helm = kube_tools.tool(helm)
    for extra in ((), ("--values", values_file(tmp_path, OTHER_VALUES)),
                  ("--values", os.path.join(MANIFESTS, "values-kustomize.yaml"))):
        proc = run(helm, "lint", "--strict", CHART, *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_3_renders_what_helm_4_renders(tmp_path):
    """Object for object, with default values, other values and the fast-alert values."""
    for args in ((), (*AS_KUSTOMIZE, "--values", values_file(tmp_path, OTHER_VALUES)),
                 ("--set", "prometheusRule.for=4s,prometheusRule.trainingStalledFloor=10,"
                           "prometheusRule.trainingHeldAfterExit=30")):
        assert helm_template(*args, helm="helm3") == helm_template(*args), args


def test_default_values_render_what_kustomize_renders():
    """Everything: the objects rendered into manifests/ and what its kustomization adds by
    hand, the generated ConfigMaps (burnrate-config's hashed name included), the part-of
    label and the images' tags; the reference job is the one part the chart's defaults leave
    out."""
    kustomized = kustomize(MANIFESTS)
    assert_same(without_helm_labels(helm_template(*AS_KUSTOMIZE)), kustomized)
    defaults = without_helm_labels(helm_template())
    assert_same(defaults, {k: v for k, v in kustomized.items() if k not in TRAINER})


def test_the_exported_labels_profile_renders_what_the_kustomize_component_renders(tmp_path):
    relative = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": [relative], "components": [f"{relative}/profiles/exported-labels"]}))
    chart = helm_template(*AS_KUSTOMIZE, "--set", "scrapeProfile=exported-labels")
    assert_same(without_helm_labels(chart), kustomize(str(tmp_path)))


def test_the_alert_rules_are_the_manifests_rules_file():
    """Read through a link, not copied: there is one rules file to edit."""
    assert os.path.samefile(os.path.join(CHART, "files", "burnrate-rules.yaml"), RULES)
    [rules] = load_yaml(RULES)
    assert helm_template()["PrometheusRule/burnrate/burnrate"]["spec"] == rules


def test_the_alert_overrides_change_what_they_name_and_nothing_else():
    """The documented values for faster alerts and runbook links: every group's interval,
    every existing `for:`, TrainingStalled's 600-second floor in all four places,
    TrainingHeldAfterExit's 600 seconds unheard, and the link's base keeping each alert's
    anchor. Alerts that fire at once still do."""
    [rules] = load_yaml(RULES)
    url = "https://wiki.example/ml-platform/burnrate-runbooks"
    chart = helm_template("--set", f"prometheusRule.interval=2s,prometheusRule.for=5s,"
                          f"prometheusRule.trainingStalledFloor=20,prometheusRule.trainingHeldAfterExit=30,"
                          f"prometheusRule.runbookURL={url}")
    spec = chart["PrometheusRule/burnrate/burnrate"]["spec"]
    assert [g["name"] for g in spec["groups"]] == [g["name"] for g in rules["groups"]]
    for group, shipped in zip(spec["groups"], rules["groups"]):
        # The roll-ups keep their minute: a window's sum of them is seconds only at that interval.
        assert group["interval"] == ("1m" if group["name"] == "burnrate-rollups" else "2s")
        assert len(group["rules"]) == len(shipped["rules"])
        for rule, before in zip(group["rules"], shipped["rules"]):
            if "record" in before:
                assert rule == before
                continue
            name = before["alert"]
            assert rule.get("for") == ("5s" if "for" in before else None), name
            anchor = before["annotations"]["runbook_url"].split("#")[1]
            assert anchor == name.lower()
            assert rule["annotations"]["runbook_url"] == f"{url}#{anchor}"
            if name == "TrainingStalled":
                assert before["expr"].count("600") == 4 and "600" not in rule["expr"]
                assert rule["expr"] == before["expr"].replace("600", "20")
            elif name == "TrainingHeldAfterExit":
                assert before["expr"].count("600") == 1 and "600" not in rule["expr"]
                assert rule["expr"] == before["expr"].replace("> 600", "> 30")
            else:
                assert rule["expr"] == before["expr"], name
            unchanged = ("for", "expr", "annotations")
            assert {k: v for k, v in rule.items() if k not in unchanged} == \
                   {k: v for k, v in before.items() if k not in unchanged}
            assert {k: v for k, v in rule["annotations"].items() if k != "runbook_url"} == \
                   {k: v for k, v in before["annotations"].items() if k != "runbook_url"}


# --- other values ----------------------------------------------------------------------------

def test_other_values_land_where_they_should_and_validate(tmp_path):
    default = helm_template(*AS_KUSTOMIZE)
    chart = helm_template("--values", values_file(tmp_path, OTHER_VALUES))
    for obj in chart.values():
        validate(obj)

    [config] = [k for k in chart if k.startswith("ConfigMap/burnrate/burnrate-config-")]
    [pricing] = [k for k in chart if k.startswith("ConfigMap/burnrate/burnrate-pricing-")]
    [default_config] = [k for k in default if k.startswith("ConfigMap/burnrate/burnrate-config-")]
    # A new URL is a new ConfigMap name, so the pods reading it roll.
    assert chart.keys() - default.keys() == {config, pricing}
    assert default.keys() - chart.keys() == {default_config}
    changed = {k for k in default.keys() & chart.keys() if default[k] != chart[k]}
    assert changed == {*WORKLOADS, *POLICIES, *OPERATOR, "PyTorchJob/burnrate-train/burnrate-reference",
                       "PersistentVolumeClaim/burnrate-train/burnrate-reference-checkpoints"}

    assert chart[config]["data"] == {"prometheus-url": OTHER_VALUES["prometheus"]["url"]}
    assert chart[pricing]["data"] == {"pricing.yaml": PRICING}
    (tmp_path / "pricing.yaml").write_text(chart[pricing]["data"]["pricing.yaml"])
    assert load_catalog(str(tmp_path / "pricing.yaml")).nodes["dgx-01"]

    agent = chart["DaemonSet/burnrate-node/burnrate-agent"]["spec"]["template"]
    default_args = container(default["DaemonSet/burnrate-node/burnrate-agent"]["spec"]["template"])["args"]
    args = container(agent)["args"]
    assert container(agent)["image"] == f"registry.example/burnrate-agent@{DIGEST}"
    assert args == default_args + ["--interval=5"]
    _, parser = _command_parser(args)
    assert parser.parse_args(args[1:]).interval == 5
    assert agent["spec"]["nodeSelector"] == {"gpu-pool": "h100"}
    assert agent["spec"]["tolerations"] == OTHER_VALUES["agent"]["tolerations"]

    for name in ("analyzer", "dashboard"):
        template = chart[f"Deployment/burnrate/burnrate-{name}"]["spec"]["template"]
        pod = template["spec"]
        assert pod["nodeSelector"] == OTHER_VALUES[name]["nodeSelector"]
        assert pod.get("tolerations") == OTHER_VALUES[name].get("tolerations")
        c = container(template)
        assert c["image"] == f"registry.example/burnrate@{DIGEST}"
        assert c["env"][0]["valueFrom"]["configMapKeyRef"]["name"] == chart[config]["metadata"]["name"]
        _, parser = _command_parser(c["args"])
        assert parser.parse_args(c["args"][1:]).pricing == "/etc/burnrate/pricing.yaml"
        [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/burnrate"]
        assert mount["readOnly"] is True
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["configMap"]["name"] == chart[pricing]["metadata"]["name"]

    job = chart["PyTorchJob/burnrate-train/burnrate-reference"]
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert container(replica["template"])["image"] == f"registry.example/burnrate-trainer@{DIGEST}"
    checkpoints = chart["PersistentVolumeClaim/burnrate-train/burnrate-reference-checkpoints"]
    assert checkpoints["spec"]["storageClassName"] == "efs"
    for key in OPERATOR:
        assert chart[key]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for key in POLICIES:
        [rule] = chart[key]["spec"]["ingress"]
        peers = OTHER_VALUES["dashboard" if "dashboard" in key else "prometheus"]["networkPolicyPeers"]
        assert rule["from"] == peers and rule["ports"] == default[key]["spec"]["ingress"][0]["ports"]


def test_the_optional_parts_turn_off():
    chart = helm_template("--set", "serviceMonitor.enabled=false,prometheusRule.enabled=false,trainer.enabled=false,"
                                   "grafanaDashboards.enabled=false")
    full = helm_template(*AS_KUSTOMIZE)
    assert chart == {k: v for k, v in full.items() if k not in OPERATOR | TRAINER | GRAFANA}


def test_the_grafana_dashboards_are_the_manifests_files_with_the_labels_asked_for(tmp_path):
    """Read through links, as the rules are; values add labels and annotations (the sidecar's
    folder annotation) to both ConfigMaps and never drop the label the sidecar selects by."""
    for name in DASHBOARDS:
        assert os.path.samefile(os.path.join(CHART, "files", "grafana", name), os.path.join(MANIFESTS, "grafana", name))
    chart = helm_template("--values", values_file(tmp_path, {"grafanaDashboards": {
        "labels": {"team": "ml-platform"}, "annotations": {"grafana_folder": "GPUs"}}}))
    default = helm_template()
    for name in DASHBOARDS:
        key = f"ConfigMap/burnrate/burnrate-grafana-{name.removeprefix('burnrate-').removesuffix('.json')}"
        meta = chart[key]["metadata"]
        assert meta["labels"]["grafana_dashboard"] == "1" and meta["labels"]["team"] == "ml-platform"
        assert meta["annotations"] == {"grafana_folder": "GPUs"}
        assert "annotations" not in default[key]["metadata"]
        with open(os.path.join(MANIFESTS, "grafana", name)) as fh:
            assert chart[key]["data"] == {name: fh.read()}
        validate(chart[key])


@pytest.mark.parametrize("setting,where", [
    ("scrapeProfile=bogus", "/scrapeProfile"),
    ("trainer.enabled=yes", "/trainer/enabled"),
    ("images.agent.digest=sha256:abc", "/images/agent/digest"),
    ("prometheus.url=prometheus:9090", "/prometheus/url"),
    ("serviceMonitor.enable=false", "'enable'"),
    ("grafanaDashboards.enabled=1", "/grafanaDashboards/enabled"),
    ("prometheusRule.for=30", "/prometheusRule/for"),
    ("prometheusRule.interval=fast", "/prometheusRule/interval"),
    ("prometheusRule.trainingStalledFloor=-1", "/prometheusRule/trainingStalledFloor"),
    ("prometheusRule.trainingHeldAfterExit=10m", "/prometheusRule/trainingHeldAfterExit"),
    ("prometheusRule.runbookURL=runbooks.md", "/prometheusRule/runbookURL"),
    ("prometheusRule.for=30s1m", "/prometheusRule/for"),
    ("prometheusRule.interval=1h1h", "/prometheusRule/interval"),
])
@pytest.mark.parametrize("helm", HELMS)
def test_bad_values_are_refused_with_a_message_naming_them(setting, where, helm):
    proc = run(kube_tools.tool(helm), "template", "burnrate", CHART, "--set", setting)
    assert proc.returncode != 0 and proc.stdout == ""
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("- ")]
    # Helm 4 names the value by JSON pointer (- at '/a/b': ..., additional properties 'x'),
    # Helm 3 by path (- a.b: ..., Additional property x is not allowed).
    if helm == "helm3":
        where = where[1:].replace("/", ".") + ":" if where.startswith("/") else f"property {where.strip(chr(39))} "
    assert where in error, proc.stderr
