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
# 2 cores well. PYTEST_WORKERS=0 runs them in-process.
PYTEST_WORKERS ?= 2
# --durations=30 in make test: every log (CI's too) lists the slowest tests; .ci/run must stay
# under 30 minutes on 2 cores.

.PHONY: venv test test-unit test-slurm test-cluster test-cluster-locked demo bench bench-peer lint clean check-torch-versions check-lightning-versions test-torch-oldest gpu-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev,lightning,plot,stacks]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=30 $(PYTEST_ARGS)

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

# Multi-node tests on a real 3-node SLURM cluster, one network namespace per node (docs/multinode.md):
# the cluster scripts of this machine kind (SLURM_CLUSTER_TOOLS; not vendored: they need root and
# ip netns and are maintained with the machine image), started, tests/cluster run, stopped
# whatever happened. Only one such cluster can run per machine: CLUSTER_LOCK serialises them.
SLURM_CLUSTER_TOOLS ?= $(abspath $(CURDIR)/../shared/tools/slurm-cluster)
SLURM_CLUSTER_DIR ?= /tmp/slurm-cluster
# 4 nodes: 3-node jobs plus one spare, so that a job requeued without a failed node still fits.
SLURM_CLUSTER_NODES ?= 4
CLUSTER_LOCK ?= /tmp/ptlr-slurm-cluster.lock
test-cluster: $(STAMP)
	@if [ ! -f '$(SLURM_CLUSTER_TOOLS)/start.sh' ]; then \
	  echo "make test-cluster: no cluster scripts in SLURM_CLUSTER_TOOLS=$(SLURM_CLUSTER_TOOLS)" \
	       "(the multi-node slurm-cluster tools of this machine kind; set SLURM_CLUSTER_TOOLS)" >&2; exit 2; fi
	@flock '$(CLUSTER_LOCK)' $(MAKE) --no-print-directory test-cluster-locked

# test-cluster's body, run under the lock.
test-cluster-locked:
	@export SLURM_CLUSTER_DIR='$(SLURM_CLUSTER_DIR)' SLURM_CLUSTER_TOOLS='$(SLURM_CLUSTER_TOOLS)' \
	  SLURM_CLUSTER_NODES='$(SLURM_CLUSTER_NODES)'; \
	trap 'bash "$$SLURM_CLUSTER_TOOLS/stop.sh"' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	bash "$$SLURM_CLUSTER_TOOLS/start.sh" || exit 1; \
	status=0; \
	PTLR_CLUSTER_TESTS=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/cluster $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -ne 0 ]; then tail -n 30 "$$SLURM_CLUSTER_DIR/log/slurmctld.log"; fi; \
	exit $$status

# A 2-rank Lightning run on CPU under scripts/autoresume.sh and ft_launcher: a simulated hang is
# detected, the workers restart and resume from their checkpoint; ends with a summary.
demo: $(STAMP)
	$(PY) examples/demo/run_demo.py

# Benchmarks (bench/run_all.py): every scenario with repeated, paired runs; writes
# docs/benchmarks.md (raw results and logs in bench/results/, git-ignored). About 9 min on this
# 2-core machine kind, plus 16 min for the soak (>= 10 min under calculated timeouts).
# BENCH_ARGS='--quick' for a short functional run, '--only client hang' for some.
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

# The GPU path (NCCL, CUDA contexts, CUDA events) in one command (bench/gpu_check.py, issue 34): the six
# scenarios of docs/benchmarks.md "GPU check" on whatever GPUs this machine has, within 8 min on one; a
# table, and JSON in bench/results/gpu-check.json. Without CUDA: one line, exit 0, every scenario skipped.
# Needs no venv: it finds a Python whose torch has CUDA (GPU_CHECK_PYTHON=... to choose one).
# GPU_CHECK_ARGS='--record' also writes the table into docs/benchmarks.md.
GPU_CHECK_ARGS ?=
gpu-check:
	$(PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS)

# The static checks of tests/unit/test_torch_hooks.py (tests/torch_source_checks.py) on the
# sources of every supported torch minor, 2.8 to 2.15 (tests/torch_versions.py): each wheel is
# downloaded once (0.2-0.9 GB, 4-40 s each here), only torch/distributed/*.py is kept in the cache.
TORCH_VERSIONS ?=
TORCH_SRC_CACHE ?= $(HOME)/.cache/ptl-resiliency/torch-src
check-torch-versions: $(STAMP)
	$(PY) -m tests.torch_versions --cache '$(TORCH_SRC_CACHE)' $(TORCH_VERSIONS)

# The Lightning behaviour the callbacks' skipped hooks rely on (tests/unit/test_lightning_hook_skipping.py)
# and the private Lightning names just-in-time state uses (tests/unit/test_lightning_private_names.py)
# on every supported Lightning minor (pyproject: lightning>=2.1): one throwaway venv each under
# LIGHTNING_VENVS, with TORCH_SPEC (a local wheel here) and the newest patch of that minor (downloaded:
# ~1 min per minor here, see docs/development.md). setuptools<81: Lightning 2.1 imports pkg_resources.
# Not in CI. LIGHTNING_VERSIONS='2.1' for one.
LIGHTNING_VERSIONS ?= 2.1 2.2 2.3 2.4 2.5 2.6
LIGHTNING_VENVS ?= /tmp/ptlr-lightning-venvs
check-lightning-versions:
	@set -e; for minor in $(LIGHTNING_VERSIONS); do \
	    venv='$(LIGHTNING_VENVS)'/lightning-$$minor; rm -rf "$$venv"; \
	    echo "== lightning $$minor.* in $$venv"; \
	    $(PYTHON) -m venv "$$venv"; \
	    "$$venv"/bin/pip install -q '$(TORCH_SPEC)' "lightning==$$minor.*" \
	        'setuptools<81' pytest pytest-timeout pyyaml filelock psutil; \
	    "$$venv"/bin/python -c 'import lightning; print("lightning", lightning.__version__)'; \
	    "$$venv"/bin/python -m pytest -q -p no:cacheprovider tests/unit/test_lightning_hook_skipping.py \
	        tests/unit/test_lightning_private_names.py; \
	    rm -rf "$$venv"; \
	done

# The launcher's tests against the oldest supported torch (2.8: no shutdown timeout in its agent,
# launcher/torch_compat.py), in .venv-torch-oldest. Not in CI: PyPI's Linux torch wheels need
# the CUDA libraries even on CPU, about 3 GB of downloads (measured: see docs/development.md).
TORCH_OLDEST ?= torch==2.8.0
OLDEST_VENV ?= .venv-torch-oldest
OLDEST_TESTS ?= tests/unit/test_torch_hooks.py tests/unit/test_launcher_cli.py tests/integration/test_launcher.py \
	tests/integration/test_torch_range.py
test-torch-oldest:
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q '$(TORCH_OLDEST)'
	$(OLDEST_VENV)/bin/python -m pip install -q -e '.[dev,lightning]'
	$(OLDEST_VENV)/bin/python -c 'import torch; print("torch", torch.__version__)'
	$(OLDEST_VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) $(OLDEST_TESTS) $(PYTEST_ARGS)

# ruff over every Python tree (pyproject.toml: one line length, 120), and the shell scripts parse.
lint: $(STAMP)
	$(PY) -m ruff check ft_core launcher ptl_resiliency tests bench examples
	bash -n scripts/autoresume.sh

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
