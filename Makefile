# The README's two set-up commands: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: run test venv venv-test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(BIN)/python
	$(PIP) install -q -e .

venv-test: $(BIN)/python
	$(PIP) install -q -e ".[test]"

run: venv
	$(BIN)/opsnn run

test: venv-test
	$(BIN)/python -m pytest

bench: venv-test
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python bench/dispatch.py

clean:
	rm -rf $(VENV) build src/*.egg-info
