"""Scoring and pool entries: what a policy asks for besides the candidates (length-penalised scores, pool entries
for the candidates that end) and the final ranking of a request's hypotheses. A :class:`Scoring` holds the
shared scoring options, the book and the table of length penalties; it never sees the engine."""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit.hypothesis import Hypothesis
from beamkit.scoring import LengthPenalty
from beamkit.search.book import Book
from beamkit.search.options import SearchOptions
from beamkit.search.records import Candidates, Paths, PoolTable, Rows, StepView
from beamkit.state import select_state


class Scoring:
    """Scores, pool entries and final rankings (see the module docstring).

    ``lps``: the engine's distinct length penalties, indexed by ``book.lp`` (the same list, growing as requests
    join). ``call_state``: the state the current model call returned, while the search keeps final states.
    """

    def __init__(self, options: SearchOptions, book: Book, lps: list[LengthPenalty]) -> None:
        self.options = options
        self.book = book
        self.lps = lps
        self.next_entry = 0  # id of the next pool entry
        self.call_state: Any = None

    def penalised(self, logprob: np.ndarray, length: np.ndarray, req: np.ndarray) -> np.ndarray:
        """Length-penalised scores, each with its request's penalty."""
        if len(self.lps) == 1:  # every request has the same penalty
            return self.lps[0](logprob, length)
        ids = self.book.lp[req]  # never empty: callers score at least one hypothesis
        if ids.min() == ids.max():
            return self.lps[int(ids[0])](logprob, length)
        out = np.empty(ids.shape[0])
        for i in np.unique(ids).tolist():
            sel = ids == i
            out[sel] = self.lps[i](logprob[sel], length[sel])
        return out

    def scores(self, rows: Rows, cand: Candidates, sel: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Final scores of the candidates ``sel`` ended at ``length``: length penalty, coverage penalty."""
        opt = self.options
        scores = self.penalised(cand.lp[sel], length[sel], cand.req[sel])
        if opt.coverage_penalty is not None and rows.cov is not None:
            scores = scores + opt.coverage_penalty(rows.cov[cand.row[sel]])
        return scores

    def entries(self, view: StepView, sel: np.ndarray, finished: bool | np.ndarray) -> PoolTable:
        """Pool entries for the candidates ``sel`` of ``view.cand`` ended at their length (``finished``: a stop
        token; False: cut off at ``max_len``), in that order."""
        n = sel.shape[0]
        if n == 0:
            return PoolTable.empty()
        rows, cand = view.rows, view.cand
        parents = cand.row[sel]
        path = Paths(rows, parents, self.book.t[rows.req[parents]])
        if self.call_state is not None:  # keep_state: the parents' rows of this call's new state
            path.state = select_state(self.call_state, parents)
        paths = np.empty(n, dtype=object)
        paths.fill(path)
        eid = np.arange(self.next_entry, self.next_entry + n)
        self.next_entry += n
        fin = np.full(n, finished, dtype=bool) if np.ndim(finished) == 0 else np.array(finished, dtype=bool)
        return PoolTable(
            cand.req[sel],
            eid,
            self.scores(rows, cand, sel, view.length),
            cand.key[sel],
            cand.lp[sel],
            fin,
            cand.tok[sel],
            sel if sel.dtype == np.int64 else sel.astype(np.int64),
            np.arange(n),
            paths,
        )

    def rank(self, r: int, pool: PoolTable) -> list[Hypothesis]:
        """Final ranking of one request's hypotheses (optional final scorer), cut to its ``num_return``."""
        opt = self.options
        order = np.argsort(-pool.score, kind="stable")  # best score first, equal ones in pool order
        hyps = pool.hypotheses(order)
        if opt.final_scorer is not None and hyps:
            new = list(opt.final_scorer(hyps))
            if len(new) != len(hyps):
                raise ValueError("final_scorer must return one score per hypothesis")
            for i, h in enumerate(hyps):  # as many as hyps (checked above)
                h.score = float(new[i])
            hyps.sort(key=lambda h: -h.score)
        n = int(self.book.nret[r])
        return hyps[:n] if n else hyps
