"""The search engine: one step loop for every search beamkit runs.

One step, for all live rows of all requests at once::

    logits, state = step_fn(state, y_prev)          # shape: (rows, V), one model call
    scores = processors(log_softmax(logits))         # only when processors are set
    cand = running[:, None] + top_m(scores)          # shape: (rows, m), per-row preselection on the device
    rank cand within each request                    # host, O(rows * m): key desc, row asc, token asc
    policy: eos / max_len -> finished, best others -> survivors, per-request stop
    state = select_state(state, parents)             # skipped when parents are the identity

Rows are compact: a request starts with one row, a finished request leaves the batch. Any request's candidates
are ranked by the same keys whatever else is in the batch, so decoding N requests together gives exactly the
results of decoding each alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

from beamkit import ops
from beamkit.hypothesis import BatchDecodeError, Hypothesis, SearchStats
from beamkit.processors import LogitsProcessor, MinLength, StepContext, is_stop
from beamkit.scoring import CoveragePenalty, FinalScorer, LengthPenalty, as_length_penalty
from beamkit.state import first_array, is_identity, select_state

StepFn = Callable[[Any, Any], Any]
EarlyStopping = bool | Literal["never"]


class Selector(Protocol):
    """Picks each row's candidate continuations (the sampler of AllenNLP's design).

    ``scores`` ``[rows, V]`` (backend) plus ``offset`` ``[rows]`` are the step's log-probabilities
    (``scores + offset``); ``parent_key`` ``[rows]`` is each row's ranking key so far. Returns host arrays
    ``(logp, token, key)``, each ``[rows, m']``: the log-probability to accumulate, the token, and the key the
    engine ranks candidates by (descending). ``-inf`` keys are never chosen. A selector whose rows come ordered
    (key descending, equal keys by token ascending) may say so with a class attribute ``ordered = True``: the
    engine then ranks by a cheaper stable sort.
    """

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class Deterministic:
    """The default selector: the m best tokens per row, key = running log-probability."""

    ordered = True  # top_candidates orders each row by value descending, column ascending

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The m best tokens of each row by log-probability; the key is the running log-probability."""
        vals, idx = ops.top_candidates(scores, m)  # shape: (rows, m)
        logp = vals + offset[:, None]
        return logp, idx, parent_key[:, None] + logp


@dataclass(frozen=True)
class SearchOptions:
    """Everything that configures a search (frozen, like whisper's ``DecodingOptions``).

    policy:
        ``"narrow"`` (seed 000): a finished hypothesis keeps its slot, the beam narrows; live hypotheses at
        ``max_len`` are returned unfinished. ``"pool"`` (fairseq / Hugging Face): ``beam_size`` running beams
        are kept from the top ``2 * beam_size`` candidates; eos candidates ranked within the top
        ``beam_size`` go to a finished pool of ``round(beam_size * patience)``; at ``max_len`` the top
        candidates are added to the pool unfinished. ``"compete"`` (Kool et al.'s stochastic beam search): the
        finished hypotheses and the new candidates of a request compete by key for its ``beam_size`` slots
        every step, so a finished hypothesis can be displaced (it never rides along as a row).
    early_stopping (pool):
        ``True``: stop a request once its pool is full. ``False``: Hugging Face's heuristic (stop when the best
        running beam, scored at the current length, cannot beat the pool's worst). ``"never"``: the exact
        bound, the best running beam scored at ``max_len`` when ``alpha > 0``.
    process_logits:
        processors edit the raw logits, which are normalised afterwards (Hugging Face's greedy search), instead
        of the log-probabilities (its beam search); the two differ for processors that are not shifts or masks,
        such as the repetition penalty.
    exact_exit (pool, ``alpha == 0`` only):
        also stop once the ``num_return``-th best finished score is at least the best running log-probability:
        with raw log-probabilities nothing later can overtake it (CTranslate2's early exit).
    """

    beam_size: int
    max_len: int
    length_penalty: LengthPenalty = field(default_factory=LengthPenalty)
    policy: Literal["narrow", "pool", "compete"] = "narrow"
    early_stopping: EarlyStopping = False
    patience: float = 1.0
    exact_exit: bool = False
    num_return: int | None = None
    min_len: int = 0
    processors: tuple[LogitsProcessor, ...] = ()
    process_logits: bool = False
    coverage_penalty: CoveragePenalty | None = None
    final_scorer: FinalScorer | None = None
    selector: Selector = field(default_factory=Deterministic)

    def __post_init__(self) -> None:
        for name in ("beam_size", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.policy not in ("narrow", "pool", "compete"):
            raise ValueError(f"policy must be 'narrow', 'pool' or 'compete', got {self.policy!r}")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, (int, float)) or not self.patience > 0:
            raise ValueError(f"patience must be > 0, got {self.patience}")
        if self.num_return is not None and not 1 <= self.num_return <= self.beam_size:
            raise ValueError(f"num_return must be between 1 and beam_size={self.beam_size}, got {self.num_return}")
        if isinstance(self.min_len, bool) or not isinstance(self.min_len, (int, np.integer)) or self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, got {self.min_len}")
        if self.exact_exit and (self.policy != "pool" or self.length_penalty.alpha != 0):
            raise ValueError("exact_exit needs policy='pool' and length penalty alpha == 0")
        raising = [type(p).__name__ for p in self.processors if getattr(p, "raises_scores", False)]
        if self.exact_exit and raising:
            raise ValueError(f"exact_exit needs step scores <= 0, but {raising} may raise them")

    @property
    def pool_size(self) -> int:
        """How many finished hypotheses make a request's pool full (Kasai et al.'s patience)."""
        return max(1, round(self.beam_size * self.patience))


@dataclass
class SearchResult:
    """Hypotheses per request (best first), counters, and per-request errors (empty when all went well)."""

    hypotheses: list[list[Hypothesis]]
    stats: SearchStats
    errors: dict[int, str]


class _Requests:
    """Per-request bookkeeping, indexed by request: finished pools, their sizes and scores, errors."""

    def __init__(self, n: int, nth: int):
        self.pools: list[list[_Finished]] = [[] for _ in range(n)]
        self.errors: dict[int, str] = {}
        self.count = np.zeros(n, dtype=np.int64)  # shape: (R,) hypotheses in each pool
        self.worst = np.full(n, -np.inf)  # shape: (R,) lowest score in each pool
        self.nth = np.full(n, -np.inf)  # shape: (R,) the nth best score (-inf while fewer)
        self._n = nth

    def add(self, found: dict[int, list[_Finished]], cap: int | None) -> None:
        """Merge new finished hypotheses into their requests' pools, best score first, capped (stable ties)."""
        for r, hyps in found.items():
            pool = self.pools[r] + hyps
            pool.sort(key=_neg_score)
            self.set(r, pool if cap is None else pool[:cap], by_score=True)

    def set(self, r: int, pool: list[_Finished], by_score: bool = False) -> None:
        """Replace request r's pool (kept in the order given; ``by_score``: it is best score first) and its
        counters."""
        self.pools[r] = pool
        self.count[r] = len(pool)
        if not pool:
            self.worst[r] = -np.inf
        else:
            self.worst[r] = pool[-1].score if by_score else min(h.score for h in pool)
        self.nth[r] = pool[self._n - 1].score if len(pool) >= self._n else -np.inf


def _neg_score(h: _Finished) -> float:
    """Sort key: best score first."""
    return -h.score


@dataclass
class _Rows:
    """The live rows, one per running hypothesis, grouped by request in rank order (host arrays)."""

    req: np.ndarray  # shape: (rows,) request of each row
    lp: np.ndarray  # shape: (rows,) running log-probability, float64
    key: np.ndarray  # shape: (rows,) selector key (== lp for the deterministic selector)
    tokens: np.ndarray  # shape: (rows, t) generated tokens
    token_lp: np.ndarray  # shape: (rows, t) step scores
    beam: np.ndarray  # shape: (rows, t) beam slot of the parent at each step
    cov: np.ndarray | None = None  # shape: (rows, S) accumulated attention
    _slots: np.ndarray | None = field(default=None, repr=False)  # shape: (rows,) cache of slots()

    @classmethod
    def start(cls, n: int) -> _Rows:
        """One empty row per request."""
        z = np.zeros((n, 0))
        return cls(np.arange(n), np.zeros(n), np.zeros(n), z.astype(np.int64), z, z.astype(np.int64))

    def slots(self) -> np.ndarray:
        """Each row's beam slot: its rank within its request (computed once per step)."""
        if self._slots is None:
            self._slots = np.arange(self.req.shape[0]) - self.req.searchsorted(self.req, side="left")
        return self._slots

    def extend(self, cand: _Candidates, sel: np.ndarray) -> _Rows:
        """The rows of the selected candidates: parents' histories gathered, new token appended."""
        parents = cand.row[sel]
        return _Rows(
            req=cand.req[sel],
            lp=cand.lp[sel],
            key=cand.key[sel],
            tokens=np.concatenate([self.tokens[parents], cand.tok[sel, None]], axis=1),
            token_lp=np.concatenate([self.token_lp[parents], (cand.lp[sel] - self.lp[parents])[:, None]], axis=1),
            beam=np.concatenate([self.beam[parents], self.slots()[parents, None]], axis=1),
            cov=None if self.cov is None else self.cov[parents],
        )


class _Paths(NamedTuple):
    """The parents' histories of the hypotheses that ended at one step, gathered once for all of them."""

    tokens: np.ndarray  # shape: (n, t)
    token_lp: np.ndarray  # shape: (n, t)
    beam: np.ndarray  # shape: (n, t)
    lp: np.ndarray  # shape: (n,) the parent's running log-probability
    slot: np.ndarray  # shape: (n,) the parent's beam slot


class _Finished(NamedTuple):
    """A pool entry: a hypothesis that ended (eos, or cut off at ``max_len``), built into a :class:`Hypothesis`
    only if it is still in its pool when the search ends (most entries are displaced before)."""

    score: float
    key: float
    logprob: float
    finished: bool
    paths: _Paths  # the step's gathered parent histories
    i: int  # its parent's index in ``paths``
    tok: int  # its last token

    def build(self) -> Hypothesis:
        """The full :class:`Hypothesis`: the parent's path plus the last token."""
        p, i = self.paths, self.i
        return Hypothesis(
            tokens=p.tokens[i].tolist() + [self.tok],
            logprob=self.logprob,
            score=self.score,
            finished=self.finished,
            token_logprobs=p.token_lp[i].tolist() + [self.logprob - float(p.lp[i])],
            beam_indices=p.beam[i].tolist() + [int(p.slot[i])],
            key=self.key,
        )


@dataclass
class _Candidates:
    """One step's finite candidates of every request, ranked: request, then key desc, row asc, token asc."""

    row: np.ndarray  # shape: (n,) parent row
    tok: np.ndarray  # shape: (n,) token
    lp: np.ndarray  # shape: (n,) log-probability of the extended prefix
    key: np.ndarray  # shape: (n,) ranking key
    req: np.ndarray  # shape: (n,) request
    rank: np.ndarray  # shape: (n,) rank within the request

    @classmethod
    def rank_all(
        cls, rows: _Rows, logp: np.ndarray, tok: np.ndarray, key: np.ndarray, ordered: bool = False
    ) -> _Candidates:
        """Flatten the per-row tables ``[rows, m]``, drop non-finite candidates, rank within each request.

        ``ordered``: each row's candidates already come by key descending, equal keys by token ascending, so
        the flat row-major order breaks ties as the engine does and a stable sort by (request, key) suffices.
        """
        c_row = np.repeat(np.arange(tok.shape[0]), tok.shape[1])  # shape: (rows * m,)
        c_tok, c_key = tok.reshape(-1), key.reshape(-1)
        c_lp = rows.lp[c_row] + logp.reshape(-1)
        c_req = rows.req[c_row]
        order, rank = rank_candidates(c_req, c_key, c_row, c_tok, np.isfinite(c_lp), ordered)
        return cls(c_row[order], c_tok[order], c_lp[order], c_key[order], c_req[order], rank)

    def rank_among(self, sel: np.ndarray) -> np.ndarray:
        """Rank of each selected candidate among the selected ones of its request."""
        r = self.req[sel]
        return np.arange(sel.shape[0]) - np.searchsorted(r, r, side="left")


class BeamSearch:
    """A configured search: ``BeamSearch(options).search(step_fn, init_state, bos, eos)``."""

    def __init__(self, options: SearchOptions):
        self.options = options
        procs = list(options.processors)
        if options.min_len > 0:
            procs.insert(0, MinLength(options.min_len))
        self.processors = tuple(procs)
        self._ordered = bool(getattr(options.selector, "ordered", False))  # see Selector
        # finish / survive / stop for one step, by policy; returns the survivors (indices into the candidates)
        self._policy_step = {"narrow": self._narrow_step, "pool": self._pool_step, "compete": self._compete_step}[
            options.policy
        ]

    def search(
        self,
        step_fn: StepFn,
        init_state: Any,
        bos: int | Sequence[int],
        eos: int | Sequence[int] | None,
        batch_size: int | None = None,
    ) -> SearchResult:
        """Decode every request of ``init_state`` (one row each); see the module docstring for one step.

        ``eos`` is the stop token, or several (any of them finishes a hypothesis); ``None`` means no stop token:
        every hypothesis runs to ``max_len``.
        """
        opt = self.options
        lead = first_array(init_state)
        n_req = count_requests(init_state, bos) if batch_size is None else int(batch_size)
        stop = eos_ids(eos)
        bos_arr = bos_array(bos, n_req)
        m = 2 * opt.beam_size if opt.policy == "pool" else opt.beam_size
        book = _Requests(n_req, opt.num_return or opt.beam_size)
        stats = SearchStats()
        rows = _Rows.start(n_req)
        state = init_state
        y_prev = ops.like(bos_arr, lead) if lead is not None else bos_arr

        for t in range(opt.max_len):
            n_rows = rows.req.shape[0]
            logits, state, extras = unpack_step(step_fn(state, y_prev))
            stats.model_calls += 1
            stats.rows_per_call.append(n_rows)
            ops.check_logits(logits, n_rows)
            if t == 0 and any(not 0 <= e < logits.shape[1] for e in stop):
                raise ValueError(f"eos={eos} is not a token id of the model's vocabulary of {logits.shape[1]}")

            lse = ops.logsumexp(logits)  # shape: (rows,)
            ok = np.isfinite(lse)
            all_ok = bool(ok.all())  # else NaN / +inf rows (their requests fail) or all -inf rows (no candidate)
            bad = np.isnan(lse) | (lse == np.inf) if not all_ok else None
            if bad is not None:
                for r in np.unique(rows.req[bad]).tolist():
                    what = "NaN" if np.isnan(lse[bad & (rows.req == r)]).any() else "+inf"
                    book.errors[r] = f"step_fn returned {what} logits at step {t}"
            ctx = StepContext(
                step=t, tokens=rows.tokens, request=rows.req, eos=stop, logprob=rows.lp, finished=book.count[rows.req]
            )
            # a row yields nothing when its request failed or it has no finite logit
            if self.processors:
                # shape: (rows, V), edited in place by the processors: raw logits (a copy) or log-probabilities
                scores = ops.copy(logits) if opt.process_logits else ops.log_softmax(logits)
                for proc in self.processors:
                    scores = proc(scores, ctx)
                if opt.process_logits:
                    plse = ops.logsumexp(scores)  # shape: (rows,) normaliser of the processed logits
                    offset = np.where(np.isfinite(plse) & (True if bad is None else ~bad), -plse, -np.inf)
                else:
                    offset = np.zeros(n_rows) if bad is None else np.where(bad, -np.inf, 0.0)
            else:
                scores, offset = logits, (-lse if all_ok else np.where(ok, -lse, -np.inf))
            logp, tok, key = opt.selector.candidates(scores, offset, rows.key, m, ctx)  # shape: (rows, m)
            if opt.coverage_penalty is not None:
                if "attention" not in extras:
                    raise ValueError("coverage_penalty needs step_fn to return extras={'attention': [rows, S]}")
                attn = ops.to_numpy(extras["attention"]).astype(np.float64)  # shape: (rows, S)
                rows.cov = attn if rows.cov is None else rows.cov + attn

            cand = _Candidates.rank_all(rows, logp, tok, key, self._ordered)
            # a row yields nothing only when some candidate was dropped (not finite)
            empty = None if cand.req.shape[0] == logp.size else np.bincount(cand.req, minlength=n_req)[rows.req] == 0
            if empty is not None and empty.any():
                for r in np.unique(rows.req[empty]).tolist():
                    book.errors.setdefault(r, f"no finite candidate at step {t} (every continuation is masked or -inf)")
            last = t + 1 == opt.max_len
            surv = self._policy_step(book, rows, cand, stop, t, last)
            if book.errors:
                surv = surv[~np.isin(cand.req[surv], np.array(sorted(book.errors)))]
            if surv.size == 0 or last:
                break
            parents = cand.row[surv]
            rows = rows.extend(cand, surv)
            if not is_identity(parents, n_rows):
                state = select_state(state, parents)
            y_prev = ops.like(cand.tok[surv], logits)

        results = [self._rank(book.pools[r]) if r not in book.errors else [] for r in range(n_req)]
        return SearchResult(results, stats, dict(book.errors))

    def _scores(self, rows: _Rows, cand: _Candidates, sel: np.ndarray, length: int) -> np.ndarray:
        """Final scores of the candidates ``sel`` ended at ``length``: length penalty, coverage penalty."""
        opt = self.options
        scores = opt.length_penalty(cand.lp[sel], length)
        if opt.coverage_penalty is not None and rows.cov is not None:
            scores = scores + opt.coverage_penalty(rows.cov[cand.row[sel]])
        return scores

    def _hypotheses(
        self,
        rows: _Rows,
        cand: _Candidates,
        sel: np.ndarray,
        finished: np.ndarray,
        length: int,
        scores: np.ndarray | None = None,
    ) -> dict[int, list[_Finished]]:
        """Pool entries for the candidates ``sel``, scored at ``length`` (unless ``scores`` are given), by request."""
        found: dict[int, list[_Finished]] = {}
        if sel.size == 0:
            return found
        if scores is None:
            scores = self._scores(rows, cand, sel, length)
        par = cand.row[sel]
        # gathered, not viewed: an entry must not keep the whole step's rows alive
        paths = _Paths(rows.tokens[par], rows.token_lp[par], rows.beam[par], rows.lp[par], rows.slots()[par])
        columns = zip(
            cand.req[sel].tolist(),
            scores.tolist(),
            cand.key[sel].tolist(),
            cand.lp[sel].tolist(),
            finished.tolist(),
            cand.tok[sel].tolist(),
            strict=True,
        )
        for i, (r, score, key, logprob, fin, tok) in enumerate(columns):
            found.setdefault(r, []).append(_Finished(score, key, logprob, fin, paths, i, tok))
        return found

    def _narrow_step(
        self, book: _Requests, rows: _Rows, cand: _Candidates, stop: tuple[int, ...], t: int, last: bool
    ) -> np.ndarray:
        """Seed 000: keep the first ``beam_size - finished`` candidates; eos finishes and keeps its slot."""
        quota = self.options.beam_size - book.count
        take = cand.rank < quota[cand.req]
        is_eos = is_stop(cand.tok, stop)
        done = np.flatnonzero(take & is_eos)
        surv = np.flatnonzero(take & ~is_eos)
        book.add(self._hypotheses(rows, cand, done, np.ones(done.size, bool), t + 1), None)
        if last:  # live hypotheses at max_len are returned unfinished
            book.add(self._hypotheses(rows, cand, surv, np.zeros(surv.size, bool), t + 1), None)
            return surv[:0]
        return surv

    def _pool_step(
        self, book: _Requests, rows: _Rows, cand: _Candidates, stop: tuple[int, ...], t: int, last: bool
    ) -> np.ndarray:
        """Hugging Face / fairseq: eos (or anything at max_len) ranked in the top k joins the pool; the best k
        other candidates run on; then each request's stopping rule."""
        opt = self.options
        k = opt.beam_size
        is_eos = is_stop(cand.tok, stop)
        hits = is_eos | last
        admit = hits & (cand.rank < k)
        if opt.early_stopping is True:
            admit &= book.count[cand.req] < opt.pool_size
        adm = np.flatnonzero(admit)
        if adm.size:
            score = self._scores(rows, cand, adm, t + 1)
            a_req = cand.req[adm]
            fits = (book.count[a_req] < opt.pool_size) | (score > book.worst[a_req])  # a full pool takes better only
            adm, score = adm[fits], score[fits]
            book.add(self._hypotheses(rows, cand, adm, is_eos[adm], t + 1, score), opt.pool_size)
        if hits.any():
            cont = np.flatnonzero(~hits)
            among = cand.rank_among(cont)  # shape: (cont,) rank among the request's non-ending candidates
            keep = among < k
            surv, first = cont[keep], np.flatnonzero(among[keep] == 0)
        else:  # nothing ends here: the best k of each request run on
            surv = np.flatnonzero(cand.rank < k)
            first = np.flatnonzero(cand.rank[surv] == 0)
        if surv.size:
            surv = surv[~self._pool_done(book, cand.req[surv], cand.lp[surv], first, t + 1)]
        return surv

    def _compete_step(
        self, book: _Requests, rows: _Rows, cand: _Candidates, stop: tuple[int, ...], t: int, last: bool
    ) -> np.ndarray:
        """Kool et al.: a request's finished hypotheses and new candidates compete by key for its k slots."""
        k = self.options.beam_size
        keep = np.zeros(cand.req.shape[0], dtype=bool)
        starts = group_starts(cand.req)
        ends = starts[1:].tolist() + [cand.req.shape[0]] if starts.size else []
        for lo, hi in zip(starts.tolist(), ends, strict=True):
            r = int(cand.req[lo])
            pk = np.array([h.key for h in book.pools[r]], dtype=np.float64)  # descending
            ck = cand.key[lo:hi]  # descending
            # overall rank = own rank + entries of the other side ranked above (finished ones win ties)
            keep[lo:hi] = np.arange(hi - lo) + np.searchsorted(-pk, -ck, side="right") < k
            stay = np.arange(pk.size) + np.searchsorted(-ck, -pk, side="left") < k
            book.set(r, [h for h, s in zip(book.pools[r], stay, strict=True) if s])
        is_eos = is_stop(cand.tok, stop)
        done = np.flatnonzero(keep & is_eos)
        surv = np.flatnonzero(keep & ~is_eos)
        by_key = self._hypotheses(rows, cand, done, np.ones(done.size, bool), t + 1)
        if last:  # live hypotheses at max_len join the result unfinished
            for r, hyps in self._hypotheses(rows, cand, surv, np.zeros(surv.size, bool), t + 1).items():
                by_key.setdefault(r, []).extend(hyps)
            surv = surv[:0]
        for r, hyps in by_key.items():
            pool = book.pools[r] + hyps
            pool.sort(key=lambda h: -h.key)
            book.set(r, pool)
        return surv

    def _pool_done(
        self, book: _Requests, s_req: np.ndarray, s_lp: np.ndarray, first: np.ndarray, cur: int
    ) -> np.ndarray:
        """For each survivor, whether its request stops now (early_stopping rules, patience, exact exit).

        Survivors come grouped by request, ranked; ``first`` indexes each request's first (best) one.
        """
        opt = self.options
        reqs, best = s_req[first], s_lp[first]
        full = book.count[reqs] >= opt.pool_size
        if opt.early_stopping is True:
            stop = full
        else:
            horizon = opt.max_len if (opt.early_stopping == "never" and opt.length_penalty.alpha > 0) else cur
            stop = full & (opt.length_penalty(best, horizon) <= book.worst[reqs])
        if opt.exact_exit:
            stop = stop | (book.nth[reqs] >= best)
        by_req = np.zeros(book.count.shape[0], dtype=bool)  # shape: (R,)
        by_req[reqs] = stop
        return by_req[s_req]

    def _rank(self, pool: list[_Finished]) -> list[Hypothesis]:
        """Final ranking of one request's hypotheses (optional final scorer), cut to ``num_return``."""
        opt = self.options
        hyps = [h.build() for h in sorted(pool, key=_neg_score)]
        if opt.final_scorer is not None and hyps:
            new = list(opt.final_scorer(hyps))
            if len(new) != len(hyps):
                raise ValueError("final_scorer must return one score per hypothesis")
            for h, s in zip(hyps, new, strict=True):
                h.score = float(s)
            hyps.sort(key=lambda h: -h.score)
        return hyps[: opt.num_return] if opt.num_return else hyps


def rank_candidates(
    req: np.ndarray,
    key: np.ndarray,
    row: np.ndarray,
    tok: np.ndarray,
    valid: np.ndarray | bool = True,
    ordered: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The engine's candidate order: request, then key descending, then row (beam) and token ascending.

    Candidates whose key is not finite (or not ``valid``) are dropped. Returns ``(order, rank)``: indices of the
    kept candidates in that order, and each one's rank within its request. ``ordered``: the arrays are already
    by row ascending and, within a row, by key descending with equal keys by token ascending, so a stable sort
    by (request, key) gives the same order. Selectors that must predict which beams the engine keeps (diverse
    beam search) rank with this same function.
    """
    finite = np.isfinite(key) & valid
    every = bool(finite.all())
    neg_key = -key if every else -np.where(finite, key, -np.inf)
    order = np.lexsort((neg_key, req) if ordered else (tok, row, neg_key, req))
    if not every:
        order = order[finite[order]]
    sorted_req = req[order]
    return order, np.arange(order.shape[0]) - sorted_req.searchsorted(sorted_req, side="left")


def eos_ids(eos: int | Sequence[int] | None) -> tuple[int, ...]:
    """The stop tokens as a tuple of distinct ints: ``None`` -> ``()``, an id -> ``(id,)``, ids kept in order."""
    if eos is None:
        return ()
    raw = np.asarray(eos)
    if raw.size == 0 and raw.ndim == 1:
        return ()
    if raw.dtype.kind not in "iu" or raw.ndim > 1:
        raise TypeError(f"eos must be an int, a sequence of ints or None, got {eos!r}")
    return tuple(dict.fromkeys(raw.reshape(-1).tolist()))


def unpack_step(out: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Split a step function's return value into ``(logits, new_state, extras)``."""
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise TypeError("step_fn must return (logits, new_state) or (logits, new_state, extras)")
    return out[0], out[1], (out[2] if len(out) == 3 else {})


def group_starts(sorted_ids: np.ndarray) -> np.ndarray:
    """Indices where a new value begins in a sorted 1-D array (the first index of each group)."""
    if sorted_ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.empty(sorted_ids.shape[0], dtype=bool)
    change[0] = True
    np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=change[1:])
    return np.flatnonzero(change)


def bos_array(bos: int | Sequence[int], n_req: int) -> np.ndarray:
    """``bos`` as int64 ``[n_req]``: one int for every request, or one id per request."""
    raw = np.asarray(bos)
    if raw.dtype.kind not in "iu":
        raise TypeError(f"bos must be an int or a sequence of ints, got dtype {raw.dtype}")
    out = np.full(n_req, raw, dtype=np.int64) if raw.ndim == 0 else raw.astype(np.int64)
    if out.shape != (n_req,):
        raise ValueError(f"bos must be an int or one id per request ({n_req}), got shape {raw.shape}")
    return out


def count_requests(init_state: Any, bos: int | Sequence[int]) -> int:
    """Requests in a batch: rows of the state's first array leaf, else ``len(bos)``, else 1."""
    lead = first_array(init_state)
    if lead is not None:
        return int(lead.shape[0])
    return int(np.shape(bos)[0]) if np.ndim(bos) == 1 else 1


def make_options(beam_size: int, max_len: int, **options: Any) -> SearchOptions:
    """Build :class:`SearchOptions`, accepting a plain float for ``length_penalty`` and lists for processors."""
    if "length_penalty" in options:
        options["length_penalty"] = as_length_penalty(options["length_penalty"])
    if "processors" in options:
        options["processors"] = tuple(options["processors"])
    return SearchOptions(beam_size=beam_size, max_len=max_len, **options)


def search_batch(
    step_fn: StepFn,
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int] | None,
    beam_size: int,
    max_len: int,
    **options: Any,
) -> list[list[Hypothesis]]:
    """Decode a batch of requests together: one ``step_fn`` call per step for all live rows.

    ``init_state`` has one row per request (axis 0 of every array leaf); ``bos`` is an int or one id per
    request. Options are the fields of :class:`SearchOptions` (``length_penalty`` may be a float). Returns each
    request's hypotheses, best first. If some requests fail (NaN logits, nothing finite to choose), the others
    still finish and a :class:`BatchDecodeError` carrying their results is raised.
    """
    result = BeamSearch(make_options(beam_size, max_len, **options)).search(step_fn, init_state, bos, eos)
    if result.errors:
        raise BatchDecodeError(result.errors, result.hypotheses)
    return result.hypotheses
