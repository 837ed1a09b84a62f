# Quickstart: `make demo` (install, build the demo dataset, dry-run, merge, verify) and `make test` (the fast
# tier, ~3 minutes: no Ray, no servers of its own, no PostgreSQL, no browser); `make test-all` is everything (CI).
# The venv gets the test and benchmark extras (pytest, moto, hypothesis; duckdb and pandas as benchmark peers),
# at the versions of constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-all mutants install bench clean

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
	$(BIN)/pytest -q

# Every guarantee's mutant against its killing tests, in a temporary copy (docs/guarantees.md, Mutation table).
mutants: install
	$(BIN)/python tests/mutants.py --write-doc

bench: install
	$(BIN)/python bench/run.py --size full

clean:
	rm -rf $(VENV) demo-data bench/data bench/out
