"""Diverse beam search (Vijayakumar et al. 2016) on the batched engine.

Each request is split into ``G`` groups of ``beam_size / G`` beams. The engine sees every (request, group) as a
request of its own (the request's initial state row repeated ``G`` times), so all groups of all requests are
rows of one model call. Within a step the :class:`Diverse` selector handles a request's groups in turn: group
``g`` has ``strength * count(token)`` subtracted from its log-probabilities, where ``count`` is how many of the new
running beams of groups ``0..g-1`` of the same request end in that token at this step (Hamming diversity). As in
Hugging Face 4.x ``_group_beam_search`` the penalty is applied after the logit processors and is part of the
accumulated score. At the end the groups of a request are merged and ranked by score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_choice, check_float, check_int, check_optional_int
from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.processors import StepContext
from beamkit.search import BeamSearch, StepFn, count_requests, make_options, rank_candidates, survivor_mask
from beamkit.search.options import POLICIES
from beamkit.state import select_state


@dataclass
class Diverse:
    """Selector for diverse beam search; engine request ``q`` is group ``q % groups`` of request ``q // groups``.

    ``group_beams`` and ``policy`` must be the engine's ``beam_size`` and ``policy``: the selector replays the
    engine's choice of survivors for each group to know which tokens later groups are penalised for.
    """

    groups: int
    strength: float
    group_beams: int
    policy: str = "narrow"

    def __post_init__(self) -> None:
        check_int("groups", self.groups, 1)
        check_float("diversity strength", self.strength)
        check_choice("policy", self.policy, POLICIES)

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``m`` per row of each group's penalised log-probs, groups of a request in turn."""
        logp = ops.plus_offset64(scores, offset)  # shape: (rows, V)
        rows, vocab = int(logp.shape[0]), int(logp.shape[1])
        width = min(m, vocab)
        out_lp = np.full((rows, width), -np.inf)  # shape: (rows, m')
        out_tok = np.zeros((rows, width), dtype=np.int64)
        orig, grp = ctx.request // self.groups, ctx.request % self.groups
        chosen: dict[int, list[int]] = {}  # request -> tokens of its earlier groups' new running beams
        for g in range(self.groups):
            sel = np.flatnonzero(grp == g)
            if sel.size == 0:
                continue
            sub = ops.gather_rows(logp, sel)  # shape: (rows_g, V) a copy
            if g > 0 and self.strength != 0:
                pr, pc = [], []
                for i, r in enumerate(orig[sel].tolist()):
                    toks = chosen.get(r, [])
                    pr.extend([i] * len(toks))
                    pc.extend(toks)
                sub = ops.add_at(
                    sub,
                    np.asarray(pr, dtype=np.int64),
                    np.asarray(pc, dtype=np.int64),
                    np.full(len(pr), -self.strength),
                )
            vals, tok = ops.top_candidates(sub, width)  # shape: (rows_g, m')
            out_lp[sel], out_tok[sel] = vals, tok
            for r, toks in self._survivors(sel, vals, tok, parent_key, ctx).items():
                chosen.setdefault(r, []).extend(toks)
        return out_lp, out_tok, parent_key[:, None] + out_lp

    def _survivors(
        self, sel: np.ndarray, vals: np.ndarray, tok: np.ndarray, parent_key: np.ndarray, ctx: StepContext
    ) -> dict[int, list[int]]:
        """Tokens of the running beams the engine will keep for the rows ``sel`` (one group), per request."""
        width = tok.shape[1]
        c_row = np.repeat(sel, width)
        c_tok = tok.reshape(-1)
        c_key = (parent_key[sel][:, None] + vals).reshape(-1)
        c_req = ctx.request[c_row]
        order, rank = rank_candidates(c_req, c_key, c_row, c_tok)
        c_req, c_tok, c_row, c_key = c_req[order], c_tok[order], c_row[order], c_key[order]
        pool_req, pool_key = ctx.pool if ctx.pool is not None else (np.zeros(0, np.int64), np.zeros(0))
        slots = int(max(ctx.request.max(initial=0), pool_req.max(initial=0))) + 1
        finished = np.zeros(slots, np.int64)  # shape: (slots,) finished hypotheses of each engine request
        if ctx.finished is not None:
            finished[ctx.request] = ctx.finished
        beam = np.full(slots, self.group_beams, np.int64)
        ends = ctx.is_eos(c_tok)
        keep = survivor_mask(self.policy, c_req, c_key, rank, ends, beam, finished, pool_req, pool_key)
        out: dict[int, list[int]] = {}
        for q, t in zip(c_req[keep].tolist(), c_tok[keep].tolist(), strict=True):
            out.setdefault(q // self.groups, []).append(t)
        return out


def diverse_beam_search(
    step_fn: StepFn,
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int],
    beam_size: int,
    max_len: int,
    groups: int,
    diversity: float = 0.5,
    num_return: int | None = None,
    **options: Any,
) -> list[list[Hypothesis]]:
    """Diverse beam search for a batch of requests (one ``init_state`` row each); hypotheses per request.

    ``beam_size`` beams are split into ``groups`` groups of ``beam_size // groups``; ``diversity`` is the Hamming
    penalty strength (lambda; 0.2-0.8 worked in the paper). Other options are those of
    :class:`beamkit.SearchOptions` (policy, length_penalty, processors, ...) and apply within each group. Returns
    every group's hypotheses merged, best score first, cut to ``num_return``.
    """
    check_int("groups", groups, 1)
    if beam_size % groups:
        raise ValueError(f"beam_size ({beam_size}) must be a multiple of groups ({groups})")
    check_optional_int("num_return", num_return, 1, beam_size)
    if "selector" in options:
        raise ValueError("diverse_beam_search sets its own selector")
    per = beam_size // groups
    policy = options.get("policy", "narrow")
    n = count_requests(init_state, bos)
    rep = np.repeat(np.arange(n, dtype=np.int64), groups)
    state = select_state(init_state, rep)
    bos_rep: int | np.ndarray = bos if np.ndim(bos) == 0 else np.asarray(bos, dtype=np.int64)[rep]  # type: ignore[assignment]
    opts = make_options(per, max_len, selector=Diverse(groups, diversity, per, policy), **options)
    result = BeamSearch(opts).search(step_fn, state, bos_rep, eos, batch_size=n * groups)  # type: ignore[arg-type]
    merged: list[list[Hypothesis]] = []
    errors: dict[int, str] = {}
    for r in range(n):
        hyps: list[Hypothesis] = []
        for g in range(groups):
            q = r * groups + g
            if q in result.errors:
                errors[r] = f"group {g}: {result.errors[q]}"
            hyps.extend(result.hypotheses[q])
        hyps.sort(key=lambda h: -h.score)
        merged.append([] if r in errors else hyps[:num_return] if num_return else hyps)
    BatchDecodeError.raise_if(errors, merged)
    return merged
