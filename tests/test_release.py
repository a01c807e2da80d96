"""release/publish: the images built from docker-bake.json are the ones the manifests deploy,
and the kustomization it writes names each by the digest it was pushed as.

No registry runs here and docker is not installed, so the bake's metadata file is written
by the test in the format `docker buildx bake --metadata-file` documents (one object per
target: containerimage.digest, image.name with every pushed tag); everything after it
(pinning, and rendering the result with kubectl's own kustomize) is the real thing."""
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests import kube_tools
from tests.conftest import ROOT

PUBLISH = os.path.join(ROOT, "release", "publish")
MANIFESTS = os.path.join(ROOT, "manifests")
REGISTRY = "registry.example.com:5000/ml"


def read_json(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


BAKE = read_json(os.path.join(ROOT, "docker-bake.json"))


def render(directory: str) -> list[dict]:
    proc = subprocess.run([kube_tools.tool("kubectl"), "kustomize", directory],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def images(objects: list[dict]) -> set[str]:
    """Every container image of every pod template (Deployments, DaemonSets, PyTorchJobs)."""
    found = set()

    def walk(node):
        if isinstance(node, dict):
            for key in ("containers", "initContainers"):
                found.update(c["image"] for c in node.get(key, []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for obj in objects:
        walk(obj.get("spec", {}))
    return found


def metadata(targets=None, **override) -> dict:
    """What a pushed bake of these targets writes (docker's documented format)."""
    out = {}
    for target in targets or BAKE["group"]["default"]["targets"]:
        digest = "sha256:" + hashlib.sha256(target.encode()).hexdigest()
        out[target] = {
            "buildx.build.provenance": {},
            "buildx.build.ref": f"builder/builder0/{target}",
            "containerimage.config.digest": "sha256:" + hashlib.sha256(b"config" + target.encode()).hexdigest(),
            "containerimage.descriptor": {"digest": digest, "mediaType": "application/vnd.oci.image.index.v1+json",
                                          "size": 856},
            "containerimage.digest": digest,
            "image.name": f"{REGISTRY}/{target}:0.1.0,{REGISTRY}/{target}:latest",
            **override,
        }
    return out


def publish(tmp_path, *args, env=None):
    return subprocess.run([sys.executable, PUBLISH, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, cwd=tmp_path)


def pin(tmp_path, built: dict):
    path = tmp_path / "images.json"
    path.write_text(json.dumps(built))
    return publish(tmp_path, "--metadata", str(path), "--out", str(tmp_path / "out"))


def test_bake_builds_every_image_the_manifests_deploy_from_a_stage_of_the_dockerfile():
    with open(os.path.join(ROOT, "Dockerfile")) as fh:
        stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", fh.read(), re.M | re.I))
    targets = BAKE["target"]
    assert set(BAKE["group"]["default"]["targets"]) == set(targets)
    assert {t["target"] for t in targets.values()} <= stages
    deployed = {image.split(":")[0] for image in images(render(MANIFESTS))}
    assert deployed == set(targets)
    kustomized = yaml.safe_load(open(os.path.join(MANIFESTS, "kustomization.yaml")))["images"]
    assert {i["name"] for i in kustomized} == set(targets)
    assert all(t["tags"] == [f"${{REGISTRY}}/{name}:${{VERSION}}"] for name, t in targets.items())


def test_the_published_kustomization_deploys_every_image_by_its_digest(tmp_path):
    built = metadata()
    proc = pin(tmp_path, built)
    assert proc.returncode == 0, proc.stderr
    pinned = render(str(tmp_path / "out"))
    expected = {f"{REGISTRY}/{t}@{r['containerimage.digest']}" for t, r in built.items()}
    assert images(pinned) == expected
    # The overlay changes images only: the same objects as manifests/ itself.
    assert sorted((o["kind"], o["metadata"]["name"]) for o in pinned) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in render(MANIFESTS))


@pytest.mark.parametrize("built,says", [
    (metadata(targets=["burnrate-agent", "burnrate"]), "no result for image burnrate-trainer"),
    (metadata(**{"containerimage.digest": None}), "image burnrate-agent has no sha256 digest"),
    (metadata(**{"containerimage.digest": "sha256:abc"}), "image burnrate-agent has no sha256 digest"),
    (metadata(**{"image.name": ""}), "image burnrate-agent has no pushed name"),
    ([], "no result for image burnrate-agent"),
], ids=["target missing", "no digest", "short digest", "not pushed", "not an object"])
def test_a_bake_result_that_cannot_be_pinned_is_one_line_and_writes_nothing(tmp_path, built, says):
    proc = pin(tmp_path, built)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_unreadable_metadata_is_one_line(tmp_path):
    (tmp_path / "images.json").write_text("{not json")
    proc = publish(tmp_path, "--metadata", "images.json", "--out", "out")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("release/publish: images.json: not a bake metadata file"), proc.stderr


def test_building_without_a_registry_or_without_docker_is_one_line(tmp_path):
    proc = publish(tmp_path, "--out", "out", env={"REGISTRY": ""})
    assert proc.returncode == 2 and "set REGISTRY to where your nodes pull images from" in proc.stderr
    proc = publish(tmp_path, "--out", "out", env={"REGISTRY": REGISTRY, "PATH": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "docker is not installed" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_failed_bake_pins_nothing(tmp_path):
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\necho 'ERROR: failed to push' >&2\nexit 1\n")
    docker.chmod(0o755)
    proc = publish(tmp_path, "--out", "out",
                   env={"REGISTRY": REGISTRY, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 2 and "docker buildx bake failed (exit 1); nothing was pinned" in proc.stderr
    assert not (tmp_path / "out" / "kustomization.yaml").exists()
