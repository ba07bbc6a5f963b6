"""Shared test fixtures."""

from __future__ import annotations

import os

import pytest

try:  # no property test may fail for being slow on a loaded or slower machine: timing is not a test oracle
    from hypothesis import HealthCheck, settings

    settings.register_profile("beamkit", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("beamkit")
except ImportError:  # pragma: no cover - hypothesis comes with the dev extra
    pass

# the CTC search's one-line note on a cold compiled cache would land in the stderr that tests read (a first run on a
# fresh checkout); tests/test_ctc_api.py checks the note with this unset
os.environ.setdefault("BEAMKIT_COMPILE_NOTE", "0")

# `make numerics` sets this to run the modules that pin torch to one thread on another thread count (so that
# no assertion leans on one way of splitting a reduction over threads).
THREADS_VAR = "BEAMKIT_TEST_TORCH_THREADS"


def pinned_threads() -> int:
    """The torch thread count of :func:`one_torch_thread`: 1, or the positive integer in BEAMKIT_TEST_TORCH_THREADS."""
    raw = os.environ.get(THREADS_VAR, "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{THREADS_VAR} must be a positive integer, got {raw!r}")
    return int(raw)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tiny models: faster, and immune to oversubscription on a shared CPU
    (``make numerics`` runs them again on another count, see :func:`pinned_threads`).

    The previous thread count is restored afterwards; without torch this does nothing.
    """
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(pinned_threads())
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    """A torch device to run a test on: ``cpu``, and ``cuda`` where a CUDA device is present (else skipped).
    ``make gpu-check`` runs the tests that use it on a GPU machine (it selects them by the ``cuda`` in their ids).

    On ``cuda``, TensorFloat-32 is switched off for matrix products and cuDNN (its 10-bit mantissa would loosen
    every float32 tolerance to about 1e-3) and restored afterwards: the tests' float32 tolerances hold on both.
    Without torch the ``cpu`` case is the string ``"cpu"`` (a numpy case parametrised beside torch ones still
    runs; the torch cases skip themselves) and ``cuda`` is skipped."""
    try:
        import torch
    except ImportError:
        if request.param != "cpu":
            pytest.skip("torch is not installed")
        yield "cpu"
        return
    if request.param == "cpu":
        yield torch.device("cpu")
        return
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield torch.device("cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture
def kinds(monkeypatch):
    """The cache kind (``"paged"`` / ``"dense"``) of each DecoderOnlyStep that ``beamkit.hf.generate`` makes,
    in order."""
    pytest.importorskip("transformers")
    from beamkit.hf.bridge import generation

    made = []
    real = generation.DecoderOnlyStep

    def recorded(*args, **kwargs):
        step = real(*args, **kwargs)
        made.append(step.kv)
        return step

    monkeypatch.setattr(generation, "DecoderOnlyStep", recorded)
    return made
