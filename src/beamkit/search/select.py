"""One-pass selection: each row's log-sum-exp and its top candidates from one read of the logits.

A row's order does not change when a constant is added to it, so the ``m`` best tokens of the log-probabilities
``x - lse(x)`` are the ``m`` best of the logits ``x``: both can come from the same read of a row. On the host the
logits are walked in chunks of rows small enough to stay in cache: numpy exponentiates and sums a chunk (the
log-sum-exp, bit for bit that of :func:`beamkit.ops.logsumexp`), and, where numba is installed, a compiled scan
(:func:`top_scan`) takes each row's group maxima (the maxima of 16 slices of the row) and reads only the groups
that can hold one of the m best, while the chunk is still in cache. Without numba the candidates come
from :func:`beamkit.ops.top_candidates`. CPU float32 / float64 tensors are read through a numpy view of their
memory; other tensors (on an accelerator, or in half precision) stay with torch (``logsumexp`` and ``topk`` on
their device; only ``[rows]`` and ``[rows, m]`` tables come back).

Either way the candidates obey the engine's rule exactly: the ``m`` largest per row, value descending, equal
values by column ascending.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from beamkit import ops

_CHUNK = 1 << 18  # elements of a [rows, V] table exponentiated and scanned at a time (about 1 MB of float32)
_TINY_SUM = 1e-30  # below this an unshifted sum of exps may have lost precision: the row is redone with a shift
_BLOCK = 16  # columns whose maximum the compiled scan compares with the row's m-th best before looking closer
_MIN_SCAN = 4096  # rows * V from which the compiled scan is used (below it the call costs more than it saves)
_MAX_SCAN_M = 128  # widest m the compiled scan takes: each entry it admits shifts up to m held ones (O(m) each),
# so past this numpy's threshold selection (:func:`beamkit.ops.top_candidates`) is faster (wide beams: m = 2 W)

_scan: Callable[..., None] | None = None
_scan_tried = False


def compiled() -> bool:
    """Whether the compiled scan is available: numba importable and ``BEAMKIT_NO_JIT`` not set (compiled on the
    first call, cached on disk by numba)."""
    return _compiled_scan() is not None


def lse_and_top(
    x: Any, m: int, *, jit: bool | None = None, shared: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise log-sum-exp and the ``m`` best entries of ``x`` ``[rows, V]`` (logits): from one read where the
    compiled scan runs, else from :func:`beamkit.ops.top_candidates` after the sums.

    Returns host arrays ``(lse float64 [rows], values float64 [rows, m'], columns int64 [rows, m'])`` with
    ``m' = min(m, V)``: ``lse`` as :func:`beamkit.ops.logsumexp` gives it (NaN, +inf and all ``-inf`` rows
    included), the candidates as :func:`beamkit.ops.top_candidates` gives them (value descending, ties to the
    lowest column). ``jit``: take the candidates by the compiled scan (None: where numba is installed, the
    table is not tiny and ``m`` at most 128; True without numba falls back to numpy). ``m == 1`` (greedy) is
    numpy's ``argmax``.

    ``shared`` ``(req, key, m_row)``, per row its request (rows grouped), running key and ``m``: only each
    request's ``m`` best candidates by key are wanted, so a row of a wide request (``m`` above 128) keeps just
    its entries that may be among them (:func:`request_floors`), the rest of its ``[m]`` padded with NaN values:
    the cost grows with the candidates kept, not with rows x m.
    """
    rows, v = int(x.shape[0]), int(x.shape[1])
    m = min(int(m), v)
    x = ops.cpu_view(x)  # a CPU float32 / float64 tensor: a numpy view of its memory
    if not isinstance(x, np.ndarray):  # on an accelerator, or half precision: torch does both, small tables back
        return ops.device_lse_and_top(x, m)
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = x.astype(np.float64)
    if m == 1:  # greedy: numpy's argmax is the first column holding the maximum (NaN: the row fails anyway)
        best = x.argmax(axis=1)  # shape: (rows,)
        top = x[np.arange(rows), best].astype(np.float64)[:, None]  # shape: (rows, 1)
        return ops.logsumexp(x), top, best.astype(np.int64)[:, None]
    size = rows * v
    if shared is not None and m > _MAX_SCAN_M:
        return _shared_top(x, m, shared)
    scan = _compiled_scan() if jit or (jit is None and size >= _MIN_SCAN and m <= _MAX_SCAN_M) else None
    if scan is not None and not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    sums = np.empty(rows, dtype=x.dtype)  # shape: (rows,) unshifted sums of exps, in x's dtype
    vals = np.empty((rows, m), dtype=x.dtype)  # shape: (rows, m)
    idx = np.empty((rows, m), dtype=np.int64)  # shape: (rows, m)
    step = max(1, _CHUNK // max(1, v))
    buf = np.empty((min(step, rows), v), dtype=x.dtype)  # shape: (step, V) one exp buffer for every chunk
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, rows, step):
            part = x[lo : lo + step]
            e = buf[: part.shape[0]]
            np.exp(part, out=e)
            np.add.reduce(e, axis=1, out=sums[lo : lo + step])
            if scan is not None and m:  # the chunk's candidates while it is in cache
                scan(part, m, vals[lo : lo + step], idx[lo : lo + step])
    if scan is None:
        top, idx = ops.top_candidates(x, m)
        return _log_of_sums(x, sums), top, idx
    return _log_of_sums(x, sums), vals.astype(np.float64), idx


def raw_top(
    x: Any, m: int, *, jit: bool | None = None, shared: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lse_and_top` for scores used as they are (a step that returns ``{"log_softmax": False}``): no
    log-sum-exp, only each row's normaliser ``0``, or its NaN / +inf / -inf where the row's maximum is one (a
    row that fails, or has no finite candidate), from one pass (:func:`beamkit.ops.row_max`); then the ``m``
    best entries as :func:`lse_and_top` takes them (the compiled scan, else :func:`beamkit.ops.top_candidates`).
    Returns ``(normaliser float64 [rows], values float64 [rows, m'], columns int64 [rows, m'])``."""
    rows, v = int(x.shape[0]), int(x.shape[1])
    m = min(int(m), v)
    peak = ops.row_max(x)  # shape: (rows,) NaN anywhere wins, then +inf; -inf for an all -inf row
    norm = np.where(np.isfinite(peak), 0.0, peak)  # shape: (rows,)
    x = ops.cpu_view(x)
    if not isinstance(x, np.ndarray):  # on an accelerator, or half precision: torch's topk there
        return norm, *ops.top_candidates(x, m)
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = x.astype(np.float64)
    if shared is not None and m > _MAX_SCAN_M:
        return _shared_top(x, m, shared, norm)
    scan = _compiled_scan() if jit or (jit is None and rows * v >= _MIN_SCAN and m <= _MAX_SCAN_M) else None
    if scan is None or m == 0:
        return norm, *ops.top_candidates(x, m)
    x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    vals = np.empty((rows, m), dtype=x.dtype)  # shape: (rows, m)
    idx = np.empty((rows, m), dtype=np.int64)  # shape: (rows, m)
    scan(x, m, vals, idx)
    return norm, vals.astype(np.float64), idx


def _shared_top(
    x: np.ndarray, m: int, shared: tuple[np.ndarray, np.ndarray, np.ndarray], lse: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lse_and_top` for wide requests: the log-sum-exps, then each row's best entries above its request's
    floor (:func:`top_above`); rows without a floor take their plain top ``m``. ``lse``: the rows' normalisers
    when they are known (raw scores: 0), else their log-sum-exps."""
    if lse is None:
        lse = ops.logsumexp(x)  # shape: (rows,)
    req, key, m_row = shared
    floors = request_floors(x, lse, req, key, m_row)
    if floors is None:
        return lse, *ops.top_candidates(x, m)
    some = np.isfinite(floors)
    if some.all():
        return lse, *top_above(x, m, floors)
    vals = np.full((x.shape[0], m), np.nan)
    idx = np.zeros((x.shape[0], m), np.int64)
    rest = np.flatnonzero(~some)
    vals[some], idx[some] = top_above(x[some], m, floors[some])
    vals[rest], idx[rest] = ops.top_candidates(x[rest], m)
    return lse, vals, idx


def _log_of_sums(x: Any, sums: np.ndarray) -> np.ndarray:
    """``log(sums)`` as float64, the rows whose unshifted sum over- or underflowed (or holds NaN / inf) redone by
    :func:`beamkit.ops.logsumexp`, which shifts them."""
    ok = (sums >= _TINY_SUM) & (sums < np.inf)
    out = np.log(np.where(ok, sums, 1.0), dtype=np.float64)  # shape: (rows,)
    if not ok.all():
        redo = np.flatnonzero(~ok)
        out[redo] = ops.logsumexp(x[redo])
    return out


def _compiled_scan() -> Callable[..., None] | None:
    """The numba-compiled top-m scan, built on first use; None without numba or with ``BEAMKIT_NO_JIT`` set."""
    global _scan, _scan_tried
    if not _scan_tried:
        _scan_tried = True
        if not os.environ.get("BEAMKIT_NO_JIT"):
            try:
                import numba
            except ImportError:  # numba is optional (the ctc extra): numpy then selects
                return None
            try:
                _scan = numba.njit(cache=True, nogil=True)(top_scan)
            except RuntimeError:  # no writable place for numba's cache: compile in each process
                _scan = numba.njit(nogil=True)(top_scan)
    return _scan


def group_peaks(x: np.ndarray) -> np.ndarray:
    """The group maxima :func:`top_scan` reads: ``[rows, V // 16]``, group ``g`` of a row holding its columns
    ``g, g + nb, ..., g + 15 nb`` (``nb = V // 16``; the last ``V % 16`` columns belong to no group), from
    element-wise maxima of contiguous slices (vectorised). NaN propagates."""
    rows, v = x.shape
    nb = v // _BLOCK
    if nb >= 256:  # long slices: one reduction over the middle axis
        return x[:, : nb * _BLOCK].reshape(rows, _BLOCK, nb).max(axis=1)  # shape: (rows, nb)
    peak = x[:, :nb].copy()  # shape: (rows, nb)
    for i in range(1, _BLOCK):
        np.maximum(peak, x[:, i * nb : (i + 1) * nb], out=peak)
    return peak


def top_scan(x: np.ndarray, m: int, vals: np.ndarray, idx: np.ndarray) -> None:
    """Write each row's ``m`` best entries of ``x`` ``[rows, V]`` (``1 <= m <= V``) into ``vals`` (x's dtype) /
    ``idx`` ``[rows, m]``: value descending, equal values by column ascending (plain Python; numba compiles it).

    Per row, one read of the row gives its group maxima (the ``V // 16`` groups of :func:`group_peaks`, NaN
    propagating) and their m-th largest, the floor (``-inf`` with fewer than m groups): m groups hold an entry at
    least that large, so the row's m best entries all reach it. Then the groups are visited in order, holding
    the row's best ``m`` so far: a group whose maximum is below the floor, or below the m-th best so far, is
    passed over, the others are read entry by entry, and so are the last ``V % 16`` columns. An entry enters
    when it beats the m-th best, or equals it at a lower column, and is placed after the equal values of lower
    columns, so the result obeys the tie rule whatever order the columns are met in. A row holding NaN belongs to
    a request that fails (its log-sum-exp is NaN), so what such a row yields is never used.
    """
    rows, v = x.shape
    nb = v // _BLOCK
    pk = np.empty(nb, dtype=x.dtype)  # the row's group maxima
    top = np.empty(max(m, 1), dtype=x.dtype)  # the m largest group maxima so far, descending
    for r in range(rows):
        row, vr, ir = x[r], vals[r], idx[r]
        for j in range(nb):
            pk[j] = row[j]
        for i in range(1, _BLOCK):
            base = i * nb
            for j in range(nb):
                a = row[base + j]
                if a > pk[j] or a != a:  # a NaN stays
                    pk[j] = a
        floor = -np.inf
        if nb >= m:
            k = 0
            for j in range(nb):
                a = pk[j]
                if k == m and not a > top[m - 1]:
                    continue
                p = k if k < m else m - 1
                while p > 0 and top[p - 1] < a:
                    top[p] = top[p - 1]
                    p -= 1
                top[p] = a
                if k < m:
                    k += 1
            floor = top[m - 1]
        n = 0
        for g in range(nb + 1):
            if g < nb:
                if pk[g] < floor or (n == m and pk[g] < vr[m - 1]):
                    continue
                lo, hi, stride = g, g + nb * _BLOCK, nb
            else:
                lo, hi, stride = nb * _BLOCK, v, 1
            for c in range(lo, hi, stride):
                a = row[c]
                if n == m and not (a > vr[m - 1] or (a == vr[m - 1] and c < ir[m - 1])):
                    continue
                p = n if n < m else m - 1
                while p > 0 and (vr[p - 1] < a or (vr[p - 1] == a and ir[p - 1] > c)):
                    if p < m:
                        vr[p] = vr[p - 1]
                        ir[p] = ir[p - 1]
                    p -= 1
                vr[p] = a
                ir[p] = c
                if n < m:
                    n += 1


_SHARE_FROM = 1 << 14  # group maxima of one request from which its rows share a floor (below it: no floor)


def request_floors(x: Any, lse: np.ndarray, req: np.ndarray, key: np.ndarray, m: np.ndarray) -> np.ndarray | None:
    """Per row of ``x`` ``[rows, V]`` (logits, a numpy array; rows grouped by request), a value below which none
    of its entries can be among its request's ``m`` best candidates by key (``key[r] + (x - lse[r])``, as the
    engine ranks them), or None where no request is wide enough for it to pay.

    Each row's group maxima (:func:`group_peaks`) are distinct entries whose keys are computed as the engine
    computes them; the ``m``-th largest of a request's, ``L``, is reached by ``m`` of its candidates, so its
    ``m`` best all have keys ``>= L`` and, keys growing with ``x``, logits ``>= (L - key[r]) + lse[r]``, taken a
    little lower for rounding. Rows of small requests get ``-inf``.
    """
    x = ops.cpu_view(x)
    rows = int(x.shape[0])
    if not isinstance(x, np.ndarray) or rows == 0 or (req[1:] < req[:-1]).any():
        return None
    nb = x.shape[1] // _BLOCK
    starts = np.flatnonzero(np.concatenate([[True], req[1:] != req[:-1]]))
    ends = np.append(starts[1:], rows)
    wide = [g for g in range(starts.shape[0]) if (ends[g] - starts[g]) * nb >= max(_SHARE_FROM, m[starts[g]])]
    if not wide:
        return None
    floors = np.full(rows, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        for g in wide:
            lo, hi, k = int(starts[g]), int(ends[g]), int(m[starts[g]])
            part = x[lo:hi]
            if part.dtype != np.float32 and part.dtype != np.float64:
                return None
            peak = group_peaks(part).astype(np.float64)  # shape: (rows_g, nb)
            pk = key[lo:hi, None] + (peak - lse[lo:hi, None])  # shape: (rows_g, nb) their keys, as ranked
            pk = np.where(np.isfinite(pk), pk, -np.inf).ravel()
            low = np.partition(pk, pk.shape[0] - k)[pk.shape[0] - k]  # m-th largest
            if not np.isfinite(low):
                continue
            f = (low - key[lo:hi]) + lse[lo:hi]  # shape: (rows_g,)
            slack = 8 * np.finfo(np.float64).eps * (abs(low) + np.abs(key[lo:hi]) + 2 * np.abs(lse[lo:hi]) + 1.0)
            floors[lo:hi] = np.where(np.isfinite(f), f - slack, -np.inf)
    return floors


def top_above(x: Any, m: int, floors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``m`` best entries of ``x`` ``[rows, V]`` (numpy) among those ``>= floors[row]``: value
    descending, equal values by column ascending, rows with fewer padded with NaN values (column 0). Returns
    ``(values float64 [rows, m], columns int64 [rows, m])``."""
    rows, v = x.shape
    m = min(int(m), v)
    r, c = np.divmod(np.flatnonzero(x >= floors[:, None]), v)  # float32 compared as float64, exactly
    val = x[r, c].astype(np.float64)
    order = np.lexsort((c, -val, r))
    r, c, val = r[order], c[order], val[order]
    rank = np.arange(r.shape[0]) - np.searchsorted(r, r)
    keep = rank < m
    out_val = np.full((rows, m), np.nan)
    out_idx = np.zeros((rows, m), np.int64)
    out_val[r[keep], rank[keep]] = val[keep]
    out_idx[r[keep], rank[keep]] = c[keep]
    return out_val, out_idx
