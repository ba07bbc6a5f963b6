"""Greedy decoding without the beam machinery: one row per request, the best token of each row after the
processors, no candidate tables, ranking or pools.

It gives what the engine gives for one beam (:func:`greedy_applies` says when the two agree by construction): the
same tokens, log-probabilities, token log-probabilities and scores, float for float, since each quantity is
computed by the same operations in the same order. Each step reads the logits once more than the model wrote
them: the row's log-sum-exp and its best token come from one read (:func:`beamkit.search.select.lse_and_top`);
with processors, they edit the scores first (a copy of the logits, or the log-probabilities, as the options say).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.hypothesis import Hypothesis
from beamkit.processors import StepContext, is_stop
from beamkit.search.inputs import StepFn, bos_array, count_requests, eos_ids, unpack_step
from beamkit.search.options import SearchOptions
from beamkit.search.records import EngineStats, SearchResult
from beamkit.search.select import lse_and_top
from beamkit.search.selectors import Deterministic
from beamkit.state import check_rows, first_array, select_state


def greedy_applies(options: SearchOptions) -> bool:
    """Whether a search with ``options`` is plain greedy decoding, which :func:`greedy_search` runs exactly as
    the engine would: one beam, the deterministic selector, a pool of one (the first stop token ends the
    request), and nothing that needs the engine's records (traces, kept states, final scorer, coverage penalty,
    beam threshold, exact exit). The pool policy's stopping rule must end a request once its pool of one is
    full (``early_stopping`` True or False: the runner-up never scores above the stop token at its length)."""
    o = options
    return (
        o.beam_size == 1
        and type(o.selector) is Deterministic
        and (o.policy != "pool" or o.pool_size == 1)
        and not o.record_trace
        and not o.keep_state
        and o.final_scorer is None
        and o.coverage_penalty is None
        and o.beam_threshold is None
        and not o.exact_exit
        and (o.policy != "pool" or o.early_stopping != "never")  # "never" may run on past a finished best
    )


def greedy_search(
    options: SearchOptions, step_fn: StepFn, init_state: Any, bos: Any, eos: Any, batch_size: int | None = None
) -> SearchResult:
    """Decode every request of ``init_state`` (one row each) greedily; results in row order, one hypothesis each
    (``options`` must pass :func:`greedy_applies`). Errors as the engine reports them: a request whose logits
    hold NaN or +inf, or whose every continuation is masked, fails alone; a malformed ``step_fn`` result
    raises."""
    if not greedy_applies(options):
        raise ValueError("greedy_search needs options that greedy_applies() accepts (one beam, plain greedy)")
    n = count_requests(init_state, bos) if batch_size is None else batch_size
    check_rows(init_state, n, "init_state")
    return _Greedy(options, step_fn, eos_ids(eos)).run(init_state, bos_array(bos, n), n)


class _Greedy:
    """One greedy search: the live rows (one per running request, in request order) and what they hold."""

    def __init__(self, options: SearchOptions, step_fn: StepFn, eos: tuple[int, ...]) -> None:
        self.opt = options
        self.step_fn = step_fn
        self.eos = eos
        procs = options.processors or ()
        self.carried = [i for i, p in enumerate(procs) if getattr(p, "carries", False)]
        self.stats = EngineStats()
        self.errors: dict[int, str] = {}
        self._stop_ids: tuple[int, np.ndarray] | None = None  # (vocabulary width, its stop ids)

    def run(self, state: Any, y: np.ndarray, n: int) -> SearchResult:
        """Step until every request has ended."""
        opt = self.opt
        req = np.arange(n)  # shape: (rows,) the request of each live row
        lp = np.zeros(n)  # shape: (rows,) running log-probability, float64
        tokens = np.zeros((n, 0), np.int64)  # shape: (rows, t) generated tokens
        token_lp = np.zeros((n, 0))  # shape: (rows, t) step scores
        carry = np.full((n, len(self.carried)), -1, np.int64)  # shape: (rows, K) carrying processors' values
        results: list[list[Hypothesis]] = [[] for _ in range(n)]
        ref: Any = first_array(state)  # y_prev follows the state's library and device, then the logits'
        vocab: int | None = None
        for t in range(opt.max_len):
            rows = req.shape[0]
            if rows == 0:
                break
            y_prev = y if ref is None else ops.like(y, ref)
            logits, state, extras = unpack_step(self.step_fn(state, y_prev))
            ops.check_logits(logits, rows)
            width = int(logits.shape[1])
            if vocab is None:
                vocab = width
                self._check_eos(req, width)
            elif width != vocab:
                raise ValueError(
                    f"step_fn returned logits of width {width}, but {vocab} before: the vocabulary must not change"
                )
            check_rows(state, rows, "the state step_fn returned")
            self.stats.record_kv(state)
            ctx = self._context(t, tokens, req, lp) if opt.processors else None  # what processors see
            tok, step_lp = self._choose(logits, extras, ctx, carry, t, req)  # shape: (rows,), (rows,)
            new_lp = lp + step_lp
            ends = is_stop(tok, self.eos)
            last = t + 1 >= opt.max_len
            failed = self._failed(req)
            done = ~failed & (ends | last)
            for i in np.flatnonzero(done).tolist():
                results[int(req[i])] = [self._hypothesis(tokens[i], token_lp[i], lp[i], new_lp[i], tok[i], ends[i])]
            keep = np.flatnonzero(~(done | failed))
            self.stats.model_calls += 1
            self.stats.rows_per_call.append(rows)
            self.stats.joined_per_call.append(n if t == 0 else 0)
            self.stats.left_per_call.append(rows - keep.shape[0])
            tokens = np.concatenate([tokens, tok[:, None]], axis=1)[keep]
            token_lp = np.concatenate([token_lp, (new_lp - lp)[:, None]], axis=1)[keep]
            lp, req, y, carry = new_lp[keep], req[keep], tok[keep], carry[keep]
            if keep.shape[0] < rows:
                state = select_state(state, keep) if keep.size else None
            ref = None if keep.size == 0 else ops.like(y[:0], logits)
        return SearchResult(results, self.stats, dict(self.errors))

    def _context(self, t: int, tokens: np.ndarray, req: np.ndarray, lp: np.ndarray) -> StepContext:
        """What the processors see of the live rows at step ``t``."""
        rows = req.shape[0]
        return StepContext(
            step=t,
            tokens=tokens,
            request=req,
            eos=self.eos,
            logprob=lp,
            finished=np.zeros(rows, np.int64),
            pool=(np.zeros(0, np.int64), np.zeros(0)),
            temperature=np.full(rows, np.nan),
        )

    def _failed(self, req: np.ndarray) -> np.ndarray:
        """Which live rows belong to a failed request (``[rows]`` bool; Python per failed request only)."""
        if not self.errors:
            return np.zeros(req.shape[0], dtype=bool)
        return np.isin(req, np.fromiter(self.errors, np.int64, len(self.errors)))

    def _check_eos(self, req: np.ndarray, width: int) -> None:
        """Stop tokens must be token ids of the model's vocabulary: every request fails otherwise."""
        if any(not 0 <= e < width for e in self.eos):
            for r in req.tolist():
                self.errors[r] = f"eos={list(self.eos)} is not a token id of the model's vocabulary of {width}"

    def _choose(
        self,
        logits: Any,
        extras: dict[str, Any],
        ctx: StepContext | None,
        carry: np.ndarray,
        t: int,
        req: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each row's best token after the processors and its step score (the engine's arithmetic)."""
        opt = self.opt
        raw = extras.get("log_softmax") is False
        masked = t < opt.min_len
        procs = opt.processors
        if not procs and not raw:  # the log-sum-exp and the best token from one read
            stop = self._stops(int(logits.shape[1])) if masked else np.zeros(0, np.int64)
            lse, vals, tok = lse_and_top(logits, 1)  # shape: (rows,), (rows, 1), (rows, 1)
            if stop.size and (bool((tok == stop).any()) or not bool(np.isfinite(lse).all())):
                # below min_len, a row's best is a stop token (or a row is not finite): read one more candidate
                # per stop token (where no row's best is one, its first non-stop candidate is that best)
                lse, vals, tok = lse_and_top(logits, 1 + stop.size)  # shape: (rows,), (rows, m), (rows, m)
            else:
                stop = stop[:0]
            if stop.size:  # below min_len: each row's best token that is no stop token (ties: lowest id)
                other = np.asarray(~np.isin(tok, stop))  # shape: (rows, m) m = 1 + stops: one at least, if V allows
                first = other.argmax(axis=1)[:, None]  # shape: (rows, 1)
                some = np.asarray(other.any(axis=1))[:, None]  # shape: (rows, 1) a token other than a stop token
                vals = np.where(some, np.take_along_axis(vals, first, axis=1), -np.inf)
                tok = np.take_along_axis(tok, first, axis=1)
            bad = self._fail_bad(lse, req, t)
            offset = np.where(np.isfinite(lse), -lse, -np.inf)
        else:
            if raw:  # NaN / +inf show in a row's maximum
                peak = ops.row_max(logits)
                lse = np.where(np.isfinite(peak), 0.0, peak)
            else:
                lse = ops.logsumexp(logits)
            bad = self._fail_bad(lse, req, t)
            ok = np.isfinite(lse)
            if not procs:
                scores = self._mask_eos(ops.copy(logits)) if masked else logits
                offset = np.where(ok, -lse, -np.inf)
            else:
                scores = ops.copy(logits) if opt.process_logits or raw else ops.log_softmax(logits)
                if masked:
                    scores = self._mask_eos(scores)
                assert ctx is not None  # built whenever there are processors
                for i, proc in enumerate(procs):
                    seen = replace(ctx, carry=carry[:, self.carried.index(i)]) if i in self.carried else ctx
                    scores = proc(scores, seen)
                    if scores is None:
                        raise TypeError(f"processors[{i}] returned None: a processor returns the edited scores")
                if opt.process_logits and not raw:
                    plse, vals, tok = lse_and_top(scores, 1)
                    offset = np.where(np.isfinite(plse) & ~bad, -plse, -np.inf)
                else:
                    offset = np.where(bad, -np.inf, 0.0)
            if not (procs and opt.process_logits and not raw):
                vals, tok = ops.top_candidates(scores, 1)
        with np.errstate(invalid="ignore"):  # +inf logits in a failed row: inf - inf
            step_lp = vals[:, 0] + offset
        tok = tok[:, 0]
        for i in np.flatnonzero(~np.isfinite(step_lp)).tolist():
            r = int(req[i])
            self.errors.setdefault(r, f"no finite candidate at step {t} (every continuation is masked or -inf)")
        return tok, step_lp

    def _fail_bad(self, lse: np.ndarray, req: np.ndarray, t: int) -> np.ndarray:
        """Fail the requests whose logits hold NaN or +inf; returns those rows."""
        bad = np.isnan(lse) | (lse == np.inf)
        for i in np.flatnonzero(bad).tolist():
            what = "NaN" if np.isnan(lse[i]) else "+inf"
            self.errors[int(req[i])] = f"step_fn returned {what} logits at step {t}"
        return bad

    def _stops(self, vocab: int) -> np.ndarray:
        """The stop token ids that are ids of a ``vocab``-wide vocabulary, each once (kept per width)."""
        if self._stop_ids is None or self._stop_ids[0] != vocab:
            stop = np.unique(np.asarray(self.eos, dtype=np.int64))
            self._stop_ids = (vocab, stop[(stop >= 0) & (stop < vocab)])
        return self._stop_ids[1]

    def _mask_eos(self, scores: Any) -> Any:
        """Stop tokens set to -inf in every row (all rows are below ``min_len`` together)."""
        stop = self._stops(int(scores.shape[1]))
        rows = int(scores.shape[0])
        if stop.size and rows:
            scores = ops.fill(scores, np.repeat(np.arange(rows), stop.size), np.tile(stop, rows), float("-inf"))
        return scores

    def _hypothesis(
        self, tokens: np.ndarray, token_lp: np.ndarray, lp: float, new_lp: float, tok: int, finished: bool
    ) -> Hypothesis:
        """The hypothesis of a request that ended at this step (a stop token, or ``max_len``)."""
        length = tokens.shape[0] + 1
        score = float(self.opt.length_penalty(np.array([new_lp]), np.array([length]))[0])
        return Hypothesis(
            tokens=tokens.tolist() + [int(tok)],
            logprob=float(new_lp),
            score=score,
            finished=bool(finished),
            token_logprobs=token_lp.tolist() + [float(new_lp) - float(lp)],
            beam_indices=[0] * length,
            key=float(new_lp),
        )
