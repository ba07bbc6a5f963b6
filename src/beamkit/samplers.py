"""Selectors that sample one row at a time: top-k, top-p, multinomial, Hugging Face beam sampling.

Each class implements the engine's :class:`beamkit.search.Selector` protocol and is passed as
``SearchOptions(selector=...)`` (or ``search_batch(..., selector=...)``). Randomness comes from ``seed`` (an int:
a fresh numpy generator per search, so the same seed gives the same result every time) or ``generator`` (a
``numpy.random.Generator`` or a ``torch.Generator``, advanced as it is used). Noise is drawn once per step for all
rows of all requests, so a batch is decoded in the same number of model calls as one request.

What each one does per step (``m`` is the number of candidates the engine asks per row):

* :class:`TopK`, :class:`TopP`, :class:`Multinomial` (AllenNLP's samplers): each row draws ``m`` tokens without
  replacement from its (top-k / nucleus / full) renormalised distribution; the engine then keeps the beams with
  the best running log-probabilities among the drawn candidates.
* :class:`BeamSample` (Hugging Face ``do_sample=True, num_beams=k``): each request draws ``m`` candidates (``2k``
  under ``policy="pool"``) without replacement from the joint distribution over all its beams and tokens,
  proportional to ``exp(running log-prob)``; the drawn candidates are then ranked by running log-probability.
* :class:`HuggingFaceSample`: Hugging Face 5.x's own rules on top of the same draws (eos finishes only among
  the first ``k`` draws, the best ``k`` others by running log-probability run on; one beam: the first draw).

Stochastic beam search (Gumbel-top-k, :func:`beamkit.variants.stochastic_beam_search`) lives in
:mod:`beamkit.variants.stochastic`; its old names here still work for one release, with a DeprecationWarning.

The accumulated log-probabilities (``Hypothesis.logprob``) are the model's (processed) log-probabilities, never
the sampling weights. Gumbel-top-k draws ``m`` items without replacement from ``softmax(w)`` by taking the ``m``
largest ``w + Gumbel`` values, which is how every sampler here draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_float, check_int, check_optional_int
from beamkit.moved import forward
from beamkit.ops import NEG_INF
from beamkit.processors import StepContext


class Noise:
    """A source of Gumbel noise: ``seed`` (int, restarted at every search) or a numpy / torch generator."""

    def __init__(self, seed: int | None = None, generator: Any = None):
        if seed is not None and generator is not None:
            raise ValueError("give either seed or generator, not both")
        check_optional_int("seed", seed)
        if generator is not None and not ops.is_generator(generator):
            raise TypeError(f"generator must be a numpy or torch Generator, got {type(generator).__name__}")
        self.seed = seed
        self.generator = generator
        self._rng: Any = generator if generator is not None else np.random.default_rng(seed)

    def restart(self) -> None:
        """Start the seeded stream again (called at step 0 of every search); a passed generator just goes on."""
        if self.generator is None:
            self._rng = np.random.default_rng(self.seed)

    def gumbel(self, shape: tuple[int, ...], ref: Any) -> Any:
        """Standard Gumbel noise of ``shape`` as float64, in the library and on the device of ``ref``."""
        return ops.gumbel(self._rng, shape, ref)


def _dead_rows(offset: np.ndarray, *tables: np.ndarray) -> None:
    """Set ``-inf`` in every table for rows the engine marked failed (offset ``-inf``), in place."""
    dead = ~np.isfinite(offset)
    if dead.any():
        for t in tables:
            t[dead] = NEG_INF


@dataclass
class RowSampler:
    """The base of the samplers here and of :class:`beamkit.variants.GumbelTopK`: a :class:`Noise` source and
    the draw of ``m`` tokens without replacement from each (restricted) row; subclasses choose the rows' weights
    in ``_choose``."""

    seed: int | None = None
    generator: Any = None
    noise: Noise = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.noise = Noise(self.seed, self.generator)

    def _draw(
        self, weights: Any, logp: Any, m: int, parent_key: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Gumbel-top-m of the (masked) log-weights ``[rows, V]``; accumulate ``logp``, key = running logp."""
        rows, vocab = int(weights.shape[0]), int(weights.shape[1])
        perturbed = weights + self.noise.gumbel((rows, vocab), weights)  # shape: (rows, V)
        pert, tok = ops.top_candidates(perturbed, m)  # shape: (rows, m)
        lp = ops.gather_cols(logp, tok)
        lp[~np.isfinite(pert)] = NEG_INF  # masked tokens are never drawn
        return lp, tok, parent_key[:, None] + lp

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The engine's selector call: restart the seeded noise at step 0, draw, give failed rows nothing."""
        if ctx.step == 0:
            self.noise.restart()
        lp, tok, key = self._choose(ops.plus_offset64(scores, offset), parent_key, m, ctx)
        _dead_rows(offset, lp, key)
        return lp, tok, key

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(logp, token, key)`` ``[rows, m']`` from the step's float64 log-probabilities ``logp`` ``[rows, V]``."""
        raise NotImplementedError


@dataclass
class Multinomial(RowSampler):
    """Each row draws ``m`` tokens without replacement from its full distribution (AllenNLP's sampler).

    The engine then keeps the candidates with the best running log-probabilities. With ``beam_size=1`` this is
    ancestral sampling.
    """

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``m`` tokens per row; see the class docstring."""
        return self._draw(logp, logp, m, parent_key)


@dataclass
class TopK(RowSampler):
    """Each row draws ``min(m, k)`` tokens without replacement from its ``k`` most likely tokens, renormalised."""

    k: int = 50

    def __post_init__(self) -> None:
        check_int("TopK k", self.k, 1)
        super().__post_init__()

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw from the top ``k`` of each row (ties at the k-th value go to the lower token id)."""
        vals, idx = ops.top_candidates(logp, self.k)  # shape: (rows, k)
        g = self.noise.gumbel(vals.shape, np.empty(0))
        pert = np.where(np.isfinite(vals), vals + g, NEG_INF)
        take = np.argsort(-pert, axis=1, kind="stable")[:, : min(m, vals.shape[1])]  # shape: (rows, m')
        lp = np.take_along_axis(vals, take, axis=1)
        tok = np.take_along_axis(idx, take, axis=1)
        return lp, tok, parent_key[:, None] + lp


@dataclass
class TopP(RowSampler):
    """Nucleus sampling: each row draws ``m`` tokens without replacement from its nucleus, renormalised.

    The nucleus is the smallest set of most likely tokens whose probability reaches ``p`` (a token is kept when
    the mass of the tokens above it is below ``p``; the best token is always kept). Tokens tied with the last
    kept one are kept too. Probabilities are those of the row's renormalised scores.
    """

    p: float = 0.9

    def __post_init__(self) -> None:
        check_float("TopP p", self.p, above=0, most=1)
        super().__post_init__()

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw from each row's nucleus; see the class docstring."""
        norm = ops.log_softmax(logp)  # shape: (rows, V), renormalised in case processors removed mass
        srt = ops.sort_desc(norm)  # shape: (rows, V)
        cum = ops.cumsum_exp(srt)  # shape: (rows, V) host
        before = np.concatenate([np.zeros((cum.shape[0], 1)), cum[:, :-1]], axis=1)
        n_keep = np.maximum((before < self.p).sum(axis=1), 1)
        thr = ops.to_numpy(srt)[np.arange(cum.shape[0]), n_keep - 1] if cum.shape[0] else np.zeros(0)
        return self._draw(ops.mask_below(norm, np.asarray(thr, dtype=np.float64)), logp, m, parent_key)


@dataclass
class BeamSample(RowSampler):
    """Hugging Face beam sampling: each request draws ``m`` candidates jointly over its beams, without replacement.

    Candidate ``(beam, token)`` is drawn with probability proportional to ``exp(running log-prob)``; the drawn
    candidates are ranked by running log-probability. Use ``policy="pool"`` for Hugging Face's ``2k`` draws.
    """

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row Gumbel-top-m, then the request-wide top ``m`` of the perturbed values are kept."""
        rows, vocab = int(logp.shape[0]), int(logp.shape[1])
        perturbed = logp + self.noise.gumbel((rows, vocab), logp)  # shape: (rows, V)
        pert, tok = ops.top_candidates(perturbed, m)  # shape: (rows, m)
        lp = ops.gather_cols(logp, tok)
        pert = pert + parent_key[:, None]  # running log-prob + Gumbel (the parent term is a per-row constant)
        pert[~np.isfinite(lp)] = NEG_INF
        keep = _top_per_request(pert, ctx.request, m)
        lp[~keep] = NEG_INF
        return lp, tok, parent_key[:, None] + lp


_FIRST = 1e12  # key offset that ranks a candidate by its draw order, ahead of every running log-probability


@dataclass
class HuggingFaceSample(RowSampler):
    """Hugging Face 5.x sampling under ``policy="pool"``: beam sampling (``do_sample=True, num_beams=k``) and,
    with one beam, plain sampling.

    Per step and request, ``m`` candidates (``2k`` under the pool policy) are drawn without replacement from the
    joint distribution over the request's beams and tokens, proportional to ``exp(running log-prob + step
    log-prob)`` (Gumbel-top-m; the draw order is the perturbed order). Then, as in Hugging Face's beam search:
    an eos candidate finishes only among the first ``k`` draws (at ``max_len``: the first ``k`` draws, eos or
    not), and the best ``k`` other candidates by running log-probability run on. With ``k == 1`` (plain
    sampling) the first draw is taken, whatever its value. Candidates that finish by draw order get a key of
    ``1e12`` minus their draw rank (``Hypothesis.key``), the others their running log-probability.

    Noise comes from one stream per request and step, seeded from ``request_seeds[request]`` (or ``seed`` and
    the request id), so a request's result does not depend on what else is in the batch. ``max_len``: the
    search's ``max_len`` (None: only eos finishes). Needs one beam size for all requests (``k = m // 2``).
    """

    max_len: int | None = None
    request_seeds: Sequence[Any] | None = None

    def _noise(self, ctx: StepContext, vocab: int) -> np.ndarray:
        """Gumbel noise ``[rows, V]``: each request's rows from its own generator for this step."""
        out = np.empty((ctx.request.shape[0], vocab))
        for r in np.unique(ctx.request).tolist():
            rows = np.flatnonzero(ctx.request == r)
            base = self.request_seeds[r] if self.request_seeds is not None else (self.seed or 0, r)
            rng = np.random.default_rng([*np.atleast_1d(base).tolist(), ctx.step])
            out[rows] = rng.gumbel(size=(rows.shape[0], vocab))
        return out

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``m`` per request; key the draws so the pool policy admits and keeps as Hugging Face does."""
        rows, vocab = int(logp.shape[0]), int(logp.shape[1])
        k = max(1, m // 2)
        running = ctx.logprob if ctx.logprob is not None else np.zeros(rows)
        noise = ops.like(self._noise(ctx, vocab) + running[:, None], logp)  # shape: (rows, V)
        pert, tok = ops.top_candidates(logp + noise, m)  # shape: (rows, m) per-row draws, in draw order
        lp = ops.gather_cols(logp, tok)
        pert[~np.isfinite(lp)] = NEG_INF
        drawn = _top_per_request(pert, ctx.request, m)
        lp[~drawn] = NEG_INF
        order = _draw_rank(pert, ctx.request)  # shape: (rows, m) rank of each draw within its request
        value = running[:, None] + lp
        first = ctx.is_eos(tok) & (order < k)
        if k == 1 or (self.max_len is not None and ctx.step + 1 >= self.max_len):
            first = np.ones_like(first)
        late_eos = ctx.is_eos(tok) & ~first
        key = np.where(first, _FIRST - order, np.where(late_eos, -_FIRST - order, value))
        key[~drawn] = NEG_INF
        return lp, tok, key


def _draw_rank(values: np.ndarray, request: np.ndarray) -> np.ndarray:
    """Rank of each entry of ``values`` ``[rows, w]`` (descending, ties by position) within its request's rows."""
    rows, width = values.shape
    flat = values.reshape(-1)
    c_req = np.repeat(request, width)
    order = np.lexsort((np.arange(flat.size), -flat, c_req))
    starts = np.searchsorted(c_req[order], c_req[order], side="left")
    rank = np.empty(flat.size, dtype=np.int64)
    rank[order] = np.arange(flat.size) - starts
    return rank.reshape(rows, width)


def _top_per_request(values: np.ndarray, request: np.ndarray, m: int) -> np.ndarray:
    """Mask of the ``m`` largest finite entries of ``values`` ``[rows, w]`` within each request's rows."""
    return (_draw_rank(values, request) < m) & np.isfinite(values)


__getattr__ = forward(
    __name__,
    {
        "PrefixTable": "beamkit.variants.stochastic.PrefixTable",
        "truncated_gumbel": "beamkit.variants.stochastic.truncated_gumbel",
        "GumbelTopK": "beamkit.variants.stochastic.GumbelTopK",
        "Sample": "beamkit.variants.stochastic.Sample",
        "stochastic_beam_search": "beamkit.variants.stochastic.stochastic_beam_search",
        "as_float64": "beamkit.ops.plus_offset64",
        "gather_cols": "beamkit.ops.gather_cols",
    },
)
