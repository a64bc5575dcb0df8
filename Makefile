# The README's two set-up commands: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: run test lint venv venv-test sysdeps bench clean clean-cache

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# pip byte-compiles a wheel's modules at install; an editable install leaves that to the first import, which
# (and every import after it where PYTHONDONTWRITEBYTECODE is set) then compiles opsnn's ~200 modules again
PYC := $(BIN)/python -m compileall -q -j0 src/opsnn

venv: $(BIN)/python
	$(PIP) install -q -e .
	$(PYC)

# the distributed extra too: tests/test_distributed.py runs ranks with the venv's mpirun
venv-test: $(BIN)/python
	$(PIP) install -q -e ".[test,distributed]"
	$(PYC)

run: venv
	$(BIN)/opsnn run

# Debian packages the tests need: chromium (timeline page in a real browser), graphviz (plots).
SYSDEPS := chromium graphviz
sysdeps:
	@if ! command -v chromium >/dev/null || ! command -v dot >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages: $(SYSDEPS)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSDEPS) >/dev/null; \
	  else \
	    echo "warning: install the Debian packages '$(SYSDEPS)' for the browser and plot tests"; \
	  fi; \
	fi

# the suite in two worker processes, a test file per worker at a time: a cold kernel cache compiles
# on both cores (numba's compiler lock serializes one process); TEST_WORKERS=0 runs it in this process.
# A worker that dies (a crash, or a test past pyproject's timeout) ends the run naming its test: xdist's
# loadfile scheduling can wait forever on a replaced worker
TEST_WORKERS ?= 2
test: venv-test sysdeps
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --max-worker-restart 0)

# house style: ruff's rules as configured in pyproject.toml (each ignore there says why) and its formatter
lint: venv-test
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

bench: venv-test
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python bench/dispatch.py

clean: clean-cache
	rm -rf $(VENV) build src/*.egg-info

# the compiled-kernel cache (runtime/kernel_cache.py: keyed by content, so this only frees space)
# and the numba files older versions left beside the modules
clean-cache:
	find src -name '*.nbi' -delete -o -name '*.nbc' -delete
	rm -rf "$${OPSNN_KERNEL_CACHE_DIR:-$${OPSNN_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/opsnn}/kernels}"
