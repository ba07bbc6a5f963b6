"""The engine's records: the running rows, one step's candidates, the finished pools, what a policy decided,
and what a request hands back. Plain data with shape comments; the engine and its policies fill them in."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from beamkit.hypothesis import Hypothesis, SearchStats
from beamkit.search.ranking import rank_candidates, requests_of
from beamkit.state import state_row

if TYPE_CHECKING:
    from beamkit.trace import Trace


@dataclass
class Rows:
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
    carry: np.ndarray | None = None  # shape: (rows, K) int64, the carrying processors' per-row values (-1: new)
    _slots: np.ndarray | None = field(default=None, repr=False)  # shape: (rows,) cache of slots()
    _reqs: np.ndarray | None = field(default=None, repr=False)  # shape: (requests,) cache of requests()

    @classmethod
    def start(cls, req: np.ndarray, width: int, carried: int = 0) -> Rows:
        """One empty row per request of ``req``, histories padded to ``width``; ``carried``: the columns of
        carried processor values (none: no ``carry`` table)."""
        n = req.shape[0]
        pad = np.zeros((n, width))
        carry = np.full((n, carried), -1, np.int64) if carried else None
        tokens = np.full((n, width), -1, np.int64)
        return cls(req, np.zeros(n), np.zeros(n), tokens, pad, pad.astype(np.int64), carry=carry)

    def slots(self) -> np.ndarray:
        """Each row's beam slot: its rank within its request (computed once per step)."""
        if self._slots is None:
            self._slots = np.arange(self.req.shape[0]) - self.req.searchsorted(self.req)
        return self._slots

    def requests(self) -> np.ndarray:
        """The distinct requests of the rows, ascending (computed once per step)."""
        if self._reqs is None:
            self._reqs = requests_of(self.req)
        return self._reqs

    def take(self, idx: np.ndarray, width: int | None = None) -> Rows:
        """The rows ``idx`` (in that order), histories cut to the last ``width`` columns."""
        w = self.tokens.shape[1] if width is None else width
        cols = slice(self.tokens.shape[1] - w, None)
        return Rows(
            self.req[idx],
            self.lp[idx],
            self.key[idx],
            self.tokens[idx, cols],
            self.token_lp[idx, cols],
            self.beam[idx, cols],
            None if self.cov is None else self.cov[idx],
            None if self.carry is None else self.carry[idx],
        )

    def join(self, req: np.ndarray) -> Rows:
        """These rows followed by one empty row per request of ``req``, histories padded to one width."""
        cov = self.cov
        if cov is not None:
            cov = np.concatenate([cov, np.zeros((req.shape[0], cov.shape[1]))])
        new = Rows.start(req, self.tokens.shape[1], 0 if self.carry is None else self.carry.shape[1])
        cat = np.concatenate
        return Rows(
            cat([self.req, new.req]),
            cat([self.lp, new.lp]),
            cat([self.key, new.key]),
            cat([self.tokens, new.tokens]),
            cat([self.token_lp, new.token_lp]),
            cat([self.beam, new.beam]),
            cov,
            None if self.carry is None or new.carry is None else cat([self.carry, new.carry]),
        )

    def extend(self, cand: Candidates, sel: np.ndarray) -> Rows:
        """The rows of the selected candidates: parents' histories gathered, new token appended."""
        parents = cand.row[sel]
        return Rows(
            req=cand.req[sel],
            lp=cand.lp[sel],
            key=cand.key[sel],
            tokens=np.concatenate([self.tokens[parents], cand.tok[sel, None]], axis=1),
            token_lp=np.concatenate([self.token_lp[parents], (cand.lp[sel] - self.lp[parents])[:, None]], axis=1),
            beam=np.concatenate([self.beam[parents], self.slots()[parents, None]], axis=1),
            cov=None if self.cov is None else self.cov[parents],
            carry=None if self.carry is None else self.carry[parents],
        )


def add_coverage(cov: np.ndarray | None, attn: np.ndarray) -> np.ndarray:
    """Accumulated attention plus one step's ``[rows, S]`` (widths of requests that joined later zero-padded)."""
    if cov is None:
        return attn
    out = np.zeros((attn.shape[0], max(cov.shape[1], attn.shape[1])))  # shape: (rows, S)
    out[:, : cov.shape[1]] = cov
    out[:, : attn.shape[1]] += attn
    return out


class Paths:
    """The parents' histories of the hypotheses that ended at one step, gathered once for all of them (a plain
    object, not a tuple, so that a pool table can hold a reference to it in each of its entries)."""

    __slots__ = ("tokens", "token_lp", "beam", "t", "lp", "slot", "state")

    def __init__(self, rows: Rows, parents: np.ndarray, t: np.ndarray) -> None:
        # gathered, not viewed: an entry must not keep the whole step's rows alive
        self.tokens = rows.tokens[parents]  # shape: (n, W) right-aligned
        self.token_lp = rows.token_lp[parents]  # shape: (n, W)
        self.beam = rows.beam[parents]  # shape: (n, W)
        self.t = t  # shape: (n,) history length (the last t columns)
        self.lp = rows.lp[parents]  # shape: (n,) the parent's running log-probability
        self.slot = rows.slots()[parents]  # shape: (n,) the parent's beam slot
        self.state: Any = None  # the parents' rows of the call's new state, when the search keeps final states

    def hypothesis(self, i: int, tok: int, logprob: float, score: float, key: float, finished: bool) -> Hypothesis:
        """The full :class:`Hypothesis` of entry ``i``: its parent's path plus the last token ``tok``."""
        cols = slice(self.tokens.shape[1] - int(self.t[i]), None)
        return Hypothesis(
            tokens=self.tokens[i, cols].tolist() + [tok],
            logprob=logprob,
            score=score,
            finished=finished,
            token_logprobs=self.token_lp[i, cols].tolist() + [logprob - float(self.lp[i])],
            beam_indices=self.beam[i, cols].tolist() + [int(self.slot[i])],
            key=key,
            state=None if self.state is None else state_row(self.state, i),
        )


@dataclass
class PoolTable:
    """Every running request's finished pool in one table: entries grouped by request (ascending slot), each
    request's entries in its pool order (best first: by score, or by key for the compete policy; equal ones in
    the order they came). A hypothesis that ended (eos, or cut off at ``max_len``) is built into a
    :class:`Hypothesis` only if it is still in its pool when its request completes (most are displaced before).
    """

    req: np.ndarray  # shape: (n,) int64 request slot
    eid: np.ndarray  # shape: (n,) int64 entry id, unique within an engine
    score: np.ndarray  # shape: (n,) float64 final score (length and coverage penalties)
    key: np.ndarray  # shape: (n,) float64 the selector's key
    lp: np.ndarray  # shape: (n,) float64 log-probability
    finished: np.ndarray  # shape: (n,) bool: ended with a stop token (False: cut off at max_len)
    tok: np.ndarray  # shape: (n,) int64 its last token
    cand: np.ndarray  # shape: (n,) int64 the candidate it was at the step it ended
    i: np.ndarray  # shape: (n,) int64 its parent's index in ``paths``
    paths: np.ndarray  # shape: (n,) object: the Paths of the step it ended at

    @classmethod
    def empty(cls) -> PoolTable:
        """A table with no entry."""
        i64, f64 = np.zeros(0, np.int64), np.zeros(0)
        return cls(i64, i64, f64, f64, f64, np.zeros(0, bool), i64, i64, i64, np.zeros(0, object))

    def __len__(self) -> int:
        return int(self.req.shape[0])

    def take(self, idx: np.ndarray) -> PoolTable:
        """The entries ``idx`` (indices or a mask), in that order."""
        return PoolTable(*[getattr(self, f)[idx] for f in _POOL_FIELDS])

    def concat(self, *others: PoolTable) -> PoolTable:
        """This table's entries followed by the others'."""
        parts = [self, *others]
        return PoolTable(*[np.concatenate([getattr(p, f) for p in parts]) for f in _POOL_FIELDS])

    def of(self, r: int) -> np.ndarray:
        """Indices of request ``r``'s entries, in pool order."""
        lo, hi = self.req.searchsorted(r), self.req.searchsorted(r, side="right")
        return np.arange(lo, hi)

    def hypothesis(self, j: int) -> Hypothesis:
        """Entry ``j`` as a :class:`Hypothesis`."""
        return self.hypotheses(np.array([j]))[0]

    def hypotheses(self, idx: np.ndarray) -> list[Hypothesis]:
        """The entries ``idx`` as :class:`Hypothesis` objects, in that order (each field read once for all)."""
        fields = (self.paths, self.i, self.tok, self.lp, self.score, self.key, self.finished)
        return [
            paths.hypothesis(i, tok, lp, score, key, finished)
            for paths, i, tok, lp, score, key, finished in zip(*(f[idx].tolist() for f in fields), strict=True)
        ]


_POOL_FIELDS = tuple(PoolTable.__dataclass_fields__)


class StopReason(enum.Enum):
    """Why a request has no running row any more."""

    MAX_LEN = "max_len"  # its hypotheses reached max_len
    BEAM_FULL = "beam_full"  # narrow: every beam slot holds a finished hypothesis
    POOL_HOLDS = "pool_holds"  # compete: the finished hypotheses outrank every new candidate
    POOL_FULL = "pool_full"  # pool, early_stopping=True: the pool is full
    BOUND = "bound"  # pool: full, and the best running beam cannot beat the pool's worst
    EXACT_EXIT = "exact_exit"  # pool: the n-th best finished score beats the best running log-probability
    NO_CANDIDATE = "no_candidate"  # pool: every candidate ended, none is left to run on
    ERROR = "error"  # the request failed (NaN logits, nothing finite to choose, ...)
    CANCELLED = "cancelled"  # Engine.cancel


@dataclass(frozen=True)
class Stop:
    """A stop reason with its detail text (what a trace shows)."""

    reason: StopReason
    detail: str

    @property
    def by_rule(self) -> bool:
        """Whether a stopping rule ended the request while candidates could still run on."""
        return self.reason in (StopReason.POOL_FULL, StopReason.BOUND, StopReason.EXACT_EXIT)


@dataclass
class StepView:
    """One step as the policy and a recorder see it, after the model call and the selection.

    ``considered`` are the ranked candidates before ``beam_threshold``; ``cand`` those it kept (``kept`` indexes
    them in ``considered``). Without a recorder, each request's ranked candidates may be only the first
    ``policy.ranked(book)[r]``, all the policy reads. ``ends``, ``length`` and ``last`` are per candidate of ``cand``.
    """

    rows: Rows
    considered: Candidates
    cand: Candidates
    kept: np.ndarray | None  # shape: (n,) index in ``considered`` of each of ``cand`` (None: all kept, same order)
    ends: np.ndarray  # shape: (n,) bool: the token is one of the request's stop tokens
    length: np.ndarray  # shape: (n,) int64 length of each candidate
    last: np.ndarray  # shape: (n,) bool: the candidate reaches its request's max_len
    pool: PoolTable  # the pools before the step


@dataclass
class StepDecision:
    """What a policy decided at one step: who runs on, the pools after the step, and why requests stop.

    Indices are into ``StepView.cand``. ``admitted`` entered a pool (and are in ``pool``); ``refused`` are stop
    tokens ranked in that the pool did not take; ``halted`` would have run on had their request not stopped;
    ``evicted`` are the ids of the entries that left a pool. ``stops`` holds every request of the step that has
    no survivor (errors aside: the engine adds those).
    """

    survivors: np.ndarray  # shape: (s,) int64, grouped by request in rank order
    pool: PoolTable
    admitted: np.ndarray  # shape: (a,) int64
    evicted: np.ndarray  # shape: (e,) int64 entry ids
    stops: dict[int, Stop]
    refused: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # shape: (f,) int64
    halted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # shape: (h,) int64
    counters: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # Book.counters(pool), when computed
    first_new: int = 0  # entries of ``pool`` with an id >= this one entered at this step (set by the engine)

    def admitted_rows(self) -> np.ndarray:
        """Indices in ``pool`` of the entries that entered it at this step."""
        return np.flatnonzero(self.pool.eid >= self.first_new)


@dataclass
class Candidates:
    """One step's finite candidates of every request, ranked: request, then key desc, row asc, token asc."""

    row: np.ndarray  # shape: (n,) parent row
    tok: np.ndarray  # shape: (n,) token
    lp: np.ndarray  # shape: (n,) log-probability of the extended prefix
    key: np.ndarray  # shape: (n,) ranking key
    req: np.ndarray  # shape: (n,) request
    rank: np.ndarray  # shape: (n,) rank within the request

    @classmethod
    def rank_all(
        cls,
        rows: Rows,
        logp: np.ndarray,
        tok: np.ndarray,
        key: np.ndarray,
        ordered: bool,
        limit: np.ndarray | None = None,
    ) -> Candidates:
        """Flatten the per-row tables ``[rows, m]``, drop non-finite candidates, rank within each request.

        ``ordered``: each row's candidates already come by key descending, equal keys by token ascending, so
        the flat row-major order breaks ties as the engine does and a stable sort by (request, key) suffices.
        ``limit`` (per request id): keep only each request's first ``limit[r]`` (see
        :func:`~beamkit.search.ranking.rank_candidates`).
        """
        c_row = np.repeat(np.arange(tok.shape[0]), tok.shape[1])  # shape: (rows * m,)
        c_tok, c_key = tok.ravel(), key.ravel()
        c_lp = (rows.lp[:, None] + logp).ravel()  # shape: (rows * m,)
        c_req = np.repeat(rows.req, tok.shape[1])  # shape: (rows * m,)
        order, rank = rank_candidates(c_req, c_key, c_row, c_tok, np.isfinite(c_lp), ordered, limit)
        return cls(c_row[order], c_tok[order], c_lp[order], c_key[order], c_req[order], rank)

    def take(self, keep: np.ndarray) -> Candidates:
        """The candidates where ``keep`` holds; ``keep`` must keep a prefix of each request (ranks stay)."""
        return Candidates(
            self.row[keep], self.tok[keep], self.lp[keep], self.key[keep], self.req[keep], self.rank[keep]
        )


class Join(NamedTuple):
    """Requests added together, waiting to join the running rows at the next step."""

    ids: np.ndarray  # shape: (n,) their request ids
    state: Any  # their model state, one row each
    bos: np.ndarray  # shape: (n,) int64


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
