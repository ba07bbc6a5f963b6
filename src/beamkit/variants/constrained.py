"""Lexically constrained beam search with disjunctive constraints and bank allocation.

A constraint is a token sequence, or several alternative sequences of which one must appear (disjunctive); an
output meets its constraints when each one has an alternative occurring as a contiguous run of its tokens.
Per step, the :class:`Constrained` selector offers every row's top tokens plus the tokens that start or continue
an unmet constraint (grid beam search, Hokamp & Liu 2017), and puts each candidate in the *bank* of how many
constraint tokens it has met (Post & Vilar 2018, vectorised by Hu et al. 2019). Beam slots go round-robin over
the banks, fullest bank first: the best candidate of every bank, then the second best of every bank, and so on;
a bank with too few candidates leaves its slots to the others. That order is the engine key, so constrained
hypotheses are not crowded out by likelier unconstrained ones. eos is allowed only once every constraint is
met. Each row's progress is derived from its tokens (``ctx.tokens``); the order within a bank is by running
log-probability (``ctx.logprob``).

Bank of a candidate: the sum over constraints of ``max alternative length`` when met, else the longest prefix
of an alternative that the candidate's tokens end with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.processors import StepContext
from beamkit.search import BeamSearch, StepFn, make_options

Alternatives = tuple[tuple[int, ...], ...]
ConstraintSet = tuple[Alternatives, ...]


def parse_constraints(constraints: Sequence[Any]) -> ConstraintSet:
    """Normalise constraints: each item is a token sequence, or a sequence of alternative token sequences."""
    if isinstance(constraints, (str, bytes)) or not isinstance(constraints, Sequence):
        raise TypeError("constraints must be a sequence of token sequences (or of lists of alternatives)")
    out = []
    for i, c in enumerate(constraints):
        items = list(c)
        if not items:
            raise ValueError(f"constraint {i} is empty")
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in items):
            alts: Alternatives = (tuple(int(x) for x in items),)
        else:
            alts = tuple(tuple(int(x) for x in a) for a in items)
            if any(len(a) == 0 for a in alts):
                raise ValueError(f"constraint {i} has an empty alternative")
        if any(t < 0 for a in alts for t in a):
            raise ValueError(f"constraint {i} has a negative token id")
        out.append(alts)
    return tuple(out)


def _suffix_eq(tokens: np.ndarray, seq: Sequence[int]) -> np.ndarray:
    """Rows of ``tokens`` ``[n, t]`` that end with ``seq`` (an empty ``seq`` always matches)."""
    n, t = tokens.shape
    if len(seq) == 0:
        return np.ones(n, dtype=bool)
    if len(seq) > t:
        return np.zeros(n, dtype=bool)
    return (tokens[:, t - len(seq) :] == np.asarray(seq, dtype=np.int64)).all(axis=1)


def _occurs(tokens: np.ndarray, seq: Sequence[int]) -> np.ndarray:
    """Rows of ``tokens`` ``[n, t]`` containing ``seq`` as a contiguous run."""
    n, t = tokens.shape
    if len(seq) > t:
        return np.zeros(n, dtype=bool)
    win = np.lib.stride_tricks.sliding_window_view(tokens, len(seq), axis=1)  # shape: (n, t - L + 1, L)
    return (win == np.asarray(seq, dtype=np.int64)).all(axis=2).any(axis=1)


def met_matrix(tokens: np.ndarray, cons: ConstraintSet) -> np.ndarray:
    """``[n, C]``: whether each row of ``tokens`` meets each constraint."""
    met = np.zeros((tokens.shape[0], len(cons)), dtype=bool)
    for c, alts in enumerate(cons):
        for a in alts:
            met[:, c] |= _occurs(tokens, a)
    return met


def meets_constraints(tokens: Sequence[int], constraints: Sequence[Any]) -> bool:
    """Whether a token sequence meets every constraint (some alternative of each occurs contiguously)."""
    cons = parse_constraints(constraints)
    return bool(met_matrix(np.asarray([list(tokens)], dtype=np.int64).reshape(1, -1), cons).all())


def _advance(tokens: np.ndarray, met: np.ndarray, cons: ConstraintSet) -> list[set[int]]:
    """Per row, the tokens that start or continue an alternative of an unmet constraint."""
    adv: list[set[int]] = [set() for _ in range(tokens.shape[0])]
    for c, alts in enumerate(cons):
        for a in alts:
            for j in range(len(a)):
                ok = _suffix_eq(tokens, a[:j]) & ~met[:, c]
                for r in np.flatnonzero(ok).tolist():
                    adv[r].add(a[j])
    return adv


def _banks(tokens: np.ndarray, met: np.ndarray, cand: np.ndarray, cons: ConstraintSet) -> tuple[np.ndarray, np.ndarray]:
    """Bank ``[n, w]`` of each candidate ``cand`` ``[n, w]`` and whether it meets every constraint."""
    n, w = cand.shape
    bank = np.zeros((n, w), dtype=np.int64)
    all_met = np.ones((n, w), dtype=bool)
    for c, alts in enumerate(cons):
        new_met = np.repeat(met[:, c : c + 1], w, axis=1)
        partial = np.zeros((n, w), dtype=np.int64)
        for a in alts:
            for j in range(1, len(a) + 1):
                hit = (cand == a[j - 1]) & _suffix_eq(tokens, a[: j - 1])[:, None]
                if j == len(a):
                    new_met |= hit
                else:
                    partial = np.maximum(partial, np.where(hit, j, 0))
        full = max(len(a) for a in alts)
        bank += np.where(new_met, full, partial)
        all_met &= new_met
    return bank, all_met


@dataclass
class Constrained:
    """Selector for lexically constrained beam search (see the module docstring).

    ``constraints`` apply to every request; or give ``per_request``, one constraint list per request.
    """

    constraints: Sequence[Any] = ()
    per_request: Sequence[Sequence[Any]] | None = None
    _parsed: list[ConstraintSet] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.per_request is not None:
            if len(self.constraints):
                raise ValueError("give either constraints or per_request, not both")
            self._parsed = [parse_constraints(c) for c in self.per_request]
        else:
            self._parsed = [parse_constraints(self.constraints)]

    def of(self, request: int) -> ConstraintSet:
        """The constraints of one request."""
        if self.per_request is None:
            return self._parsed[0]
        if request >= len(self._parsed):
            raise ValueError(f"per_request has {len(self._parsed)} constraint lists; request {request} has none")
        return self._parsed[request]

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``m`` tokens plus constraint tokens per row; keys give the round-robin bank order."""
        if ctx.logprob is None:
            raise ValueError("Constrained needs ctx.logprob, the running log-probability the engine passes")
        run = np.asarray(ctx.logprob, dtype=np.float64)  # shape: (rows,) running log-probability of each row
        logp = ops.plus_offset64(scores, offset)  # shape: (rows, V)
        rows, vocab = int(logp.shape[0]), int(logp.shape[1])
        vals, tok = ops.top_candidates(logp, m)  # shape: (rows, m')
        tokens = np.asarray(ctx.tokens, dtype=np.int64)
        met_rows = np.zeros(rows, dtype=bool)
        extra: list[list[int]] = [[] for _ in range(rows)]
        per_req: dict[int, np.ndarray] = {}
        for r in np.unique(ctx.request).tolist():
            sel = np.flatnonzero(ctx.request == r)
            cons = self.of(r)
            if any(e in a for alts in cons for a in alts for e in ctx.eos):
                raise ValueError(f"a constraint of request {r} contains eos ({ctx.eos})")
            if any(t >= vocab for alts in cons for a in alts for t in a):
                raise ValueError(f"a constraint of request {r} has a token id >= vocabulary size {vocab}")
            met = met_matrix(tokens[sel], cons)
            per_req[r] = met
            met_rows[sel] = met.all(axis=1)
            for i, adv in zip(sel.tolist(), _advance(tokens[sel], met, cons), strict=True):
                have = set(tok[i].tolist())
                extra[i] = sorted(adv - have)
        more = max((len(e) for e in extra), default=0)
        if more:
            e_tok = np.zeros((rows, more), dtype=np.int64)
            e_ok = np.zeros((rows, more), dtype=bool)
            for i, e in enumerate(extra):
                e_tok[i, : len(e)] = e
                e_ok[i, : len(e)] = True
            e_lp = np.where(e_ok, ops.gather_cols(logp, e_tok), -np.inf)
            tok = np.concatenate([tok, e_tok], axis=1)  # shape: (rows, m' + extra)
            vals = np.concatenate([vals, e_lp], axis=1)
        lp = vals.copy()
        lp[ctx.is_eos(tok) & ~met_rows[:, None]] = -np.inf  # eos only once every constraint is met
        cum = run[:, None] + lp  # shape: (rows, w)
        bank = np.zeros(tok.shape, dtype=np.int64)
        top = 0
        for r, met in per_req.items():
            sel = np.flatnonzero(ctx.request == r)
            cons = self.of(r)
            bank[sel], _ = _banks(tokens[sel], met, tok[sel], cons)
            top = max(top, sum(max(len(a) for a in alts) for alts in cons))
        key = self._order(cum, tok, bank, ctx.request, top)
        lp[~np.isfinite(key)] = -np.inf
        return lp, tok, key

    @staticmethod
    def _order(cum: np.ndarray, tok: np.ndarray, bank: np.ndarray, request: np.ndarray, top: int) -> np.ndarray:
        """Keys ``-rank_in_bank * (top + 1) + bank``: round-robin over banks, fullest first, best first in each."""
        rows, w = tok.shape
        c_row = np.repeat(np.arange(rows), w)
        c_cum, c_tok, c_bank = cum.reshape(-1), tok.reshape(-1), bank.reshape(-1)
        c_req = request[c_row]
        ok = np.isfinite(c_cum)
        order = np.lexsort((c_tok, c_row, -np.where(ok, c_cum, -np.inf), c_bank, c_req))
        order = order[ok[order]]
        grp = c_req[order] * (top + 1) + c_bank[order]  # (request, bank) groups, contiguous in this order
        starts = np.searchsorted(grp, grp, side="left")
        rank = np.arange(order.size) - starts
        key = np.full(rows * w, -np.inf)
        key[order] = -rank.astype(np.float64) * (top + 1) + c_bank[order]
        return key.reshape(rows, w)


def _check_fits(sel: Constrained, max_len: Any) -> None:
    """Refuse, before any search, a constraint whose shortest alternative is longer than ``max_len``: no output
    of at most ``max_len`` tokens can contain it (ValueError naming the constraint and both lengths)."""
    from beamkit._checks import check_int

    max_len = check_int("max_len", max_len, least=1)
    for r, cons in enumerate(sel._parsed):
        for i, alts in enumerate(cons):
            need = min(len(a) for a in alts)
            if need > max_len:
                which = f"constraint {i}" + (f" of request {r}" if sel.per_request is not None else "")
                raise ValueError(
                    f"{which} is {need} tokens long, more than max_len={max_len}: no output can contain it"
                )


def constrained_beam_search(
    step_fn: StepFn,
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int],
    beam_size: int,
    max_len: int,
    constraints: Sequence[Any],
    per_request: bool = False,
    **options: Any,
) -> list[list[Hypothesis]]:
    """Beam search whose outputs contain every constraint; hypotheses per request, best first.

    ``constraints`` is one list for all requests (each item a token sequence or a list of alternatives), or,
    with ``per_request=True``, one such list per request. Other options are those of
    :class:`beamkit.SearchOptions`. Only hypotheses meeting all their constraints are returned (finished ones,
    and unfinished ones at ``max_len``), so a request may get an empty list when the beam found none.
    """
    if "selector" in options:
        raise ValueError("constrained_beam_search sets its own selector")
    sel = Constrained(per_request=constraints) if per_request else Constrained(constraints)
    _check_fits(sel, max_len)
    num_return = options.pop("num_return", None)  # cut after the constraint filter, not before
    result = BeamSearch(make_options(beam_size, max_len, selector=sel, **options)).search(step_fn, init_state, bos, eos)
    out = []
    for r, hyps in enumerate(result.hypotheses):
        cons = sel.of(r)
        kept = [h for h in hyps if met_matrix(np.asarray([h.tokens], dtype=np.int64), cons).all()]
        out.append(kept[:num_return] if num_return else kept)
    BatchDecodeError.raise_if(result.errors, out)
    return out
