# Two commands: `make run` (API + worker on the embedded default) and `make test` (whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Extra pip arguments for torch, e.g. PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"
PIP_TORCH_ARGS ?=

.PHONY: run test install check-python services clean

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "SpecDeck needs Python 3.11 or newer")'

$(BIN)/python: | check-python
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml requirements/local.txt requirements/speculators.txt
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(PIP_TORCH_ARGS) torch==2.13.0
	$(BIN)/pip install --quiet -c requirements/local.txt -r requirements/local.txt
	$(BIN)/pip install --quiet --no-deps -r requirements/speculators.txt
	$(BIN)/pip install --quiet -c requirements/local.txt -e '.[local,test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	SPECDECK_DEFAULT_RUNTIME=$${SPECDECK_DEFAULT_RUNTIME:-local} $(BIN)/specdeck run

services:
	@bash scripts/ensure-services.sh

test: install services
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var
