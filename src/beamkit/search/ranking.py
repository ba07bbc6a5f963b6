"""The engine's candidate order, shared by every policy and by the selectors that must predict it."""

from __future__ import annotations

import numpy as np


def rank_candidates(
    req: np.ndarray,
    key: np.ndarray,
    row: np.ndarray,
    tok: np.ndarray,
    valid: np.ndarray | bool = True,
    ordered: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The engine's candidate order: request, then key descending, then row (beam) and token ascending.

    Candidates whose key is not finite (or not ``valid``) are dropped. Returns ``(order, rank)``: indices of the
    kept candidates in that order, and each one's rank within its request. ``ordered``: the arrays are already
    by row ascending and, within a row, by key descending with equal keys by token ascending, so a stable sort
    by (request, key) gives the same order. Selectors that must predict which beams the engine keeps (diverse
    beam search) rank with this same function.
    """
    finite = np.isfinite(key) & valid
    neg_key = -key  # non-finite keys may sort anywhere (NaN last): they are dropped right after
    order = np.lexsort((neg_key, req) if ordered else (tok, row, neg_key, req))
    if not finite.all():
        order = order[finite[order]]
    sorted_req = req[order]
    return order, np.arange(order.shape[0]) - sorted_req.searchsorted(sorted_req)


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
