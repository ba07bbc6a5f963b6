# beamkit: `make demo` sets up and runs the main job; `make test` sets up and runs every check.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

PEER := .venv-peer
PEER_STAMP := $(PEER)/.installed

.PHONY: demo test lint typecheck pytest peer docs mutation bench clean

# The demo needs only the runtime extra of the shipped models (torch, safetensors, tqdm); the checks need all of dev.
DEMO_STAMP := $(VENV)/.installed-demo

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml $(VENV)/bin/python
	@echo "installing beamkit[dev] into $(VENV) (every tool the checks use)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml $(VENV)/bin/python
	@echo "installing beamkit[models] into $(VENV) (torch, safetensors, tqdm)"
	$(BIN)/pip install -q -e ".[models]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/beamkit translate --beam 5 "3rd of March 1999"

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest tests

# Peer libraries that cannot share the main environment (pyctcdecode pins numpy<2).
$(PEER_STAMP): pyproject.toml
	$(PY) -m venv $(PEER)
	$(PEER)/bin/pip install -q --upgrade pip
	$(PEER)/bin/pip install -q "numpy<2" pyctcdecode==0.5.0 kenlm==0.3.0 numba==0.68.1 wordsegment==1.3.1 flashlight-text==0.0.7 pytest
	$(PEER)/bin/pip install -q -e . --no-deps
	touch $(PEER_STAMP)

peer: $(PEER_STAMP)
	$(PEER)/bin/python -m pytest tests/peer

# The documentation site, built strictly: a broken link, a missing page or a bad reference fails it.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet --site-dir site

test: lint typecheck pytest peer docs

mutation: $(STAMP)
	$(BIN)/python bench/mutation.py

bench: $(STAMP) $(PEER_STAMP)
	$(BIN)/python bench/search_overhead.py
	$(BIN)/python bench/hf_vs_beamkit.py
	$(PEER)/bin/python bench/ctc_vs_pyctcdecode.py
	$(BIN)/python bench/paged_kv.py

clean:
	rm -rf $(VENV) $(PEER) site mutants .pytest_cache .mypy_cache .ruff_cache
