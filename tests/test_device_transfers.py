"""Device readiness of the search on torch logits: at most one small device-to-host transfer per step.

On a CPU the engine reads float32 / float64 logits through a zero-copy numpy view (``beamkit.ops.cpu_view``):
nothing moves. Tensors it cannot view (on an accelerator, or half precision) stay with torch and only small
tables come back. These tests take the accelerator path on any machine: on ``cpu`` the view is switched off
(every tensor is then treated as a device tensor would be), on ``cuda`` (where present) the tensors are on the
GPU. A torch function mode counts every call that brings tensor data to the host (``.cpu()``, ``.numpy()``,
``.item()``, ``.tolist()``, ``int()`` / ``float()`` / ``bool()``, ``np.asarray``) or that must read data to
know a result's shape (``nonzero``, ``masked_select``, ``unique``, boolean indexing), outside the model's
step function.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.overrides import TorchFunctionMode  # noqa: E402

import beamkit.ops as ops  # noqa: E402
import beamkit.ops.backend  # noqa: E402, F401
import beamkit.ops.gather  # noqa: E402, F401
import beamkit.ops.normalize  # noqa: E402, F401
import beamkit.ops.top  # noqa: E402, F401
import beamkit.search.select as select  # noqa: E402
from beamkit import search_batch  # noqa: E402

TO_HOST = {"cpu", "numpy", "item", "tolist", "__int__", "__float__", "__bool__", "__index__", "__array__"}
DATA_SHAPED = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"}
V = 2000


class Transfers(TorchFunctionMode):
    """Counts host transfers and data-dependent shapes while ``on``; records each transfer's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.on = True
        self.shapes: list[tuple[int, ...]] = []
        self.other: collections.Counter[str] = collections.Counter()
        self.hosted: list[torch.Tensor] = []  # the last tensor brought to the host

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        out = func(*args, **(kwargs or {}))
        if self.on:
            if name == "numpy" and any(args[0] is t for t in self.hosted):
                pass  # the numpy view of a tensor just brought to the host: the same transfer
            elif name in TO_HOST or (name == "to" and _to_host(args, kwargs)):
                self.shapes.append(tuple(args[0].shape))
                self.hosted = [out] if isinstance(out, torch.Tensor) else []
            elif name in DATA_SHAPED:
                self.other[name] += 1
            elif name in ("__getitem__", "__setitem__") and _bool_index(args[1]):
                self.other["boolean index"] += 1
        return out


def _to_host(args, kwargs) -> bool:
    target = [a for a in args[1:] if isinstance(a, (str, torch.device))] + [(kwargs or {}).get("device")]
    return any(t is not None and torch.device(t).type == "cpu" for t in target)


def _bool_index(idx) -> bool:
    parts = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


@pytest.fixture
def device_path(device, monkeypatch):
    """``device``, with the CPU's zero-copy view switched off on ``cpu`` (the accelerator path on any machine)."""
    if device.type == "cpu":
        for module in (ops, ops.backend, ops.top, ops.normalize, ops.gather, select):
            monkeypatch.setattr(module, "cpu_view", lambda x: x, raising=False)
    return device


def toy(device, seed: int = 0):
    """A step function over torch logits on ``device``: a bigram table plus a per-row drift; and its state."""
    g = torch.Generator().manual_seed(seed)
    table = (torch.randn(V, V, generator=g) * 3).to(device)

    def step(state, y):
        y = torch.as_tensor(y, device=device)
        return torch.log_softmax(table[y] + state[:, None], dim=-1), state + 0.25  # shape: (rows, V)

    return step, torch.zeros(3, device=device)


@pytest.mark.parametrize("beam", [1, 4])
def test_one_small_transfer_per_step(device_path, beam):
    step, state = toy(device_path)
    mode = Transfers()
    calls = [0]

    def counted(st, y):
        mode.on = False  # the model's own work is not the engine's
        try:
            calls[0] += 1
            return step(st, y)
        finally:
            mode.on = True

    with mode:
        search_batch(counted, state, 0, 1, beam, 10)
    assert calls[0] == 10
    assert len(mode.shapes) == calls[0], mode.shapes  # exactly one transfer per step
    for shape in mode.shapes:  # small: the candidates of each row, never a [rows, V] table
        assert len(shape) == 2 and shape[1] <= 2 * (2 * beam) + 3 < V, shape
    assert not mode.other, mode.other


def test_device_selection_equals_the_host_one_ties_included(device_path):
    # logits on a grid of 0.5: many equal values, so the tie rule (lowest column first) decides the candidates
    g = torch.Generator().manual_seed(3)
    host = (torch.randint(-8, 8, (6, 300), generator=g) / 2.0).float()
    host[2] = 0.5  # a whole row tied
    host[4, 7:9] = 200.0  # exp overflows float32: the row's log-sum-exp is redone with a shift
    for m in (1, 3, 8):
        lse_h, vals_h, cols_h = select.lse_and_top(host.numpy(), m)
        lse_d, vals_d, cols_d = select.lse_and_top(host.to(device_path), m)
        assert np.array_equal(cols_d, cols_h) and np.array_equal(vals_d, vals_h)
        # the two sums of 300 float32 exps may add in other orders: within 300 u of the sum, relative
        assert np.allclose(lse_d, lse_h, rtol=0, atol=300 * 2.0**-24)


@pytest.mark.parametrize("beam", [1, 4])
def test_device_search_equals_the_host_search(device, monkeypatch, beam):
    step, state = toy(device, seed=1)
    host_step, host_state = toy(torch.device("cpu"), seed=1)
    ours = search_batch(step, state, 0, 1, beam, 10, num_return=beam)
    theirs = search_batch(host_step, host_state, 0, 1, beam, 10, num_return=beam)
    for a, b in zip(ours, theirs, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        # per step the log-sum-exp of V float32 exps may differ by V u (other summation order), 10 steps
        assert np.allclose([h.score for h in a], [h.score for h in b], rtol=0, atol=10 * V * 2.0**-24)
