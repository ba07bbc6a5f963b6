"""A paged key/value cache: beams share the blocks they have in common, a block is copied only when written.

One preallocated pool per layer holds keys and values in blocks of ``block_size`` positions, head first
(``[heads, n_blocks, block_size, d_head]``: the blocks of a run of block ids are one strided view per head, so
attention can read a shared prefix in place, see :mod:`beamkit.kv.attention`). Each row (hypothesis) owns a
*block table* (the ids of its blocks, in order) and a length. Forking rows by parent (``beamkit_select``, the
engine's gather) copies tables and raises reference counts, never block contents; appending a position to a
partial block that other rows also hold copies that one block first (copy-on-write); blocks whose count drops
to zero return to the free list. Full blocks are never copied, and nothing is ever recomputed.

Handles (:class:`PagedRows`) are *linear*: ``beamkit_select``, ``beamkit_concat`` and :meth:`PagedRows.append`
consume the handle they are called on and return the one that now owns its references; using a consumed handle
raises. A handle dropped without being consumed (a finished or cancelled request's state) releases its blocks
when it is garbage collected, or at once with :meth:`PagedRows.release`.

Requires torch (the ``torch`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from beamkit._checks import check_int
from beamkit.kv.attention import PrefixPlan, plan_prefix, shared_prefix_attention


class CacheFullError(RuntimeError):
    """The pool has fewer free blocks than an operation needs (nothing was changed)."""


def _pad_table(table: np.ndarray, nb: int) -> np.ndarray:
    """A block table ``[rows, w]`` widened to ``nb`` columns with -1 (a new array either way)."""
    rows, w = table.shape
    out = np.full((rows, max(nb, w)), -1, dtype=table.dtype)  # shape: (rows, max(nb, w)); np.pad is slower
    out[:, :w] = table
    return out


class PagedKVCache:
    """A block pool per layer for self-attention keys and values, with reference counts and a free list.

    ``PagedKVCache(layers, heads, d_head, n_blocks, block_size=16, dtype=torch.float32, device="cpu")``
    preallocates ``2 * layers`` tensors of ``[heads, n_blocks, block_size, d_head]``. Rows live in
    :class:`PagedRows` handles made by :meth:`rows` or :meth:`prefill`; rows of different requests and lengths
    share one pool.
    """

    def __init__(
        self,
        layers: int,
        heads: int,
        d_head: int,
        n_blocks: int,
        block_size: int = 16,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.layers = check_int("layers", layers, 1)
        self.heads = check_int("heads", heads, 1)
        self.d_head = check_int("d_head", d_head, 1)
        self.n_blocks = check_int("n_blocks", n_blocks, 1)
        self.block_size = check_int("block_size", block_size, 1)
        shape = (self.heads, self.n_blocks, self.block_size, self.d_head)
        self.k = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.layers))
        self.v = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.layers))
        self.device = self.k[0].device
        self.refcount = np.zeros(self.n_blocks, np.int64)  # shape: (n_blocks,) table entries naming each block
        self._free = list(range(self.n_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._peak = 0  # blocks
        self.copied_blocks = 0  # copy-on-write copies made
        self.written_positions = 0  # positions whose keys/values were written (prefill and appends)

    # ------------------------------------------------------------------------------------------ accounting
    @property
    def block_bytes(self) -> int:
        """Bytes one block takes over all layers, keys and values."""
        return 2 * self.layers * self.heads * self.block_size * self.d_head * self.k[0].element_size()

    def blocks_in_use(self) -> int:
        """Blocks held by at least one row."""
        return self.n_blocks - len(self._free)

    def free_blocks(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    def bytes_in_use(self) -> int:
        """Bytes of the blocks held by at least one row (all layers, keys and values)."""
        return self.blocks_in_use() * self.block_bytes

    def peak_bytes(self) -> int:
        """The most bytes in use at any time since creation (or :meth:`reset_peak`)."""
        return self._peak * self.block_bytes

    def reset_peak(self) -> None:
        """Start measuring the peak again from what is in use now."""
        self._peak = self.blocks_in_use()

    def grow(self, n_blocks: int) -> None:
        """Enlarge the pool to ``n_blocks`` blocks: contents, block ids, tables and reference counts are kept
        (live handles stay valid), the new blocks join the free list. Call it between steps, not during one."""
        n_blocks = check_int("n_blocks", n_blocks, self.n_blocks)
        old = self.n_blocks
        if n_blocks == old:
            return

        def bigger(pool: Tensor) -> Tensor:
            out = pool.new_zeros((pool.shape[0], n_blocks, *pool.shape[2:]))  # shape: (heads, n_blocks, bs, d_head)
            with torch.no_grad():
                out[:, :old] = pool
            return out

        self.k = tuple(bigger(p) for p in self.k)
        self.v = tuple(bigger(p) for p in self.v)
        self.refcount = np.concatenate([self.refcount, np.zeros(n_blocks - old, np.int64)])
        self._free = list(range(n_blocks - 1, old - 1, -1)) + self._free  # blocks freed earlier still go first
        self.n_blocks = n_blocks

    # ------------------------------------------------------------------------------------------ blocks
    def _alloc(self, n: int) -> np.ndarray:
        if n > len(self._free):
            raise CacheFullError(
                f"PagedKVCache out of blocks: {n} needed, {len(self._free)} free of {self.n_blocks} "
                f"(block_size {self.block_size}); create the cache with more n_blocks"
            )
        out = np.sort(np.array([self._free.pop() for _ in range(n)], dtype=np.int64))  # runs of ids stay runs
        self.refcount[out] = 1
        self._peak = max(self._peak, self.blocks_in_use())
        return out

    def _incref(self, blocks: np.ndarray) -> None:
        if blocks.size:
            self.refcount += np.bincount(blocks, minlength=self.n_blocks)

    def _decref(self, blocks: np.ndarray) -> None:
        if blocks.size == 0:
            return
        counts = np.bincount(blocks, minlength=self.n_blocks)
        self.refcount -= counts
        touched = np.flatnonzero(counts)
        if (self.refcount[touched] < 0).any():
            raise RuntimeError("PagedKVCache reference count below zero: a handle was released twice")
        self._free.extend(touched[self.refcount[touched] == 0][::-1].tolist())

    def _copy_blocks(self, src: np.ndarray, dst: np.ndarray, positions: int | None = None) -> None:
        """Copy blocks ``src`` into blocks ``dst`` in every pool: their first ``positions`` positions (all when
        None; the rest of a destination keeps what it held)."""
        s = torch.as_tensor(src, device=self.device)
        d = torch.as_tensor(dst, device=self.device)
        upto = self.block_size if positions is None else positions
        with torch.no_grad():
            for pool in (*self.k, *self.v):
                # indexing the pool itself: an index_select of a sliced (non-contiguous) view copies the whole
                # pool first, time growing with the pool instead of the blocks copied
                pool[:, d, :upto] = pool[:, s, :upto]  # shape: (heads, copies, upto, d_head)
        self.copied_blocks += int(src.shape[0])

    # ------------------------------------------------------------------------------------------ handles
    def rows(self, n: int) -> PagedRows:
        """``n`` empty rows (length 0, no blocks)."""
        n = check_int("the number of rows", n, 0)
        return PagedRows(self, np.full((n, 0), -1, np.int64), np.zeros(n, np.int64))

    def prefill(self, keys: list[Tensor] | tuple[Tensor, ...], values: list[Tensor] | tuple[Tensor, ...]) -> PagedRows:
        """Rows holding the given positions: ``keys[layer]`` and ``values[layer]`` are ``[rows, heads, P, d_head]``
        (a teacher-forced prefix); each row gets ``ceil(P / block_size)`` blocks of its own."""
        if len(keys) != self.layers or len(values) != self.layers:
            raise ValueError(f"prefill needs keys and values for each of the {self.layers} layers")
        want = (self.heads, self.d_head)
        first = keys[0]
        n, p = int(first.shape[0]), int(first.shape[2])
        for x in (*keys, *values):
            if x.dim() != 4 or (int(x.shape[1]), int(x.shape[3])) != want or x.shape[0] != n or x.shape[2] != p:
                raise ValueError(
                    f"prefill tensors must all be [rows, {self.heads}, P, {self.d_head}], got {tuple(x.shape)}"
                )
        bs = self.block_size
        nb = -(-p // bs)
        blocks = self._alloc(n * nb)
        if nb:
            dst = torch.as_tensor(blocks, device=self.device)
            with torch.no_grad():
                for pool, x in zip((*self.k, *self.v), (*keys, *values), strict=True):
                    pad = x.new_zeros(n, self.heads, nb * bs - p, self.d_head)
                    full = torch.cat([x.detach().to(pool.dtype), pad], dim=2)  # shape: (rows, heads, nb * bs, d)
                    blocks_of = full.view(n, self.heads, nb, bs, self.d_head).transpose(0, 1)
                    pool[:, dst] = blocks_of.reshape(self.heads, n * nb, bs, self.d_head)  # rows' blocks in order
        self.written_positions += n * p
        return PagedRows(self, blocks.reshape(n, nb), np.full(n, p, np.int64))


@dataclass(frozen=True)
class Pages:
    """Where one step writes and reads, on the cache's device (computed once per step for every layer).

    ``slots`` ``[rows]``: where each row's newest position goes, as a column of a pool viewed
    ``[heads, n_blocks * block_size, d_head]`` (the same column in every head); ``table`` ``[rows, nb]``: block
    ids to gather (unused entries point at block 0 and are masked); ``width``: the longest row;
    ``mask`` ``[rows, 1, 1, width]`` (True = may attend) or None when every row holds ``width`` positions.
    """

    slots: Tensor
    table: Tensor
    width: int
    mask: Tensor | None


class PagedRows:
    """Rows of a :class:`PagedKVCache`: a block table and a length per row (host arrays), owning one reference
    per table entry. A state leaf for beamkit: ``beamkit_select`` forks rows, ``beamkit_concat`` joins new
    requests' rows; both consume this handle."""

    def __init__(self, cache: PagedKVCache, table: np.ndarray, length: np.ndarray) -> None:
        self.cache = cache
        self.table = table  # shape: (rows, nb) block ids, -1 past each row's last block
        self.length = length  # shape: (rows,) positions held
        self._live = True
        self._pages: Pages | None = None
        self._plan: PrefixPlan | None = None
        self._write_at: tuple[np.ndarray, np.ndarray] | None = None  # (block, offset) per row, set by append()
        self._slots: Tensor | None = None  # shape: (rows,) the newest positions' slots on the device
        self.copied = np.zeros(0, np.int64)  # shape: (c,) rows whose last block append() replaced by a copy

    def __len__(self) -> int:
        return int(self.length.shape[0])

    def __repr__(self) -> str:
        state = "live" if self._live else "consumed"
        return f"PagedRows(rows={len(self)}, blocks={int((self.table >= 0).sum())}, {state})"

    def _check(self) -> None:
        if not self._live:
            raise ValueError(
                "this PagedRows handle was consumed (by beamkit_select, beamkit_concat, append or release): "
                "use the one that call returned"
            )

    def _hand_over(self, table: np.ndarray, length: np.ndarray) -> PagedRows:
        """A new handle taking over this one's references (table columns no row uses are cut)."""
        self._live = False
        nb = -(-int(length.max()) // self.cache.block_size) if length.size else 0
        return PagedRows(self.cache, table[:, :nb], length)

    def release(self) -> None:
        """Give this handle's blocks back (reference counts down; blocks nobody holds return to the free list)."""
        if self._live:
            self._live = False
            self.cache._decref(self.table[self.table >= 0])

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: the pool is going away anyway
            pass

    # ------------------------------------------------------------------------------------------ state protocol
    def beamkit_select(self, idx: np.ndarray) -> PagedRows:
        """Rows ``idx`` (parents, may repeat): tables copied, reference counts raised, no block contents copied;
        blocks of rows not selected are released."""
        self._check()
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        if idx.shape[0] == len(self) and bool((idx == np.arange(len(self))).all()):
            return self._hand_over(self.table, self.length)  # the identity: no reference count changes
        table, length = self.table[idx], self.length[idx]
        self.cache._incref(table[table >= 0])
        self.cache._decref(self.table[self.table >= 0])
        return self._hand_over(table, length)

    def beamkit_concat(self, others: list[PagedRows]) -> PagedRows:
        """These rows followed by the rows of ``others`` (same cache); every handle is consumed."""
        parts = [self, *others]
        for p in parts:
            p._check()
            if p.cache is not self.cache:
                raise ValueError("cannot join PagedRows of different PagedKVCache pools")
        nb = max(p.table.shape[1] for p in parts)
        table = np.concatenate([_pad_table(p.table, nb) for p in parts])
        length = np.concatenate([p.length for p in parts])
        for p in parts[1:]:
            p._live = False
        return self._hand_over(table, length)

    # ------------------------------------------------------------------------------------------ one step
    def _next_blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(column, offset) of each row's next position, the rows starting a block, and the rows that must copy
        their partial last block first (held by other rows too; when every holder is here, the first keeps it)."""
        c, bs = self.cache, self.cache.block_size
        col, off = np.divmod(self.length, bs)
        fresh = np.flatnonzero(off == 0)  # shape: (f,) rows starting a block
        part = np.flatnonzero(off > 0)  # shape: (p,) rows writing into their last block
        last = self.table[part, col[part]]
        uniq, first, count = np.unique(last, return_index=True, return_counts=True)
        keeps = np.zeros(part.shape[0], dtype=bool)
        keeps[first[c.refcount[uniq] == count]] = True  # every holder is here: the first keeps it
        shared = c.refcount[last] > 1
        return col, off, fresh, part[shared & ~keeps]

    def blocks_needed(self) -> int:
        """Free blocks the next :meth:`append` takes: one per row starting a block, one per copy-on-write."""
        self._check()
        _, _, fresh, cow = self._next_blocks()
        return int(fresh.shape[0] + cow.shape[0])

    def append(self) -> PagedRows:
        """Make room for one more position per row; returns the handle that owns the longer rows.

        A row whose length is a multiple of ``block_size`` gets a fresh block. A row whose last block is partial
        and held by other rows too gets its own copy of it first (copy-on-write); when every holder writes at
        this step, the first keeps the original (the returned handle's ``copied`` names the rows that got a
        copy: the only rows whose earlier positions moved). Raises :class:`CacheFullError` (changing nothing)
        when the free list is short.
        """
        self._check()
        c = self.cache
        n = len(self)
        col, off, fresh, cow = self._next_blocks()
        new = c._alloc(fresh.shape[0] + cow.shape[0])
        nb = int(col.max()) + 1 if n else 0
        table = _pad_table(self.table, nb)
        table[fresh, col[fresh]] = new[: fresh.shape[0]]
        if cow.size:
            src = table[cow, col[cow]]
            dst = new[fresh.shape[0] :]
            c._copy_blocks(src, dst, int(off[cow].max()))  # the positions the rows hold in them
            table[cow, col[cow]] = dst
            c._decref(src)
        c.written_positions += n
        out = self._hand_over(table, self.length + 1)
        out._write_at = (table[np.arange(n), col], off)
        out.copied = cow
        return out

    def slots(self) -> np.ndarray:
        """Where each row's newest position goes (after :meth:`append`), ``[rows]`` on the host: a column of a
        pool viewed ``[heads, n_blocks * block_size, d_head]`` (the same column in every head)."""
        where = self._write_at
        if where is None:
            raise ValueError("slots() needs the handle returned by append()")
        block, offset = where
        return block * self.cache.block_size + offset  # shape: (rows,)

    def _device_slots(self) -> Tensor:
        """:meth:`slots` on the cache's device (made once per step)."""
        self._check()
        if self._slots is None:
            self._slots = torch.as_tensor(self.slots(), device=self.cache.device)
        return self._slots

    def pages(self) -> Pages:
        """Device tensors for the step after :meth:`append`: where each row's newest position goes, and the
        tables to gather every row's positions from."""
        self._check()
        if self._pages is None:
            if self._write_at is None:
                raise ValueError("pages() needs the handle returned by append()")
            dev = self.cache.device
            width = int(self.length.max()) if len(self) else 0
            table = torch.as_tensor(np.maximum(self.table, 0), device=dev)
            mask = None
            if len(self) and int(self.length.min()) < width:
                length = torch.as_tensor(self.length, device=dev)
                mask = (torch.arange(width, device=dev)[None, :] < length[:, None])[:, None, None, :]
            self._pages = Pages(self._device_slots(), table, width, mask)  # slots shape: (rows,)
        return self._pages

    def write(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Store the newest position's key and value ``[rows, heads, 1, d_head]`` of ``layer`` (only the slots
        are needed: the tables and mask of :meth:`pages` are made for :meth:`read` alone)."""
        slots = self._device_slots()
        c = self.cache
        with torch.no_grad():
            for pool, x in ((c.k[layer], k), (c.v[layer], v)):
                new = x[:, :, 0].detach().to(pool.dtype).transpose(0, 1)  # shape: (heads, rows, d_head)
                pool.view(c.heads, -1, c.d_head).index_copy_(1, slots, new)

    def attend(self, layer: int, query: Tensor, scale: float) -> Tensor:
        """Attention of the rows' newest queries ``[rows, q_heads, 1, d_head]`` over their positions of ``layer``
        (after :meth:`write`), ``[rows, q_heads, d_head]``: shared-prefix attention (a group of rows reads the
        blocks they all hold once, in place; see :mod:`beamkit.kv.attention`), planned once per step."""
        self._check()
        if self._write_at is None:
            raise ValueError("attend() needs the handle returned by append()")
        if self._plan is None:
            self._plan = plan_prefix(self.table, self.length, self.cache.block_size, self.cache.device)
        return shared_prefix_attention(self._plan, query, self.cache.k[layer], self.cache.v[layer], scale)

    def read(self, layer: int) -> tuple[Tensor, Tensor]:
        """Every row's keys and values of ``layer``, ``[rows, heads, width, d_head]`` gathered into new tensors
        (positions past a row's length hold whatever their block holds: mask them with :attr:`Pages.mask`).
        :func:`beamkit.kv.attention.shared_prefix_attention` attends without this copy."""
        p = self.pages()
        c = self.cache
        n, nb = p.table.shape
        flat = p.table.reshape(-1)
        out = []
        for pool in (c.k[layer], c.v[layer]):
            g = pool.index_select(1, flat).view(c.heads, n, nb * c.block_size, c.d_head)
            out.append(g[:, :, : p.width].transpose(0, 1))  # shape: (rows, heads, width, d_head)
        return out[0], out[1]
