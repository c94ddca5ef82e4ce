# Two commands on a fresh machine: `make run` (the whole pipeline) and `make test` (the test suite). `make help` lists
# every target.
PYTHON ?= python3
VENV ?= .venv
# CORES (default: every core) and SNAKEMAKE_ARGS reach amprepro.env.launch through the environment, never through a
# shell.
CORES ?=
SNAKEMAKE_ARGS ?=
export CORES SNAKEMAKE_ARGS
BIN := $(VENV)/bin
# Rules call `python`: it must be the venv's (with --use-conda, the env's own python comes first).
export PATH := $(abspath $(BIN)):$(PATH)
# Snakemake on every core and every GPU nvidia-smi lists; removes the lock of a killed run once it is dead. PYTHONPATH
# stays: a venv made elsewhere (tools/gpu/make_run.sh, from carried wheels) has no amprepro installed.
LAUNCH := PYTHONPATH=$(CURDIR)/workflow $(BIN)/python -m amprepro.env.launch

# The venv is finished only when its stamp holds the sha256 of the files it was installed from (VENV_INPUTS).
# The stamp is written last, after every install succeeded, so a venv whose install failed or was interrupted, one
# made by `python -m venv` alone, or one whose requirements changed is completed by the next make. pip keeps what
# already satisfies a pin: a torch 2.13.0 you installed first (CPU or CUDA 12.9 build) stays.
# `make run` needs the run's requirements only (requirements.txt, the Slurm plugin); `make test`, `lint` and `mutation`
# add the developer tools (requirements-dev.txt) under a second stamp, so a newcomer's first `make run` and a container
# image (container/Containerfile) install no test tools.
VENV_STAMP := $(VENV)/.amprepro-installed
VENV_INPUTS := requirements.txt profiles/slurm/requirements.txt pyproject.toml
VENV_HASH := $(firstword $(shell cat $(VENV_INPUTS) | sha256sum))
ifneq ($(shell cat $(VENV_STAMP) 2>/dev/null),$(VENV_HASH))
.PHONY: $(VENV_STAMP)
endif
DEV_STAMP := $(VENV)/.amprepro-dev-installed
DEV_HASH := $(firstword $(shell cat $(VENV_INPUTS) requirements-dev.txt | sha256sum))
ifneq ($(shell cat $(DEV_STAMP) 2>/dev/null),$(DEV_HASH))
.PHONY: $(DEV_STAMP)
endif

.PHONY: help run test lint verify venv clean-venv venv-hash container-test mutation

help:
	@echo "make run         create or complete .venv (pinned requirements), then run the whole pipeline:"
	@echo "                 results/report/report.html; job logs in results/logs/ (CORES=N, SNAKEMAKE_ARGS=...)"
	@echo "make verify      compare a finished run with the committed reference of the same GPU model"
	@echo "make test        the test suite (what CI runs: .ci/run)"
	@echo "make lint        snakemake --lint, snakefmt --check, ruff check, lint-imports (the package's layers)"
	@echo "make venv        create or complete .venv with the developer tools (make run installs only what runs)"
	@echo "make clean-venv  remove .venv (results/ stays)"
	@echo "make container-test  build the container image and run the smoke preset in it (minutes)"
	@echo "make mutation    mutation testing of the verdict's core (docs/mutation.md; over an hour)"
	@echo "make help        this list"

# What a failed or interrupted install says (the stamps are not written: the next make continues from what is there).
UNFINISHED = { echo "amprepro: the install into $(VENV) did not finish; run make again (it continues from what is there)" >&2; \
  exit 1; }

# The pinned requirements, then amprepro itself, editable (workflow/amprepro) and --no-deps (the pins stay the source
# of truth), so the venv's python imports it from any directory. --no-compile: Python compiles what it imports on
# first use instead of pip compiling every file of every package (torch alone: 2 min 15 s -> 1 min 42 s here).
# pip is upgraded first: it costs 5 s and saves more (the pinned install with Python 3.11.7's bundled pip 23.2.1: 88 s
# and 100 s; after the upgrade to 26.3: 55 s and 68 s; 2 cores at load 2-3, 2026-12-02).
$(VENV_STAMP):
	@echo "amprepro: installing the pinned requirements into $(VENV) (a torch there that matches the pin is kept)"
	@$(PYTHON) -m venv $(VENV) && \
	  $(BIN)/python -m pip install --quiet --upgrade pip && \
	  $(BIN)/python -m pip install --quiet --no-compile -r requirements.txt -r profiles/slurm/requirements.txt && \
	  $(BIN)/python -m pip install --quiet --no-deps -e . || \
	  $(UNFINISHED)
	@# The .pyc of what the jobs import, written once here: where PYTHONDONTWRITEBYTECODE is set (this project's
	@# machines, many container images) every job would otherwise compile torch's modules again (torch._dynamo too:
	@# every optimizer imports it). The cells read the digits without importing scikit-learn. Best effort: a package
	@# that cannot be imported is reported by the pipeline's own checks.
	@cd $(VENV) && { env -u PYTHONDONTWRITEBYTECODE bin/python -c 'import torch, torch._dynamo' & \
	  env -u PYTHONDONTWRITEBYTECODE bin/python -c 'import snakemake.cli, pandas, matplotlib.pyplot, papermill, nbconvert' & \
	  wait; } >/dev/null 2>&1 || true
	@printf '%s\n' '$(VENV_HASH)' > $(VENV_STAMP).tmp && mv $(VENV_STAMP).tmp $(VENV_STAMP)

$(DEV_STAMP): $(VENV_STAMP)
	@echo "amprepro: installing the developer tools into $(VENV) (requirements-dev.txt)"
	@$(BIN)/python -m pip install --quiet --no-compile -r requirements-dev.txt || \
	  $(UNFINISHED)
	@printf '%s\n' '$(DEV_HASH)' > $(DEV_STAMP).tmp && mv $(DEV_STAMP).tmp $(DEV_STAMP)

venv: $(DEV_STAMP)

run: $(VENV_STAMP)
	$(LAUNCH)
	@echo "Report: $(CURDIR)/results/report/report.html (job logs: results/logs/)"

# Compare this run with the committed reference results of the same GPU model (reference/<gpu-slug>/); exits non-zero
# when a cell is out of tolerance, naming the cells and by how much; exits 0 with a warning when there is no reference.
verify: $(VENV_STAMP)
	$(LAUNCH) verify

# TEST_WORKERS pytest-xdist processes (2: CI's cores); each test file is one work unit, the slowest first
# (tests/conftest.py). TEST_WORKERS=0 runs everything in this one process.
# The venv is installed --no-compile, so Python compiles each module on its first import and keeps the .pyc, unless
# PYTHONDONTWRITEBYTECODE is set (the shells on the CI machine set it): then each of the suite's hundreds of Python
# processes compiled torch, Snakemake and scikit-learn again (there, import torch and torch._dynamo took 13.6 s of CPU
# instead of 7.0, snakemake.cli 7.0 instead of 2.6, sklearn.datasets 10.3 instead of 2.9; issue 28). The tests run
# without it: the .pyc go to __pycache__ folders (.venv, workflow/, the tests' workflow copies), which git ignores.
TEST_WORKERS ?= 2
test: $(DEV_STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder tests

# Mutation testing of the verdict's core (docs/mutation.md; not part of make test: over an hour on 2 cores). mutmut copies
# the package into mutants/, mutates the modules [tool.mutmut] in pyproject.toml names, runs the tests that reach
# each mutant and records the counts per module in docs/mutation.md. MUTATION_CHILDREN: mutants tested at once. One
# OpenMP thread: a mutant's test is forked from a process that ran torch's CPU kernels, and would deadlock in its pool.
MUTATION_CHILDREN ?= 2
mutation: $(DEV_STAMP)
	rm -rf mutants
	start=$$(date +%s); \
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python tools/mutation/mutmut_workflow.py run --max-children $(MUTATION_CHILDREN) > mutants.log 2>&1; \
	status=$$?; tail -n 5 mutants.log; [ $$status = 0 ] || exit $$status; \
	$(BIN)/python tools/mutation/summary.py --doc docs/mutation.md --seconds $$(($$(date +%s) - start))

lint: $(DEV_STAMP)
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/ruff check workflow tools tests
	PYTHONPATH=workflow $(BIN)/lint-imports --no-cache

clean-venv:
	rm -rf $(VENV)

# The hash a finished venv's stamp holds; tools/gpu/venv.sh writes it into a venv it made from carried wheels.
venv-hash:
	@echo $(VENV_HASH)

# Build the image (container/Containerfile) with podman, no network, and run the smoke preset in it; minutes, so not
# part of `make test`. Its output goes to results-reference/container/ (docs/containers.md).
container-test:
	bash container/test.sh
