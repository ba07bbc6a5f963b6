"""The top ``m`` entries of each row of a ``[rows, V]`` table, ties to the lowest column, exactly: a partial
selection checked at its boundary, or on large numpy tables a group-maximum threshold and a sort of the few entries
above it."""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit.ops.backend import NUMPY_FLOATS, cpu_view, is_torch, to_numpy
from beamkit.ops.chunks import LARGE_TABLE, TOP_CHUNK, chunk_rows


def top_candidates(x: Any, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``m`` largest entries of each row of ``x`` ``[rows, V]``, ties to the lowest column.

    Returns host arrays ``(values float64 [rows, m'], columns int64 [rows, m'])`` with ``m' = min(m, V)``, each
    row ordered by value descending, then column ascending. The selected *set* obeys the tie rule exactly: a
    partial selection (torch ``topk``, numpy ``argpartition``) is checked at its boundary and a row whose m-th
    and (m+1)-th values are equal is redone; large numpy tables sort the few entries above a group-maximum
    threshold instead.
    """
    rows, v = int(x.shape[0]), int(x.shape[1])
    m = min(m, v)
    large = _threshold_path(rows, v, m)
    if large:
        x = cpu_view(x)  # numpy's threshold selection beats torch's topk on big CPU tables
    if large and not is_torch(x):
        vals, idx = _top_by_block_threshold(x, m)
    elif is_torch(x) and m < v:
        vals_t, idx_t = x.topk(m + 1, dim=1, largest=True, sorted=True)  # shape: (rows, m + 1), value descending
        vals, idx = to_numpy(vals_t).astype(np.float64), to_numpy(idx_t)
        if not (vals[:, 1:] == vals[:, :-1]).any():  # no equal neighbours: set and order are exact as they are
            return vals[:, :m], idx[:, :m]
        vals, idx = _mend_ties(x, vals, idx, m)
    elif m == v:
        idx = np.lexsort((np.broadcast_to(np.arange(v), (rows, v)), -to_numpy(x)), axis=1).astype(np.int64)
        vals = np.take_along_axis(to_numpy(x), idx, axis=1).astype(np.float64)
    else:
        vals, idx = _partial_top(x, m)
    return _order_rows(vals, idx)


def _threshold_path(rows: int, v: int, m: int) -> bool:
    """Whether a ``[rows, v]`` table's top ``m`` (already cut to ``<= v``) takes the group-maximum threshold."""
    return rows * v >= LARGE_TABLE and 1 <= m < v and v >= 8 * m


def _order_rows(vals: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order each row of ``[rows, m]`` candidates by value descending, then column ascending.

    NaN-free (the engine rejects NaN rows first). A partial selection comes sorted by value; only rows with
    equal neighbours may need their columns reordered.
    """
    rows, m = vals.shape
    if rows == 0 or (m > 1 and not (vals[:, 1:] >= vals[:, :-1]).any()):
        return vals, idx
    order = np.lexsort((idx, -vals), axis=1)
    return np.take_along_axis(vals, order, axis=1), np.take_along_axis(idx, order, axis=1)


def _partial_top(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy top ``m < V`` per row by a partial selection plus the (m+1)-th value to detect boundary ties."""
    v = x.shape[1]
    part = np.argpartition(x, v - m - 1, axis=1)  # shape: (rows, V); the last m are the m largest
    idx = part[:, v - m :].astype(np.int64)
    vals = np.take_along_axis(x, idx, axis=1).astype(np.float64)
    nxt = x[np.arange(x.shape[0]), part[:, v - m - 1]].astype(np.float64)
    vals, idx = np.concatenate([vals, nxt[:, None]], axis=1), np.concatenate([idx, idx[:, :1]], axis=1)
    return _mend_ties(x, vals, idx, m)


def _mend_ties(x: Any, vals: np.ndarray, idx: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``[rows, m + 1]`` partial selections to m, redoing rows whose m-th and (m+1)-th values tie."""
    nxt = vals[:, m]
    tied = np.flatnonzero(vals[:, :m].min(axis=1) == nxt)
    vals, idx = vals[:, :m].copy(), idx[:, :m].copy()
    for r in tied:
        row = to_numpy(x[int(r)]).astype(np.float64)
        idx[r] = _exact_top_row(row, m)
        vals[r] = row[idx[r]]
    return vals, idx


def _top_by_block_threshold(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy top-m per row (``1 <= m``, ``8 m <= V``) without a full partition: a threshold, then an exact sort.

    Columns are split into ``nb`` strided groups (group g holds columns ``g, g + nb, g + 2 nb, ...``), and the
    group maxima of a row are folded in halves into ``4 m`` to ``8 m`` maxima of disjoint sets of groups. The m-th
    largest of those, ``t``, is reached by m distinct entries, so every entry of the exact top m (ties to the
    lowest column included) is ``>= t`` and lies in a group whose maximum is ``>= t``, or in the tail columns;
    only those few entries are gathered and sorted. The table is read in chunks of rows, each chunk's groups
    gathered while it is in cache. Returns ``(values float64 [rows, m], columns int64 [rows, m])``, each row
    ordered by value descending, then column ascending.
    """
    rows, v = x.shape
    top = max(1, min(32, v // 128, v // (4 * m)))
    bs = next((b for b in range(top, max(1, top // 2) - 1, -1) if v % b == 0), top)  # columns per group
    nb = v // bs  # number of groups, >= 4 m
    flat = x.flags.c_contiguous
    if flat and nb * bs == v:
        view = x.reshape(rows, bs, nb)  # shape: (rows, bs, nb); group g = column g + nb * j
    else:  # the first nb * bs columns, as a view without a copy
        view = np.lib.stride_tricks.as_strided(x, (rows, bs, nb), (x.strides[0], nb * x.strides[1], x.strides[1]))
    step = chunk_rows(v, TOP_CHUNK)  # rows per chunk
    in_group = nb * np.arange(bs)  # shape: (bs,) column offsets of a group's entries
    parts_r, parts_c, parts_v = [], [], []
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            part = view[lo:hi]  # shape: (k, bs, nb)
            group_max = part.max(axis=1)  # shape: (k, nb)
            t = _fold_threshold(group_max, m)  # shape: (k,) m entries of each row are >= t
            # a row with fewer than m finite entries (a masked row: a dictionary's few allowed ids) has t = -inf,
            # which every entry reaches: take its finite entries only, the -inf ones are filled in below
            t = np.where(t == -np.inf, np.finfo(x.dtype).min, t).astype(x.dtype)
            gr, gg = np.divmod(np.flatnonzero(group_max >= t[:, None]), nb)  # shape: (n,) groups that may hold one
            # shape: (n, bs) the entries of those groups
            vals = np.take(x[lo:hi].reshape(-1), (gr * v + gg)[:, None] + in_group) if flat else part[gr, :, gg]
            gi, j = np.divmod(np.flatnonzero(vals >= t[gr, None]), bs)  # the top m are all >= t; most entries not
            parts_r.append(gr[gi] + lo)
            parts_c.append(gg[gi] + nb * j)
            parts_v.append(vals[gi, j])
            if nb * bs < v:  # tail columns outside the groups
                tr, tc = np.divmod(np.flatnonzero(x[lo:hi, nb * bs :] >= t[:, None]), v - nb * bs)
                parts_r.append(tr + lo)
                parts_c.append(tc + nb * bs)
                parts_v.append(x[tr + lo, tc + nb * bs])
    r = np.concatenate(parts_r)
    c = np.concatenate(parts_c)
    val = np.concatenate(parts_v)
    r, c, val = _sort_candidates(r, c, val, rows, v)
    counts = np.bincount(r, minlength=rows)  # shape: (rows,)
    rank = np.arange(r.shape[0]) - (np.cumsum(counts) - counts)[r]
    keep = rank < m
    out_idx = np.zeros((rows, m), dtype=np.int64)
    out_val = np.full((rows, m), np.nan)
    out_idx[r[keep], rank[keep]] = c[keep]
    out_val[r[keep], rank[keep]] = val[keep]
    short = np.flatnonzero(counts < m)  # rows with fewer than m finite entries, or with NaN
    if short.size:
        nan = np.isnan(x[short]).any(axis=1)
        _fill_with_neg_inf(x, short[~nan], counts, out_val, out_idx, m)
        for row in short[nan]:  # NaN rows: comparisons fail
            out_idx[row] = _exact_top_row(x[row].astype(np.float64), m)
            out_val[row] = x[row, out_idx[row]]
    return out_val, out_idx


def _fill_with_neg_inf(
    x: np.ndarray, rows: np.ndarray, counts: np.ndarray, out_val: np.ndarray, out_idx: np.ndarray, m: int
) -> None:
    """Complete the top m of ``rows`` (all their ``counts`` finite entries already placed first) with their
    lowest ``-inf`` columns, in column order (ties to the lowest column), in place. A row's first m columns hold
    at least ``m - counts`` of its ``-inf`` entries, so only they are read."""
    if rows.size == 0:
        return
    neg = x[rows, :m] == -np.inf  # shape: (k, m)
    nth = np.cumsum(neg, axis=1)  # shape: (k, m) the how-many-th -inf entry of its row each is
    need = (m - counts[rows])[:, None]  # shape: (k, 1)
    ri, col = np.nonzero(neg & (nth <= need))  # row-major: each row's columns ascending
    rank = counts[rows][ri] + nth[ri, col] - 1
    out_idx[rows[ri], rank] = col
    out_val[rows[ri], rank] = -np.inf


def _fold_threshold(group_max: np.ndarray, m: int) -> np.ndarray:
    """A value per row of ``[k, nb]`` group maxima (``nb >= 4 m``) that at least m entries of the row reach.

    The maxima are folded in halves (column i with column i + h) while ``4 m`` or more columns would remain, so
    each column is the maximum of a disjoint set of groups; the m-th largest column is the threshold.
    """
    folded, w = group_max, group_max.shape[1]
    while w >= 8 * m:
        h = w // 2
        folded, w = np.maximum(folded[:, :h], folded[:, h : 2 * h]), h  # shape: (k, h)
    return np.partition(folded, w - m, axis=1)[:, w - m]


def _sort_candidates(
    r: np.ndarray, c: np.ndarray, val: np.ndarray, rows: int, v: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Order candidate entries by row, then value descending, then column; values come back as float64.

    float32 values (NaN-free, no ``-0.0``) sort as one uint64 key ``row | descending value bits | column`` when
    that fits in 64 bits (the value decoded from its bits, exactly); else a three-key lexsort.
    """
    cb, rb = max(1, (v - 1).bit_length()), max(1, (rows - 1).bit_length())
    if val.dtype == np.float32 and rb + 32 + cb <= 64:
        bits = val.view(np.uint32)
        if not (bits == 0x80000000).any():  # -0.0 would sort apart from +0.0 (equal values tie by column)
            asc = np.where(bits >> 31, ~bits, bits | 0x80000000)  # uint32, increasing with the value
            key = (r.astype(np.uint64) << (32 + cb)) | ((~asc).astype(np.uint64) << cb) | c.astype(np.uint64)
            key.sort()
            asc = ~((key >> cb) & 0xFFFFFFFF).astype(np.uint32)
            bits = np.where(asc >> 31, asc & 0x7FFFFFFF, ~asc)
            rc = (key >> (32 + cb)).astype(np.intp), (key & ((1 << cb) - 1)).astype(np.int64)
            return rc[0], rc[1], bits.view(np.float32).astype(np.float64)
    val = val.astype(np.float64)
    order = np.lexsort((c, -val, r))
    return r[order], c[order].astype(np.int64), val[order]


def _exact_top_row(row: np.ndarray, m: int) -> np.ndarray:
    """The m largest columns of one row under the lowest-column tie rule (slow path for boundary ties)."""
    order = np.lexsort((np.arange(row.shape[0]), -row))
    return order[:m].astype(np.int64)


def device_lse_and_top(x: Any, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise log-sum-exp and the ``m`` best entries of a tensor ``x`` ``[rows, V]`` that stays on its device.

    Float32 / float64 with ``m`` < V (not on MPS, which has no float64): one transfer to the host, the sums of
    ``exp``, the ``m + 1`` best values and their columns packed in one float64 table (columns below 2^53 are
    exact in float64); else :func:`beamkit.ops.logsumexp` then :func:`top_candidates`. The same results as
    those two either way (rows that need a shifted sum or a tie mended read ``x`` again). Returns host arrays
    ``(lse float64 [rows], values float64 [rows, m'], columns int64 [rows, m'])``, ``m' = min(m, V)``.
    """
    import torch

    from beamkit.ops.normalize import _log_of_sums, logsumexp

    if not (m < int(x.shape[1]) and str(x.dtype) in NUMPY_FLOATS and x.device.type != "mps"):
        return logsumexp(x), *top_candidates(x, m)

    sums = x.exp().sum(dim=1)  # shape: (rows,), in x's dtype, as logsumexp
    vals, cols = x.topk(m + 1, dim=1, largest=True, sorted=True)  # shape: (rows, m + 1), value descending
    packed = torch.cat([sums[:, None].double(), vals.double(), cols.double()], dim=1)  # shape: (rows, 2m + 3)
    host = to_numpy(packed)  # the one device-to-host transfer
    lse = _log_of_sums(x, host[:, 0].astype(np.float32 if str(x.dtype) == "torch.float32" else np.float64))
    top_vals, top_cols = host[:, 1 : m + 2], host[:, m + 2 :].astype(np.int64)
    if not (top_vals[:, 1:] == top_vals[:, :-1]).any():  # no equal neighbours: set and order exact as they are
        return lse, top_vals[:, :m], top_cols[:, :m]
    return lse, *_order_rows(*_mend_ties(x, top_vals, top_cols, m))
