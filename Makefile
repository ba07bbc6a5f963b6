# beamkit: `make demo` sets up and runs the main job; `make test` sets up and runs every check.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

PEER := .venv-peer
PEER_STAMP := $(PEER)/.installed

.PHONY: demo test test-fast lint typecheck pytest peer peer-torchaudio hf-newest docs numerics wheel-check mutation bench gpu-check clean

# The demo needs beamkit alone (numpy: the shipped models run on it); the checks need all of dev.
DEMO_STAMP := $(VENV)/.installed-demo

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml $(VENV)/bin/python
	@echo "installing beamkit[dev] into $(VENV) (every tool the checks use)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml $(VENV)/bin/python
	@echo "installing beamkit into $(VENV) (numpy only)"
	$(BIN)/pip install -q -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/beamkit demo
	$(BIN)/beamkit translate --beam 5 "3rd of March 1999"

# The quick checks: the numpy core (search, engine, processors, variants, the numpy models) and the command line,
# under a minute, with beamkit, numpy, pytest and hypothesis alone (no torch, nothing else downloaded). Where .venv
# already holds the dev tools, the same tests run there.
FAST_STAMP := $(VENV)/.installed-fast
FAST_TESTS := tests/test_search.py tests/test_engine_rules.py tests/test_engine.py tests/test_contract.py \
	tests/test_batch.py tests/test_fusion.py tests/test_weights.py tests/test_processors.py tests/test_trace.py \
	tests/test_exact.py tests/test_constrained.py tests/test_diverse.py tests/test_keep_state.py \
	tests/test_lm_arpa.py tests/test_api_errors.py tests/test_dates.py tests/test_cli_usability.py \
	tests/test_cli_safety.py tests/test_cli_hostile.py

$(FAST_STAMP): pyproject.toml $(VENV)/bin/python
	@echo "installing beamkit, pytest and hypothesis into $(VENV) (numpy only, no torch)"
	$(BIN)/pip install -q -e . "pytest>=8" "hypothesis>=6.100"
	touch $(FAST_STAMP) $(DEMO_STAMP)

# pytest's options from pyproject (addopts "-q") are replaced, not added to: one -q keeps the "N passed" line
test-fast: $(FAST_STAMP)
	$(BIN)/python -m pytest -o addopts= -q -m "not slow" $(FAST_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench docs/_ext
	$(BIN)/ruff format --check src tests bench docs/_ext

typecheck: $(STAMP)
	$(BIN)/mypy

# OLMo's beam search module, the oracle of tests/test_compat_olmo.py: fetched once from the package index (one
# file of the ai2-olmo wheel, checked against its RECORD) into the gitignored bench/.cache.
OLMO_SOURCE := bench/.cache/ai2_olmo-0.6.0/olmo/beam_search.py

$(OLMO_SOURCE): | $(STAMP)
	$(BIN)/python bench/olmo_source.py

pytest: $(STAMP) $(OLMO_SOURCE)
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

# torchaudio's CTC decoder, the oracle of beamkit.ctc.compat.torchaudio: torchaudio's wheel without its dependencies
# (its compiled extension is not loaded, see tests/peer/torchaudio_oracle.py) next to torch and flashlight-text.
PEER_TA := .venv-ta
PEER_TA_STAMP := $(PEER_TA)/.installed

$(PEER_TA_STAMP): pyproject.toml
	$(PY) -m venv $(PEER_TA)
	$(PEER_TA)/bin/pip install -q --upgrade pip
	$(PEER_TA)/bin/pip install -q torch==2.13.0 numpy kenlm==0.3.0 numba==0.68.1 pytest
	$(PEER_TA)/bin/pip install -q --no-deps torchaudio==2.11.0 flashlight-text==0.0.7
	$(PEER_TA)/bin/pip install -q -e . --no-deps
	touch $(PEER_TA_STAMP)

peer-torchaudio: $(PEER_TA_STAMP)
	$(PEER_TA)/bin/python -m pytest tests/peer/test_ctc_torchaudio.py tests/peer/test_torchaudio_own_tests.py

# The Hugging Face tests (every tests/test_hf*.py) again on the newest transformers release beamkit supports
# (beamkit.hf.versions.TESTED_TRANSFORMERS); the dev extra pins the oldest. torch and the test tools only; the
# stamp names the release, so changing HF_NEWEST_TRANSFORMERS reinstalls.
HF_NEWEST := .venv-hf
HF_NEWEST_TRANSFORMERS := 5.24.0
HF_NEWEST_STAMP := $(HF_NEWEST)/.installed-$(HF_NEWEST_TRANSFORMERS)

$(HF_NEWEST_STAMP): pyproject.toml
	$(PY) -m venv $(HF_NEWEST)
	$(HF_NEWEST)/bin/pip install -q torch==2.13.0 transformers==$(HF_NEWEST_TRANSFORMERS) numpy safetensors==0.8.0 "pytest>=8" "hypothesis>=6.100"
	$(HF_NEWEST)/bin/pip install -q -e . --no-deps
	touch $(HF_NEWEST_STAMP)

hf-newest: $(HF_NEWEST_STAMP)
	$(HF_NEWEST)/bin/python -m pytest tests/test_hf*.py -q

# The documentation site, built strictly: a broken link, a missing page or a bad reference fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

test: lint typecheck pytest peer peer-torchaudio hf-newest docs

# The modules whose figures come from floating-point kernels, run again with the CPU's vector instructions
# switched off (torch, MKL, oneDNN, numpy) and other thread counts (torch and BLAS on one thread, the modules that
# pin torch to one thread on three): an assertion that holds only for one SIMD path, BLAS blocking or thread
# count fails here. .ci/run calls it after `make test`.
NUMERIC_TESTS := tests/test_kv_paged.py tests/test_engine_models.py tests/test_models.py tests/test_dates.py \
	tests/test_numpy_models.py tests/test_weights.py tests/test_batch.py tests/test_hf.py tests/test_hf_dropin.py \
	tests/test_hf_join.py tests/test_hf_sample.py tests/test_samplers.py tests/test_fusion.py tests/test_g2p.py \
	tests/test_serve_models.py
OTHER_CPU = BEAMKIT_TEST_TORCH_THREADS=3 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default \
	MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41 NPY_DISABLE_CPU_FEATURES="$(NPY_VECTOR)"
# numpy's vector paths above its baseline that this CPU has (numpy refuses to switch off the baseline)
NPY_VECTOR = $(shell $(BIN)/python -c "from numpy._core._multiarray_umath import __cpu_features__ as f, __cpu_dispatch__ as d; print(' '.join(k for k in d if f.get(k)))")
numerics: $(STAMP)
	$(OTHER_CPU) $(BIN)/python -m pytest $(NUMERIC_TESTS)

mutation: $(STAMP)
	$(BIN)/python bench/mutation.py

bench: $(STAMP) $(PEER_STAMP) $(PEER_TA_STAMP)
	$(BIN)/python bench/search_overhead.py
	$(BIN)/python bench/hf_vs_beamkit.py
	$(PEER)/bin/python bench/ctc_vs_pyctcdecode.py
	$(PEER_TA)/bin/python bench/ctc_vs_torchaudio.py
	$(BIN)/python bench/paged_kv.py
	$(BIN)/python bench/vs_olmo.py

# On a machine with a CUDA GPU: the cuda case of every test that takes a `device` (tests/conftest.py; `-k cuda`
# selects them by their ids, wherever they are: the engine and search on torch logits, beamkit's torch models, the
# Hugging Face bridge, the paged KV cache and attention, the processors, samplers and ops) and the compiled step
# against the eager one under inductor (CPU and GPU), then the side-by-side benchmark on the GPU. Under 8 minutes
# on one GPU; it stops at the first failing step.
gpu-check: $(STAMP)
	$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: torch sees no CUDA device')"
	BEAMKIT_TEST_INDUCTOR=1 $(BIN)/python -m pytest -q -k "cuda or inductor" tests
	$(BIN)/python bench/vs_ct2.py --device cuda --repeats 3 --int8 --compile

wheel-check:
	bash .ci/wheel-check

clean:
	rm -rf $(VENV) $(PEER) $(PEER_TA) $(HF_NEWEST) site mutants .pytest_cache .mypy_cache .ruff_cache
