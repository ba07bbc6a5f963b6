"""Shared-prefix attention over a paged cache: a request's beams read their common blocks once, in place.

The beams of one request hold the same leading blocks (the prompt, and generated blocks no beam has left yet):
a :class:`beamkit.kv.PagedRows` table names the same block ids in those columns. Gathering every row's keys and
values into ``[rows, heads, L, d]`` copies that prefix once per beam and step; here attention is split in two
exact parts instead (the softmax of a union of key sets is recovered from the parts' maxima, sums and
unnormalised outputs):

- the **shared prefix** of each group of rows (consecutive rows whose tables agree on their leading full
  blocks): all the group's queries against the group's keys/values in one batched product per head, read
  from the pool in place (a run of consecutive block ids is a strided view of the head-first pool; other
  shared blocks are gathered once per group, never once per row);
- each row's **tail** (its positions after the shared prefix, the newest included): gathered per row, as they
  differ from row to row.

:func:`plan_prefix` does the host work once per step (every layer reads the same plan);
:func:`shared_prefix_attention` is one layer's attention. Groups are bucketed by size (powers of two of their
rows and shared blocks) so that many requests share one product per bucket and padding stays below 2x; a
bucket of a few groups whose blocks are runs of ids (the usual wide case) reads each group in place instead.

Requires torch (the ``torch`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

_NEG = float("-inf")
_IN_PLACE_GROUPS = 4  # a bucket of at most this many groups over runs of blocks reads each group in place


@dataclass(frozen=True)
class PrefixBucket:
    """Groups of rows whose shared prefixes are attended in one batched product.

    ``groups`` groups of at most ``width`` rows, each reading at most ``blocks`` shared blocks. The keys are the
    pool's blocks ``start .. start + blocks`` in place when ``block_ids`` is None (one group over a run of
    consecutive block ids), else ``block_ids`` ``[groups * blocks]`` gathered once per group. The queries are
    rows ``first .. first + groups * width`` when ``query_rows`` is None, else ``query_rows``
    ``[groups * width]`` (padding slots repeat a real row). ``key_mask`` ``[1, groups, 1, blocks * block_size]``
    is 0 / -inf (None: no padded key); ``keep`` ``[k]`` are the query slots holding real rows and ``targets``
    ``[k]`` those rows (None: every slot, in row order from ``first``).
    """

    groups: int
    width: int
    blocks: int
    start: int
    block_ids: Tensor | None
    first: int
    query_rows: Tensor | None
    key_mask: Tensor | None
    keep: Tensor | None
    targets: Tensor | None


@dataclass(frozen=True)
class PrefixPlan:
    """One step's reading plan for every layer (device tensors built once on the host).

    ``rows``: rows attending; ``buckets``: the shared prefixes; ``tail_slots`` ``[rows * tail]``: each row's
    positions after its shared prefix, as columns of a head of the pool viewed ``[heads, n_blocks * block_size,
    d]`` (padding reads column 0); ``tail_mask`` ``[1, rows, 1, tail]`` 0 / -inf, or None when no tail is padded;
    ``shared_positions`` / ``tail_positions``: positions read in place once per group / gathered per row (counts
    for the benchmarks and tests).
    """

    rows: int
    block_size: int
    buckets: tuple[PrefixBucket, ...]
    tail: int
    tail_slots: Tensor
    tail_mask: Tensor | None
    shared_positions: int
    tail_positions: int


def _groups(table: np.ndarray, length: np.ndarray, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each group ``[g]``, shared full blocks of each group ``[g]``) for rows in table order: a group
    is a run of consecutive rows with the same first block; its shared blocks are the leading columns every one
    of its rows names alike, before the block of any row's newest position (so every tail holds at least that
    position)."""
    first_block = table[:, 0]
    new = np.empty(first_block.shape[0], dtype=bool)
    new[:1] = True
    np.not_equal(first_block[1:], first_block[:-1], out=new[1:])
    starts = np.flatnonzero(new)  # shape: (g,)
    lead = starts[np.cumsum(new) - 1]  # shape: (rows,) first row of each row's group
    same = np.cumprod(table == table[lead], axis=1, dtype=np.int8).sum(axis=1)  # shape: (rows,) leading equal
    shared = np.minimum(same, (length - 1) // bs)  # full blocks before the block of the newest position
    return starts, np.minimum.reduceat(shared, starts)


def plan_prefix(table: np.ndarray, length: np.ndarray, block_size: int, device: torch.device | str) -> PrefixPlan:
    """The reading plan of rows with block tables ``table`` ``[rows, nb]`` (-1 past a row's blocks) holding
    ``length`` ``[rows]`` positions each (this step's included): see :class:`PrefixPlan`."""
    rows = int(length.shape[0])
    bs = block_size
    if rows == 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return PrefixPlan(0, bs, (), 0, empty, None, 0, 0)
    starts, shared = _groups(table, length, bs)
    sizes = np.diff(np.append(starts, rows))  # shape: (g,) rows per group
    # tails: each row's positions from its group's shared prefix on
    row_shared = np.repeat(shared, sizes) * bs  # shape: (rows,) first tail position
    tail_len = length - row_shared
    tail = int(tail_len.max())
    pos = row_shared[:, None] + np.arange(tail)[None, :]  # shape: (rows, tail)
    valid = pos < length[:, None]
    col = np.minimum(pos // bs, table.shape[1] - 1)
    block = np.take_along_axis(table, col, axis=1)
    slots = np.where(valid, block * bs + pos % bs, 0)
    tail_slots = torch.as_tensor(slots.reshape(-1), device=device)
    tail_mask = None
    if not valid.all():
        tail_mask = torch.as_tensor(np.where(valid, 0.0, _NEG)[None, :, None, :], dtype=torch.float32, device=device)
    buckets = []
    live = np.flatnonzero(shared > 0)
    keys = (np.log2(sizes[live]).astype(np.int64) << 32) | np.log2(shared[live]).astype(np.int64)
    for key in np.unique(keys):
        mine = live[keys == key]  # shape: (n,) groups of the bucket
        if mine.shape[0] <= _IN_PLACE_GROUPS and all(_run(table[starts[g], : shared[g]]) for g in mine):
            for g in mine:  # a few groups over runs of blocks: each read in place, one product each
                buckets.append(_bucket(table, starts[g : g + 1], sizes[g : g + 1], shared[g : g + 1], bs, device))
        else:
            buckets.append(_bucket(table, starts[mine], sizes[mine], shared[mine], bs, device))
    return PrefixPlan(
        rows, bs, tuple(buckets), tail, tail_slots, tail_mask, int((shared * bs).sum()), int(tail_len.sum())
    )


def _run(ids: np.ndarray) -> bool:
    """Whether block ids are consecutive (a strided view of the pool)."""
    return bool((np.diff(ids) == 1).all())


def _bucket(
    table: np.ndarray, starts: np.ndarray, sizes: np.ndarray, shared: np.ndarray, bs: int, device: torch.device | str
) -> PrefixBucket:
    """One bucket of groups (their first rows, row counts and shared blocks), padded to the largest."""
    n, width, blocks = int(starts.shape[0]), int(sizes.max()), int(shared.max())
    ids = table[starts, :blocks]  # shape: (n, blocks)
    padded_keys = shared < blocks
    ids = np.where(np.arange(blocks)[None, :] < shared[:, None], ids, 0)
    start, block_ids = 0, None
    if n == 1 and _run(ids[0]):
        start = int(ids[0, 0])  # a run of consecutive blocks: read in place
    else:
        block_ids = torch.as_tensor(ids.reshape(-1), device=device)
    key_mask = None
    if padded_keys.any():
        cols = np.arange(blocks * bs)[None, :] < (shared * bs)[:, None]  # shape: (n, blocks * bs)
        key_mask = torch.as_tensor(np.where(cols, 0.0, _NEG)[None, :, None, :], dtype=torch.float32, device=device)
    slot_rows = starts[:, None] + np.arange(width)[None, :]  # shape: (n, width)
    real = np.arange(width)[None, :] < sizes[:, None]
    first, query_rows, keep, targets = int(starts[0]), None, None, None
    in_order = bool(real.all()) and bool((np.diff(starts) == width).all())
    if not in_order:
        query_rows = torch.as_tensor(np.where(real, slot_rows, starts[:, None]).reshape(-1), device=device)
        keep = torch.as_tensor(np.flatnonzero(real.reshape(-1)), device=device)
        targets = torch.as_tensor(slot_rows[real], device=device)
    return PrefixBucket(n, width, blocks, start, block_ids, first, query_rows, key_mask, keep, targets)


def _partial(scores: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(max, sum of exp(scores - max), unnormalised output) of softmax(scores) @ values over the last axis, in
    the scores' dtype."""
    m = scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores - m)
    out = torch.matmul(e.to(values.dtype), values)
    return m, e.sum(dim=-1, keepdim=True), out.to(scores.dtype)


def shared_prefix_attention(
    plan: PrefixPlan, query: Tensor, k_pool: Tensor, v_pool: Tensor, scale: float, softcap: float | None = None
) -> Tensor:
    """One layer's attention of the plan's rows: ``query`` ``[rows, q_heads, 1, d]`` against the rows' keys and
    values in the pools ``[kv_heads, n_blocks, block_size, d]`` (q_heads a multiple of kv_heads: grouped
    queries), ``scale`` times the dot products (``softcap``: ``tanh(s / cap) * cap`` of the scaled ones).
    Returns ``[rows, q_heads, d]`` in ``query``'s dtype: softmax over each row's positions, merged exactly
    from the shared-prefix and tail parts (the sums in float32, or float64 for float64 queries)."""
    rows, q_heads, _, d = query.shape
    heads, _, bs, _ = k_pool.shape
    g = q_heads // heads
    q = (query[:, :, 0] * scale).view(rows, heads, g, d).transpose(0, 1)  # shape: (heads, rows, g, d)
    k_flat, v_flat = k_pool.view(heads, -1, d), v_pool.view(heads, -1, d)  # shape: (heads, n_blocks * bs, d)

    work = torch.promote_types(query.dtype, torch.float32)  # softmax sums in float32 at least

    def scores_of(qq: Tensor, kk: Tensor) -> Tensor:
        s = torch.matmul(qq, kk.transpose(-1, -2)).to(work)
        return s if softcap is None else torch.tanh(s / softcap) * softcap

    t = plan.tail
    k_tail = k_flat.index_select(1, plan.tail_slots).view(heads, rows, t, d)  # per-row data: the divergent tails
    v_tail = v_flat.index_select(1, plan.tail_slots).view(heads, rows, t, d)
    s_tail = scores_of(q.to(k_tail.dtype), k_tail)  # shape: (heads, rows, g, tail)
    if plan.tail_mask is not None:
        s_tail = s_tail + plan.tail_mask
    m, total, out = _partial(s_tail, v_tail)  # shape: (heads, rows, g, 1), (heads, rows, g, 1), (heads, rows, g, d)
    for b in plan.buckets:
        n, w, span = b.groups, b.width, b.blocks * bs
        if b.block_ids is None:  # in place: a view of the pool
            keys = k_pool[:, b.start : b.start + b.blocks].reshape(heads, 1, span, d)
            vals = v_pool[:, b.start : b.start + b.blocks].reshape(heads, 1, span, d)
        else:  # once per group, not per row
            keys = k_pool.index_select(1, b.block_ids).view(heads, n, span, d)
            vals = v_pool.index_select(1, b.block_ids).view(heads, n, span, d)
        if b.query_rows is None:
            qb = q[:, b.first : b.first + n * w]  # shape: (heads, n * w, g, d)
        else:
            qb = q.index_select(1, b.query_rows)
        s = scores_of(qb.reshape(heads, n, w * g, d).to(keys.dtype), keys)  # shape: (heads, n, w * g, span)
        if b.key_mask is not None:
            s = s + b.key_mask
        ms, ts, os = (x.view(heads, n * w, g, -1) for x in _partial(s, vals))
        if b.keep is not None:
            assert b.targets is not None
            ms, ts, os = (x.index_select(1, b.keep) for x in (ms, ts, os))
            mt, tt, ot = (x.index_select(1, b.targets) for x in (m, total, out))
        else:
            sl = slice(b.first, b.first + n * w)
            mt, tt, ot = m[:, sl], total[:, sl], out[:, sl]
        top = torch.maximum(mt, ms)
        a, c = torch.exp(mt - top), torch.exp(ms - top)
        merged = (top, tt * a + ts * c, ot * a + os * c)
        if b.targets is not None:
            for whole, part in zip((m, total, out), merged, strict=True):
                whole.index_copy_(1, b.targets, part)
        else:
            for whole, part in zip((m, total, out), merged, strict=True):
                whole[:, sl] = part
    att = (out / total).to(query.dtype)  # shape: (heads, rows, g, d)
    return att.transpose(0, 1).reshape(rows, q_heads, d)
