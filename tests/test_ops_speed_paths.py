"""The chunked numpy paths of ops: the block-threshold top_candidates, logsumexp, log_softmax.

Oracles are independent of ops: a full per-row lexsort for the top m, and a float64 max-shifted log-sum-exp.
Tables are above the threshold-path size (rows * V >= 2**20) and span several chunks, the last one partial.
"""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import ops
from beamkit.ops import chunks, normalize, top

torch = pytest.importorskip("torch")

ROWS, V, M = 83, 30011, 10  # V prime: the strided groups leave tail columns


def top_and_lse(x, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The engine's two calls on one table: its top m per row and its log-sum-exp."""
    return (*ops.top_candidates(x, m), ops.logsumexp(x))


def _top_oracle(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: columns sorted by value descending, then column ascending; the first m (NaN-free rows)."""
    v = x.shape[1]
    idx = np.array([np.lexsort((np.arange(v), -row.astype(np.float64)))[:m] for row in x], dtype=np.int64)
    return np.take_along_axis(x, idx, axis=1).astype(np.float64), idx


def _lse_oracle(x: np.ndarray) -> np.ndarray:
    """float64 log-sum-exp per row: max-shifted; -inf rows give -inf, +inf rows +inf, NaN rows NaN."""
    out = []
    for row in x.astype(np.float64):
        if np.isnan(row).any():
            out.append(np.nan)
        elif (row == np.inf).any():
            out.append(np.inf)
        elif (row == -np.inf).all():
            out.append(-np.inf)
        else:
            m = row.max()
            out.append(m + np.log(np.exp(row - m).sum()))
    return np.array(out)


# |lse error| bound for float32 logits: numpy's float32 exp is within 2.52 ulp (<= 3.0e-7 relative) per term;
# its pairwise sum of positive terms adds at most 26 roundings along any path for V <= 32768 (16 sequential adds
# in each of 8 accumulators of a 128-block, 3 to combine them, 8 halvings above): 26 * 2**-24 = 1.55e-6 relative.
# log turns a relative error d of the sum into an absolute error ~d on the lse: <= 1.9e-6; 4e-6 leaves a margin.
LSE_ATOL = {np.float32: 4e-6, np.float64: 1e-12}


def _table(seed: int, dtype=np.float32, rows: int = ROWS, v: int = V) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, v)) * 3.0).astype(dtype)
    x[1] = -np.inf  # an all -inf row
    x[2, :] = -np.inf  # three finite entries, fewer than m: the rest of its top m are -inf by column
    x[2, [7, 400, 29000]] = [1.0, 2.0, 1.0]
    x[3, 123] = np.inf  # one +inf entry
    x[4, rng.choice(v, 2 * M, replace=False)] = np.inf  # more +inf entries than m
    x[5] += 100.0  # the unshifted float32 sum overflows: redone with the shift
    x[6] -= 120.0  # ... underflows
    x[7] = np.round(x[7])  # many ties
    boundary = np.sort(rng.choice(v, 40, replace=False))  # ties across the m-th place: the lowest columns win
    x[8] = -5.0
    x[8, boundary[:4]] = [9.0, 8.0, 8.0, 7.0]
    x[8, boundary[4:]] = 6.0
    x[9] = 0.0  # a flat row: the first m columns
    return x


def _check_top(x: np.ndarray, vals: np.ndarray, idx: np.ndarray, m: int) -> None:
    want_v, want_i = _top_oracle(x, m)
    assert vals.dtype == np.float64 and idx.dtype == np.int64 and vals.shape == (x.shape[0], m)
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(vals, want_v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "row-slice"])
def test_top_candidates_and_logsumexp_against_oracles(dtype, layout):
    x = _table(0, dtype)
    if layout == "strided":  # every other column of a wider table
        x = np.repeat(x, 2, axis=1)[:, ::2]
    elif layout == "row-slice":  # rows padded in memory, as logits[:, -1, :] of a bigger buffer
        x = np.concatenate([x, x[:, :5]], axis=1)[:, :V]
    assert top._threshold_path(*x.shape, M)
    rows = chunks.chunk_rows
    assert x.shape[0] > rows(V, chunks.TOP_CHUNK) > rows(V) and x.shape[0] % rows(V)
    vals, idx, lse = top_and_lse(x, M)
    _check_top(x, vals, idx, M)
    assert lse.dtype == np.float64 and lse.shape == (x.shape[0],)
    np.testing.assert_allclose(lse, _lse_oracle(x), rtol=0, atol=LSE_ATOL[dtype])
    assert lse[1] == -np.inf and lse[3] == np.inf and lse[4] == np.inf
    # the same arrays as the two separate calls, bit for bit
    t_vals, t_idx = ops.top_candidates(x, M)
    np.testing.assert_array_equal(t_idx, idx)
    np.testing.assert_array_equal(t_vals, vals)
    np.testing.assert_array_equal(ops.logsumexp(x), lse)


def test_unshifted_sums_are_the_plain_numpy_sums():
    # well-scaled rows: logsumexp is log(np.exp(x).sum(axis=1)) bit for bit, chunked or not
    x = _table(1)[10:]
    want = np.log(np.exp(x).sum(axis=1), dtype=np.float64)
    np.testing.assert_array_equal(ops.logsumexp(x), want)
    np.testing.assert_array_equal(top_and_lse(x, M)[2], want)


@pytest.mark.parametrize("seed", range(4))
def test_block_threshold_top_on_tie_heavy_tables(seed):
    rng = np.random.default_rng(seed)
    v = int(rng.integers(20000, 40000))
    m = int(rng.integers(1, 17))
    x = rng.integers(-3, 4, size=(64, v)).astype(np.float32)  # every row ties far beyond the m-th place
    x[::7, rng.integers(0, v, 5)] = 4.0
    vals, idx, lse = top_and_lse(x, m)
    _check_top(x, vals, idx, m)
    np.testing.assert_allclose(lse, _lse_oracle(x), rtol=0, atol=LSE_ATOL[np.float32])
    t_vals, t_idx = ops.top_candidates(x, m)
    np.testing.assert_array_equal(t_idx, idx)
    np.testing.assert_array_equal(t_vals, vals)


def test_signed_zeros_tie_by_column_and_keep_their_sign():
    x = np.zeros((40, 32768), dtype=np.float32)
    x[:, 1::3] = -0.0
    x[5, 40] = -1.0
    vals, idx = ops.top_candidates(x, M)
    np.testing.assert_array_equal(idx, np.broadcast_to(np.arange(M), (40, M)))
    np.testing.assert_array_equal(np.signbit(vals), np.signbit(x[:, :M]))
    assert top_and_lse(x, M)[1].tolist() == idx.tolist()


def test_nan_rows_leave_the_other_rows_alone():
    x = _table(2)
    x[11] = np.nan
    x[12, 5] = np.nan
    vals, idx, lse = top_and_lse(x, M)
    assert np.isnan(lse[11]) and np.isnan(lse[12])
    ok = np.setdiff1d(np.arange(ROWS), [11, 12])
    _check_top(x[ok], vals[ok], idx[ok], M)


def test_small_tables_torch_and_wide_m_against_oracles():
    """The other paths (small tables, m close to or above V, torch float32 and bfloat16) obey the same rules."""
    rng = np.random.default_rng(3)
    small = rng.standard_normal((6, 50)).astype(np.float32)
    for x, m in [(small, 3), (small, 50), (small, 80), (_table(4), 4000)]:
        vals, idx, lse = top_and_lse(x, m)
        _check_top(x, vals, idx, min(m, x.shape[1]))
        np.testing.assert_allclose(lse, _lse_oracle(x), rtol=0, atol=LSE_ATOL[np.float32])
    x = _table(5)
    _check_top(x, *top_and_lse(torch.from_numpy(x), M)[:2], M)
    lse = top_and_lse(torch.from_numpy(x), M)[2]
    np.testing.assert_allclose(lse, _lse_oracle(x), rtol=0, atol=LSE_ATOL[np.float32])
    bf = torch.from_numpy(x).to(torch.bfloat16)
    _check_top(bf.float().numpy(), *top_and_lse(bf, M)[:2], M)  # ranked on the bfloat16 values themselves


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_log_softmax_and_shifted_logsumexp(dtype):
    x = _table(6, dtype)
    ls = ops.log_softmax(x)
    assert ls.dtype == x.dtype and ls.shape == x.shape
    with np.errstate(invalid="ignore"):
        want = x - ops.logsumexp(x)[:, None].astype(dtype)  # the unchunked formula
    np.testing.assert_array_equal(ls, want)
    finite = np.isfinite(_lse_oracle(x))
    np.testing.assert_allclose(np.exp(ls[finite].astype(np.float64)).sum(axis=1), 1.0, rtol=1e-5)
    shifted = normalize._shifted_logsumexp(x)
    np.testing.assert_allclose(shifted, _lse_oracle(x), rtol=0, atol=LSE_ATOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masked_tables_with_few_finite_entries_per_row(dtype):
    """A dictionary's mask: each row keeps a few hundred ids of 32,768 (some rows fewer than m, one none), the
    rest -inf: the top m against the oracle, -inf places filled by column."""
    rng = np.random.default_rng(7)
    rows, v, m = 60, 32768, 100
    x = np.full((rows, v), -np.inf, dtype=dtype)
    for r in range(rows):
        keep = rng.choice(v, int(rng.integers(0, 300)) if r % 3 else int(rng.integers(1, m)), replace=False)
        x[r, keep] = rng.standard_normal(keep.size) * 3.0
    x[0] = -np.inf
    assert top._threshold_path(rows, v, m)
    vals, idx = ops.top_candidates(x, m)
    _check_top(x, vals, idx, m)
