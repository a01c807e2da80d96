"""manifests/: its objects are what the chart renders now (release/render-manifests), every
object validates offline against the Kubernetes 1.30 schemas (custom resources against
tests/schemas/), the kustomization lists every file and the objects fit together, the agent and training pods are set up as the design needs, and each container's
arguments parse with the burnrate command it runs."""
import argparse
import copy
import importlib
import importlib.machinery
import importlib.util
import json
import os
import posixpath
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from burnrate.agent.cli import DEFAULT_KUBELET_SOCKET
from burnrate.agent.telemetry import TelemetryInbox
from burnrate.exporter.telemetry import DEFAULT_SOCKET_PATH as DEFAULT_SOCKET
from burnrate.cli import COMMANDS
from tests import kube_tools
from tests.conftest import ROOT, require

MANIFESTS = os.path.join(ROOT, "manifests")
RENDER = os.path.join(ROOT, "release", "render-manifests")
# The values the chart renders the kustomize base's objects with; not an object itself.
RENDER_VALUES = "values-kustomize.yaml"
SCHEMAS = os.path.join(ROOT, "tests", "schemas")
KUBERNETES_VERSION = "1.30.0"
# Pod Security level of each namespace: only the agent's is privileged.
NAMESPACES = {"burnrate-node": "privileged", "burnrate": "restricted", "burnrate-train": "privileged"}
# Prometheus' own files, not Kubernetes objects: they are for a Prometheus run without
# the operator, and checked by promtool (here and in test_alert_rules.py).
PROMETHEUS_FILES = {"alerts/burnrate-rules.yaml", "prometheus/scrape-configs.yaml"}
GRAFANA_FILES = {"grafana/burnrate-training-job.json", "grafana/burnrate-fleet-cost.json"}
CUSTOM_RESOURCES = {"ServiceMonitor": "servicemonitor.json", "PrometheusRule": "prometheusrule.json",
                    "PyTorchJob": "pytorchjob.json"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
WORKLOADS = {"DaemonSet", "Deployment"}


def load_yaml(path: str) -> list[dict]:
    with open(path) as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def kustomization() -> dict:
    return load_yaml(os.path.join(MANIFESTS, "kustomization.yaml"))[0]


def render() -> list[dict]:
    """What `kubectl apply -k manifests/` creates, without kustomize: the listed files (each
    object names its namespace), plus the generated ConfigMaps (under their base names)."""
    k = kustomization()
    assert "namespace" not in k, "one namespace for all would put the agent's privileges on every part"
    objects = []
    for resource in k["resources"]:
        objects.extend(load_yaml(os.path.join(MANIFESTS, resource)))
    for generator in k.get("configMapGenerator", []):
        data = dict(literal.split("=", 1) for literal in generator.get("literals", []))
        for path in generator.get("files", []):
            with open(os.path.join(MANIFESTS, path)) as fh:
                data[posixpath.basename(path)] = fh.read()
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": generator["name"], "namespace": generator["namespace"]}, "data": data})
    return objects


OBJECTS = render()


def ident(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']}/{meta.get('namespace', '-')}/{meta['name']}"


def find(kind: str, name: str | None = None) -> list[dict]:
    return [o for o in OBJECTS if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(kind: str, name: str, namespace: str | None = None) -> dict:
    found = [o for o in find(kind, name) if namespace is None or o["metadata"].get("namespace") == namespace]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_templates() -> list[tuple[str, dict]]:
    """(owner, pod template) of every workload and training replica."""
    out = [(ident(o), o["spec"]["template"]) for o in OBJECTS if o["kind"] in WORKLOADS]
    for job in find("PyTorchJob"):
        for replica, spec in job["spec"]["pytorchReplicaSpecs"].items():
            out.append((f"{ident(job)}/{replica}", spec["template"]))
    return out


def containers() -> list[tuple[str, dict, dict]]:
    return [(f"{owner}/{c['name']}", c, template)
            for owner, template in pod_templates() for c in template["spec"]["containers"]]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def env_of(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def option(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# --- the kustomization -----------------------------------------------------------------

def test_the_kustomization_lists_every_manifest_and_nothing_else():
    on_disk = set()
    for folder, _, files in os.walk(MANIFESTS):
        for name in files:
            on_disk.add(os.path.relpath(os.path.join(folder, name), MANIFESTS).replace(os.sep, "/"))
    listed = kustomization()["resources"]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    profiles = {f for f in on_disk if f.startswith("profiles/")}
    # The Grafana dashboards are the configMapGenerator's inputs, not resources.
    generated = {f for g in kustomization()["configMapGenerator"] for f in g.get("files", [])}
    assert generated == {f for f in on_disk if f.startswith("grafana/")} == GRAFANA_FILES
    assert set(listed) == on_disk - {"kustomization.yaml", RENDER_VALUES} - PROMETHEUS_FILES - profiles - generated
    assert PROMETHEUS_FILES <= on_disk
    assert profiles == {"profiles/exported-labels/kustomization.yaml"}


# --- rendered from the chart ------------------------------------------------------------------

def render_manifests(*args: str, manifests: str = MANIFESTS, helm: str = "helm") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, RENDER, "--manifests", manifests, *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HELM": kube_tools.tool(helm)})


def _script(path: str):
    """A script of release/ (no .py) as a module, to read its files as it does."""
    loader = importlib.machinery.SourceFileLoader(os.path.basename(path).replace("-", "_"), path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


RENDERER = _script(RENDER)


@pytest.mark.parametrize("helm", ["helm", "helm3"])
def test_every_object_file_is_what_the_chart_renders_now(helm):
    """One source: each file the kustomization lists is rendered from charts/burnrate, and
    rendering again, with Helm 4 or Helm 3, changes none of them."""
    assert set(RENDERER.on_disk(MANIFESTS)) == set(kustomization()["resources"])
    proc = render_manifests("--check", helm=helm)
    assert proc.returncode == 0, proc.stderr


def test_a_stale_file_is_named_and_rendering_again_restores_every_file(tmp_path):
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    daemonset = copy / "agent" / "daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("maxUnavailable: 10%", "maxUnavailable: 1"))
    (copy / "agent" / "service.yaml").unlink()
    (copy / "agent" / "podmonitor.yaml").write_text(f"{RENDERER.MARK}agent/podmonitor.yaml with {RENDER_VALUES}:\n")
    proc = render_manifests("--check", manifests=str(copy))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "manifests/agent/daemonset.yaml differs from what the chart renders: run `make manifests`",
        "manifests/agent/podmonitor.yaml is no longer rendered by the chart: run `make manifests`",
        "manifests/agent/service.yaml is missing: run `make manifests`"]
    assert RENDERER.on_disk(str(copy)) != RENDERER.on_disk(MANIFESTS)

    proc = render_manifests(manifests=str(copy))
    assert proc.returncode == 0, proc.stderr
    assert RENDERER.on_disk(str(copy)) == RENDERER.on_disk(MANIFESTS)
    assert render_manifests("--check", manifests=str(copy)).returncode == 0
    # What is written by hand stays as it was.
    with open(os.path.join(MANIFESTS, "kustomization.yaml")) as fh:
        assert (copy / "kustomization.yaml").read_text() == fh.read()


def test_rendering_without_helm_or_with_bad_values_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, RENDER, "--check"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HELM": str(tmp_path / "helm")})
    assert proc.returncode == 2 and proc.stderr == f"release/render-manifests: HELM={tmp_path / 'helm'} is not an executable\n"
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    (copy / RENDER_VALUES).write_text("kustomizeBase: true\ntrainer: {enabled: yes please}\n")
    proc = render_manifests(manifests=str(copy))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("release/render-manifests: helm template failed") and "/trainer/enabled" in proc.stderr
    with open(os.path.join(MANIFESTS, "agent", "daemonset.yaml")) as fh:
        assert (copy / "agent" / "daemonset.yaml").read_text() == fh.read()


def test_the_exported_labels_profile_changes_only_how_the_agent_is_scraped(tmp_path):
    """kubectl's kustomize with the component added as the profile's comment says: the
    agent's ServiceMonitor no longer honors its labels nor drops the target's, and nothing
    else changes."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(MANIFESTS, overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{base}/profiles/exported-labels]\n")
    kubectl = kube_tools.tool("kubectl")
    rendered = {}
    for name, path in (("base", MANIFESTS), ("profile", str(overlay))):
        proc = subprocess.run([kubectl, "kustomize", path],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        rendered[name] = {ident(o): o for o in yaml.safe_load_all(proc.stdout) if o}
    assert rendered["base"].keys() == rendered["profile"].keys()
    changed = [k for k in rendered["base"] if rendered["base"][k] != rendered["profile"][k]]
    assert changed == ["ServiceMonitor/burnrate-node/burnrate-agent"]
    (before,), (after,) = rendered["base"][changed[0]]["spec"]["endpoints"], rendered["profile"][changed[0]]["spec"]["endpoints"]
    assert before["honorLabels"] is True and after["honorLabels"] is False
    assert [r for r in after["relabelings"] if r.get("action") == "labeldrop"] == []
    assert after["relabelings"] == [r for r in before["relabelings"] if r.get("action") != "labeldrop"]
    schema = _schema("ServiceMonitor")
    jsonschema.Draft202012Validator(schema).validate(rendered["profile"][changed[0]])


def test_objects_render_together_with_unique_identities():
    idents = [ident(o) for o in OBJECTS]
    assert len(idents) == len(set(idents)), sorted(i for i in idents if idents.count(i) > 1)
    levels = {n["metadata"]["name"]: n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
              for n in find("Namespace")}
    assert levels == NAMESPACES
    for obj in OBJECTS:
        assert (obj["metadata"].get("namespace") is None) == (obj["kind"] in CLUSTER_SCOPED), ident(obj)
    privileged = {o["metadata"]["namespace"] for o in find("DaemonSet")}
    assert privileged == {"burnrate-node"}
    assert {o["metadata"]["namespace"] for o in find("Deployment")} == {"burnrate"}
    assert {o["metadata"]["namespace"] for o in find("PyTorchJob")} == {"burnrate-train"}


@pytest.mark.parametrize("owner,template", [(o, t) for o, t in pod_templates() if "Deployment/" in o],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_pods_in_the_restricted_namespace_meet_the_restricted_level(owner, template):
    """What Pod Security's restricted level checks, for the pods placed under it."""
    spec = template["spec"]
    assert not (spec.get("hostPID") or spec.get("hostNetwork") or spec.get("hostIPC")), owner
    assert all("hostPath" not in v for v in spec.get("volumes", [])), owner
    assert spec["securityContext"]["runAsNonRoot"] is True
    for container in spec["containers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"]["drop"] == ["ALL"]
        assert not ctx.get("privileged") and not any(p.get("hostPort") for p in container.get("ports", []))
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_kustomize_renders_the_same_objects():
    """kubectl's own kustomize: the same objects, each valid for 1.30."""
    proc = subprocess.run([kube_tools.tool("kubectl"), "kustomize", MANIFESTS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rendered = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    generated = {g["name"] for g in kustomization().get("configMapGenerator", [])}

    def base(obj: dict) -> str:
        name = obj["metadata"]["name"]
        if obj["kind"] == "ConfigMap" and name.rsplit("-", 1)[0] in generated:
            name = name.rsplit("-", 1)[0]
        return f"{obj['kind']}/{obj['metadata'].get('namespace', '-')}/{name}"

    assert sorted(base(o) for o in rendered) == sorted(ident(o) for o in OBJECTS)
    for obj in rendered:
        if obj["kind"] not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "burnrate", base(obj)


# --- schemas -----------------------------------------------------------------------------

@pytest.mark.parametrize("obj", [o for o in OBJECTS if o["kind"] not in CUSTOM_RESOURCES], ids=ident)
def test_objects_validate_against_kubernetes_1_30(obj):
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def _schema(kind: str) -> dict:
    with open(os.path.join(SCHEMAS, CUSTOM_RESOURCES[kind])) as fh:
        return json.load(fh)


@pytest.mark.parametrize("obj", [o for o in OBJECTS if o["kind"] in CUSTOM_RESOURCES], ids=ident)
def test_custom_resources_validate_against_their_crd_schemas(obj):
    schema = _schema(obj["kind"])
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(obj)
    if obj["kind"] == "PyTorchJob":
        for spec in obj["spec"]["pytorchReplicaSpecs"].values():
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                          "metadata": {"name": obj["metadata"]["name"]},
                                          "template": spec["template"]}, KUBERNETES_VERSION, strict=True)


def test_the_crd_schemas_reject_what_the_operators_would():
    """The vendored schemas are strict on the fields burnrate uses."""
    monitor = copy.deepcopy(one("ServiceMonitor", "burnrate-agent"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    rule = copy.deepcopy(find("PrometheusRule")[0])
    rule["spec"]["groups"][0]["rules"][0]["record"] = "both_alert_and_record"
    job = copy.deepcopy(find("PyTorchJob")[0])
    job["spec"]["pytorchReplicaSpecs"]["Launcher"] = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    typo = copy.deepcopy(find("PyTorchJob")[0])
    typo["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    for bad in (monitor, rule, job, typo):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(_schema(bad["kind"])).validate(bad)


# --- references between objects -------------------------------------------------------------

def test_services_select_pods_and_name_their_ports():
    for service in find("Service"):
        matched = [t for _, t in pod_templates() if selects({"matchLabels": service["spec"]["selector"]},
                                                            t["metadata"]["labels"])]
        assert len(matched) == 1, ident(service)
        ports = {p["name"] for c in matched[0]["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, (ident(service), port)


def test_service_monitors_select_services_by_port_name():
    for monitor in find("ServiceMonitor"):
        matched = [s for s in find("Service") if selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
        assert len(matched) == 1, ident(monitor)
        names = {p["name"] for p in matched[0]["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in names
            # Series carry their training pod's namespace/pod/container labels.
            assert endpoint["honorLabels"] is True


def test_the_agents_scrape_limits_sit_above_what_the_agent_can_expose():
    """A flood on the telemetry socket is bounded by the agent; past sampleLimit Prometheus
    drops the whole scrape, so the limit must be above the agent's own bound or one noisy
    pod would blind the node's GPU series."""
    import inspect

    from burnrate.agent.telemetry.schema import MAX_LABEL_CHARS
    from burnrate.exporter.catalog import CATALOG
    from burnrate.exporter.labels import RANK
    max_ranks = inspect.signature(TelemetryInbox).parameters["max_ranks"].default
    per_rank = sum(1 for spec in CATALOG if RANK in spec.labels)
    # Everything else: 64 devices (8 GPUs x 7 MIG instances, and more) at every device series.
    per_device = sum(1 for spec in CATALOG if RANK not in spec.labels)
    bound = max_ranks * per_rank + 64 * per_device
    spec = one("ServiceMonitor", "burnrate-agent")["spec"]
    assert bound <= spec["sampleLimit"] <= 2 * bound
    assert spec["labelLimit"] >= max(len(s.labels) for s in CATALOG) + 4  # + the target's own labels
    assert spec["labelValueLengthLimit"] >= MAX_LABEL_CHARS


def test_network_policies_open_only_the_served_port_to_one_peer():
    for policy in find("NetworkPolicy"):
        matched = [t for _, t in pod_templates() if selects(policy["spec"]["podSelector"], t["metadata"]["labels"])]
        assert len(matched) == 1, ident(policy)
        ports = {p["containerPort"] for c in matched[0]["spec"]["containers"] for p in c.get("ports", [])}
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        [rule] = policy["spec"]["ingress"]
        assert {p["port"] for p in rule["ports"]} == ports
        [peer] = rule["from"]
        assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"]


def test_references_resolve():
    for owner, container, template in containers():
        spec = template["spec"]
        namespace = owner.split("/")[1]
        if "serviceAccountName" in spec:
            one("ServiceAccount", spec["serviceAccountName"], namespace)
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                assert ref["key"] in one("ConfigMap", ref["name"], namespace)["data"], owner
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                one("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"], namespace)
        mounts = {m["name"] for m in container.get("volumeMounts", [])}
        assert mounts <= {v["name"] for v in spec.get("volumes", [])}, owner
        ports = {p["name"] for p in container.get("ports", [])}
        for probe in ("livenessProbe", "readinessProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["port"] in ports, (owner, probe)
    for binding in find("ClusterRoleBinding"):
        one("ClusterRole", binding["roleRef"]["name"])
        for subject in binding["subjects"]:
            one("ServiceAccount", subject["name"], subject["namespace"])


# --- how the pods are set up -------------------------------------------------------------------

@pytest.mark.parametrize("owner,container,template", containers(), ids=[o for o, _, _ in containers()])
def test_every_container_is_locked_down_and_sized(owner, container, template):
    pod = template["spec"].get("securityContext", {})
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert "add" not in ctx["capabilities"] and not ctx.get("privileged")
    assert (ctx.get("seccompProfile") or pod.get("seccompProfile")) == {"type": "RuntimeDefault"}
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]
    if not owner.startswith("DaemonSet/"):
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0


def test_the_cluster_role_only_reads_pods_and_nodes():
    [role] = find("ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]


def _volume(template: dict, container: dict, mount_path: str) -> dict:
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == mount_path]
    [volume] = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    return {**volume, "readOnly": mount.get("readOnly", False)}


def test_the_agent_daemonset():
    ds = one("DaemonSet", "burnrate-agent")
    template = ds["spec"]["template"]
    spec = template["spec"]
    [container] = spec["containers"]
    assert spec["priorityClassName"] == "system-node-critical"
    # Without the host's PID namespace the kernel names no telemetry sender (pid 0).
    assert spec["hostPID"] is True
    assert spec["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in terms[0]["matchExpressions"]
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # No GPU request: the agent watches every GPU without holding one.
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
    pod_resources = _volume(template, container, posixpath.dirname(DEFAULT_KUBELET_SOCKET))
    assert pod_resources["hostPath"]["path"] == posixpath.dirname(DEFAULT_KUBELET_SOCKET)
    assert pod_resources["readOnly"] is True
    telemetry = _volume(template, container, posixpath.dirname(DEFAULT_SOCKET))
    assert telemetry["hostPath"] == {"path": "/run/burnrate", "type": "DirectoryOrCreate"}
    assert telemetry["readOnly"] is False
    # The single-agent lock in a host directory of the agent's own: a pod that could open it could hold it.
    lock = _volume(template, container, posixpath.dirname(option(container["args"], "--telemetry-lock")))
    assert lock["hostPath"] == {"path": "/run/burnrate-agent", "type": "DirectoryOrCreate"}
    assert lock["readOnly"] is False


def test_the_training_job_reaches_the_agent_and_survives_eviction():
    ds = one("DaemonSet", "burnrate-agent")
    agent_socket_dir = _volume(ds["spec"]["template"], ds["spec"]["template"]["spec"]["containers"][0],
                               posixpath.dirname(DEFAULT_SOCKET))["hostPath"]["path"]
    [job] = find("PyTorchJob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    for replica in replicas.values():
        template = replica["template"]
        [container] = template["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert container["command"] == ["python", "-m", "burnrate.trainer"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
        env = env_of(container)
        socket = env["BURNRATE_TELEMETRY_SOCKET"]["value"]
        telemetry = _volume(template, container, posixpath.dirname(socket))
        assert telemetry["hostPath"]["path"] == agent_socket_dir
        assert "/run/burnrate-agent" not in [v.get("hostPath", {}).get("path") for v in template["spec"]["volumes"]]
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        args = container["args"]
        assert "--resume-or-start" in args     # the first start, and every restart after it
        checkpoints = _volume(template, container, option(args, "--checkpoint-dir"))
        assert "persistentVolumeClaim" in checkpoints and not checkpoints["readOnly"]
        # Room for a step and an emergency checkpoint after SIGTERM.
        assert template["spec"]["terminationGracePeriodSeconds"] >= 60
        assert {"key": "nvidia.com/gpu", "operator": "Exists"} in template["spec"]["tolerations"]


# --- container arguments against the commands they run -------------------------------------------

def _command_parser(args: list[str]) -> tuple[str, argparse.ArgumentParser]:
    command = args[0]
    if command not in COMMANDS:
        pytest.skip(f"`burnrate {command}` is not a registered command")
    parser = argparse.ArgumentParser(prog=f"burnrate {command}", exit_on_error=False)
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    return command, parser


def _expanded(args: list[str], container: dict) -> list[str]:
    """Arguments with $(VAR) replaced as the kubelet does, from literal or ConfigMap env."""
    values = {}
    for name, env in env_of(container).items():
        if "value" in env:
            values[name] = env["value"]
        elif "configMapKeyRef" in env.get("valueFrom", {}):
            ref = env["valueFrom"]["configMapKeyRef"]
            values[name] = one("ConfigMap", ref["name"])["data"][ref["key"]]
    out = []
    for arg in args:
        for name, value in values.items():
            arg = arg.replace(f"$({name})", value)
        out.append(arg)
    return out


BURNRATE_CONTAINERS = [(o, c) for o, c, _ in containers() if not c.get("command")]


@pytest.mark.parametrize("owner,container", BURNRATE_CONTAINERS, ids=[o for o, _ in BURNRATE_CONTAINERS])
def test_burnrate_arguments_parse_and_listen_on_the_container_port(owner, container):
    command, parser = _command_parser(_expanded(container["args"], container))
    args = parser.parse_args(_expanded(container["args"], container)[1:])
    [port] = [p["containerPort"] for p in container["ports"]]
    assert args.listen.rsplit(":", 1) == ["0.0.0.0", str(port)], owner
    if command in ("analyze", "dashboard"):
        assert args.prometheus.startswith("http"), owner


def test_trainer_arguments_parse():
    from burnrate.trainer import config

    for _, container, _ in containers():
        if container.get("command") == ["python", "-m", "burnrate.trainer"]:
            parser = argparse.ArgumentParser(prog="python -m burnrate.trainer", exit_on_error=False)
            config.add_arguments(parser)
            cfg = config.from_args(parser.parse_args(container["args"]))
            assert cfg.checkpoint.resume_or_start and cfg.checkpoint.checkpoint_dir


# --- Prometheus without the operator ---------------------------------------------------------------

def test_plain_prometheus_configuration_loads(tmp_path):
    """promtool checks the jobs and the rule file. Debian's promtool is built without
    Kubernetes service discovery, so it sees each job with a static target instead and
    the discovery section is checked here."""
    scrape = load_yaml(os.path.join(MANIFESTS, "prometheus", "scrape-configs.yaml"))[0]
    jobs = copy.deepcopy(scrape["scrape_configs"])
    service_namespace = {s["metadata"]["name"]: s["metadata"]["namespace"] for s in find("Service")}
    for job in jobs:
        namespace = service_namespace[job["relabel_configs"][0]["regex"].split(";")[0]]
        assert job.pop("kubernetes_sd_configs") == [{"role": "endpoints", "namespaces": {"names": [namespace]}}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
        # Series carry their training pod's namespace/pod/container labels.
        assert job["honor_labels"] is True
    config = {"global": {"evaluation_interval": "1m"},
              "rule_files": [os.path.join(MANIFESTS, "alerts", "burnrate-rules.yaml")],
              "scrape_configs": jobs}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([require("promtool"), "check", "config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The same jobs with or without the operator (the operator names a job after its Service).
    assert {job["job_name"] for job in jobs} == {m["metadata"]["name"] for m in find("ServiceMonitor")}
    services = {s["metadata"]["name"]: {p["name"] for p in s["spec"]["ports"]} for s in find("Service")}
    for job in jobs:
        service, port = job["relabel_configs"][0]["regex"].split(";")
        assert port in services[service]
