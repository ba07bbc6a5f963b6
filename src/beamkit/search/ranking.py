"""The engine's candidate order, shared by every policy and by the selectors that must predict it."""

from __future__ import annotations

import numpy as np

from beamkit.search.kernels import compiled_head

_CUT_FROM = 2048  # candidates of one request from which ranking only its first ``limit`` starts with a partition
_HEAD_MAX = 64  # widest limit the compiled head scan takes (each candidate it admits shifts up to limit held ones)


def rank_candidates(
    req: np.ndarray,
    key: np.ndarray,
    row: np.ndarray,
    tok: np.ndarray,
    valid: np.ndarray | bool = True,
    ordered: bool = False,
    limit: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The engine's candidate order: request, then key descending, then row (beam) and token ascending.

    Candidates whose key is not finite (or not ``valid``) are dropped. Returns ``(order, rank)``: indices of the
    kept candidates in that order, and each one's rank within its request. ``ordered``: the arrays are already
    by row ascending and, within a row, by key descending with equal keys by token ascending, so a stable sort
    by (request, key) gives the same order. Selectors that must predict which beams the engine keeps (diverse
    beam search) rank with this same function.

    ``limit`` (indexed by request id): only each request's first ``limit[r]`` candidates are returned, exactly
    the head of the full order (same candidates, order and ranks). A request with many more candidates than that
    (``req`` grouped by request) is first cut at the key of its ``limit[r]``-th best, found by one partition;
    every candidate tied with that key is kept for the sort, so the tie order is the full one's. The cost then
    grows with the candidates rather than as their sort.
    """
    if limit is not None and req.shape[0] and int(limit.max()) <= _HEAD_MAX:
        scan = compiled_head()
        if scan is not None and not (req[1:] < req[:-1]).any():  # requests grouped: one compiled pass
            order = np.empty(req.shape[0], np.int64)
            rank = np.empty(req.shape[0], np.int64)
            ok = np.broadcast_to(np.asarray(valid, dtype=bool), req.shape)
            n = scan(req, np.asarray(key, np.float64), row, tok, ok, limit, order, rank)
            return order[:n], rank[:n]
    finite = np.isfinite(key) & valid
    if limit is not None:
        finite = _cut(req, key, finite, limit)
    if finite.all():
        order = np.lexsort((-key, req) if ordered else (tok, row, -key, req))
    else:
        idx = np.flatnonzero(finite)  # ascending: a stable sort of the rest keeps the flat order among equals
        r, k = req[idx], -key[idx]
        order = idx[np.lexsort((k, r) if ordered else (tok[idx], row[idx], k, r))]
    sorted_req = req[order]
    rank = np.arange(order.shape[0]) - sorted_req.searchsorted(sorted_req)
    if limit is not None:
        head = rank < limit[sorted_req]
        if not head.all():
            order, rank = order[head], rank[head]
    return order, rank


def _cut(req: np.ndarray, key: np.ndarray, finite: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """``finite`` without the candidates of large requests whose key is below their request's ``limit[r]``-th
    best finite key (a request with fewer finite candidates keeps them all; ties with that key stay). Requests
    must come grouped; otherwise (or with no large request) ``finite`` comes back as it is."""
    n = req.shape[0]
    if n < _CUT_FROM or (req[1:] < req[:-1]).any():
        return finite
    starts = group_starts(req)
    sizes = np.diff(np.append(starts, n))  # shape: (groups,)
    lim = limit[req[starts]]
    big = np.flatnonzero((sizes >= _CUT_FROM) & (sizes > 2 * lim))
    if big.size == 0:
        return finite
    out = finite.copy()
    for g in big.tolist():  # only requests of thousands of candidates: the loop costs little beside the partition
        lo, hi, k = int(starts[g]), int(starts[g] + sizes[g]), int(lim[g])
        if k <= 0:
            out[lo:hi] = False
            continue
        seg = finite[lo:hi]
        part = key[lo:hi] if seg.all() else key[lo:hi][seg]  # shape: (finite candidates of the request,)
        if part.shape[0] <= 2 * k:  # few finite ones (rows cut at their request's floor): the sort is cheap
            continue
        floor = np.partition(part, part.shape[0] - k)[part.shape[0] - k]  # the k-th largest
        with np.errstate(invalid="ignore"):
            out[lo:hi] &= key[lo:hi] >= floor
    return out


def group_starts(sorted_ids: np.ndarray) -> np.ndarray:
    """Indices where a new value begins in a sorted 1-D array (the first index of each group)."""
    if sorted_ids.shape[0] == 0:
        return np.zeros(0, np.int64)
    change = sorted_ids[1:] != sorted_ids[:-1]
    return np.concatenate([[0], np.flatnonzero(change) + 1])


def requests_of(sorted_req: np.ndarray) -> np.ndarray:
    """The distinct values of a sorted 1-D array, ascending (``np.unique`` without the sort)."""
    return sorted_req[group_starts(sorted_req)]


def without(present: np.ndarray, taken: np.ndarray, size: int) -> np.ndarray:
    """The values of ``present`` (distinct, ascending, each < ``size``) that are not in ``taken``."""
    mask = np.zeros(size, dtype=bool)  # shape: (size,)
    mask[taken] = True
    return present[~mask[present]]


def member(ids: np.ndarray, of: np.ndarray) -> np.ndarray:
    """``np.isin(ids, of)`` for 1-D integer arrays: a broadcast comparison while they are small (a step's pool
    entries and requests; ``np.isin`` costs tens of microseconds however small its inputs), ``np.isin`` above."""
    if ids.size * of.size > 4096:
        return np.isin(ids, of)
    if of.size == 0:
        return np.zeros(ids.shape, dtype=bool)
    return (ids[:, None] == of[None, :]).any(axis=1)
