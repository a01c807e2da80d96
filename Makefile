# `make demo` and `make test` work on a fresh machine: they build the virtualenv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= /tmp/burnrate-demo
DEMO_PORT ?= 9400

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing that depends on torch pulls the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all]'
	touch $(STAMP)

# The agent on simulated GPUs (NVML where a GPU answers), driven by a real 2-rank CPU
# training run with a straggler rank; the agent's view is printed at the end.
demo: $(STAMP)
	@rm -rf $(DEMO) && mkdir -p $(DEMO)
	@$(PY) -m burnrate agent --gpus 2 --listen 127.0.0.1:$(DEMO_PORT) --node demo-node \
	    --telemetry-socket $(DEMO)/telemetry.sock --record $(DEMO)/recording 2>$(DEMO)/agent.log & \
	  agent=$$!; trap "kill $$agent 2>/dev/null" EXIT INT TERM; sleep 2; \
	  kill -0 $$agent 2>/dev/null || { cat $(DEMO)/agent.log; exit 1; }; \
	  echo "agent: http://127.0.0.1:$(DEMO_PORT)/metrics  (log: $(DEMO)/agent.log)"; \
	  BURNRATE_TELEMETRY_SOCKET=$(DEMO)/telemetry.sock $(PY) -m burnrate train --nproc 2 --steps 300 \
	    --job-name demo --fault straggler:rank=1,factor=2 && \
	  echo && echo "What the agent saw (per rank):" && \
	  $(PY) -c "import urllib.request as u; t = u.urlopen('http://127.0.0.1:$(DEMO_PORT)/metrics').read().decode(); \
	    print('\n'.join(l for l in t.splitlines() if l.startswith(('burnrate_train_steps_total', \
	    'burnrate_train_compute_seconds_total', 'burnrate_train_data_wait_seconds_total', 'burnrate_gpu_allocated'))))" && \
	  echo && echo "Recording for the analyzer: $(DEMO)/recording"

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/agent.py

clean:
	rm -rf $(VENV) $(DEMO)
