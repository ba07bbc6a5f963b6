"""The ranking's compiled kernel: each request's first candidates in the engine's order, from one pass over the
candidates grouped by request (:func:`head_scan`, compiled by numba when it is installed; without it, or with
``BEAMKIT_NO_JIT`` set, :func:`beamkit.search.ranking.rank_candidates` sorts with numpy). A module of its own:
numba compiles the plain function as it is written here."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

_head: Callable[..., int] | None = None
_head_tried = False


def head_scan(
    req: np.ndarray,
    key: np.ndarray,
    row: np.ndarray,
    tok: np.ndarray,
    valid: np.ndarray,
    limit: np.ndarray,
    order: np.ndarray,
    rank: np.ndarray,
) -> int:
    """Each request's first ``limit[r]`` candidates in the engine's order, from one pass over candidates grouped by
    request (ascending): written to ``order`` (indices) and ``rank`` (within the request); returns how many
    (plain Python; numba compiles it). A candidate counts when ``valid`` and its key is finite; one ranks before
    another by key descending, then row ascending, then token ascending, then index ascending. Each request holds
    its best so far, sorted, and a candidate enters when it ranks before the last one held (or while fewer than
    ``limit[r]`` are held): ``O(candidates * limit)``."""
    n = req.shape[0]
    out = 0
    s = 0
    while s < n:
        r = req[s]
        e = s
        while e < n and req[e] == r:
            e += 1
        k = limit[r]
        held = 0
        for i in range(s, e):
            a = key[i]
            if k <= 0 or not valid[i] or not (a > -np.inf and a < np.inf):
                continue
            if held == k:
                w = order[out + k - 1]
                b = key[w]
                if not (a > b or (a == b and (row[i] < row[w] or (row[i] == row[w] and tok[i] < tok[w])))):
                    continue
                p = k - 1
            else:
                p = held
                held += 1
            while p > 0:
                w = order[out + p - 1]
                b = key[w]
                if not (a > b or (a == b and (row[i] < row[w] or (row[i] == row[w] and tok[i] < tok[w])))):
                    break
                order[out + p] = w
                p -= 1
            order[out + p] = i
        for j in range(held):
            rank[out + j] = j
        out += held
        s = e
    return out


def compiled_head() -> Callable[..., int] | None:
    """The numba-compiled :func:`head_scan`, built on first use; None without numba or with ``BEAMKIT_NO_JIT``."""
    global _head, _head_tried
    if not _head_tried:
        _head_tried = True
        if not os.environ.get("BEAMKIT_NO_JIT"):
            try:
                import numba
            except ImportError:  # numba is optional (the ctc extra): numpy's sort ranks then
                return None
            try:
                _head = numba.njit(cache=True, nogil=True)(head_scan)
            except RuntimeError:  # no writable place for numba's cache: compile in each process
                _head = numba.njit(nogil=True)(head_scan)
    return _head
