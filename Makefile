# Two commands on a fresh machine: `make run` (the whole pipeline) and `make test` (the test suite).
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

.PHONY: run test lint clean-venv verify mutation

# The pinned requirements, then amprepro itself, editable (workflow/amprepro) and --no-deps (the pins stay the source
# of truth), so the venv's python imports it from any directory.
$(BIN)/activate: requirements.txt requirements-dev.txt profiles/slurm/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(BIN)/activate

run: $(BIN)/activate
	$(LAUNCH)
	@echo "Report: $(CURDIR)/results/report/report.html"

# Compare this run with the committed reference results of the same GPU model (reference/<gpu-slug>/); exits non-zero
# when a cell is out of tolerance, naming the cells and by how much; exits 0 with a warning when there is no reference.
verify: $(BIN)/activate
	$(LAUNCH) verify

# TEST_WORKERS pytest-xdist processes (2: CI's cores); each test file is one work unit, the slowest first
# (tests/conftest.py). TEST_WORKERS=0 runs everything in this one process.
TEST_WORKERS ?= 2
test: $(BIN)/activate
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder tests

# Mutation testing of the verdict's core (docs/mutation.md; not part of make test: over an hour on 2 cores). mutmut copies
# the package into mutants/, mutates the modules [tool.mutmut] in pyproject.toml names, runs the tests that reach
# each mutant and records the counts per module in docs/mutation.md. MUTATION_CHILDREN: mutants tested at once.
MUTATION_CHILDREN ?= 2
mutation: $(BIN)/activate
	rm -rf mutants
	start=$$(date +%s); \
	$(BIN)/python tools/mutation/mutmut_workflow.py run --max-children $(MUTATION_CHILDREN) > mutants.log 2>&1; \
	status=$$?; tail -n 5 mutants.log; [ $$status = 0 ] || exit $$status; \
	$(BIN)/python tools/mutation/summary.py --doc docs/mutation.md --seconds $$(($$(date +%s) - start))

lint: $(BIN)/activate
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/ruff check workflow tools tests

clean-venv:
	rm -rf $(VENV)
