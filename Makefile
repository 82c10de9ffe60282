# Set-up and everyday commands. `make run` and `make test` do all the set-up on a fresh
# machine with Python 3.11+ and make: each creates .venv and installs what it needs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The suite runs on three worker processes, one test file each at a time (module fixtures,
# and the compilations they share, stay within one process), the heaviest files first
# (tests/conftest.py; xdist's own reorder, by number of tests, is off). Three on a 2-core
# machine: with two, the cores idled an eighth of the time (a worker waiting on a server
# or a command line it started); a third keeps them busy.
PYTEST_WORKERS ?= -n 3 --dist loadfile --no-loadscope-reorder
BENCH ?= env_throughput
DESCRIPTION ?= local run
TAG ?= dev
# Pin benchmarks to one core so our code and the reference share the same processor.
PIN := $(shell command -v taskset >/dev/null 2>&1 && echo "taskset -c 0")

.PHONY: install install-dev reference-env run test test-all lint format bench compare clean

# The environment's installer is uv (installed by pip into the environment): it installs
# the same packages as pip in a fraction of the time (a fresh environment with every
# extra: 8 s against 55 s from a warm cache). Where uv cannot be installed, or its
# install fails (uv reads no pip.conf: an index configured only for pip), pip does the
# install. Either way the versions are docker/constraints.txt's: the set the images
# install is the set the tests run with.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv || $(BIN)/python -m pip install --quiet --upgrade pip

PIN_VERSIONS := --quiet --constraint docker/constraints.txt
install_into_venv = $(if $(wildcard $(BIN)/uv),$(BIN)/uv pip install --python $(BIN)/python $(PIN_VERSIONS) $(1) || )$(BIN)/python -m pip install $(PIN_VERSIONS) $(1)

# Every extra (pyproject.toml): the main job tracks in MLflow, and the README's commands
# import plant logs and serve. `pip install -e .` alone is the core (train and evaluate
# from Python); see the README's installation section for the extras by use.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(call install_into_venv,-e ".[all]")
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(call install_into_venv,-e ".[dev]")
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

# The reference simulators of the fidelity tests, in an environment of their own (pc-gym
# pins other versions of torch than the benchmarks' d3rlpy): `make reference-env`, then
# the slow tests re-record the references live (tests/core/environments/references/), the
# NMPC oracle (do-mpc) gives the expert references, and env_throughput times pc-gym and
# NeoRL-2 (its Pipeline and DMSD; the package without its dependencies, which pin others).
REFERENCE_VENV := .venv-reference

$(REFERENCE_VENV)/.installed:
	$(PYTHON) -m venv $(REFERENCE_VENV)
	$(REFERENCE_VENV)/bin/python -m pip install --quiet "pcgym==0.1.8" "do-mpc==5.1.2"
	$(REFERENCE_VENV)/bin/python -m pip install --quiet --no-deps "neorl2==0.0.1"
	touch $@

reference-env: $(REFERENCE_VENV)/.installed

# d3rlpy 2.8 for the peer-parity benchmark (benchmarks/peer_parity.py runs it as a child
# process), in an environment of its own: d3rlpy pins gymnasium 1.0 and brings torch.
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu gets the CPU-only torch.
PEER_VENV := .venv-d3rlpy

$(PEER_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEER_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(PEER_VENV)/bin/python -m pip install --quiet "d3rlpy==2.8.*" -e .
	touch $@

.PHONY: peer-env
peer-env: $(PEER_VENV)/.installed

install-dev: $(VENV)/.installed-dev

# Python keeps the bytecode of what it imports (__pycache__, .pyc) for these commands even
# where the environment says not to (PYTHONDONTWRITEBYTECODE): each of the suite's Python
# processes (three workers, and every command line, server and reference run a test
# starts) would otherwise compile JAX's, MLflow's and our own sources afresh (collecting
# the suite: 17.0 -> 6.2 CPU s; `neorl-industrial --help`: 2.95 -> 1.31 s).
KEEP_BYTECODE := PYTHONDONTWRITEBYTECODE=

run: install
	$(KEEP_BYTECODE) $(BIN)/neorl-industrial run

test: install-dev
	$(KEEP_BYTECODE) $(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-all: install-dev
	$(KEEP_BYTECODE) $(BIN)/python -m pytest $(PYTEST_WORKERS) -m "" $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

format: install-dev
	$(BIN)/python -m ruff format .
	$(BIN)/python -m ruff check --fix .

bench: install-dev
	$(PIN) $(BIN)/python -m benchmarks.run $(BENCH) -d "$(DESCRIPTION)" -t "$(TAG)"

compare: install-dev
	$(BIN)/python -m benchmarks.compare

clean:
	rm -rf $(VENV) $(REFERENCE_VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
