"""The gather index of paged rows, kept from step to step: where each row's positions live in the pool.

A step that reads every row's keys/values as one dense ``[rows, heads, width, d]`` tensor (the layout a dense
cache holds: rows aligned on the right, the columns before a row's first position left padding) gathers them
from the pool by an index: for each row and column, the *slot* of that position, ``block * block_size +
offset`` (a column of one head of a pool viewed ``[heads, n_blocks * block_size, d]``; padding reads slot 0,
masked by the attention mask). :class:`GatherIndex` keeps that ``[rows, width]`` table on the pool's device and
follows the rows instead of building it again from the block tables at every step:

- a step adds one column, the slot of each row's new position (every row gains one position, so the new
  column is the last one for all of them);
- forking rows by parent gathers the table's rows (``select``), rows that leave are not selected;
- joining other rows (``join``) places each part's table in the wider width (extra columns are padding);
- dropping leading columns that every row pads (``trim``) drops them from the table;
- only what changed in another way is built from the block tables: the last ``block_size`` columns of rows
  whose shared partial last block was replaced by a copy (copy-on-write, ``PagedRows.copied``: only that
  block moved), and whole rows that joined without a table of their own.

The table is always equal to one built from scratch (:func:`gather_slots`) from the rows' block tables and
lengths. Requires torch (the ``torch`` extra).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from beamkit.kv.paged import PagedRows


def gather_slots(table: np.ndarray, length: np.ndarray, width: int, block_size: int, start: int = 0) -> np.ndarray:
    """The slots of rows with block tables ``table`` ``[rows, nb]`` holding ``length`` ``[rows]`` positions
    (at least one each, at most ``width``), aligned on the right in ``width`` columns: ``[rows, width - start]``,
    the columns ``start ..`` of the table (the columns before a row's first position are 0: padding)."""
    bs = block_size
    p = np.arange(start, width)[None, :] - (width - length)[:, None]  # shape: (rows, width - start) own positions
    pos = np.maximum(p, 0)
    block = np.take_along_axis(table, pos // bs, axis=1)  # shape: (rows, width - start)
    return np.where(p >= 0, block * bs + pos % bs, 0)


class GatherIndex:
    """The ``[rows, width]`` slots of paged rows aligned on the right (see the module docstring), on
    ``device``, kept in step with the rows by the calls that change them.

    A decoding step calls :meth:`step` with the rows after :meth:`beamkit.kv.PagedRows.append` (the width grows
    by one); :meth:`select`, :meth:`join` and :meth:`trim` follow the rows' forks, joins and dropped padding
    columns between steps. An index that does not know rows (made empty, or :meth:`forget`) builds them from
    their block tables at the next step. ``rebuilt`` counts the rows built from block tables so far. The table
    lives in a buffer with room for ``SPARE`` more columns, so that a step writes its column in place.
    """

    SPARE = 64  # columns of room made whenever the buffer is full

    def __init__(self, block_size: int, device: torch.device | str) -> None:
        self.block_size = block_size
        self.device = torch.device(device)
        self._buf: Tensor | None = None  # shape: (rows, capacity) the table in columns 0 .. width; None: unknown
        self._width = 0
        self.stale = np.zeros(0, dtype=bool)  # shape: (rows,) rows to build from their tables at the next step
        self.rebuilt = 0

    @property
    def slots(self) -> Tensor | None:
        """The table ``[rows, width]`` (a view of the buffer), None when it is unknown."""
        return None if self._buf is None else self._buf[:, : self._width]

    @property
    def width(self) -> int:
        """Columns of the table (-1 when it is unknown)."""
        return -1 if self._buf is None else self._width

    def forget(self) -> None:
        """Drop the table: the next :meth:`step` builds every row (the rows are not followed until then)."""
        self._buf = None
        self.stale = np.zeros(0, dtype=bool)

    def select(self, idx: np.ndarray) -> None:
        """Rows ``idx`` (parents; rows may repeat or leave), as :meth:`beamkit.kv.PagedRows.beamkit_select`."""
        if self._buf is None:
            return
        rows = int(self._buf.shape[0])
        if idx.shape[0] == rows and bool((idx == np.arange(rows)).all()):
            return  # the identity
        self._buf = self._buf.index_select(0, torch.from_numpy(idx).to(self.device))  # shape: (rows', capacity)
        self.stale = self.stale[idx]

    def trim(self, columns: int) -> None:
        """Drop ``columns`` leading columns (padding of every row)."""
        if self._buf is not None:
            self._buf = self._buf[:, columns:]  # shape: (rows, capacity - columns) view
            self._width -= columns

    @staticmethod
    def join(parts: list[GatherIndex], rows: list[int], widths: list[int], width: int) -> GatherIndex:
        """One index for the rows of ``parts`` in order (``rows[i]`` rows spanning ``widths[i]`` columns each),
        aligned on the right in ``width`` columns: a part's table keeps its slots (the new columns are
        padding); a part without one has its rows built at the next step."""
        first = parts[0]
        out = GatherIndex(first.block_size, first.device)
        buf = torch.zeros(sum(rows), width + GatherIndex.SPARE, dtype=torch.long, device=first.device)
        stale, at = [], 0
        for part, n, w in zip(parts, rows, widths, strict=True):
            if part.slots is not None:
                buf[at : at + n, width - w : width] = part.slots  # shape: (n, w)
                stale.append(part.stale)
            else:
                stale.append(np.ones(n, dtype=bool))
            at += n
        out._buf, out._width = buf, width
        out.stale = np.concatenate(stale)
        return out

    def step(self, rows: PagedRows, width: int) -> Tensor:
        """The slots ``[rows, width]`` of ``rows`` (the handle :meth:`beamkit.kv.PagedRows.append` returned, so
        ``width`` is one more than the last step's): the last step's table with one column added; rows that
        joined without a table built from their block tables, and rows whose partial last block was replaced
        by a copy (``rows.copied``) their last ``block_size`` columns (the only ones that block can hold);
        everything built when the table is unknown."""
        n = len(rows)
        buf = self._buf
        if buf is None or self._width != width - 1 or int(buf.shape[0]) != n:
            self.stale = np.ones(n, dtype=bool)
            buf = torch.zeros(n, width + self.SPARE, dtype=torch.long, device=self.device)
        elif int(buf.shape[1]) < width:  # full: room for more columns
            grown = torch.zeros(n, width + self.SPARE, dtype=torch.long, device=self.device)
            grown[:, : width - 1] = buf[:, : width - 1]
            buf = grown
        buf[:, width - 1] = torch.from_numpy(rows.slots()).to(self.device)  # each row's new position
        self._buf, self._width = buf, width
        whole = np.flatnonzero(self.stale)  # shape: (k,)
        copied = rows.copied[~self.stale[rows.copied]]  # shape: (c,)
        self._build(rows, whole, 0)
        self._build(rows, copied, max(0, width - self.block_size))
        self.stale = np.zeros(n, dtype=bool)
        return buf[:, :width]

    def _build(self, rows: PagedRows, which: np.ndarray, start: int) -> None:
        """Columns ``start ..`` of rows ``which`` of the table built from the rows' block tables."""
        if which.size == 0:
            return
        assert self._buf is not None
        width = self._width
        built = gather_slots(rows.table[which], rows.length[which], width, self.block_size, start)
        self._buf[torch.from_numpy(which).to(self.device), start:width] = torch.from_numpy(built).to(self.device)
        self.rebuilt += int(which.size)
