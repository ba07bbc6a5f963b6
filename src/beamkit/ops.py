"""The few array operations the search needs, for numpy and torch.

The engine never calls numpy or torch directly on model outputs: it goes through these functions, so a backend
is one place. Work on ``[rows, V]`` arrays stays in the logits' own library and device; only ``[rows, m]``
candidate tables (m = a few times the beam size) and ``[rows]`` vectors come back to the host as numpy.
torch is imported lazily: numpy users never load it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

NEG_INF = float("-inf")


def is_torch(x: Any) -> bool:
    """Return True when ``x`` is a torch tensor (checked without importing torch)."""
    kind = type(x)
    known = _TENSOR_TYPES.get(kind)
    if known is None:
        known = _TENSOR_TYPES[kind] = kind.__module__.startswith("torch") and hasattr(x, "device")
    return known


_TENSOR_TYPES: dict[type, bool] = {np.ndarray: False}  # type -> is it a torch tensor (types don't change)


def torch_threads() -> int | None:
    """torch's CPU thread count, or None when torch has not been imported (it is not imported here)."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())


def set_torch_threads(count: int | None) -> int | None:
    """Set torch's CPU thread count to ``count`` (None: leave it) and return the count before; torch is imported
    only when a count is given and it is installed (without it there is nothing to set: None)."""
    if count is None:
        return torch_threads()
    try:
        import torch
    except ImportError:
        return None
    before = int(torch.get_num_threads())
    torch.set_num_threads(int(count))
    return before


@contextlib.contextmanager
def torch_threads_set(count: int | None) -> Iterator[None]:
    """Run the block with torch's CPU thread count at ``count`` (None: as it is), put back afterwards."""
    before = set_torch_threads(count)
    try:
        yield
    finally:
        if count is not None and before is not None:
            set_torch_threads(before)


@contextlib.contextmanager
def inference_mode(uses_torch: bool = True) -> Iterator[None]:
    """Run the block under ``torch.inference_mode()`` when ``uses_torch`` (torch then imported), else as it is."""
    if not uses_torch:
        yield
        return
    import torch

    with torch.inference_mode():
        yield


def is_array(x: Any) -> bool:
    """Return True for numpy arrays and torch tensors with at least one dimension (the gatherable leaves)."""
    if isinstance(x, np.ndarray):
        return x.ndim >= 1
    return is_torch(x) and x.dim() >= 1


def to_numpy(x: Any) -> np.ndarray:
    """Copy a small array (a ``[rows]`` or ``[rows, m]`` table) to a host numpy array."""
    if is_torch(x):
        x = x.detach()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):  # numpy has no bfloat16
            x = x.double()
        return x.cpu().numpy()
    return np.asarray(x)


def cpu_view(x: Any) -> Any:
    """A zero-copy numpy view of a CPU float32/float64 torch tensor (numpy's kernels are faster there), else x.

    Nothing moves between devices: a CUDA tensor, or a dtype numpy lacks (bfloat16, float16), stays as it is.
    """
    if is_torch(x) and x.device.type == "cpu" and not x.requires_grad and str(x.dtype) in _NUMPY_FLOATS:
        return x.numpy()
    return x


_NUMPY_FLOATS = ("torch.float32", "torch.float64")


def like(values: np.ndarray, ref: Any) -> Any:
    """Return host ``values`` in the library and on the device of ``ref`` (numpy stays numpy)."""
    if is_torch(ref):
        import torch

        if ref.device.type == "cpu":  # shares the host memory, no copy
            return torch.from_numpy(np.ascontiguousarray(values))
        return torch.as_tensor(values, device=ref.device)
    return values


def check_logits(logits: Any, rows: int) -> None:
    """Raise ValueError unless ``logits`` is a float ``[rows, V]`` array with V >= 1."""
    if not (isinstance(logits, np.ndarray) or is_torch(logits)):
        raise TypeError(f"step_fn must return logits as a numpy array or torch tensor, got {type(logits).__name__}")
    shape = tuple(logits.shape)
    if len(shape) != 2 or shape[0] != rows or shape[1] < 1:
        raise ValueError(f"step_fn returned logits of shape {shape}; expected [{rows}, V] for the {rows} rows sent")
    kind = str(logits.dtype)
    if "float" not in kind:
        raise TypeError(f"logits must be floating point, got dtype {kind}")


def logsumexp(x: Any) -> np.ndarray:
    """Row-wise log-sum-exp of ``[rows, V]`` logits, returned on the host as float64 ``[rows]``.

    NaN anywhere in a row gives NaN, +inf gives +inf and an all ``-inf`` row gives ``-inf``: the engine uses
    that to validate rows without another pass over the logits. Float32/float64 rows take two passes, ``exp``
    then a sum in the logits' dtype, with no max shift; the few rows where that over- or underflows (or holds
    NaN / inf) are redone with the shift. bfloat16 / float16 are summed from float32. CPU tensors are read
    through a zero-copy numpy view (numpy's chunked exp is faster there); accelerator tensors stay on their device.
    """
    x = cpu_view(x)
    if is_torch(x) and str(x.dtype) not in _NUMPY_FLOATS:
        x = cpu_view(x.float())
    if is_torch(x):  # on an accelerator
        sums = to_numpy(x.exp().sum(dim=1))  # shape: (rows,) on the host
    else:
        x = np.asarray(x)
        if x.dtype != np.float32 and x.dtype != np.float64:
            x = x.astype(np.float64)
        sums = _exp_sums(x)
    return _log_of_sums(x, sums)


_CHUNK = 1 << 18  # elements of a numpy [rows, V] table exponentiated at a time: the rows and their buffer stay in cache
_TOP_CHUNK = 1 << 20  # elements of a numpy table whose group maxima are taken at a time (no exp buffer beside them)
_TINY_SUM = 1e-30  # a sum of exps below this may have lost precision to underflow: redo the row with a shift


def _chunk_rows(v: int, chunk: int | None = None) -> int:
    """Rows of a ``[rows, v]`` numpy table per chunk of ``chunk`` elements (default ``_CHUNK``), at least one."""
    return max(1, (_CHUNK if chunk is None else chunk) // max(1, v))


def _row_chunks(x: np.ndarray) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """``(rows, part, buf)`` for each chunk of rows of a ``[rows, V]`` numpy table: the rows' slice, their view
    ``part`` and a scratch array of its shape, one buffer reused by every chunk (so it stays in cache)."""
    n, v = x.shape
    step = _chunk_rows(v)
    buf = np.empty((min(step, n), v), dtype=x.dtype)  # shape: (step, V)
    for lo in range(0, n, step):
        rows = slice(lo, lo + step)
        part = x[rows]
        yield rows, part, buf[: part.shape[0]]


def _exp_sums(x: np.ndarray) -> np.ndarray:
    """Row sums of ``exp(x)`` in x's dtype (float32 / float64), no shift: chunks of rows through one buffer.

    Bit for bit ``np.exp(x).sum(axis=1)``: each row is exponentiated element-wise and summed by numpy's pairwise
    sum along the row, whatever the chunk; the chunks only keep the exp buffer in cache and skip a big temporary.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if _chunk_rows(x.shape[1]) >= x.shape[0]:
            return np.exp(x).sum(axis=1)
        sums = np.empty(x.shape[0], dtype=x.dtype)  # shape: (rows,)
        for rows, part, e in _row_chunks(x):
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
        for rows, part, e in _row_chunks(x):
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
    if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64) and x.ndim == 2 and x.size >= _LARGE:
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
        for rows, part, e in _row_chunks(x):
            np.exp(part, out=e)
            lse = _log_of_sums(part, np.add.reduce(e, axis=1))  # shape: (k,) float64
            np.subtract(part, lse[:, None].astype(x.dtype), out=out[rows])
    return out


def copy(x: Any) -> Any:
    """A copy of ``x`` in its own library, device and dtype."""
    return x.clone() if is_torch(x) else np.array(x, copy=True)


def fill(x: Any, rows: np.ndarray, cols: np.ndarray, value: float) -> Any:
    """Set ``x[rows[i], cols[i]] = value`` in place (a mask scatter) and return ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        x[r, c] = value
        return x
    x[rows, cols] = value
    return x


def add_at(x: Any, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> Any:
    """``x[rows[i], cols[i]] += values[i]`` in place (repeated pairs add up) and return ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        index = (torch.as_tensor(rows, device=x.device), torch.as_tensor(cols, device=x.device))
        x.index_put_(index, torch.as_tensor(values, device=x.device, dtype=x.dtype), accumulate=True)
        return x
    np.add.at(x, (rows, cols), np.asarray(values, dtype=x.dtype))
    return x


def gather_rows(x: Any, idx: np.ndarray) -> Any:
    """Return ``x[idx]`` along axis 0 (rows may repeat), in ``x``'s library and device."""
    if is_torch(x):
        return x.index_select(0, _torch_index(idx, x.device))
    return x[idx]


def _torch_index(idx: np.ndarray, device: Any) -> Any:
    """A host index array as a torch tensor on ``device`` (a zero-copy view on the CPU)."""
    import torch

    if device.type == "cpu" and isinstance(idx, np.ndarray) and idx.dtype == np.int64 and idx.flags.writeable:
        return torch.from_numpy(np.ascontiguousarray(idx))
    return torch.as_tensor(idx, device=device)


def concat_rows(parts: list[Any]) -> Any:
    """Concatenate arrays along axis 0 in their own library."""
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=0)
    return np.concatenate(parts, axis=0)


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


_LARGE = 1 << 20  # rows * V from which the threshold selection is used


def _threshold_path(rows: int, v: int, m: int) -> bool:
    """Whether a ``[rows, v]`` table's top ``m`` (already cut to ``<= v``) takes the group-maximum threshold."""
    return rows * v >= _LARGE and 1 <= m < v and v >= 8 * m


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
    step = _chunk_rows(v, _TOP_CHUNK)  # rows per chunk
    in_group = nb * np.arange(bs)  # shape: (bs,) column offsets of a group's entries
    parts_r, parts_c, parts_v = [], [], []
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            part = view[lo:hi]  # shape: (k, bs, nb)
            group_max = part.max(axis=1)  # shape: (k, nb)
            t = _fold_threshold(group_max, m)  # shape: (k,) m entries of each row are >= t
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
    for row in np.flatnonzero(counts < m):  # NaN rows: comparisons fail
        out_idx[row] = _exact_top_row(x[row].astype(np.float64), m)
        out_val[row] = x[row, out_idx[row]]
    return out_val, out_idx


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


def dtype_kind(x: Any) -> str:
    """The kind of an array's values as numpy names it: "f" float, "i" integer (signed or not), "b" bool, "c"
    complex, "O" object; a torch tensor's dtype is read the same way."""
    dtype = x.dtype
    if isinstance(dtype, np.dtype):
        return "i" if dtype.kind == "u" else dtype.kind
    if dtype.is_complex:  # a torch dtype
        return "c"
    if dtype.is_floating_point:
        return "f"
    return "b" if str(dtype) == "torch.bool" else "i"


def to_library(x: Any, ref: Any) -> Any:
    """``x`` (numpy or torch, its dtype kept) in the library and on the device of ``ref``."""
    if is_torch(ref):
        import torch

        return x.to(device=ref.device) if is_torch(x) else torch.as_tensor(np.asarray(x), device=ref.device)
    return to_numpy(x)


def plus_offset64(scores: Any, offset: np.ndarray) -> Any:
    """``scores + offset[:, None]`` in float64, in the scores' library and device (``[rows, V]``)."""
    if is_torch(scores):
        import torch

        return scores.double() + torch.as_tensor(offset, device=scores.device)[:, None]
    return np.asarray(scores, dtype=np.float64) + offset[:, None]


def take_cols(x: Any, cols: np.ndarray) -> Any:
    """``x[:, cols]`` (columns may repeat) in ``x``'s library and device."""
    if is_torch(x):
        import torch

        return x.index_select(1, torch.as_tensor(cols, device=x.device))
    return x[:, cols]


def where_cols(x: Any, missing: np.ndarray, fill: Any) -> Any:
    """``x`` ``[rows, V]`` with the columns ``missing`` (bool ``[V]``) replaced by ``fill`` (a float, or a
    ``[rows, 1]`` column in ``x``'s library); a new array."""
    if is_torch(x):
        import torch

        mask = torch.as_tensor(missing, device=x.device)[None, :]
        value = fill if is_torch(fill) else torch.as_tensor(fill, dtype=x.dtype, device=x.device)
        return torch.where(mask, value, x)
    return np.where(missing[None, :], fill, x)


def row_max(x: Any) -> np.ndarray:
    """The maximum of each row of ``x`` ``[rows, V]``, on the host as float64 ``[rows]``: NaN anywhere in a row
    gives NaN, else +inf when the row holds one, -inf for an all ``-inf`` row (one cheap pass, no exp)."""
    x = cpu_view(x)
    if is_torch(x):
        return to_numpy(x.amax(dim=1)).astype(np.float64)
    return np.asarray(x).max(axis=1).astype(np.float64)


def row_min(x: Any) -> Any:
    """The minimum of each row of ``x`` ``[rows, V]``, as a ``[rows, 1]`` column in ``x``'s library."""
    if is_torch(x):
        return x.amin(dim=1, keepdim=True)
    return x.min(axis=1, keepdims=True)


def pick(x: Any, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``x[rows[i], cols[i]]`` for every i, as a float64 host vector (only the picked values leave the device)."""
    if is_torch(x):
        import torch

        picked = x[torch.as_tensor(rows, device=x.device), torch.as_tensor(cols, device=x.device)]
        return to_numpy(picked).astype(np.float64)
    return np.asarray(x[rows, cols], dtype=np.float64)


def gather_cols(x: Any, idx: np.ndarray) -> np.ndarray:
    """``x[r, idx[r, j]]`` for a ``[rows, V]`` array and host ``idx`` ``[rows, m]``, as float64 on the host."""
    if is_torch(x):
        import torch

        return to_numpy(x.gather(1, torch.as_tensor(idx, device=x.device))).astype(np.float64)
    return np.take_along_axis(x, idx, axis=1).astype(np.float64)


def keep_only(x: Any, rows: np.ndarray, cols: np.ndarray) -> Any:
    """Set every entry of the rows ``rows`` to ``-inf`` except column ``cols[i]`` of row ``rows[i]``, in place;
    returns ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        kept = x[r, c].clone()
        x[r] = float("-inf")
        x[r, c] = kept
        return x
    kept = x[rows, cols].copy()
    x[rows] = float("-inf")
    x[rows, cols] = kept
    return x


def penalize_at(x: Any, rows: np.ndarray, cols: np.ndarray, penalty: float) -> Any:
    """``x[rows[i], cols[i]]`` multiplied by ``penalty`` where negative, divided by it elsewhere (pairs distinct),
    in place; returns ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        v = x[r, c]
        x[r, c] = torch.where(v < 0, v * penalty, v / penalty)
        return x
    v = x[rows, cols]
    x[rows, cols] = np.where(v < 0, v * penalty, v / penalty)
    return x


def sort_desc(x: Any) -> Any:
    """Each row of ``x`` ``[rows, V]`` sorted in descending order, in ``x``'s library and device."""
    if is_torch(x):
        return x.sort(dim=1, descending=True).values
    return -np.sort(-x, axis=1)


def cumsum_exp(x: Any) -> np.ndarray:
    """Row-wise cumulative sum of ``exp(x)`` for ``[rows, V]``, on the host."""
    if is_torch(x):
        return to_numpy(x.exp().cumsum(dim=1))
    return np.cumsum(np.exp(x), axis=1)


def mask_below(x: Any, threshold: np.ndarray) -> Any:
    """``x`` ``[rows, V]`` with every entry below its row's ``threshold`` (host ``[rows]``) set to ``-inf``; a new
    array in ``x``'s library."""
    if is_torch(x):
        import torch

        thr = torch.as_tensor(threshold, device=x.device, dtype=x.dtype)[:, None]
        return torch.where(x >= thr, x, torch.full_like(x, float("-inf")))
    return np.where(x >= threshold[:, None], x, float("-inf"))


def is_generator(x: Any) -> bool:
    """True for a random generator the samplers can draw from: a ``numpy.random.Generator`` or a
    ``torch.Generator`` (checked without importing torch)."""
    return isinstance(x, np.random.Generator) or type(x).__module__.startswith("torch")


def gumbel(rng: Any, shape: tuple[int, ...], ref: Any) -> Any:
    """Standard Gumbel noise of ``shape`` as float64 from ``rng`` (a numpy or torch generator), in the library
    and on the device of ``ref``."""
    if isinstance(rng, np.random.Generator):
        return like(rng.gumbel(size=shape), ref)
    import torch

    u = torch.rand(shape, generator=rng, dtype=torch.float64, device=rng.device)
    tiny = torch.finfo(torch.float64).tiny
    g = -torch.log(-torch.log(u.clamp(min=tiny)))
    return g.to(ref.device) if is_torch(ref) else g.cpu().numpy()


def uniform(rng: Any, shape: tuple[int, ...], ref: Any) -> Any:
    """Uniform noise on ``[0, 1)`` of ``shape`` as float64 from ``rng`` (a numpy or torch generator), in the
    library and on the device of ``ref``."""
    if isinstance(rng, np.random.Generator):
        return like(rng.random(size=shape), ref)
    import torch

    u = torch.rand(shape, generator=rng, dtype=torch.float64, device=rng.device)
    return u.to(ref.device) if is_torch(ref) else u.cpu().numpy()


def div_rows(x: Any, d: np.ndarray) -> Any:
    """``x / d[:, None]`` for ``x`` ``[rows, V]`` and host ``d`` ``[rows]``, in ``x``'s library, device and dtype."""
    if is_torch(x):
        import torch

        return x / torch.as_tensor(d, device=x.device, dtype=x.dtype)[:, None]
    return (x / np.asarray(d, dtype=np.float64)[:, None]).astype(x.dtype, copy=False)


def nucleus_size(srt: Any, p: float) -> np.ndarray:
    """For rows of log-probabilities sorted descending (``[rows, V]``), how many lead entries have a mass before
    them below ``p`` (at least 1), as host int64 ``[rows]``; the sums stay on the device."""
    rows = int(srt.shape[0])
    if is_torch(srt):
        import torch

        cum = srt.exp().cumsum(dim=1)  # shape: (rows, V)
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)
        n = to_numpy((before < p).sum(dim=1)).astype(np.int64)
    else:
        acc = np.cumsum(np.exp(srt), axis=1)
        ahead = np.concatenate([np.zeros((rows, 1), dtype=acc.dtype), acc[:, :-1]], axis=1)
        n = (ahead < p).sum(axis=1).astype(np.int64)
    return np.maximum(n, 1)


def inverse_cdf(log_weights: Any, u: Any) -> np.ndarray:
    """Draws with replacement by inverse transform sampling: for each row of ``log_weights`` ``[rows, V]``
    (unnormalised log-weights; ``-inf`` is never drawn) and each uniform of ``u`` ``[rows, m]`` (on ``[0, 1)``,
    in the weights' library), the first column whose cumulative probability under ``softmax(row)`` exceeds the
    uniform. Host int64 ``[rows, m]``; a row without a finite weight gives arbitrary columns (the caller drops
    them). The cumulative sums stay on the device; only the ``[rows, m]`` columns come back."""
    rows, v = int(log_weights.shape[0]), int(log_weights.shape[1])
    if is_torch(log_weights):
        import torch

        w = log_weights.double()
        top = w.amax(dim=1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        prob = (w - top).exp()  # shape: (rows, V) weights relative to the row's largest
        cum = prob.cumsum(dim=1)
        target = u.to(device=cum.device, dtype=torch.float64) * cum[:, -1:]  # shape: (rows, m)
        col = torch.searchsorted(cum, target.contiguous(), right=True)
        ids = torch.arange(v, device=cum.device)
        last = torch.where(prob > 0, ids, torch.zeros_like(ids)).amax(dim=1, keepdim=True)  # last drawable column
        return to_numpy(torch.minimum(col, last)).astype(np.int64)
    x = np.asarray(log_weights, dtype=np.float64)
    peak = x.max(axis=1, keepdims=True) if v else np.zeros((rows, 1))
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(invalid="ignore"):
        rel = np.exp(x - peak)  # shape: (rows, V) weights relative to the row's largest
    acc = np.cumsum(rel, axis=1)
    goal = np.asarray(u, dtype=np.float64) * acc[:, -1:]  # shape: (rows, m)
    found = np.empty(goal.shape, dtype=np.int64)
    for r in range(rows):  # one binary search per row: [rows, m] work, no [rows, m, V] table
        found[r] = np.searchsorted(acc[r], goal[r], side="right")
    end = np.where(rel > 0, np.arange(v), 0).max(axis=1, keepdims=True) if v else np.zeros((rows, 1), np.int64)
    return np.minimum(found, end)


def keep_pairs(x: Any, rows: np.ndarray, cols: np.ndarray, among: np.ndarray | None = None) -> Any:
    """Set every entry of the rows ``among`` of ``x`` ``[rows, V]`` (None: all rows) to ``-inf`` except
    ``x[rows[i], cols[i]]``, in place (a row of ``among`` with no pair becomes all ``-inf``); returns ``x``. One
    write of the rows and one gather / scatter of the kept entries, no ``[rows, V]`` mask."""
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        kept = x[r, c].clone()
        if among is None:
            x.fill_(float("-inf"))
        else:
            x[torch.as_tensor(among, device=x.device)] = float("-inf")
        x[r, c] = kept
        return x
    kept = x[rows, cols].copy()
    if among is None:
        x.fill(-np.inf)
    else:
        x[among] = -np.inf
    x[rows, cols] = kept
    return x
