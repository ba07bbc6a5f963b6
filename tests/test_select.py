"""The one-pass selection (beamkit.search.select.lse_and_top): each row's log-sum-exp and top m from one read.

Oracles are independent of the code under test: a full per-row sort (value descending, then column ascending)
for the candidates, and a float64 max-shifted log-sum-exp. Tables are drawn with many ties (small integers),
-inf entries and all -inf rows, for the compiled scan, its plain-Python source (the same function numba
compiles, run interpreted) and the numpy path.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beamkit import ops
from beamkit.search import select


def full_sort(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: every column sorted by value descending, then column ascending; the first m."""
    v = x.shape[1]
    idx = np.array([np.lexsort((np.arange(v), -row.astype(np.float64)))[:m] for row in x], dtype=np.int64)
    return np.take_along_axis(x, idx.reshape(x.shape[0], -1), axis=1).astype(np.float64), idx


def shifted_lse(x: np.ndarray) -> np.ndarray:
    """float64 log-sum-exp per row, the row maximum shifted out; an all -inf row gives -inf."""
    out = []
    for row in x.astype(np.float64):
        top = row.max()
        out.append(-np.inf if top == -np.inf else top + np.log(np.exp(row - top).sum()))
    return np.array(out)


# float32 terms: numpy's exp within 2.52 ulp (3e-7 relative) per term, and its pairwise sum of <= 512 positive
# terms at most 9 + 8 roundings on any path (17 * 2**-24 = 1e-6 relative): the log is off by about that much.
LSE_ATOL = {np.float32: 4e-6, np.float64: 1e-12}


@st.composite
def tables(draw):
    """A [rows, V] table with ties, -inf entries and sometimes an all -inf row, and an m (possibly > V)."""
    rows = draw(st.integers(1, 6))
    v = draw(st.integers(1, 300))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    spread = draw(st.sampled_from([2, 5, 1000]))  # 2: almost every value ties
    x = rng.integers(-spread, spread, size=(rows, v)).astype(dtype)
    x[rng.random((rows, v)) < draw(st.sampled_from([0.0, 0.3]))] = -np.inf
    if draw(st.booleans()):
        x[draw(st.integers(0, rows - 1))] = -np.inf
    return x, draw(st.integers(1, v + 3))


@settings(max_examples=150, deadline=None)
@given(tables(), st.sampled_from(["compiled", "python", "numpy"]))
def test_one_pass_matches_a_full_sort(table, path) -> None:
    """Candidates equal the full sort's first m (ties to the lowest column), values exact; the log-sum-exp
    equals a max-shifted float64 one within the dtype's rounding (bit for bit ops.logsumexp's)."""
    x, m = table
    if path == "compiled" and not select.compiled():
        pytest.skip("numba is not installed")
    if path == "python":  # the scan's source, interpreted: the compiled scan runs the same steps
        want_v, want_i = full_sort(x, min(m, x.shape[1]))
        vals = np.empty(want_v.shape, dtype=x.dtype)
        idx = np.empty(want_i.shape, dtype=np.int64)
        select.top_scan(x, min(m, x.shape[1]), vals, idx)
        np.testing.assert_array_equal(idx, want_i)
        np.testing.assert_array_equal(vals, want_v)
        return
    lse, vals, idx = select.lse_and_top(x, m, jit=path == "compiled")
    want_v, want_i = full_sort(x, min(m, x.shape[1]))
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(vals, want_v)
    assert vals.dtype == np.float64 and idx.dtype == np.int64
    np.testing.assert_allclose(lse, shifted_lse(x), rtol=0, atol=LSE_ATOL[x.dtype.type])
    np.testing.assert_array_equal(lse, ops.logsumexp(x))  # the engine's normaliser, unchanged


def test_rows_of_many_chunks_and_bad_rows() -> None:
    """A table of several chunks (the last one partial): NaN, +inf, overflowing and all -inf rows get the
    log-sum-exp ops.logsumexp gives them; the finite rows' candidates match the full sort."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((70, 4099)) * 4).astype(np.float32)
    x[0] = -np.inf
    x[1, 17] = np.nan
    x[2, 5] = np.inf
    x[3] += 200.0  # exp overflows float32: the row is redone with a shift
    x[4] -= 200.0  # exp underflows
    for jit in (True, False):
        lse, vals, idx = select.lse_and_top(x, 7, jit=jit)
        np.testing.assert_array_equal(lse, ops.logsumexp(x))
        assert np.isnan(lse[1]) and lse[2] == np.inf and lse[0] == -np.inf
        np.testing.assert_allclose(lse[3:], shifted_lse(x[3:]), rtol=1e-6)
        keep = np.r_[0, 3:70]
        want_v, want_i = full_sort(x[keep], 7)
        np.testing.assert_array_equal(idx[keep], want_i)
        np.testing.assert_array_equal(vals[keep], want_v)


def test_torch_tensors(device) -> None:
    """A CPU float32 tensor is read through numpy, a bfloat16 one (or any tensor on an accelerator) by torch on its
    device: both match the full sort (integer values: ties everywhere, every value exact) and ops' own
    log-sum-exp."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 3, size=(9, 513)).astype(np.float32)
    for t in (torch.from_numpy(x).to(device), torch.from_numpy(x).to(device, torch.bfloat16)):
        lse, vals, idx = select.lse_and_top(t, 4)
        want_v, want_i = full_sort(t.float().cpu().numpy(), 4)
        np.testing.assert_array_equal(idx, want_i)
        np.testing.assert_array_equal(vals, want_v)
        np.testing.assert_array_equal(lse, ops.logsumexp(t))
