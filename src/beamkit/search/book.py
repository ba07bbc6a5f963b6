"""The per-request book of an engine: each request's options and counters as arrays indexed by slot, and every
running request's finished pool in one :class:`~beamkit.search.records.PoolTable`."""

from __future__ import annotations

from typing import Annotated, Any, get_type_hints

import numpy as np

from beamkit.hypothesis import Hypothesis
from beamkit.search.ranking import group_starts
from beamkit.search.records import PoolTable

Ints = Annotated[np.ndarray, np.int64]  # shape: (R,) a column of int64, one entry per request slot
Floats = Annotated[np.ndarray, np.float64]  # shape: (R,) a column of float64 (new slots start at -inf)


class Book:
    """Per-request bookkeeping: arrays indexed by request slot (grown as requests are added) and the pools.

    Options per request (``beam``, ``max_len``, ``min_len``, ``m`` candidates per row, ``pool`` size, early
    stopping mode ``es`` (an :class:`~beamkit.search.options.EarlyMode`), length penalty ``lp`` (index into the
    engine's list) and its ``alpha``, ``patience``, stop tokens ``eos`` (index), ``nret``: ``num_return`` or 0, the
    sampling temperature ``temp``: NaN where the request set none), the tokens generated so far ``t``, and the pool
    counters (``count``, ``worst``, ``nth``), kept in step with ``table`` by :meth:`commit`. The columns are the
    class's annotations, declared once here (:data:`BOOK_COLUMNS` reads their dtypes).
    """

    rid: Ints  # the request id in the slot
    t: Ints
    beam: Ints
    max_len: Ints
    min_len: Ints
    m: Ints
    pool: Ints
    es: Ints
    lp: Ints
    eos: Ints
    nret: Ints
    count: Ints
    alpha: Floats
    patience: Floats
    worst: Floats
    nth: Floats
    temp: Floats

    def __init__(self) -> None:
        self.size = 0
        for name, dtype in BOOK_COLUMNS.items():
            setattr(self, name, np.zeros(0, dtype))
        self.table = PoolTable.empty()
        self.held: set[int] = set()  # slots of the requests added and not yet completed
        self.errors: dict[int, str] = {}

    @property
    def pools(self) -> dict[int, list[Hypothesis]]:
        """Each held request's pool as hypotheses, in pool order (a view for inspection; built on each call)."""
        return {r: [self.table.hypothesis(int(j)) for j in self.table.of(r)] for r in sorted(self.held)}

    def grow(self, n: int) -> np.ndarray:
        """Slots for ``n`` new requests (arrays grow by doubling)."""
        need, cap = self.size + n, self.t.shape[0]
        if need > cap:
            new = max(need, 2 * cap, 16)
            for name, dtype in BOOK_COLUMNS.items():
                old = getattr(self, name)
                out = np.zeros(new, dtype) if dtype is np.int64 else np.full(new, -np.inf)
                out[:cap] = old
                setattr(self, name, out)
        ids = np.arange(self.size, need)
        self.size = need
        self.held.update(ids.tolist())
        return ids

    def compact(self, live: np.ndarray) -> np.ndarray:
        """Keep only the slots ``live`` (ascending: every held request, between steps, when no error is pending),
        renumbered 0.. in the same order; returns the old -> new map (of the live slots: the others are never
        looked up again)."""
        remap = np.empty(self.size, dtype=np.int64)  # shape: (R,) old slot -> new slot
        remap[live] = np.arange(live.shape[0])
        for name in BOOK_COLUMNS:
            setattr(self, name, getattr(self, name)[live].copy())
        self.table.req = remap[self.table.req]  # the table holds only held requests' entries: all of them stay
        self.held = set(range(live.shape[0]))
        self.size = int(live.shape[0])
        return remap

    def counters(self, table: PoolTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(count, worst, nth)`` per slot for ``table``: its entries, the lowest score, and the score of the
        n-th entry in pool order (n = ``num_return``, else ``beam_size``; -inf when fewer)."""
        count = np.bincount(table.req, minlength=self.size)[: self.size]  # shape: (R,)
        worst = np.full(self.size, -np.inf)
        nth = np.full(self.size, -np.inf)
        if len(table):
            starts = group_starts(table.req)
            reqs = table.req[starts]
            worst[reqs] = np.minimum.reduceat(table.score, starts)
            n = np.where(self.nret[reqs] > 0, self.nret[reqs], self.beam[reqs])
            full = count[reqs] >= n
            nth[reqs[full]] = table.score[(starts + n - 1)[full]]
        return count, worst, nth

    def commit(self, table: PoolTable, counters: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """Make ``table`` the pools. ``counters``: its :meth:`counters` (the pool policy computes them: ``worst``
        and ``nth`` are its stopping rules' figures); without them only ``count`` is brought up to date."""
        self.table = table
        if counters is None:
            self.count[: self.size] = np.bincount(table.req, minlength=self.size)[: self.size]
        else:
            self.count[: self.size], self.worst[: self.size], self.nth[: self.size] = counters

    def release(self, slots: list[int]) -> dict[int, tuple[PoolTable, str | None]]:
        """Forget the requests ``slots``: each one's pool entries (in pool order) and error."""
        table = self.table
        out = {}
        for r in slots:
            out[r] = (table.take(table.of(r)), self.errors.pop(r, None))
            self.held.discard(r)
        mask = np.zeros(self.size, dtype=bool)  # shape: (R,)
        mask[slots] = True
        gone = mask[table.req]
        if gone.any():  # the other requests' entries and counters are unchanged
            self.table = table.take(np.flatnonzero(~gone))
        return out


# the book's columns and their dtypes, in declaration order (read from Book's annotations)
BOOK_COLUMNS: dict[str, Any] = {
    name: hint.__metadata__[0] for name, hint in get_type_hints(Book, include_extras=True).items()
}
