"""Expand and select: a step's logits become each row's candidates ``[rows, m]`` (the engine's phases 2 and 3).

The log-probabilities (an exact log-softmax, stop tokens masked below ``min_len``, processors applied) and each
row's ``m`` best candidates by key, read from the book's columns (``t``, ``min_len``, ``m``, ``eos``, ``temp``) and
the rows; a row whose logits hold NaN or +inf fails its request (``book.errors``). Nothing here reads the engine:
an :class:`Expander` holds the shared options, the book and the table of stop-token sets.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.processors import StepContext, is_stop
from beamkit.search.book import Book
from beamkit.search.options import SearchOptions
from beamkit.search.records import Rows, add_coverage
from beamkit.search.select import lse_and_top, raw_top
from beamkit.search.selectors import Deterministic

CandidateTables = tuple[np.ndarray, np.ndarray, np.ndarray]  # (logp, tok, key), each shape: (rows, m)


class Expander:
    """Normalisation and selection of one step, for every row at once (see the module docstring).

    ``eos``: the engine's distinct stop-token sets, indexed by ``book.eos`` (the same list, growing as requests
    join); ``carried``: processor index -> column of ``Rows.carry`` for the processors that carry a value.
    """

    def __init__(self, options: SearchOptions, book: Book, eos: list[tuple[int, ...]], carried: dict[int, int]):
        self.options = options
        self.book = book
        self.eos = eos
        self.carried = carried

    def expand(self, logits: Any, extras: dict[str, Any], rows: Rows, ranked_all: bool) -> tuple[CandidateTables, bool]:
        """The step's candidates ``(logp, tok, key)`` ``[rows, m]`` and whether they are only each request's
        ``m`` best (``shared``; then a policy that reads more asks :meth:`again`). ``ranked_all``: a recorder or a
        ``beam_threshold`` reads every row's own candidates."""
        b = self.book
        t_row = b.t[rows.req]  # shape: (rows,) tokens so far of each row's request
        masked = t_row < b.min_len[rows.req]  # shape: (rows,) stop tokens masked below min_len
        if self.one_pass():  # log-sum-exp (or raw scores' checks) and candidates from one read of the logits
            shared = not ranked_all and not masked.any()
            return self.select_one_pass(logits, rows, shared, masked, _raw(extras)), shared
        segments = self.segments(rows, t_row)
        scores, offset = self.normalise(logits, extras, rows, t_row, segments)  # shape: (rows, V), (rows,)
        return self.select(scores, offset, rows, segments), False

    def again(self, logits: Any, extras: dict[str, Any], rows: Rows) -> CandidateTables:
        """Every row's own ``m`` best candidates (after a shared selection held too few for the policy)."""
        b = self.book
        return self.select_one_pass(logits, rows, False, b.t[rows.req] < b.min_len[rows.req], _raw(extras))

    def one_pass(self) -> bool:
        """Whether this step's selection is the deterministic one with no processor: then one read of the logits
        gives the candidates and the normaliser (the log-sum-exp; for raw scores only the checks for NaN and
        +inf), stop tokens masked below ``min_len`` included."""
        opt = self.options
        return type(opt.selector) is Deterministic and not opt.processors

    def select_one_pass(
        self, logits: Any, rows: Rows, shared: bool = False, masked: np.ndarray | None = None, raw: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The deterministic selection from one read of the logits (:func:`beamkit.search.select.lse_and_top`):
        each row's m best tokens and its log-sum-exp; rows with NaN or +inf logits fail their request.
        ``shared``: wide requests keep only the candidates that may be among their request's m best.
        ``masked`` ``[rows]``: rows whose stop tokens may not be chosen yet (below ``min_len``); they read as
        many more candidates as they have stop tokens and drop those, so each keeps its m best other tokens,
        normalised over the whole vocabulary as when the stop tokens are set to ``-inf`` after the log-sum-exp.
        ``raw``: the logits are the step's scores as they are (:func:`beamkit.search.select.raw_top`)."""
        b = self.book
        m_row = b.m[rows.req]
        share = (rows.req, rows.key, m_row) if shared else None
        stops = self.masked_stops(rows, masked)  # shape: (rows, s) stop ids of masked rows, -1 padded
        m = int(m_row.max()) + stops.shape[1]
        top = raw_top if raw else lse_and_top
        lse, vals, tok = top(logits, m, shared=share)  # shape: (rows,), (rows, m'), (rows, m')
        self.fail_bad_rows(lse, rows)
        offset = np.where(np.isfinite(lse), -lse, -np.inf)  # shape: (rows,)
        with np.errstate(invalid="ignore"):  # +inf logits in a failed row: inf - inf, dropped as not finite
            logp = vals + offset[:, None]
            key = rows.key[:, None] + logp
        if not stops.shape[1] and int(m_row.min()) >= tok.shape[1]:  # every row keeps all it read
            return logp, tok, key
        keep = np.ones(tok.shape, dtype=bool)  # shape: (rows, m')
        if 0 < stops.shape[1] <= 32:
            keep = ~(tok[:, :, None] == stops[:, None, :]).any(axis=2)  # shape: (rows, m') compared at once
        elif stops.shape[1]:  # many stop tokens: a lookup per row (no rows x m' x s table)
            keep = np.stack([~np.isin(t, s) for t, s in zip(tok, stops, strict=True)])
        rank = np.cumsum(keep, axis=1) if stops.shape[1] else np.arange(1, tok.shape[1] + 1)[None, :]
        keep &= rank <= m_row[:, None]  # each row its own m best (other beam sizes; stop tokens left out)
        if not keep.all():
            key = np.where(keep, key, np.nan)  # dropped by rank_all
        return logp, tok, key

    def masked_stops(self, rows: Rows, masked: np.ndarray | None) -> np.ndarray:
        """The stop token ids of each ``masked`` row ``[rows, s]`` (s: the most any masked row has; -1 pads and
        fills the other rows, and matches no token)."""
        if masked is None or not masked.any():
            return np.zeros((rows.req.shape[0], 0), dtype=np.int64)
        e_row = self.book.eos[rows.req]  # shape: (rows,) each row's stop set
        first = int(e_row[int(masked.argmax())])
        if (e_row[masked] == first).all():  # one stop set (the usual case)
            ids = np.asarray(self.eos[first], dtype=np.int64)
            return np.where(masked[:, None], ids[None, :], -1)
        sets = {int(e): np.asarray(self.eos[int(e)], dtype=np.int64) for e in np.unique(e_row[masked]).tolist()}
        out = np.full((rows.req.shape[0], max(len(v) for v in sets.values())), -1, dtype=np.int64)
        for e, ids in sets.items():
            out[masked & (e_row == e), : len(ids)] = ids
        return out

    def fail_bad_rows(self, lse: np.ndarray, rows: Rows) -> np.ndarray:
        """Fail the requests of the rows whose logits hold NaN or +inf (``lse`` NaN / +inf); returns those rows."""
        b = self.book
        bad = np.isnan(lse) | (lse == np.inf)  # shape: (rows,) their requests fail; all -inf rows: no candidate
        if bad.any():
            for r in np.unique(rows.req[bad]).tolist():
                what = "NaN" if np.isnan(lse[bad & (rows.req == r)]).any() else "+inf"
                b.errors[r] = f"step_fn returned {what} logits at step {int(b.t[r])}"
        return bad

    def normalise(
        self,
        logits: Any,
        extras: dict[str, Any],
        rows: Rows,
        t_row: np.ndarray,
        segments: list[tuple[int, int, StepContext]],
    ) -> tuple[Any, np.ndarray]:
        """The step's scores ``[rows, V]`` (on the logits' library and device) and per-row offsets such that
        ``scores + offset`` are the log-probabilities: eos masked below ``min_len``, processors applied. Rows
        with NaN or +inf logits fail their request (offset -inf)."""
        opt, b = self.options, self.book
        raw = extras.get("log_softmax") is False  # the step's logits are its scores (shallow fusion)
        if raw:  # only NaN / +inf need finding: a row's maximum shows them (NaN wins), no exp over [rows, V]
            peak = ops.row_max(logits)  # shape: (rows,)
            lse = np.where(np.isfinite(peak), 0.0, peak)  # shape: (rows,) 0, or the row's NaN / +inf / -inf
        else:
            lse = ops.logsumexp(logits)  # shape: (rows,)
        ok = np.isfinite(lse)
        bad = self.fail_bad_rows(lse, rows)
        masked = t_row < b.min_len[rows.req]  # shape: (rows,) eos is masked until min_len
        procs = opt.processors
        if not procs:
            return self.mask_eos(logits, rows, masked, copy=True), np.where(ok, -lse, -np.inf)
        # shape: (rows, V), edited in place by the processors: raw logits (a copy) or log-probabilities
        scores = ops.copy(logits) if opt.process_logits or raw else ops.log_softmax(logits)
        scores = self.mask_eos(scores, rows, masked)
        for lo, hi, ctx in segments:
            part = scores[lo:hi]
            edited = part
            for i, proc in enumerate(procs):
                seen = ctx
                if i in self.carried and rows.carry is not None:  # its per-row values, written in place
                    seen = replace(ctx, carry=rows.carry[lo:hi, self.carried[i]])
                edited = proc(edited, seen)
                if edited is None:
                    raise TypeError(f"processors[{i}] returned None: a processor returns the edited scores")
            if len(segments) == 1:
                scores = edited
            elif edited is not part:
                scores[lo:hi] = edited
        if opt.process_logits and not raw:
            plse = ops.logsumexp(scores)  # shape: (rows,) normaliser of the processed logits
            return scores, np.where(np.isfinite(plse) & ~bad, -plse, -np.inf)
        return scores, np.where(bad, -np.inf, 0.0)

    def with_coverage(self, rows: Rows, extras: dict[str, Any]) -> Rows:
        """The rows with this step's attention added to their coverage (when a coverage penalty is set)."""
        if self.options.coverage_penalty is None:
            return rows
        attn = ops.to_numpy(extras["attention"]).astype(np.float64)  # shape: (rows, S)
        return replace(rows, cov=add_coverage(rows.cov, attn))

    def segments(self, rows: Rows, t_row: np.ndarray) -> list[tuple[int, int, StepContext]]:
        """Runs of rows at the same step with the same stop tokens and candidates per row (``m``), each with its
        :class:`StepContext`."""
        e_row, m_row, temp = self.book.eos[rows.req], self.book.m[rows.req], self.book.temp[rows.req]
        n = rows.req.shape[0]
        differ = (t_row[1:] != t_row[:-1]) | (e_row[1:] != e_row[:-1]) | (m_row[1:] != m_row[:-1])
        change = np.flatnonzero(differ) + 1
        bounds = [0, *change.tolist(), n]
        width = rows.tokens.shape[1]
        out = []
        for lo, hi in itertools.pairwise(bounds):
            t = int(t_row[lo])
            whole = lo == 0 and hi == n
            ctx = StepContext(
                step=t,
                tokens=rows.tokens if whole and t == width else rows.tokens[lo:hi, width - t :],
                request=rows.req[lo:hi],
                eos=self.eos[self.book.eos[rows.req[lo]]],
                logprob=rows.lp[lo:hi],
                finished=self.book.count[rows.req[lo:hi]],
                pool=(self.book.table.req, self.book.table.key),
                temperature=temp[lo:hi],
                beam=self.book.beam[rows.req[lo:hi]],
                max_len=self.book.max_len[rows.req[lo:hi]],
                request_id=self.book.rid[rows.req[lo:hi]],
            )
            out.append((lo, hi, ctx))
        return out

    def mask_eos(self, scores: Any, rows: Rows, masked: np.ndarray, copy: bool = False) -> Any:
        """Stop tokens set to -inf in the ``masked`` rows (requests below their ``min_len``)."""
        if not masked.any():
            return scores
        if copy:
            scores = ops.copy(scores)
        where = np.flatnonzero(masked)
        e_row = self.book.eos[rows.req[where]]
        for e in np.unique(e_row).tolist():
            stop = np.asarray(self.eos[e])  # ints (float when empty: then skipped)
            stop = stop[(stop >= 0) & (stop < scores.shape[1])]  # ids out of the vocabulary fail at the call
            sel = where[e_row == e]
            if stop.size:
                scores = ops.fill(scores, np.repeat(sel, stop.size), np.tile(stop, sel.size), float("-inf"))
        return scores

    def select(
        self, scores: Any, offset: np.ndarray, rows: Rows, segments: list[tuple[int, int, StepContext]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The selector's candidates ``[rows, m']``, asked per run of rows (one call when there is one run; the
        deterministic selector is asked once, each row then cut to its own request's ``m``)."""
        m_row = self.book.m[rows.req]
        m = int(m_row.max())
        sel = self.options.selector
        if len(segments) == 1 or type(sel) is Deterministic:
            logp, tok, key = sel.candidates(scores, offset, rows.key, m, segments[0][2])
        else:
            parts = [
                sel.candidates(scores[lo:hi], offset[lo:hi], rows.key[lo:hi], int(m_row[lo]), ctx)
                for lo, hi, ctx in segments
            ]
            w = max(p[0].shape[1] for p in parts)
            fills = ((0, np.nan), (1, 0), (2, np.nan))  # logp, tok, key: NaN is not finite, so rank_all drops it
            logp, tok, key = (np.concatenate([_pad_cols(p[i], w, fill) for p in parts]) for i, fill in fills)
        if type(sel) is Deterministic and int(m_row.min()) < m:  # other beam sizes: each row keeps its own top m
            beyond = np.arange(tok.shape[1]) >= m_row[:, None]  # shape: (rows, m)
            key = np.where(beyond, np.nan, key)  # a key that is not finite drops the candidate (rank_all)
        return logp, tok, key

    def is_eos(self, tok: np.ndarray, req: np.ndarray) -> np.ndarray:
        """Whether each candidate token is one of its request's stop tokens."""
        if len(self.eos) == 1:  # every request has the same stop tokens
            return is_stop(tok, self.eos[0])
        e = self.book.eos[req]
        out = np.zeros(tok.shape[0], dtype=bool)
        for i in np.unique(e).tolist():
            sel = e == i
            out[sel] = is_stop(tok[sel], self.eos[i])
        return out


def _pad_cols(a: np.ndarray, width: int, fill: float) -> np.ndarray:
    """``a`` ``[rows, w]`` padded on the right to ``width`` columns with ``fill``."""
    if a.shape[1] == width:
        return a
    return np.concatenate([a, np.full((a.shape[0], width - a.shape[1]), fill)], axis=1)


def _raw(extras: dict[str, Any]) -> bool:
    """Whether the step returned its scores as they are, to be added without a log-softmax (shallow fusion)."""
    return extras.get("log_softmax") is False
