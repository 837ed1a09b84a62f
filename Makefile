# Quickstart: `make demo` (install, build the demo dataset, dry-run, merge, verify) and `make test` (the fast
# tier, ~8 minutes on 2 cores: no Ray, no servers of its own, no PostgreSQL, no browser); `make test-all` is everything (CI),
# as two pytest processes side by side: the modules that start Ray, and the rest (tests/streams.py).
# The venv gets the test and benchmark extras (pytest, moto, hypothesis; duckdb and pandas as benchmark peers),
# at the versions of constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-all mutants mutate install bench clean

# Installed from constraints.txt: the one known set of versions CI tests (pyproject.toml holds the ranges).
$(BIN)/sidecar-ops: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,bench]'
	@touch $@

install: $(BIN)/sidecar-ops

demo: install
	$(BIN)/sidecar-ops demo

test: install
	$(BIN)/pytest -q -m fast

test-all: install
	BIN=$(BIN) tests/both_streams

# Every guarantee's mutant against its killing tests, in a temporary copy (docs/guarantees.md, Mutation table).
mutants: install
	$(BIN)/python tests/mutants.py --write-doc

# mutmut over the guarantee modules (pyproject.toml [tool.mutmut]), resumable; then the score per module against
# the triage files tests/mutation_survivors/<module>.txt, written into docs/guarantees.md. Hours on 2 cores: not in CI.
# MUTATE=<glob> limits the run (e.g. MUTATE='tasks.ops.alignment*'); MUTATE_JOBS sets mutmut's children.
MUTATE ?=
MUTATE_JOBS ?= 1
mutate: install
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,bench,mutate]'
	PYTHONPATH=tests $(BIN)/mutmut run --max-children $(MUTATE_JOBS) $(MUTATE) || true
	$(BIN)/python tests/mutation_score.py --write-doc

bench: install
	$(BIN)/python bench/run.py --size full

clean:
	rm -rf $(VENV) demo-data bench/data bench/out
