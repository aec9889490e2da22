# ptl-resiliency developer entry points. `make demo` and `make test` work on a fresh machine:
# they create .venv (CPU torch by default) on first use.

PYTHON ?= python3
VENV ?= .venv
# Override to test another torch, e.g. make test TORCH_SPEC='torch==2.13.0+cpu --index-url ...'
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes for make test: most tests wait on launchers and subprocesses, so two share the
# 2 cores well (7 min instead of 9 on this machine kind). PYTEST_WORKERS=0 runs them in-process.
PYTEST_WORKERS ?= 2

.PHONY: venv test test-unit test-slurm demo bench bench-peer lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# Real-SLURM tests: start a private cluster on 127.0.0.1 (tests/slurm/cluster, installs Debian's
# slurm and munge if missing; needs root), run tests/slurm, and stop the cluster whatever happened.
SLURM_DIR ?= /tmp/ptlr-slurm
test-slurm: $(STAMP)
	@export PTLR_SLURM_DIR='$(SLURM_DIR)'; \
	trap 'bash tests/slurm/cluster/stop.sh' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	bash tests/slurm/cluster/start.sh || exit 1; \
	status=0; \
	SLURM_CONF='$(SLURM_DIR)/etc/slurm.conf' $(PY) -m pytest -q tests/slurm $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -ne 0 ]; then tail -n 40 '$(SLURM_DIR)'/log/*.log; fi; \
	exit $$status

# A 2-rank Lightning run on CPU under scripts/autoresume.sh and ft_launcher: a simulated hang is
# detected, the workers restart and resume from their checkpoint; ends with a summary.
demo: $(STAMP)
	$(PY) examples/demo/run_demo.py

# Benchmarks (bench/run_all.py): every scenario with repeated, paired runs; writes
# docs/benchmarks.md (raw results and logs in bench/results/, git-ignored). About 9 min on this
# 2-core machine kind. BENCH_ARGS='--quick' for a short functional run, '--only client hang' for some.
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

# The same, side by side with NVIDIA nvidia-resiliency-ext 0.4.1 (the peer; the last release with
# its Lightning callbacks), installed only into a separate venv: NVRx code never enters the repo.
# The peer venv gets the same torch and the same Lightning version as .venv. About 16 min
# (+1.5 min to make the venv the first time).
PEER_VENV ?= .venv-peer
PEER_PY := $(PEER_VENV)/bin/python
PEER_STAMP := $(PEER_VENV)/.installed
NVRX_SPEC ?= nvidia-resiliency-ext==0.4.1
PEER_DEPS ?= defusedxml nvidia-ml-py pynvml psutil packaging pyyaml

$(PEER_STAMP): $(STAMP)
	rm -rf $(PEER_VENV)
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_PY) -m pip install -q $(TORCH_SPEC)
	$(PEER_PY) -m pip install -q --no-deps $(NVRX_SPEC)
	$(PEER_PY) -m pip install -q $(PEER_DEPS) \
	    "lightning==$$($(PY) -c 'import importlib.metadata as m; print(m.version("lightning"))')"
	touch $(PEER_STAMP)

bench-peer: $(STAMP) $(PEER_STAMP)
	$(PY) bench/run_all.py --peer-python $(PEER_PY) $(BENCH_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check ft_core launcher ptl_resiliency tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
