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

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import numpy as np

from beamkit import ops
from beamkit.hypothesis import BatchDecodeError, Hypothesis, SearchStats
from beamkit.processors import LogitsProcessor, StepContext, check_int, is_stop
from beamkit.scoring import CoveragePenalty, FinalScorer, LengthPenalty, as_length_penalty
from beamkit.state import check_rows, concat_state, first_array, is_identity, select_state

if TYPE_CHECKING:  # beamkit.trace is imported only when a search records one
    from beamkit.trace import Trace, TraceRecorder

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
        ``"narrow"`` (the exact beam-search contract): a finished hypothesis keeps its slot, the beam narrows;
        live hypotheses at ``max_len`` are returned unfinished. ``"pool"`` (fairseq / Hugging Face): ``beam_size``
        running beams are kept from the top ``2 * beam_size`` candidates; eos candidates ranked within the top
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
    record_trace:
        keep each request's search tree (:class:`beamkit.trace.Trace`) on ``Completed.trace`` /
        ``SearchResult.trace``; off, it costs one attribute check per step.
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
    beam_threshold: float | None = None
    record_trace: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_size", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value < 2**31:
                raise ValueError(f"{name} must be an integer between 1 and 2**31 - 1, got {value!r}")
        object.__setattr__(self, "length_penalty", as_length_penalty(self.length_penalty))  # a plain alpha too
        self.length_penalty.check_max_len(int(self.max_len))
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
        if self.min_len > self.max_len:
            raise ValueError(f"min_len={self.min_len} must be <= max_len={self.max_len}")
        if self.exact_exit and (self.policy != "pool" or self.length_penalty.alpha != 0):
            raise ValueError("exact_exit needs policy='pool' and length penalty alpha == 0")
        if self.beam_threshold is not None and (
            isinstance(self.beam_threshold, bool)
            or not isinstance(self.beam_threshold, (int, float))
            or not 0 <= self.beam_threshold < float("inf")
        ):
            raise ValueError(f"beam_threshold must be a finite number >= 0 or None, got {self.beam_threshold!r}")
        for i, proc in enumerate(self.processors):
            if not callable(proc):
                raise TypeError(f"processors[{i}] must be callable as processor(scores, ctx) -> scores, got {proc!r}")
        if not callable(getattr(self.selector, "candidates", None)):
            raise TypeError(
                "selector must be a Selector object (one with a candidates method), such as beamkit.Deterministic(), "
                "beamkit.TopK(k), beamkit.TopP(p), beamkit.Multinomial() or beamkit.GumbelTopK(); "
                f"got {self.selector!r}"
            )
        raising = [type(p).__name__ for p in self.processors if getattr(p, "raises_scores", False)]
        if self.exact_exit and raising:
            raise ValueError(f"exact_exit needs step scores <= 0, but {raising} may raise them")

    @property
    def pool_size(self) -> int:
        """How many finished hypotheses make a request's pool full (Kasai et al.'s patience)."""
        return max(1, round(self.beam_size * self.patience))


# per-request options: they may differ between the requests of one Engine; the other SearchOptions fields are shared
REQUEST_FIELDS = ("beam_size", "max_len", "min_len", "num_return", "length_penalty", "early_stopping", "patience")
_SHARED_FIELDS = tuple(f for f in SearchOptions.__dataclass_fields__ if f not in REQUEST_FIELDS)
_EARLY = {False: 0, True: 1, "never": 2}  # early_stopping mode as a small int per request


@dataclass
class SearchResult:
    """Hypotheses per request (best first), counters, and per-request errors (empty when all went well).
    ``trace``: each request's :class:`beamkit.trace.Trace` when ``record_trace`` is on, else None."""

    hypotheses: list[list[Hypothesis]]
    stats: SearchStats
    errors: dict[int, str]
    trace: list[Trace | None] | None = None


@dataclass
class Completed:
    """A request that ended at one :meth:`Engine.step`: its hypotheses (best first), or why it failed.

    ``error`` is ``None`` or the message (``"cancelled"`` after :meth:`Engine.cancel`); a failed request has no
    hypotheses. ``steps`` counts the model calls the request took part in. ``trace``: its search tree when
    ``record_trace`` is on.
    """

    request_id: int
    hypotheses: list[Hypothesis]
    error: str | None = None
    steps: int = 0
    trace: Trace | None = None


@dataclass
class EngineStats(SearchStats):
    """:class:`SearchStats` plus key/value-cache accounting, read from the state after each model call when the
    state offers ``kv_bytes()`` (for example a Transformer state over a :class:`beamkit.kv.PagedKVCache`):
    ``kv_bytes`` after the latest call, ``kv_peak_bytes`` the most seen (both 0 when the state has no such hook).
    """

    kv_bytes: int = 0
    kv_peak_bytes: int = 0

    def record_kv(self, state: Any) -> None:
        """Read ``state.kv_bytes()`` when the state has it."""
        kv_bytes = getattr(state, "kv_bytes", None)
        if callable(kv_bytes):
            self.kv_bytes = int(kv_bytes())
            self.kv_peak_bytes = max(self.kv_peak_bytes, self.kv_bytes)


class _Book:
    """Per-request bookkeeping: arrays indexed by request id (grown as requests are added) and finished pools.

    Options per request (``beam``, ``max_len``, ``min_len``, ``m`` candidates per row, ``pool`` size, early
    stopping mode ``es``, length penalty ``lp`` (index into the engine's list) and its ``alpha``, stop tokens
    ``eos`` (index), ``nret``: ``num_return`` or 0), the tokens generated so far ``t``, and the pool
    counters (``count``, ``worst``, ``nth``).
    """

    _INT = ("rid", "t", "beam", "max_len", "min_len", "m", "pool", "es", "lp", "eos", "nret", "count")
    _FLOAT = ("alpha", "worst", "nth")

    rid: np.ndarray  # shape: (R,) each array is indexed by slot; rid: the request id in the slot
    t: np.ndarray
    beam: np.ndarray
    max_len: np.ndarray
    min_len: np.ndarray
    m: np.ndarray
    pool: np.ndarray
    es: np.ndarray
    lp: np.ndarray
    eos: np.ndarray
    nret: np.ndarray
    count: np.ndarray
    alpha: np.ndarray
    worst: np.ndarray
    nth: np.ndarray

    def __init__(self) -> None:
        self.size = 0
        for name in self._INT:
            setattr(self, name, np.zeros(0, np.int64))
        for name in self._FLOAT:
            setattr(self, name, np.zeros(0))
        self.pools: dict[int, list[_Finished]] = {}
        self.errors: dict[int, str] = {}

    def grow(self, n: int) -> np.ndarray:
        """Ids for ``n`` new requests (arrays grow by doubling)."""
        need, cap = self.size + n, self.t.shape[0]
        if need > cap:
            new = max(need, 2 * cap, 16)
            for name in self._INT + self._FLOAT:
                old = getattr(self, name)
                out = np.zeros(new, old.dtype) if name in self._INT else np.full(new, -np.inf)
                out[:cap] = old
                setattr(self, name, out)
        ids = np.arange(self.size, need)
        self.size = need
        for r in ids.tolist():
            self.pools[r] = []
        return ids

    def compact(self, live: np.ndarray) -> None:
        """Keep only the slots ``live`` (ascending), renumbered 0.. in the same order."""
        for name in self._INT + self._FLOAT:
            setattr(self, name, getattr(self, name)[live].copy())
        new = {int(r): i for i, r in enumerate(live.tolist())}
        self.pools = {new[r]: p for r, p in self.pools.items()}
        self.errors = {new[r]: e for r, e in self.errors.items()}
        self.size = int(live.shape[0])

    def add(self, found: dict[int, list[_Finished]], capped: bool = False) -> None:
        """Merge new finished hypotheses into their requests' pools, best score first (stable ties), each cut to
        its request's pool size when ``capped``."""
        for r, hyps in found.items():
            pool = self.pools[r] + hyps
            pool.sort(key=_neg_score)
            self.set(r, pool[: self.pool[r]] if capped else pool)

    def set(self, r: int, pool: list[_Finished]) -> None:
        """Replace request r's pool (kept in the order given) and its counters."""
        self.pools[r] = pool
        self.count[r] = len(pool)
        self.worst[r] = min((h.score for h in pool), default=-np.inf)
        n = int(self.nret[r] or self.beam[r])  # the nth best: num_return, else beam_size
        self.nth[r] = pool[n - 1].score if len(pool) >= n else -np.inf

    def release(self, r: int) -> tuple[list[_Finished], str | None]:
        """Forget request r; return its pool and error."""
        return self.pools.pop(r, []), self.errors.pop(r, None)


def _neg_score(h: _Finished) -> float:
    """Sort key: best score first."""
    return -h.score


@dataclass
class _Rows:
    """The live rows, one per running hypothesis, grouped by request (ascending id) in rank order (host arrays).

    Requests are at different steps, so token histories are ragged: they are right-aligned in ``[rows, W]``
    tables (``W`` = the longest history), a row of request ``r`` holding its ``t[r]`` tokens in the last
    columns and ``-1`` (scores 0) before them. Requests that joined the engine at the same step are adjacent and
    share their history length, so a run of rows with one length is a plain ``[rows, t]`` view.
    """

    req: np.ndarray  # shape: (rows,) request of each row
    lp: np.ndarray  # shape: (rows,) running log-probability, float64
    key: np.ndarray  # shape: (rows,) selector key (== lp for the deterministic selector)
    tokens: np.ndarray  # shape: (rows, W) generated tokens, right-aligned, -1 before
    token_lp: np.ndarray  # shape: (rows, W) step scores
    beam: np.ndarray  # shape: (rows, W) beam slot of the parent at each step
    cov: np.ndarray | None = None  # shape: (rows, S) accumulated attention
    _slots: np.ndarray | None = field(default=None, repr=False)  # shape: (rows,) cache of slots()

    @classmethod
    def start(cls, req: np.ndarray, width: int) -> _Rows:
        """One empty row per request of ``req``, histories padded to ``width``."""
        n = req.shape[0]
        pad = np.zeros((n, width))
        return cls(req, np.zeros(n), np.zeros(n), np.full((n, width), -1, np.int64), pad, pad.astype(np.int64))

    def slots(self) -> np.ndarray:
        """Each row's beam slot: its rank within its request (computed once per step)."""
        if self._slots is None:
            self._slots = np.arange(self.req.shape[0]) - self.req.searchsorted(self.req)
        return self._slots

    def take(self, idx: np.ndarray, width: int | None = None) -> _Rows:
        """The rows ``idx`` (in that order), histories cut to the last ``width`` columns."""
        w = self.tokens.shape[1] if width is None else width
        cols = slice(self.tokens.shape[1] - w, None)
        return _Rows(
            self.req[idx],
            self.lp[idx],
            self.key[idx],
            self.tokens[idx, cols],
            self.token_lp[idx, cols],
            self.beam[idx, cols],
            None if self.cov is None else self.cov[idx],
        )

    def join(self, req: np.ndarray) -> _Rows:
        """These rows followed by one empty row per request of ``req``, histories padded to one width."""
        cov = self.cov
        if cov is not None:
            cov = np.concatenate([cov, np.zeros((req.shape[0], cov.shape[1]))])
        new = _Rows.start(req, self.tokens.shape[1])
        cat = np.concatenate
        return _Rows(
            cat([self.req, new.req]),
            cat([self.lp, new.lp]),
            cat([self.key, new.key]),
            cat([self.tokens, new.tokens]),
            cat([self.token_lp, new.token_lp]),
            cat([self.beam, new.beam]),
            cov,
        )

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


def _add_coverage(cov: np.ndarray | None, attn: np.ndarray) -> np.ndarray:
    """Accumulated attention plus one step's ``[rows, S]`` (widths of requests that joined later zero-padded)."""
    if cov is None:
        return attn
    out = np.zeros((attn.shape[0], max(cov.shape[1], attn.shape[1])))  # shape: (rows, S)
    out[:, : cov.shape[1]] = cov
    out[:, : attn.shape[1]] += attn
    return out


class _Paths(NamedTuple):
    """The parents' histories of the hypotheses that ended at one step, gathered once for all of them."""

    tokens: np.ndarray  # shape: (n, W) right-aligned
    token_lp: np.ndarray  # shape: (n, W)
    beam: np.ndarray  # shape: (n, W)
    t: np.ndarray  # shape: (n,) history length (the last t columns)
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
        cols = slice(p.tokens.shape[1] - int(p.t[i]), None)
        return Hypothesis(
            tokens=p.tokens[i, cols].tolist() + [self.tok],
            logprob=self.logprob,
            score=self.score,
            finished=self.finished,
            token_logprobs=p.token_lp[i, cols].tolist() + [self.logprob - float(p.lp[i])],
            beam_indices=p.beam[i, cols].tolist() + [int(p.slot[i])],
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
    def rank_all(cls, rows: _Rows, logp: np.ndarray, tok: np.ndarray, key: np.ndarray, ordered: bool) -> _Candidates:
        """Flatten the per-row tables ``[rows, m]``, drop non-finite candidates, rank within each request.

        ``ordered``: each row's candidates already come by key descending, equal keys by token ascending, so
        the flat row-major order breaks ties as the engine does and a stable sort by (request, key) suffices.
        """
        c_row = np.repeat(np.arange(tok.shape[0]), tok.shape[1])  # shape: (rows * m,)
        c_tok, c_key = tok.ravel(), key.ravel()
        c_lp = rows.lp[c_row] + logp.ravel()
        c_req = rows.req[c_row]
        order, rank = rank_candidates(c_req, c_key, c_row, c_tok, np.isfinite(c_lp), ordered)
        return cls(c_row[order], c_tok[order], c_lp[order], c_key[order], c_req[order], rank)

    def take(self, keep: np.ndarray) -> _Candidates:
        """The candidates where ``keep`` holds; ``keep`` must keep a prefix of each request (ranks stay)."""
        return _Candidates(
            self.row[keep], self.tok[keep], self.lp[keep], self.key[keep], self.req[keep], self.rank[keep]
        )

    def rank_among(self, sel: np.ndarray) -> np.ndarray:
        """Rank of each selected candidate among the selected ones of its request."""
        r = self.req[sel]
        return np.arange(sel.shape[0]) - np.searchsorted(r, r)


class _Join(NamedTuple):
    """Requests added together, waiting to join the running rows at the next step."""

    ids: np.ndarray  # shape: (n,) their request ids
    state: Any  # their model state, one row each
    bos: np.ndarray  # shape: (n,) int64


class Engine:
    """The step-wise search engine: requests join and leave the running rows at every step (continuous batching).

    ``Engine(step_fn, **options)`` takes the fields of :class:`SearchOptions`. The policy, selector, processors
    and the other search-wide fields are shared by all requests; ``beam_size``, ``max_len``, ``min_len``,
    ``num_return``, ``length_penalty``, ``early_stopping`` and ``patience`` are defaults that each
    :meth:`add` may override. Each :meth:`step` makes one ``step_fn`` call for every live row of every
    request and returns the requests that ended at it::

        engine = Engine(model.step, beam_size=5, max_len=64, policy="pool")
        rid = engine.add(model.init_state(src), bos, eos, beam_size=3)
        while not engine.idle:
            for done in engine.step():
                deliver(done.request_id, done.hypotheses, done.error)

    Every request gets exactly the hypotheses it would get decoded alone: candidates are ranked within their
    request, each request stops by its own rules, and what processors and selectors see of a row (the step,
    the token history) is that request's own. Joining mid-flight: the running state and the new states are
    joined with :func:`beamkit.concat_state` (``[running, new...]``, rows in request order), and the new rows
    get their ``bos`` as ``y_prev``; see the README for what a step function must do to allow it.

    ``on_step_error``: what happens when ``step_fn`` (or a processor, selector or final scorer) raises or returns
    something malformed (the whole call is lost, so every request in it is): ``"fail"`` completes each of them
    with the error, ``"raise"`` re-raises. ``stats_window``: keep only about that many calls in the per-call
    lists of :attr:`stats` (a long-running server); ``None`` keeps all.

    Request ids are the engine's own, counting from 0. Internally a request lives in a *slot* of the per-request
    arrays; slots of completed requests are reclaimed (renumbered in order) when many have piled up, so a
    long-running engine stays as large as the requests it holds. Processors and selectors see slots in
    ``StepContext.request``: equal to the ids while no slot was reclaimed (always, for a closed batch).
    """

    def __init__(
        self,
        step_fn: StepFn,
        options: SearchOptions | None = None,
        *,
        on_step_error: Literal["fail", "raise"] = "fail",
        stats_window: int | None = None,
        **fields: Any,
    ):
        if not callable(step_fn):
            raise TypeError(
                f"step_fn must be callable as step_fn(state, y_prev) -> (logits, new_state), got {step_fn!r}"
            )
        if on_step_error not in ("fail", "raise"):
            raise ValueError(f"on_step_error must be 'fail' or 'raise', got {on_step_error!r}")
        if options is not None and fields:
            raise TypeError("give Engine either options= or keyword fields, not both")
        self._need_max_len = options is None and "max_len" not in fields
        if options is None:
            options = make_options(fields.pop("beam_size", 1), fields.pop("max_len", 1), **fields)
        self.options = options  # the shared fields, and the defaults of the per-request ones
        self._defaults = {k: getattr(options, k) for k in REQUEST_FIELDS}
        self.step_fn = step_fn
        self.on_step_error = on_step_error
        self.stats_window = stats_window  # keep only about this many calls in the per-call lists (a server)
        self._ordered = bool(getattr(options.selector, "ordered", False))  # see Selector
        # finish / survive / stop for one step, by policy; returns the survivors (indices into the candidates)
        self._policy_step = {"narrow": self._narrow_step, "pool": self._pool_step, "compete": self._compete_step}[
            options.policy
        ]
        self.book = _Book()
        self.stats = EngineStats()
        self._rows = _Rows.start(np.zeros(0, np.int64), 0)
        self._state: Any = None
        self._y = np.zeros(0, np.int64)  # shape: (rows,) host copy of the next y_prev
        self._ref: Any = None  # y_prev follows this array's library and device (the last logits)
        self._vocab: int | None = None
        self._pending: list[_Join] = []
        self._cancel: set[int] = set()
        self._eos: list[tuple[int, ...]] = []  # distinct stop-token sets, indexed by book.eos
        self._lps: list[LengthPenalty] = []  # distinct length penalties, indexed by book.lp
        self._index_of: dict[Any, int] = {}
        self._ids = np.zeros(0, np.int64)  # shape: (R,) the request id of each book slot
        self._slot: dict[int, int] = {}  # request id -> book slot, while the request is running or waiting
        self._next_id = 0
        self._trace: TraceRecorder | None = None
        if options.record_trace:  # see beamkit.trace
            from beamkit.trace import TraceRecorder

            self._trace = TraceRecorder(self)

    # ---------------------------------------------------------------------------------------------- requests
    def add(self, init_state: Any, bos: int, eos: int | Sequence[int] | None, **request_options: Any) -> int:
        """Add one request (``init_state`` has one row on axis 0 of every array leaf); it joins at the next
        :meth:`step`. ``request_options``: ``beam_size``, ``max_len``, ``min_len``, ``num_return``,
        ``length_penalty``, ``early_stopping``, ``patience``. Returns the request id."""
        return self.add_batch(init_state, bos, eos, 1, **request_options)[0]

    def add_batch(
        self,
        init_state: Any,
        bos: int | Sequence[int],
        eos: int | Sequence[int] | None,
        n: int | None = None,
        **request_options: Any,
    ) -> list[int]:
        """Add ``n`` requests with the same options at once (``init_state`` has one row each; ``n`` defaults to
        the rows of its first array leaf, else ``len(bos)``); returns their ids, in row order."""
        opts = self._request_options(request_options)
        n = count_requests(init_state, bos) if n is None else n
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"the number of requests must be an integer >= 0, got {n!r}")
        check_rows(init_state, n, "init_state")
        stop = eos_ids(eos)
        bos_arr = bos_array(bos, n)
        self._reclaim()
        ids = self.book.grow(n)  # slots
        b = self.book
        b.rid[ids] = np.arange(self._next_id, self._next_id + n)
        self._slot.update(zip(b.rid[ids].tolist(), ids.tolist(), strict=True))
        self._next_id += n
        b.beam[ids] = opts.beam_size
        b.max_len[ids] = opts.max_len
        b.min_len[ids] = opts.min_len
        b.m[ids] = 2 * opts.beam_size if opts.policy == "pool" else opts.beam_size
        b.pool[ids] = opts.pool_size
        b.es[ids] = _EARLY[opts.early_stopping]
        b.lp[ids] = self._index(self._lps, opts.length_penalty)
        b.alpha[ids] = opts.length_penalty.alpha
        b.eos[ids] = self._index(self._eos, stop)
        b.nret[ids] = opts.num_return or 0
        b.t[ids] = 0
        b.count[ids] = 0
        if n:
            self._pending.append(_Join(ids, init_state, bos_arr))
        return b.rid[ids].tolist()

    def _index(self, table: list[Any], value: Any) -> int:
        """Position of ``value`` in ``table`` (appended when new): per-request values stored as small ints."""
        key = (id(table), value)
        if key not in self._index_of:
            self._index_of[key] = len(table)
            table.append(value)
        return self._index_of[key]

    def _reclaim(self) -> None:
        """Renumber the slots of the requests still held (in order) once completed ones dominate the arrays."""
        b = self.book
        if b.size < 1024 or b.size < 2 * len(b.pools) or self._trace is not None:  # traces are kept by slot
            return
        live = np.array(sorted(b.pools), dtype=np.int64)
        b.compact(live)
        remap = np.full(int(live[-1]) + 1 if live.size else 1, -1, dtype=np.int64)
        remap[live] = np.arange(live.shape[0])
        self._rows = replace(self._rows, req=remap[self._rows.req], _slots=None)
        self._pending = [j._replace(ids=remap[j.ids]) for j in self._pending]
        self._cancel = {int(remap[r]) for r in self._cancel}
        self._slot = {int(b.rid[i]): i for i in range(b.size)}

    def _request_options(self, request_options: dict[str, Any]) -> SearchOptions:
        shared = sorted(set(request_options) & set(_SHARED_FIELDS))
        if shared:
            raise TypeError(f"{', '.join(shared)} are shared by every request: give them to Engine(), not add()")
        unknown = sorted(set(request_options) - set(REQUEST_FIELDS))
        if unknown:
            raise TypeError(f"unknown request options {unknown}; per-request options are {list(REQUEST_FIELDS)}")
        if self._need_max_len and "max_len" not in request_options:
            raise ValueError("max_len is needed: give it to Engine() or to add()")
        values = {**self._defaults, **request_options}
        if "length_penalty" in request_options:
            values["length_penalty"] = as_length_penalty(values["length_penalty"])
        return replace(self.options, **values)

    def cancel(self, request_id: int) -> bool:
        """Cancel a waiting or running request: its rows leave before the next model call and it completes with
        the error ``"cancelled"``. Returns False when it had already completed; an id this engine never gave out
        raises ValueError (TypeError for one that is not an integer)."""
        r = self._slot_of(request_id)
        if r is None or r in self._cancel:
            return False
        self._cancel.add(r)
        return True

    def _slot_of(self, request_id: int) -> int | None:
        """The slot of a waiting or running request, None once it has completed; an id this engine never gave
        out raises."""
        rid = check_int("request_id", request_id, 0)
        if rid >= self._next_id:
            raise ValueError(f"no request {request_id} was added to this engine")
        return self._slot.get(rid)

    def best(self, request_id: int) -> Hypothesis | None:
        """The best hypothesis of a running request so far by score, finished (its pool) or running (scored at
        its length), for streaming; None while it waits to join or once it has completed. An id this engine never
        gave out raises ValueError, as with :meth:`cancel`."""
        r = self._slot_of(request_id)
        if r is None:
            return None
        b, pool = self.book, self.book.pools[r]
        rows = np.flatnonzero(self._rows.req == r)
        found = [min(pool, key=_neg_score).build()] if pool else []
        if rows.size:
            t = int(b.t[r])
            scores = self._penalised(self._rows.lp[rows], np.full(rows.size, max(t, 1)), np.full(rows.size, r))
            j = int(np.argmax(scores))
            i = int(rows[j])
            cols = slice(self._rows.tokens.shape[1] - t, None)
            found.append(
                Hypothesis(
                    tokens=self._rows.tokens[i, cols].tolist(),
                    logprob=float(self._rows.lp[i]),
                    score=float(scores[j]),
                    finished=False,
                    token_logprobs=self._rows.token_lp[i, cols].tolist(),
                    beam_indices=self._rows.beam[i, cols].tolist(),
                    key=float(self._rows.key[i]),
                )
            )
        return max(found, key=lambda h: h.score) if found else None

    @property
    def idle(self) -> bool:
        """True when no request is running or waiting."""
        return not self._pending and self._rows.req.shape[0] == 0

    @property
    def running(self) -> int:
        """Requests added and not yet completed."""
        return len(self.book.pools)

    # ---------------------------------------------------------------------------------------------- one step
    def step(self) -> list[Completed]:
        """One model call for all live rows of all requests; returns the requests that ended at it."""
        out: list[Completed] = []
        joined = self._admit(out)
        n_rows = self._rows.req.shape[0]
        if n_rows == 0:
            return out
        ended: list[Completed] = []
        try:
            logits, state, extras = self._call(n_rows)
            self.stats.record_kv(state)  # KV-cache accounting (optional state hook)
            self._advance(logits, state, extras, ended)
        except Exception as exc:  # the whole call is lost: every request in it fails, the engine goes on
            if self.on_step_error == "raise":
                raise
            self._fail_all(f"{type(exc).__name__}: {exc}", out)
            return out
        out += ended
        st = self.stats
        st.model_calls += 1
        st.rows_per_call.append(n_rows)
        st.joined_per_call.append(joined)
        st.left_per_call.append(len(ended))
        if self.stats_window is not None and len(st.rows_per_call) > 2 * self.stats_window:
            for name in ("rows_per_call", "joined_per_call", "left_per_call"):
                setattr(st, name, getattr(st, name)[-self.stats_window :])
        return out

    def _advance(self, logits: Any, state: Any, extras: dict[str, Any], ended: list[Completed]) -> None:
        """Everything after the model call: normalise, process, select, rank, apply the policy, end requests,
        then commit the new rows and state (only once nothing can fail any more)."""
        opt, b, rows = self.options, self.book, self._rows
        n_rows = rows.req.shape[0]
        t_row = b.t[rows.req]  # shape: (rows,) tokens generated so far by each row's request
        lse = ops.logsumexp(logits)  # shape: (rows,)
        raw = extras.get("log_softmax") is False  # the step's logits are its scores (shallow fusion)
        if raw:
            lse = np.where(np.isfinite(lse), 0.0, lse)
        ok = np.isfinite(lse)
        bad = np.isnan(lse) | (lse == np.inf)  # shape: (rows,) their requests fail; all -inf rows: no candidate
        for r in np.unique(rows.req[bad]).tolist():
            what = "NaN" if np.isnan(lse[bad & (rows.req == r)]).any() else "+inf"
            b.errors[r] = f"step_fn returned {what} logits at step {int(b.t[r])}"
        segments = self._segments(rows, t_row)
        masked = t_row < b.min_len[rows.req]  # shape: (rows,) eos is masked until min_len
        procs = opt.processors
        if procs:
            # shape: (rows, V), edited in place by the processors: raw logits (a copy) or log-probabilities
            scores = ops.copy(logits) if opt.process_logits or raw else ops.log_softmax(logits)
            scores = self._mask_eos(scores, rows, masked)
            for lo, hi, ctx in segments:
                part = scores[lo:hi]
                edited = part
                for i, proc in enumerate(procs):
                    edited = proc(edited, ctx)
                    if edited is None:
                        raise TypeError(f"processors[{i}] returned None: a processor returns the edited scores")
                if len(segments) == 1:
                    scores = edited
                elif edited is not part:
                    scores[lo:hi] = edited
            if opt.process_logits and not raw:
                plse = ops.logsumexp(scores)  # shape: (rows,) normaliser of the processed logits
                offset = np.where(np.isfinite(plse) & ~bad, -plse, -np.inf)
            else:
                offset = np.where(bad, -np.inf, 0.0)
        else:
            scores = self._mask_eos(logits, rows, masked, copy=True)
            offset = np.where(ok, -lse, -np.inf)
        logp, tok, key = self._select(scores, offset, rows, segments)  # shape: (rows, m)
        cov = rows.cov
        if opt.coverage_penalty is not None:
            cov = _add_coverage(cov, ops.to_numpy(extras["attention"]).astype(np.float64))  # shape: (rows, S)
        rows = replace(rows, cov=cov)

        cand = _Candidates.rank_all(rows, logp, tok, key, self._ordered)
        # a row yields nothing only when some candidate was dropped (not finite)
        if cand.req.shape[0] != logp.size:
            counts = np.bincount(cand.req, minlength=b.size)
            for r in np.unique(rows.req).tolist():
                if counts[r] == 0:
                    msg = f"no finite candidate at step {int(b.t[r])} (every continuation is masked or -inf)"
                    b.errors.setdefault(r, msg)
        if self._trace is not None:
            self._trace.considered(rows, cand)
        pruned = 0
        if opt.beam_threshold is not None and cand.req.shape[0]:
            first = group_starts(cand.req)
            best = np.repeat(cand.key[first], np.diff(np.append(first, cand.req.shape[0])))
            keep = cand.key >= best - opt.beam_threshold
            pruned = int(keep.shape[0] - np.count_nonzero(keep))
            cand = cand.take(keep)
        c_len = b.t[cand.req] + 1  # shape: (n,) length of each candidate
        last = c_len >= b.max_len[cand.req]
        surv = self._policy_step(rows, cand, self._is_eos(cand.tok, cand.req), c_len, last)
        if b.errors:
            surv = surv[~np.isin(cand.req[surv], np.fromiter(b.errors, np.int64))]
        if self._trace is not None:
            self._trace.selected(rows, cand, surv)

        s_req = cand.req[surv]
        for r in np.setdiff1d(np.unique(rows.req), s_req).tolist():
            ended.append(self._complete(r))

        # commit
        parents = cand.row[surv]
        new_rows = rows.extend(cand, surv)
        b.t[np.unique(s_req)] += 1
        width = int(b.t[s_req].max()) if surv.size else 0
        if width < new_rows.tokens.shape[1]:
            new_rows = new_rows.take(np.arange(surv.shape[0]), width)
        if surv.size == 0:
            state = None
        elif not is_identity(parents, n_rows):
            state = select_state(state, parents)
        self._rows, self._state, self._y = new_rows, state, cand.tok[surv]
        self._ref = None if surv.size == 0 else ops.like(self._y[:0], logits)  # library and device, not the data
        self.stats.pruned += pruned

    def _admit(self, out: list[Completed]) -> int:
        """Before a call: join the waiting requests, then drop the rows of cancelled ones; returns how many
        requests joined. Requests whose state cannot join the running state fail alone."""
        joined = 0
        if self._pending:
            pending, self._pending = self._pending, []
            try:
                self._join(pending)
                joined = sum(j.ids.shape[0] for j in pending)
            except Exception:
                if self.on_step_error == "raise":
                    raise
                for j in pending:  # find the ones that cannot join
                    try:
                        self._join([j])
                        joined += j.ids.shape[0]
                    except Exception as exc:
                        for r in j.ids.tolist():
                            self.book.errors[r] = f"cannot join the running state: {type(exc).__name__}: {exc}"
                            out.append(self._complete(r))
        if self._cancel:
            gone = np.fromiter(self._cancel, np.int64)
            self._cancel = set()
            keep = np.flatnonzero(~np.isin(self._rows.req, gone))
            if keep.shape[0] < self._rows.req.shape[0]:
                self._rows = self._rows.take(keep)
                self._y = self._y[keep]
                self._state = select_state(self._state, keep) if keep.size else None
            for r in gone.tolist():
                self.book.errors[r] = "cancelled"
                out.append(self._complete(r))
        return joined

    def _join(self, pending: list[_Join]) -> None:
        """Join waiting requests to the running rows (state first: it is the part that can fail)."""
        states = [j.state for j in pending]
        if self._rows.req.shape[0]:
            state = concat_state([self._state, *states])
        else:
            state = states[0] if len(states) == 1 else concat_state(states)
            self._ref = first_array(states[0])
        ids = np.concatenate([j.ids for j in pending])
        self._state = state
        self._rows = self._rows.join(ids)
        self._y = np.concatenate([self._y, *[j.bos for j in pending]])

    def _call(self, n_rows: int) -> tuple[Any, Any, dict[str, Any]]:
        """Run ``step_fn`` on the live rows and check what it returned."""
        y_prev = self._y if self._ref is None else ops.like(self._y, self._ref)
        logits, state, extras = unpack_step(self.step_fn(self._state, y_prev))
        ops.check_logits(logits, n_rows)
        width = int(logits.shape[1])
        if self._vocab is None:
            self._vocab = width
        elif width != self._vocab:
            raise ValueError(
                f"step_fn returned logits of width {width}, but {self._vocab} before: the vocabulary must not change"
            )
        check_rows(state, n_rows, "the state step_fn returned")
        if self.options.coverage_penalty is not None and "attention" not in extras:
            raise ValueError("coverage_penalty needs step_fn to return extras={'attention': [rows, S]}")
        b = self.book
        for r in np.unique(self._rows.req[b.t[self._rows.req] == 0]).tolist():
            stop = self._eos[b.eos[r]]
            if any(not 0 <= e < width for e in stop):
                b.errors[r] = f"eos={list(stop)} is not a token id of the model's vocabulary of {width}"
        return logits, state, extras

    def _fail_all(self, message: str, out: list[Completed]) -> None:
        """The call failed as a whole: every request in it completes with ``message``."""
        for r in np.unique(self._rows.req).tolist():
            self.book.errors[r] = message
            out.append(self._complete(r))
        self._rows = self._rows.take(np.zeros(0, np.int64))
        self._state, self._ref, self._y = None, None, np.zeros(0, np.int64)

    def _complete(self, r: int) -> Completed:
        """Hand out request (slot) ``r``: its ranked hypotheses or its error; the slot is free from now on."""
        pool, error = self.book.release(r)
        rid = int(self.book.rid[r])
        self._slot.pop(rid, None)
        steps = int(self.book.t[r]) + (0 if error == "cancelled" else 1)
        done = Completed(rid, [] if error else self._rank(r, pool), error, steps)
        if self._trace is not None:
            done.trace = self._trace.close(r, done)
        return done

    def _segments(self, rows: _Rows, t_row: np.ndarray) -> list[tuple[int, int, StepContext]]:
        """Runs of rows at the same step with the same stop tokens and candidates per row (``m``), each with its
        :class:`StepContext`."""
        e_row, m_row = self.book.eos[rows.req], self.book.m[rows.req]
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
                eos=self._eos[self.book.eos[rows.req[lo]]],
                logprob=rows.lp[lo:hi],
                finished=self.book.count[rows.req[lo:hi]],
            )
            out.append((lo, hi, ctx))
        return out

    def _mask_eos(self, scores: Any, rows: _Rows, masked: np.ndarray, copy: bool = False) -> Any:
        """Stop tokens set to -inf in the ``masked`` rows (requests below their ``min_len``)."""
        if not masked.any():
            return scores
        if copy:
            scores = ops.copy(scores)
        where = np.flatnonzero(masked)
        e_row = self.book.eos[rows.req[where]]
        for e in np.unique(e_row).tolist():
            stop = np.asarray(self._eos[e])  # ints (float when empty: then skipped)
            stop = stop[(stop >= 0) & (stop < scores.shape[1])]  # ids out of the vocabulary fail at the call
            sel = where[e_row == e]
            if stop.size:
                scores = ops.fill(scores, np.repeat(sel, stop.size), np.tile(stop, sel.size), float("-inf"))
        return scores

    def _select(
        self, scores: Any, offset: np.ndarray, rows: _Rows, segments: list[tuple[int, int, StepContext]]
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

    def _is_eos(self, tok: np.ndarray, req: np.ndarray) -> np.ndarray:
        """Whether each candidate token is one of its request's stop tokens."""
        e = self.book.eos[req]
        out = np.zeros(tok.shape[0], dtype=bool)
        for i in np.unique(e).tolist():
            sel = e == i
            out[sel] = is_stop(tok[sel], self._eos[i])
        return out

    def _penalised(self, logprob: np.ndarray, length: np.ndarray, req: np.ndarray) -> np.ndarray:
        """Length-penalised scores, each with its request's penalty."""
        ids = self.book.lp[req]  # never empty: callers score at least one hypothesis
        if ids.min() == ids.max():
            return self._lps[int(ids[0])](logprob, length)
        out = np.empty(ids.shape[0])
        for i in np.unique(ids).tolist():
            sel = ids == i
            out[sel] = self._lps[i](logprob[sel], length[sel])
        return out

    def _scores(self, rows: _Rows, cand: _Candidates, sel: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Final scores of the candidates ``sel`` ended at ``length``: length penalty, coverage penalty."""
        opt = self.options
        scores = self._penalised(cand.lp[sel], length[sel], cand.req[sel])
        if opt.coverage_penalty is not None and rows.cov is not None:
            scores = scores + opt.coverage_penalty(rows.cov[cand.row[sel]])
        return scores

    def _paths(self, rows: _Rows, par: np.ndarray) -> _Paths:
        # gathered, not viewed: an entry must not keep the whole step's rows alive
        return _Paths(
            rows.tokens[par],
            rows.token_lp[par],
            rows.beam[par],
            self.book.t[rows.req[par]],
            rows.lp[par],
            rows.slots()[par],
        )

    def _hypotheses(
        self,
        rows: _Rows,
        cand: _Candidates,
        sel: np.ndarray,
        finished: bool | np.ndarray,
        length: np.ndarray,
    ) -> dict[int, list[_Finished]]:
        """Pool entries for the candidates ``sel`` scored at ``length``, by request."""
        found: dict[int, list[_Finished]] = {}
        if sel.size == 0:
            return found
        scores = self._scores(rows, cand, sel, length).tolist()
        fin = np.broadcast_to(finished, sel.shape).tolist()
        paths = self._paths(rows, cand.row[sel])
        key, logprob, tok = cand.key[sel].tolist(), cand.lp[sel].tolist(), cand.tok[sel].tolist()
        for i, r in enumerate(cand.req[sel].tolist()):
            found.setdefault(r, []).append(_Finished(scores[i], key[i], logprob[i], fin[i], paths, i, tok[i]))
        return found

    # ---------------------------------------------------------------------------------------------- policies
    def _narrow_step(
        self, rows: _Rows, cand: _Candidates, is_eos: np.ndarray, c_len: np.ndarray, last: np.ndarray
    ) -> np.ndarray:
        """The exact contract: keep the first ``beam_size - finished`` candidates; eos finishes and keeps its slot."""
        b = self.book
        take = cand.rank < (b.beam - b.count)[cand.req]
        done = np.flatnonzero(take & is_eos)
        surv = np.flatnonzero(take & ~is_eos)
        b.add(self._hypotheses(rows, cand, done, True, c_len))
        if last.any():  # live hypotheses at max_len are returned unfinished
            cut = last[surv]
            b.add(self._hypotheses(rows, cand, surv[cut], False, c_len))
            surv = surv[~cut]
        return surv

    def _pool_step(
        self, rows: _Rows, cand: _Candidates, is_eos: np.ndarray, c_len: np.ndarray, last: np.ndarray
    ) -> np.ndarray:
        """Hugging Face / fairseq: eos (or anything at max_len) ranked in the top k joins the pool; the best k
        other candidates run on; then each request's stopping rule."""
        b = self.book
        k = b.beam[cand.req]  # shape: (n,)
        hits = is_eos | last
        adm = np.flatnonzero(hits & (cand.rank < k))  # a full pool keeps the better ones (add cuts it)
        b.add(self._hypotheses(rows, cand, adm, is_eos[adm], c_len), capped=True)
        if hits.any():
            cont = np.flatnonzero(~hits)
            among = cand.rank_among(cont)  # shape: (cont,) rank among the request's non-ending candidates
            keep = among < k[cont]
            surv, first = cont[keep], np.flatnonzero(among[keep] == 0)
        else:  # nothing ends here: the best k of each request run on
            surv = np.flatnonzero(cand.rank < k)
            first = np.flatnonzero(cand.rank[surv] == 0)
        if surv.size:
            surv = surv[~self._pool_done(cand.req[surv], cand.lp[surv], first)]
        return surv

    def _compete_step(
        self, rows: _Rows, cand: _Candidates, is_eos: np.ndarray, c_len: np.ndarray, last: np.ndarray
    ) -> np.ndarray:
        """Kool et al.: a request's finished hypotheses and new candidates compete by key for its k slots."""
        b = self.book
        keep = np.zeros(cand.req.shape[0], dtype=bool)
        bounds = [*group_starts(cand.req).tolist(), cand.req.shape[0]]
        for lo, hi in itertools.pairwise(bounds):
            r = int(cand.req[lo])
            k = int(b.beam[r])
            pk = np.array([h.key for h in b.pools[r]])  # descending, float64
            ck = cand.key[lo:hi]  # descending
            # overall rank = own rank + entries of the other side ranked above (finished ones win ties)
            keep[lo:hi] = np.arange(hi - lo) + np.searchsorted(-pk, -ck, side="right") < k
            stay = np.arange(pk.size) + np.searchsorted(-ck, -pk) < k
            b.set(r, list(itertools.compress(b.pools[r], stay)))
        done = np.flatnonzero(keep & is_eos)
        surv = np.flatnonzero(keep & ~is_eos)
        by_key = self._hypotheses(rows, cand, done, True, c_len)
        if last.any():  # live hypotheses at max_len join the result unfinished
            cut = last[surv]
            for r, hyps in self._hypotheses(rows, cand, surv[cut], False, c_len).items():
                by_key.setdefault(r, []).extend(hyps)
            surv = surv[~cut]
        for r, hyps in by_key.items():
            pool = b.pools[r] + hyps
            pool.sort(key=lambda h: -h.key)
            b.set(r, pool)
        return surv

    def _pool_done(self, s_req: np.ndarray, s_lp: np.ndarray, first: np.ndarray) -> np.ndarray:
        """For each survivor, whether its request stops now (early_stopping rules, patience, exact exit).

        Survivors come grouped by request, ranked; ``first`` indexes each request's first (best) one.
        """
        b = self.book
        reqs, best = s_req[first], s_lp[first]
        full = b.count[reqs] >= b.pool[reqs]
        es = b.es[reqs]
        cur = b.t[reqs] + 1
        horizon = np.where((es == 2) & (b.alpha[reqs] > 0), b.max_len[reqs], cur)
        stop = np.where(es == 1, full, full & (self._penalised(best, horizon, reqs) <= b.worst[reqs]))
        if self.options.exact_exit:
            stop = stop | (b.nth[reqs] >= best)
        by_req = np.zeros(b.size, dtype=bool)  # shape: (R,)
        by_req[reqs] = stop
        return by_req[s_req]

    def _rank(self, r: int, pool: list[_Finished]) -> list[Hypothesis]:
        """Final ranking of one request's hypotheses (optional final scorer), cut to its ``num_return``."""
        opt = self.options
        hyps = [h.build() for h in sorted(pool, key=_neg_score)]
        if opt.final_scorer is not None and hyps:
            new = list(opt.final_scorer(hyps))
            if len(new) != len(hyps):
                raise ValueError("final_scorer must return one score per hypothesis")
            for i, h in enumerate(hyps):  # as many as hyps (checked above)
                h.score = float(new[i])
            hyps.sort(key=lambda h: -h.score)
        n = int(self.book.nret[r])
        return hyps[:n] if n else hyps


def _pad_cols(a: np.ndarray, width: int, fill: float) -> np.ndarray:
    """``a`` ``[rows, w]`` padded on the right to ``width`` columns with ``fill``."""
    if a.shape[1] == width:
        return a
    return np.concatenate([a, np.full((a.shape[0], width - a.shape[1]), fill)], axis=1)


class BeamSearch:
    """A configured search over a closed batch: ``BeamSearch(options).search(step_fn, init_state, bos, eos)``.

    A thin driver of :class:`Engine`: add every request, step until idle.
    """

    def __init__(self, options: SearchOptions):
        self.options = options

    def search(
        self,
        step_fn: StepFn,
        init_state: Any,
        bos: int | Sequence[int],
        eos: int | Sequence[int] | None,
        batch_size: int | None = None,
    ) -> SearchResult:
        """Decode every request of ``init_state`` (one row each) together; results in row order.

        ``eos`` is the stop token, or several (any of them finishes a hypothesis); ``None`` means no stop token:
        every hypothesis runs to ``max_len``.
        """
        engine = Engine(step_fn, self.options, on_step_error="raise")
        ids = engine.add_batch(init_state, bos, eos, batch_size)
        done: dict[int, Completed] = {}
        while not engine.idle:
            for c in engine.step():
                done[c.request_id] = c
        results = [done[i].hypotheses for i in ids]
        errors = {n: done[i].error for n, i in enumerate(ids) if done[i].error is not None}
        traces = [done[i].trace for i in ids] if self.options.record_trace else None
        return SearchResult(results, engine.stats, errors, traces)  # type: ignore[arg-type]


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
    neg_key = -key  # non-finite keys may sort anywhere (NaN last): they are dropped right after
    order = np.lexsort((neg_key, req) if ordered else (tok, row, neg_key, req))
    if not finite.all():
        order = order[finite[order]]
    sorted_req = req[order]
    return order, np.arange(order.shape[0]) - sorted_req.searchsorted(sorted_req)


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
    if len(out) == 2:
        return out[0], out[1], {}
    if not isinstance(out[2], dict):
        raise TypeError(f"step_fn's extras (the third value it returns) must be a dict, got {type(out[2]).__name__}")
    return out[0], out[1], out[2]


def group_starts(sorted_ids: np.ndarray) -> np.ndarray:
    """Indices where a new value begins in a sorted 1-D array (the first index of each group)."""
    return np.unique(sorted_ids, return_index=True)[1]


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
