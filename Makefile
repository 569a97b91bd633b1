# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all bench setup clean

$(STAMP): requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m inttrain.kernels.native
	touch $(STAMP)

setup: $(STAMP)

## Train the same small CNN on the built-in digits dataset in fp32 and int8 and compare them.
demo: $(STAMP)
	$(PY) -m inttrain demo

## The default test run (< 10 minutes on 2 cores); `make test-all` adds the slow tests.
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/speed.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
