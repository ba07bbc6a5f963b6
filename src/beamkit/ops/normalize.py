"""Row normalisers of ``[rows, V]`` logits: log-sum-exp (on the host, float64) and log-softmax (in the logits'
library, device and dtype), exact for any magnitude and for NaN / inf rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit.ops.backend import NUMPY_FLOATS, cpu_view, is_torch, to_numpy
from beamkit.ops.chunks import LARGE_TABLE, chunk_rows, row_chunks
from beamkit.ops.gather import gather_rows


def logsumexp(x: Any) -> np.ndarray:
    """Row-wise log-sum-exp of ``[rows, V]`` logits, returned on the host as float64 ``[rows]``.

    NaN anywhere in a row gives NaN, +inf gives +inf and an all ``-inf`` row gives ``-inf``: the engine uses
    that to validate rows without another pass over the logits. Float32/float64 rows take two passes, ``exp``
    then a sum in the logits' dtype, with no max shift; the few rows where that over- or underflows (or holds
    NaN / inf) are redone with the shift. bfloat16 / float16 are summed from float32. CPU tensors are read
    through a zero-copy numpy view (numpy's chunked exp is faster there); accelerator tensors stay on their device.
    """
    x = cpu_view(x)
    if is_torch(x) and str(x.dtype) not in NUMPY_FLOATS:
        x = cpu_view(x.float())
    if is_torch(x):  # on an accelerator
        sums = to_numpy(x.exp().sum(dim=1))  # shape: (rows,) on the host
    else:
        x = np.asarray(x)
        if x.dtype != np.float32 and x.dtype != np.float64:
            x = x.astype(np.float64)
        sums = _exp_sums(x)
    return _log_of_sums(x, sums)


_TINY_SUM = 1e-30  # a sum of exps below this may have lost precision to underflow: redo the row with a shift


def _exp_sums(x: np.ndarray) -> np.ndarray:
    """Row sums of ``exp(x)`` in x's dtype (float32 / float64), no shift: chunks of rows through one buffer.

    Bit for bit ``np.exp(x).sum(axis=1)``: each row is exponentiated element-wise and summed by numpy's pairwise
    sum along the row, whatever the chunk; the chunks only keep the exp buffer in cache and skip a big temporary.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if chunk_rows(x.shape[1]) >= x.shape[0]:
            return np.exp(x).sum(axis=1)
        sums = np.empty(x.shape[0], dtype=x.dtype)  # shape: (rows,)
        for rows, part, e in row_chunks(x):
            np.exp(part, out=e)
            np.add.reduce(e, axis=1, out=sums[rows])
    return sums


def _log_of_sums(x: Any, sums: np.ndarray) -> np.ndarray:
    """``log(sums)`` as float64 ``[rows]``, the rows whose unshifted sum is unusable redone from ``x`` with a shift."""
    ok = (sums >= _TINY_SUM) & (sums < np.inf)  # else overflow, underflow, NaN or +-inf in the row
    out = np.log(np.where(ok, sums, 1.0), dtype=np.float64)
    if not ok.all():
        redo = np.flatnonzero(~ok)
        part = gather_rows(x, redo)  # shape: (redo, V), on the logits' device
        out[redo] = to_numpy(part.logsumexp(dim=1)).astype(np.float64) if is_torch(x) else _shifted_logsumexp(part)
    return out


def _shifted_logsumexp(x: np.ndarray) -> np.ndarray:
    """Row-wise log-sum-exp with the row maximum shifted out (any magnitude, NaN and +-inf rows as documented)."""
    m = x.max(axis=1)  # shape: (rows,)
    finite = np.isfinite(m)
    shift = np.where(finite, m, 0.0).astype(x.dtype, copy=False)  # shape: (rows,)
    sums = np.empty(x.shape[0], dtype=np.float64)  # shape: (rows,) sums of exp(x - shift)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for rows, part, e in row_chunks(x):
            np.subtract(part, shift[rows, None], out=e)
            np.exp(e, out=e)
            e.sum(axis=1, dtype=np.float64, out=sums[rows])
        out = np.log(sums) + shift.astype(np.float64)
    # A +inf or NaN maximum must survive (NaN propagates through max).
    return np.where(np.isnan(m) | (m == np.inf), m.astype(np.float64), out)


def log_softmax(x: Any) -> Any:
    """Row-wise log-softmax of ``[rows, V]`` logits, in the logits' library, device and dtype."""
    if is_torch(x):
        return x.log_softmax(dim=1)
    if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64) and x.ndim == 2 and x.size >= LARGE_TABLE:
        return _chunked_log_softmax(x)
    lse = logsumexp(x)
    with np.errstate(invalid="ignore"):
        return (x - lse[:, None].astype(x.dtype, copy=False)).astype(x.dtype, copy=False)


def _chunked_log_softmax(x: np.ndarray) -> np.ndarray:
    """:func:`log_softmax` of a large float32 / float64 table, each chunk of rows normalised while in cache.

    The same arithmetic as ``x - logsumexp(x)`` row by row (the normaliser rounded to x's dtype), one read of x.
    """
    out = np.empty_like(x)  # shape: (rows, V)
    with np.errstate(over="ignore", invalid="ignore"):
        for rows, part, e in row_chunks(x):
            np.exp(part, out=e)
            lse = _log_of_sums(part, np.add.reduce(e, axis=1))  # shape: (k,) float64
            np.subtract(part, lse[:, None].astype(x.dtype), out=out[rows])
    return out
