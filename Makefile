# `make demo` and `make test` work on a fresh machine: they build the virtualenv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= /tmp/burnrate-demo

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing that depends on torch pulls the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all]'
	touch $(STAMP)

demo: $(STAMP)
	DEMO=$(DEMO) PY=$(PY) sh scripts/demo.sh

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/agent.py

clean:
	rm -rf $(VENV) $(DEMO)
