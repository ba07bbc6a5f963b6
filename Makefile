# beamkit: `make demo` sets up and runs the main job; `make test` sets up and runs every check.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest mutation bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/beamkit demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest tests

test: lint typecheck pytest

mutation: $(STAMP)
	$(BIN)/python bench/mutation.py

bench: $(STAMP)
	$(BIN)/python bench/search_overhead.py

clean:
	rm -rf $(VENV) mutants .pytest_cache .mypy_cache .ruff_cache
