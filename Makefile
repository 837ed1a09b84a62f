# Quickstart: `make demo` (install, build the demo dataset, dry-run, merge, verify) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install bench clean

$(BIN)/sidecar-ops: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

install: $(BIN)/sidecar-ops

demo: install
	$(BIN)/sidecar-ops demo

test: install
	$(BIN)/pytest -q

bench: install
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) demo-data bench/data bench/out
