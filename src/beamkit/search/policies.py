"""The policies: who among a step's ranked candidates runs on, who enters the finished pool, and when a request
stops. Each :class:`Policy` reads a :class:`~beamkit.search.records.StepView` and returns a
:class:`~beamkit.search.records.StepDecision` (pure: the engine commits it). The survivor rules themselves are
plain functions, shared with the selectors that must predict the engine's choice (diverse beam search).

``narrow``   the exact contract: the first ``beam_size - finished`` candidates of a request are taken; a stop
             token finishes and keeps its slot, so the beam narrows; live hypotheses at ``max_len`` are
             returned unfinished.
``pool``     Hugging Face / fairseq: stop tokens (or anything at ``max_len``) ranked in the top ``beam_size``
             join a pool of ``round(beam_size * patience)``; the best ``beam_size`` other candidates run on; then
             the request's stopping rule (early_stopping, patience, exact exit).
``compete``  Kool et al.: a request's finished hypotheses and new candidates compete by key for its
             ``beam_size`` slots, so a finished hypothesis can be displaced.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from beamkit.search.book import Book
from beamkit.search.options import EarlyMode
from beamkit.search.ranking import group_starts, member, without
from beamkit.search.records import PoolTable, StepDecision, StepView, Stop, StopReason


class Entries(Protocol):
    """What a policy asks for besides the view and the book: pool entries for candidates, and length-penalised
    scores (:class:`beamkit.search.entries.Scoring`)."""

    def entries(self, view: StepView, sel: np.ndarray, finished: bool | np.ndarray) -> PoolTable:
        """Pool entries for the candidates ``sel`` of ``view.cand``, in that order."""
        ...

    def penalised(self, logprob: np.ndarray, length: np.ndarray, req: np.ndarray) -> np.ndarray:
        """Length-penalised scores, each with its request's penalty."""
        ...


class Policy(Protocol):
    """One step's decision for every request at once."""

    name: str

    def step(self, view: StepView, book: Book, scoring: Entries) -> StepDecision: ...

    def ranked(self, book: Book) -> np.ndarray:
        """How many of each request's ranked candidates (per slot) the step reads: the engine may rank only those."""
        ...

    def covered(self, view: StepView, book: Book) -> bool:
        """Whether ``view``, ranked only to :meth:`ranked`, holds every candidate the step reads (if not, the
        engine ranks them all)."""
        ...


# ------------------------------------------------------------------------------------------------ survivor rules
def narrow_take(req: np.ndarray, rank: np.ndarray, beam: np.ndarray, finished: np.ndarray) -> np.ndarray:
    """Narrow: each request takes its first ``beam - finished`` candidates (``beam``, ``finished`` per slot)."""
    return rank < (beam - finished)[req]


def pool_take(req: np.ndarray, ends: np.ndarray, beam: np.ndarray) -> np.ndarray:
    """Pool: the first ``beam`` candidates of each request that do not end run on (candidates grouped by request,
    ranked)."""
    cont = np.flatnonzero(~ends)
    r = req[cont]
    among = np.arange(cont.shape[0]) - np.searchsorted(r, r)  # rank among the request's non-ending candidates
    out = np.zeros(req.shape[0], dtype=bool)
    out[cont[among < beam[r]]] = True
    return out


def compete_take(
    req: np.ndarray, key: np.ndarray, beam: np.ndarray, pool_req: np.ndarray, pool_key: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Compete: a request's pool entries and candidates, merged by key (an entry wins a tie, each side keeps its
    order), take its ``beam`` best places. Both sides come grouped by request, key descending. Returns
    ``(candidate taken, entry stays)``."""
    n_pool = pool_req.shape[0]
    if n_pool == 0:  # nothing finished yet: the first beam candidates of each request
        r = np.arange(req.shape[0]) - np.searchsorted(req, req)
        return r < beam[req], np.zeros(0, dtype=bool)
    all_req = np.concatenate([pool_req, req])  # entries first: the stable sort puts them first among equal keys
    order = np.lexsort((-np.concatenate([pool_key, key]), all_req))  # stable: each side keeps its order
    sorted_req = all_req[order]
    place = np.arange(order.shape[0]) - np.searchsorted(sorted_req, sorted_req)
    win = np.empty(order.shape[0], dtype=bool)
    win[order] = place < beam[sorted_req]
    return win[n_pool:], win[:n_pool]


def survivor_mask(
    policy: str,
    req: np.ndarray,
    key: np.ndarray,
    rank: np.ndarray,
    ends: np.ndarray,
    beam: np.ndarray,
    finished: np.ndarray | None = None,
    pool_req: np.ndarray | None = None,
    pool_key: np.ndarray | None = None,
) -> np.ndarray:
    """Which ranked candidates run on under ``policy`` (before ``max_len`` and the pool's stopping rule):
    ``narrow`` needs each request's ``finished`` count, ``compete`` its pool keys (``pool_req``, ``pool_key``)."""
    if policy == "narrow":
        return narrow_take(req, rank, beam, beam * 0 if finished is None else finished) & ~ends
    if policy == "pool":
        return pool_take(req, ends, beam)
    if policy == "compete":
        if pool_req is None or pool_key is None:  # nothing finished
            return narrow_take(req, rank, beam, beam * 0) & ~ends
        return compete_take(req, key, beam, pool_req, pool_key)[0] & ~ends
    raise ValueError(f"policy must be 'narrow', 'pool' or 'compete', got {policy!r}")


# ------------------------------------------------------------------------------------------------ pools
def merge(
    old: PoolTable, new: list[PoolTable], measure: str, cap: np.ndarray | None = None
) -> tuple[PoolTable, np.ndarray]:
    """``old`` plus the ``new`` entries, each request's entries by ``measure`` (``"score"`` or ``"key"``)
    descending, equal ones in the order given (old first); ``cap``: at most ``cap[slot]`` entries per request.
    Returns the table and the ids of the old entries that left it."""
    new = [t for t in new if len(t)]
    if not new:
        return old, np.zeros(0, np.int64)
    table = old.concat(*new)
    table = table.take(np.lexsort((-getattr(table, measure), table.req)))  # lexsort is stable
    if cap is None:
        return table, np.zeros(0, np.int64)
    place = np.arange(len(table)) - np.searchsorted(table.req, table.req)
    keep = place < cap[table.req]
    out = table.take(np.flatnonzero(keep))
    gone = table.eid[~keep]
    return out, gone[member(gone, old.eid)]


def stops_of(view: StepView, book: Book, survivors: np.ndarray, default: Stop) -> dict[int, Stop]:
    """The requests of the step left without a survivor: ``max_len`` when they reached it, else ``default``."""
    gone = without(view.rows.requests(), view.cand.req[survivors], book.size)
    out = {}
    for r in gone.tolist():
        if book.t[r] + 1 >= book.max_len[r]:
            out[r] = Stop(StopReason.MAX_LEN, f"max_len ({int(book.max_len[r])} tokens)")
        else:
            out[r] = default
    return out


# the stopping modes as plain ints: an array compared with an IntEnum member costs several times more
_FULL, _NEVER = int(EarlyMode.FULL), int(EarlyMode.NEVER)
_BEAM_FULL = Stop(StopReason.BEAM_FULL, "every beam slot holds a finished hypothesis")
_POOL_HOLDS = Stop(StopReason.POOL_HOLDS, "finished hypotheses hold every beam slot")
_NO_CANDIDATE = Stop(StopReason.NO_CANDIDATE, "no candidate left to run on")


# ------------------------------------------------------------------------------------------------ policies
class _FirstBeam:
    """What a policy that takes its candidates among each request's first ``beam_size`` ranks (Narrow, Compete)
    asks of the engine: those ranks, and nothing beyond them."""

    def ranked(self, book: Book) -> np.ndarray:
        """The first ``beam_size``: at most that many are taken (Compete: a request's pool entries can only push
        its candidates further down)."""
        return book.beam

    def covered(self, view: StepView, book: Book) -> bool:
        """Always: the candidates taken are among the first ``beam_size``."""
        return True


class Narrow(_FirstBeam):
    """The exact contract: keep the first ``beam_size - finished`` candidates; eos finishes and keeps its slot."""

    name = "narrow"

    def step(self, view: StepView, book: Book, scoring: Entries) -> StepDecision:
        """Take, finish, cut at ``max_len``."""
        cand, ends = view.cand, view.ends
        take = narrow_take(cand.req, cand.rank, book.beam, book.count)
        done = np.flatnonzero(take & ends)
        surv = np.flatnonzero(take & ~ends)
        new = [scoring.entries(view, done, True)]
        if view.last.any():  # live hypotheses at max_len are returned unfinished
            cut = view.last[surv]
            new.append(scoring.entries(view, surv[cut], False))
            surv = surv[~cut]
        pool, evicted = merge(view.pool, new, "score")
        admitted = np.concatenate([t.cand for t in new])
        return StepDecision(surv, pool, admitted, evicted, stops_of(view, book, surv, _BEAM_FULL))


class Pool:
    """Hugging Face / fairseq: endings ranked in the top k join the pool (capped); the best k others run on; then
    each request's stopping rule."""

    name = "pool"

    def __init__(self, exact_exit: bool = False) -> None:
        self.exact_exit = exact_exit

    def ranked(self, book: Book) -> np.ndarray:
        """The first ``2 beam_size``, as many as each row offers: with one stop token at most one per row ends,
        so they hold ``beam_size`` that run on; :meth:`covered` checks it."""
        return 2 * book.beam

    def covered(self, view: StepView, book: Book) -> bool:
        """Whether every request of ``view.cand`` has all its candidates there (fewer than :meth:`ranked`), or
        ``beam_size`` that do not end, or has reached ``max_len`` (every candidate ends): what the step reads
        (endings among the first ``beam_size``, the first ``beam_size`` that do not end) is then there."""
        cand = view.cand
        n = cand.req.shape[0]
        if n == 0:
            return True
        starts = group_starts(cand.req)
        reqs = cand.req[starts]
        count = np.diff(np.append(starts, n))  # shape: (requests,)
        going = np.add.reduceat((~(view.ends | view.last)).astype(np.int64), starts)  # shape: (requests,)
        ok = (count < 2 * book.beam[reqs]) | (going >= book.beam[reqs]) | view.last[starts]
        return bool(ok.all())

    def step(self, view: StepView, book: Book, scoring: Entries) -> StepDecision:
        """Admit, run on, stop by rule."""
        cand, ends = view.cand, view.ends
        k = book.beam[cand.req]  # shape: (n,)
        hits = ends | view.last
        adm = np.flatnonzero(hits & (cand.rank < k))  # a full pool keeps the better ones (merge cuts it)
        new = scoring.entries(view, adm, ends[adm])
        pool, evicted = merge(view.pool, [new], "score", cap=book.pool)
        entered = member(new.eid, pool.eid)
        admitted, refused = new.cand[entered], new.cand[~entered & new.finished]
        surv = np.flatnonzero(pool_take(cand.req, hits, book.beam))
        counters = book.counters(pool)
        halted = np.zeros(0, np.int64)
        stops: dict[int, Stop] = {}
        if surv.size:
            s_req = cand.req[surv]
            first = group_starts(s_req)  # each request's best survivor
            stops = self._stops(book, counters, s_req[first], cand.lp[surv[first]], scoring)
            if stops:
                halt = member(s_req, np.fromiter(stops, np.int64, len(stops)))
                halted, surv = surv[halt], surv[~halt]
        for r, s in stops_of(view, book, surv, _NO_CANDIDATE).items():
            stops.setdefault(r, s)
        return StepDecision(surv, pool, admitted, evicted, stops, refused, halted, counters)

    def _stops(
        self,
        book: Book,
        counters: tuple[np.ndarray, np.ndarray, np.ndarray],
        reqs: np.ndarray,
        best: np.ndarray,
        scoring: Entries,
    ) -> dict[int, Stop]:
        """The requests ``reqs`` (each with its best survivor's log-probability ``best``) that stop now, and why:
        early_stopping, patience, exact exit."""
        count, worst, nth = (c[reqs] for c in counters)
        full = count >= book.pool[reqs]
        es = book.es[reqs]
        to_max = (es == _NEVER) & (book.alpha[reqs] > 0)
        horizon = np.where(to_max, book.max_len[reqs], book.t[reqs] + 1)
        stop = np.where(es == _FULL, full, full & (scoring.penalised(best, horizon, reqs) <= worst))
        exit_ = nth >= best if self.exact_exit else np.zeros(reqs.shape[0], dtype=bool)
        out: dict[int, Stop] = {}
        for j in np.flatnonzero(stop | exit_).tolist():  # only the requests that stop: Python per request is fine
            r = int(reqs[j])
            size = int(book.pool[r])
            patience = f" (patience {float(book.patience[r]):g})" if size != int(book.beam[r]) else ""
            pool = f"pool {int(count[j])}/{size}{patience}"
            if exit_[j]:
                detail = f"exact exit: the n-th best finished score {nth[j]:.4f} >= best running {best[j]:.4f}"
                out[r] = Stop(StopReason.EXACT_EXIT, detail)
            elif es[j] == EarlyMode.FULL:
                out[r] = Stop(StopReason.POOL_FULL, f"{pool} full (early_stopping=True)")
            else:
                at = "max_len" if to_max[j] else "its current length"
                detail = f"{pool} full and bound: the best running beam scored at {at} cannot beat the pool's worst"
                out[r] = Stop(StopReason.BOUND, detail)
        return out


class Compete(_FirstBeam):
    """Kool et al.: a request's finished hypotheses and new candidates compete by key for its k slots (one
    vectorised merge for every request)."""

    name = "compete"

    def step(self, view: StepView, book: Book, scoring: Entries) -> StepDecision:
        """Merge by key, finish, cut at ``max_len``."""
        cand, ends, old = view.cand, view.ends, view.pool
        keep, stay = compete_take(cand.req, cand.key, book.beam, old.req, old.key)
        done = np.flatnonzero(keep & ends)
        surv = np.flatnonzero(keep & ~ends)
        new = [scoring.entries(view, done, True)]
        if view.last.any():  # live hypotheses at max_len join the result unfinished
            cut = view.last[surv]
            new.append(scoring.entries(view, surv[cut], False))
            surv = surv[~cut]
        pool, _ = merge(old if stay.all() else old.take(np.flatnonzero(stay)), new, "key")
        admitted = np.concatenate([t.cand for t in new])
        return StepDecision(surv, pool, admitted, old.eid[~stay], stops_of(view, book, surv, _POOL_HOLDS))


def make_policy(name: str, exact_exit: bool = False) -> Policy:
    """The policy called ``name``."""
    if name == "narrow":
        return Narrow()
    if name == "pool":
        return Pool(exact_exit)
    if name == "compete":
        return Compete()
    raise ValueError(f"policy must be 'narrow', 'pool' or 'compete', got {name!r}")
