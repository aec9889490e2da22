# ptl-resiliency developer entry points. `make demo` and `make test` work on a fresh machine:
# they create .venv (CPU torch by default) on first use.

PYTHON ?= python3
VENV ?= .venv
# Override to test another torch, e.g. make test TORCH_SPEC='torch==2.13.0+cpu --index-url ...'
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv test test-unit test-slurm demo bench bench-peer lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) examples/ft_core_demo.py

lint: $(STAMP)
	$(PY) -m ruff check ft_core launcher ptl_resiliency tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
