"""Stochastic beam search (Kool, van Hoof, Welling 2019): sequences sampled without replacement by Gumbel-top-k.

:class:`GumbelTopK` is the selector: each child gets a Gumbel perturbation of its running log-probability,
truncated so that the children's maximum equals the parent's perturbed value; the engine keeps the top-k
perturbed values. :func:`stochastic_beam_search` runs it under the ``"compete"`` policy so that the k results are
exact samples without replacement from the model's sequence distribution. :class:`PrefixTable` carries the
per-row values the engine does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.ops import NEG_INF
from beamkit.processors import StepContext
from beamkit.samplers import RowSampler
from beamkit.scoring import LengthPenalty, as_length_penalty
from beamkit.search import BeamSearch, SearchOptions


class PrefixTable:
    """Per-row values a selector needs that the engine does not carry, found again next step by the row's tokens.

    The engine passes back each survivor's key (``parent_key``) and running log-probability (``ctx.logprob``);
    a selector needing anything else per row stores it here for every candidate it emits, keyed by
    (request, tokens), and looks the survivors up at the next step. :class:`GumbelTopK` keeps its ``phi`` (the
    log-probability under the renormalised sampling distribution, which differs from ``ctx.logprob`` when
    processors remove mass) and its keys, which :func:`stochastic_beam_search` reads after the last step. One
    search at a time per table.
    """

    def __init__(self, width: int):
        self.width = width
        self._table: dict[tuple[int, bytes], np.ndarray] = {}

    def lookup(self, ctx: StepContext) -> np.ndarray:
        """Stored values of each live row ``[rows, width]``; zeros at step 0."""
        rows = ctx.request.shape[0]
        if ctx.step == 0:
            self._table = {}
            return np.zeros((rows, self.width))
        out = np.empty((rows, self.width))
        tokens = np.ascontiguousarray(ctx.tokens, dtype=np.int64)
        for i in range(rows):
            try:
                out[i] = self._table[(int(ctx.request[i]), tokens[i].tobytes())]
            except KeyError:
                raise RuntimeError(
                    "selector lost track of a row: was the same selector used by two searches at once?"
                ) from None
        return out

    def store(self, ctx: StepContext, tok: np.ndarray, values: np.ndarray, valid: np.ndarray) -> None:
        """Remember ``values[r, j]`` (``[rows, m, width]``) for the candidate (row r, token ``tok[r, j]``)."""
        table: dict[tuple[int, bytes], np.ndarray] = {}
        tokens = np.ascontiguousarray(ctx.tokens, dtype=np.int64)
        rs, js = np.nonzero(valid)
        for r, j in zip(rs.tolist(), js.tolist(), strict=True):
            seq = np.append(tokens[r], np.int64(tok[r, j]))
            table[(int(ctx.request[r]), seq.tobytes())] = values[r, j]
        self._table = table

    def get(self, request: int, tokens: Sequence[int]) -> np.ndarray | None:
        """The values stored for one candidate of the last step, or None."""
        return self._table.get((int(request), np.asarray(tokens, dtype=np.int64).tobytes()))


def truncated_gumbel(phi: np.ndarray, g: np.ndarray, z: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Kool et al.'s truncation: Gumbels ``g`` (locations ``phi``, maximum ``z``) shifted to have maximum ``t``.

    ``-log(exp(-t) - exp(-z) + exp(-g))``, computed stably as in the paper's appendix B.3.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = t - g + np.log1p(-np.exp(g - z))  # log1mexp(g - z); -inf..0
        out = t - np.maximum(v, 0.0) - np.log1p(np.exp(-np.abs(v)))
    out = np.where(g == z, t, out)  # the argmax child keeps the parent's value exactly
    return np.where(np.isfinite(phi), out, NEG_INF)


@dataclass
class GumbelTopK(RowSampler):
    """Stochastic beam search (Kool, van Hoof, Welling 2019): keys are truncated Gumbel perturbations.

    A row with running log-probability ``phi_S`` and perturbed value ``G_S`` (its key) gives each child
    ``phi_i = phi_S + log p(i)`` a Gumbel ``G_i ~ Gumbel(phi_i)``; with ``Z = max_i G_i`` over the whole
    vocabulary, the child's key is ``-log(exp(-G_S) - exp(-Z) + exp(-G_i))``. The root has ``G = 0``. The
    sampling distribution is the row's renormalised scores, so ``phi_S`` is not the engine's running
    log-probability (``ctx.logprob``) and is kept in a :class:`PrefixTable`. The engine keeps the top-k keys of
    each request.

    Kool's algorithm is this selector under the engine's ``"compete"`` policy (finished sequences keep competing
    by key), which is what :func:`stochastic_beam_search` runs; under ``"narrow"`` a finished hypothesis would
    keep its slot instead.

    ``temperature`` ``T`` (default 1; a request's own, where it set one, replaces it): the sampling distribution
    is ``log_softmax(logp / T)``, so ``phi`` and the keys follow the tempered distribution while the
    hypotheses' log-probabilities stay the model's. Stochastic beam search samples without replacement:
    ``with_replacement=True`` is a ValueError.
    """

    table: PrefixTable = field(default_factory=lambda: PrefixTable(2), repr=False, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.with_replacement:
            raise ValueError(
                "GumbelTopK samples without replacement (stochastic beam search); with_replacement=True is for "
                "TopK, TopP and Multinomial"
            )

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``m`` children of each row by perturbed value, keyed by the truncated Gumbel."""
        phi_s = self.table.lookup(ctx)[:, 0]  # shape: (rows,)
        norm = ops.log_softmax(self._tempered(logp, ctx))  # shape: (rows, V) the (tempered) sampling distribution
        rows, vocab = int(logp.shape[0]), int(logp.shape[1])
        perturbed = norm + self.noise.gumbel((rows, vocab), norm)  # shape: (rows, V), G_i - phi_S
        pert, tok = ops.top_candidates(perturbed, m)  # shape: (rows, m), descending: column 0 is Z - phi_S
        n_lp = ops.gather_cols(norm, tok)
        lp = ops.gather_cols(logp, tok)
        phi = phi_s[:, None] + n_lp
        g = phi_s[:, None] + pert
        z = g[:, :1]
        key = truncated_gumbel(phi, g, z, parent_key[:, None])
        lp[~np.isfinite(key)] = NEG_INF
        self.table.store(ctx, tok, np.stack([phi, key], axis=2), np.isfinite(key))  # a failed row's are never read
        return lp, tok, key


@dataclass
class Sample:
    """One sequence of a stochastic beam search: the hypothesis and its perturbed log-probability (key)."""

    hypothesis: Hypothesis
    key: float
    phi: float


def stochastic_beam_search(
    step_fn: Any,
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int],
    beam_size: int,
    max_len: int,
    *,
    seed: int | None = None,
    generator: Any = None,
    length_penalty: float | LengthPenalty = 1.0,
) -> list[list[Sample]]:
    """Kool et al.'s stochastic beam search: ``beam_size`` sequences sampled without replacement, per request.

    Runs the engine with :class:`GumbelTopK` under the ``"compete"`` policy: each step a request's finished
    sequences and its new candidates compete by perturbed log-probability (key) for the ``beam_size`` slots,
    so each request's result is exactly the top ``beam_size`` perturbed sequences among all outputs (finished
    ones, and unfinished ones of ``max_len`` tokens). Returns, per request, the samples ordered by key (largest
    first); ``hypothesis.score`` is the length-normalised log-probability, ``phi`` the log-probability.
    Randomness comes from ``seed`` (keyword-only, an integer >= 0) or ``generator``.

    A request that fails (NaN logits, no finite candidate) fails alone: the others finish and a
    :class:`BatchDecodeError` is raised whose ``results`` hold every request's samples (an empty list for a
    failed one) and whose ``errors`` name the failed requests.
    """
    lp = as_length_penalty(length_penalty)
    selector = GumbelTopK(seed=seed, generator=generator)
    opts = SearchOptions(beam_size=beam_size, max_len=max_len, length_penalty=lp, selector=selector, policy="compete")
    result = BeamSearch(opts).search(step_fn, init_state, bos, eos)
    samples = [[Sample(h, h.key, h.logprob) for h in sorted(hyps, key=lambda h: -h.key)] for hyps in result.hypotheses]
    BatchDecodeError.raise_if(result.errors, samples)  # results hold Samples here, not Hypotheses
    return samples
