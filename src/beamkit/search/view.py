"""Rank: a step's candidate tables ``[rows, m]`` become the :class:`~beamkit.search.records.StepView` a policy
reads (the engine's phase 4, before the policy): the candidates of each request ranked together (key descending,
then row and token ascending), those below ``beam_threshold`` set apart, which end and which reach ``max_len``.
Reads only the rows, the tables and the book's columns."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from beamkit.search.book import Book
from beamkit.search.policies import Policy
from beamkit.search.ranking import group_starts
from beamkit.search.records import Candidates, Rows, StepView


class Ranker:
    """Builds each step's :class:`StepView` from the candidate tables.

    ``ranked`` / ``covered``: the policy's :meth:`~beamkit.search.policies.Policy.ranked` and
    :meth:`~beamkit.search.policies.Policy.covered` (how many candidates of each request it reads, and whether a
    view ranked only that far holds them all); ``is_eos(tok, req)``: whether each token ends its request;
    ``ordered``: the selector gives each row's candidates in the engine's order already.
    """

    def __init__(
        self,
        book: Book,
        policy: Policy,
        is_eos: Callable[[np.ndarray, np.ndarray], np.ndarray],
        ordered: bool,
        beam_threshold: float | None,
    ) -> None:
        self.book = book
        self.policy = policy
        self.is_eos = is_eos
        self.ordered = ordered
        self.beam_threshold = beam_threshold
        self.pruned = 0  # candidates beam_threshold dropped, over every step

    def view(
        self, rows: Rows, logp: np.ndarray, tok: np.ndarray, key: np.ndarray, every: bool, shared: bool = False
    ) -> StepView | None:
        """Rank the selected candidates within each request (``every``: all of them, else only as many as the
        policy reads); drop those below ``beam_threshold``. ``shared``: the rows hold only their requests' m best
        candidates; None when the policy needs more (then the caller selects again)."""
        policy = self.policy
        limit = None if every else policy.ranked(self.book)
        view = self.ranked_view(rows, logp, tok, key, limit)
        if limit is not None and not policy.covered(view, self.book):
            if shared:  # e.g. many stop tokens ranked in
                return None
            view = self.ranked_view(rows, logp, tok, key, None)
        if self.beam_threshold is not None and view.considered.req.shape[0]:
            self.pruned += self._pruned(view, rows, logp, key, limit)
        return view

    def _pruned(self, view: StepView, rows: Rows, logp: np.ndarray, key: np.ndarray, limit: np.ndarray | None) -> int:
        """How many finite candidates ``beam_threshold`` dropped at this step (those left unranked included)."""
        if limit is None or view.considered.req.shape[0] == logp.size:
            return int(view.considered.req.shape[0] - view.cand.req.shape[0])
        assert self.beam_threshold is not None
        best = np.full(self.book.size, np.nan)
        first = group_starts(view.considered.req)
        best[view.considered.req[first]] = view.considered.key[first]
        finite = np.isfinite(key) & np.isfinite(rows.lp[:, None] + logp)  # shape: (rows, m)
        with np.errstate(invalid="ignore"):
            below = finite & ~(key >= (best[rows.req] - self.beam_threshold)[:, None])
        return int(below.sum())

    def ranked_view(
        self, rows: Rows, logp: np.ndarray, tok: np.ndarray, key: np.ndarray, limit: np.ndarray | None
    ) -> StepView:
        """The step's view with each request's first ``limit[r]`` candidates ranked (None: all)."""
        b = self.book
        considered = Candidates.rank_all(rows, logp, tok, key, self.ordered, limit)
        if considered.req.shape[0] != logp.size:  # a row yields nothing only when some candidate was dropped
            reqs = rows.requests()
            for r in reqs[np.bincount(considered.req, minlength=b.size)[reqs] == 0].tolist():
                msg = f"no finite candidate at step {int(b.t[r])} (every continuation is masked or -inf)"
                b.errors.setdefault(r, msg)
        cand, kept = considered, None
        if self.beam_threshold is not None and considered.req.shape[0]:
            first = group_starts(considered.req)
            best = np.repeat(considered.key[first], np.diff(np.append(first, considered.req.shape[0])))
            kept = np.flatnonzero(considered.key >= best - self.beam_threshold)
            cand = considered.take(kept)
        length = b.t[cand.req] + 1  # shape: (n,) length of each candidate
        last = length >= b.max_len[cand.req]
        return StepView(rows, considered, cand, kept, self.is_eos(cand.tok, cand.req), length, last, b.table)
