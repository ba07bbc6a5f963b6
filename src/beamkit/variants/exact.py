"""Exact search: the true n best outputs of a small problem, by best-first branch and bound.

The output space is every sequence of at most ``max_len`` tokens that ends in eos (finished) or has exactly
``max_len`` tokens and no eos (unfinished), scored like ``beam_search``: ``logprob / lp(len)``. Step
log-probabilities are <= 0 (so are the weighted sums of :func:`beamkit.fuse`, which the engine takes as they
are), so a prefix of ``t`` tokens with running sum ``r`` can only reach scores up to
``max(r / lp(t + 1), r / lp(max_len))`` (``r / lp(max_len)`` for ``alpha >= 0``, the best-first stopping bound).
Prefixes are expanded best bound first, ``expand_batch`` at a time in one ``step_fn`` call, and pruned once
their bound cannot beat the n-th best output found. Used to count search errors (Stahlberg & Byrne 2019).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_int
from beamkit.hypothesis import Hypothesis
from beamkit.scoring import LengthPenalty, as_length_penalty
from beamkit.search import StepFn, bos_array, eos_ids, search_batch, unpack_step
from beamkit.state import concat_state, first_array, select_state


@dataclass
class ExactResult:
    """The n best outputs and what finding them cost, next to what full enumeration would cost."""

    hypotheses: list[Hypothesis]
    rows_evaluated: int  # prefixes sent to step_fn
    model_calls: int
    rows_full_enumeration: int  # prefixes a full enumeration sends: sum_{t < max_len} (V - 1) ** t


@dataclass(order=True)
class _Node:
    neg_bound: float
    seq: int
    tokens: list[int] = field(compare=False)
    logprob: float = field(compare=False)
    token_logprobs: list[float] = field(compare=False)
    batch: int = field(compare=False)  # which stored state holds this prefix's row
    row: int = field(compare=False)


def _bound(logprob: float, length: int, max_len: int, lp: LengthPenalty) -> float:
    """Best score any output extending a prefix of ``length`` tokens and sum ``logprob`` can reach."""
    return float(max(lp(logprob, length + 1), lp(logprob, max_len)))


def exact_search_stats(
    step_fn: StepFn,
    init_state: Any,
    bos: int,
    eos: int | Sequence[int],
    max_len: int,
    length_penalty: float | LengthPenalty = 1.0,
    n: int = 1,
    expand_batch: int = 16,
    max_rows: int = 1_000_000,
) -> ExactResult:
    """Exact n-best search for one request, with counters; see :func:`exact_search`.

    ``expand_batch`` prefixes (the best bounds first) are expanded per ``step_fn`` call; ``max_rows`` stops a
    search that grows too large with a RuntimeError.
    """
    check_int("max_len", max_len, 1)
    check_int("n", n, 1)
    check_int("expand_batch", expand_batch, 1)
    lp = as_length_penalty(length_penalty)
    stop = set(eos_ids(eos))
    lead = first_array(init_state)
    if lead is not None and int(lead.shape[0]) != 1:
        raise ValueError(f"exact_search decodes one request: init_state must have 1 row, got {lead.shape[0]}")

    states: dict[int, Any] = {-1: init_state}
    ref: Any = lead  # library/device of y_prev
    best: list[tuple[float, int, Hypothesis]] = []  # min-heap of the n best outputs (score, -seq, hyp)
    counter = 0
    # one heap per prefix length: a step_fn call batches prefixes of one length (state shapes agree)
    heaps: dict[int, list[_Node]] = {0: [_Node(-_bound(0.0, 0, max_len, lp), 0, [], 0.0, [], -1, 0)]}
    rows_done = calls = 0
    vocab = 0

    def threshold() -> float:
        return best[0][0] if len(best) >= n else -np.inf

    def offer(hyp: Hypothesis) -> None:
        nonlocal counter
        counter += 1
        item = (hyp.score, -counter, hyp)
        if len(best) < n:
            heapq.heappush(best, item)
        elif hyp.score > best[0][0]:
            heapq.heapreplace(best, item)

    while True:
        heads = [(h[0].neg_bound, length) for length, h in heaps.items() if h]
        if not heads or -min(heads)[0] <= threshold():
            break
        heap = heaps[min(heads)[1]]
        nodes: list[_Node] = []
        while heap and len(nodes) < expand_batch and -heap[0].neg_bound > threshold():
            nodes.append(heapq.heappop(heap))
        state = _gather(states, nodes)
        y = np.array([nd.tokens[-1] if nd.tokens else bos for nd in nodes], dtype=np.int64)
        logits, new_state, extras = unpack_step(step_fn(state, ops.like(y, ref) if ref is not None else y))
        ops.check_logits(logits, len(nodes))
        ref = logits
        calls += 1
        rows_done += len(nodes)
        if rows_done > max_rows:
            raise RuntimeError(f"exact_search evaluated more than max_rows={max_rows} prefixes; problem too large")
        lse = ops.logsumexp(logits)  # shape: (b,)
        if np.isnan(lse).any() or (lse == np.inf).any():
            raise ValueError("step_fn returned NaN or +inf logits")
        raw = extras.get("log_softmax", True) is False  # the step's scores are used as they are (shallow fusion)
        if raw:
            lse = np.zeros_like(lse)
        logp = ops.to_numpy(logits).astype(np.float64) + (-lse)[:, None]  # shape: (b, V) as the engine sums
        if raw and (logp > 0).any():
            raise ValueError("exact_search needs step scores <= 0 (its bound), but step_fn returned positive ones")
        vocab = logp.shape[1]
        bid = calls
        states[bid] = new_state
        for i, nd in enumerate(nodes):
            length = len(nd.tokens) + 1
            child_lp = nd.logprob + logp[i]  # shape: (V,)
            for v in np.flatnonzero(np.isfinite(child_lp)).tolist():
                total = float(child_lp[v])
                if v in stop or length == max_len:
                    score = float(lp(total, length))
                    if len(best) < n or score > best[0][0]:
                        offer(
                            Hypothesis(
                                tokens=nd.tokens + [v],
                                logprob=total,
                                score=score,
                                finished=v in stop,
                                token_logprobs=nd.token_logprobs + [float(logp[i, v])],
                            )
                        )
                    continue
                b = _bound(total, length, max_len, lp)
                if b > threshold():
                    counter += 1
                    toks = nd.tokens + [v]
                    heapq.heappush(
                        heaps.setdefault(length, []),
                        _Node(-b, counter, toks, total, nd.token_logprobs + [float(logp[i, v])], bid, i),
                    )
        if calls % 32 == 0:
            _forget(states, heaps)
    hyps = [h for _, _, h in sorted(best, key=lambda x: (-x[0], -x[1]))]
    full = sum((vocab - 1) ** t for t in range(max_len)) if vocab else 0
    return ExactResult(hyps, rows_done, calls, full)


def _gather(states: dict[int, Any], nodes: list[_Node]) -> Any:
    """The state rows of ``nodes`` in order, from the stored step outputs they came from."""
    parts, i = [], 0
    while i < len(nodes):
        j = i
        while j < len(nodes) and nodes[j].batch == nodes[i].batch:
            j += 1
        rows = np.array([nd.row for nd in nodes[i:j]], dtype=np.int64)
        parts.append(select_state(states[nodes[i].batch], rows))
        i = j
    return parts[0] if len(parts) == 1 else concat_state(parts)


def _forget(states: dict[int, Any], heaps: dict[int, list[_Node]]) -> None:
    """Drop stored states no queued prefix needs any more."""
    needed = {nd.batch for heap in heaps.values() for nd in heap}
    for b in [b for b in states if b not in needed]:
        del states[b]


def exact_search(
    step_fn: StepFn,
    init_state: Any,
    bos: int,
    eos: int | Sequence[int],
    max_len: int,
    length_penalty: float | LengthPenalty = 1.0,
    n: int = 1,
) -> list[Hypothesis]:
    """The true ``n`` best outputs of one request (finished, or unfinished at ``max_len``), best first.

    Scored like ``beam_search`` (``logprob / len ** length_penalty``, eos counted). Exhaustive in the worst case:
    meant for small vocabularies and lengths, to measure search errors. ``exact_search_stats`` also reports
    the rows evaluated and what full enumeration would evaluate.
    """
    return exact_search_stats(step_fn, init_state, bos, eos, max_len, length_penalty, n).hypotheses


@dataclass
class SearchErrors:
    """Beam search against exact search over a batch (Stahlberg & Byrne 2019)."""

    errors: int  # requests whose beam result scores below the exact optimum
    total: int
    beam_scores: list[float]
    exact_scores: list[float]
    exact_rows: int  # rows evaluated by exact search, all requests
    full_rows: int  # rows a full enumeration would evaluate, all requests
    exact_hypotheses: list[Hypothesis]


# Options that change which hypotheses the beam keeps, not how an output is scored.
_SEARCH_ONLY_OPTIONS = {"policy", "early_stopping", "patience", "exact_exit", "num_return"}


def search_errors(
    step_fn: StepFn,
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int],
    beam_size: int,
    max_len: int,
    length_penalty: float | LengthPenalty = 1.0,
    tol: float = 1e-9,
    **options: Any,
) -> SearchErrors:
    """Count the requests where batched beam search (``search_batch``) scores below the exact optimum.

    ``init_state`` has one row per request; ``options`` go to the beam search. A beam result within ``tol`` of
    the optimum is not an error.
    """
    scoring = sorted(set(options) - _SEARCH_ONLY_OPTIONS)
    if scoring:
        raise ValueError(f"search_errors: {scoring} change scores, and exact_search does not apply them")
    beams = search_batch(step_fn, init_state, bos, eos, beam_size, max_len, length_penalty=length_penalty, **options)
    n_req = len(beams)
    bos_arr = bos_array(bos, n_req)
    errors, b_scores, e_scores, e_hyps = 0, [], [], []
    rows = full = 0
    for r in range(n_req):
        one = select_state(init_state, np.array([r], dtype=np.int64))
        ex = exact_search_stats(step_fn, one, int(bos_arr[r]), eos, max_len, length_penalty)
        rows += ex.rows_evaluated
        full += ex.rows_full_enumeration
        e = ex.hypotheses[0].score if ex.hypotheses else -np.inf
        b = beams[r][0].score if beams[r] else -np.inf
        errors += int(b < e - tol)
        b_scores.append(float(b))
        e_scores.append(float(e))
        e_hyps.append(ex.hypotheses[0])
    return SearchErrors(errors, n_req, b_scores, e_scores, rows, full, e_hyps)
