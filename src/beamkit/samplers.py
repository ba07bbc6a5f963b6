"""Selectors that sample one row at a time: top-k, top-p, multinomial, Hugging Face beam sampling.

Each class implements the engine's :class:`beamkit.search.Selector` protocol and is passed as
``SearchOptions(selector=...)`` (or ``search_batch(..., selector=...)``). Randomness comes from ``seed`` (an int:
a fresh numpy generator per search, so the same seed gives the same result every time) or ``generator`` (a
``numpy.random.Generator`` or a ``torch.Generator``, advanced as it is used). Noise is drawn once per step for all
rows of all requests, so a batch is decoded in the same number of model calls as one request.

What each one does per step (``m`` is the number of candidates the engine asks per row):

* :class:`TopK`, :class:`TopP`, :class:`Multinomial` (AllenNLP's samplers): each row draws ``m`` tokens from
  its (top-k / nucleus / full) renormalised distribution, without replacement (the default) or with it
  (``with_replacement=True``: a token may be drawn more than once, each draw its own candidate); the engine
  then keeps the beams with the best running log-probabilities among the drawn candidates. ``temperature``
  (default 1) tempers the distribution the tokens are drawn from, in AllenNLP's order (below).
* :class:`BeamSample` (Hugging Face ``do_sample=True, num_beams=k``): each request draws ``m`` candidates (``2k``
  under ``policy="pool"``) without replacement from the joint distribution over all its beams and tokens,
  proportional to ``exp(running log-prob)``; the drawn candidates are then ranked by running log-probability.
* :class:`HuggingFaceSample`: Hugging Face 5.x's own rules on top of the same draws (eos finishes only among
  the first ``k`` draws, the best ``k`` others by running log-probability run on; one beam: the first draw).

Stochastic beam search (Gumbel-top-k, :func:`beamkit.variants.stochastic_beam_search`) lives in
:mod:`beamkit.variants.stochastic`.

Temperature ``T`` changes only what is drawn, never what is accumulated: the log-probabilities added to a
hypothesis (``Hypothesis.logprob``, and the key the engine ranks by) stay the model's (processed)
log-probabilities, never the sampling weights. :class:`Multinomial` draws from ``softmax(logp / T)``;
:class:`TopK` keeps the ``k`` most likely tokens, then draws from ``softmax(logp / T)`` among them; :class:`TopP`
tempers first and takes the nucleus of the tempered distribution. A request of an :class:`beamkit.Engine` may
set its own temperature (``engine.add(..., temperature=T)``, or ``SearchOptions(temperature=T)`` for every
request), which replaces the selector's for that request's rows. The deterministic selector ignores
temperature. :class:`BeamSample` and :class:`HuggingFaceSample` follow Hugging Face, where temperature is a
logits processor: temper their scores with ``processors=[beamkit.processors.Temperature(T)]``.

Without replacement, Gumbel-top-k draws ``m`` items from ``softmax(w)`` by taking the ``m`` largest
``w + Gumbel`` values. With replacement, each of the ``m`` draws is an independent uniform looked up in the
row's cumulative probabilities (inverse transform sampling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_bool, check_float, check_int, check_optional_int
from beamkit.ops import NEG_INF
from beamkit.processors import StepContext


class Noise:
    """A source of Gumbel noise: ``seed`` (int, restarted at every search) or a numpy / torch generator."""

    def __init__(self, seed: int | None = None, generator: Any = None):
        if seed is not None and generator is not None:
            raise ValueError("give either seed or generator, not both")
        check_optional_int("seed", seed, 0)
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

    def uniform(self, shape: tuple[int, ...], ref: Any) -> Any:
        """Uniform noise on ``[0, 1)`` of ``shape`` as float64, in the library and on the device of ``ref``."""
        return ops.uniform(self._rng, shape, ref)


def _dead_rows(offset: np.ndarray, *tables: np.ndarray) -> None:
    """Set ``-inf`` in every table for rows the engine marked failed (offset ``-inf``), in place."""
    dead = ~np.isfinite(offset)
    if dead.any():
        for t in tables:
            t[dead] = NEG_INF


@dataclass
class RowSampler:
    """The base of the samplers here and of :class:`beamkit.variants.GumbelTopK`: a :class:`Noise` source, the
    temperature, and the draw of ``m`` tokens from each (restricted) row; subclasses choose the rows' weights in
    ``_choose``.

    ``temperature`` (a finite number > 0, default 1) tempers the distribution tokens are drawn from and nothing
    else; a request's own temperature (``Engine.add(..., temperature=T)``, seen in ``StepContext.temperature``)
    replaces it for that request's rows. ``with_replacement`` (default False): draw the ``m`` tokens of a row
    independently, so a token may be drawn, and offered to the engine, more than once. ``seed``, ``generator``,
    ``temperature`` and ``with_replacement`` are keyword-only, so ``TopK(5)`` is ``TopK(k=5)`` and
    ``TopP(0.9)`` is ``TopP(p=0.9)``.
    """

    _: KW_ONLY
    seed: int | None = None
    generator: Any = None
    temperature: float = 1.0
    with_replacement: bool = False
    noise: Noise = field(init=False, repr=False)

    def __post_init__(self) -> None:
        name = type(self).__name__
        self.temperature = check_float(f"{name} temperature", self.temperature, above=0)
        self.with_replacement = check_bool(f"{name} with_replacement", self.with_replacement)
        self.noise = Noise(self.seed, self.generator)

    def check_temperature(self, temperature: float) -> None:
        """Called by :class:`beamkit.SearchOptions` with a temperature given to the search or to one request;
        every row sampler here accepts any (checked) temperature."""

    def _temperatures(self, ctx: StepContext, rows: int) -> np.ndarray | None:
        """Each row's temperature ``[rows]``: its request's where one was set, else the selector's; None when
        every row's is 1 (nothing to temper)."""
        temp = np.full(rows, self.temperature)
        given = ctx.temperature
        if given is not None:
            temp = np.where(np.isnan(given), temp, given)
        return None if (temp == 1.0).all() else temp

    def _tempered(self, logp: Any, ctx: StepContext) -> Any:
        """``logp`` ``[rows, V]`` divided by each row's temperature (``logp`` itself when all are 1)."""
        temp = self._temperatures(ctx, int(logp.shape[0]))
        return logp if temp is None else ops.div_rows(logp, temp)

    def _draw(
        self, weights: Any, logp: Any, m: int, parent_key: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``m`` tokens per row from ``softmax`` of the (masked, tempered) log-weights ``[rows, V]`` (``-inf``:
        never drawn), with or without replacement; accumulate ``logp``, key = running logp."""
        rows, vocab = int(weights.shape[0]), int(weights.shape[1])
        if self.with_replacement:
            tok = ops.inverse_cdf(weights, self.noise.uniform((rows, m), weights))  # shape: (rows, m)
            drawn = ops.gather_cols(weights, tok)
        else:
            perturbed = weights + self.noise.gumbel((rows, vocab), weights)  # shape: (rows, V)
            drawn, tok = ops.top_candidates(perturbed, m)  # shape: (rows, m)
        lp = ops.gather_cols(logp, tok)
        lp[~np.isfinite(drawn)] = NEG_INF  # masked tokens are never drawn
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
    """Each row draws ``m`` tokens from its full distribution, ``softmax(logp / temperature)`` (AllenNLP's
    sampler): without replacement, or with it when ``with_replacement=True``.

    The engine then keeps the candidates with the best running log-probabilities (untempered). With
    ``beam_size=1`` this is ancestral sampling.
    """

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``m`` tokens per row; see the class docstring."""
        return self._draw(self._tempered(logp, ctx), logp, m, parent_key)


@dataclass
class TopK(RowSampler):
    """Each row keeps its ``k`` most likely tokens and draws from them, renormalised and tempered
    (``softmax(logp / temperature)`` over the ``k``): ``min(m, k)`` tokens without replacement, or ``m`` with
    replacement (``with_replacement=True``). Ties at the k-th value go to the lower token id."""

    k: int = 50

    def __post_init__(self) -> None:
        check_int("TopK k", self.k, 1)
        super().__post_init__()

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw from the top ``k`` of each row (ties at the k-th value go to the lower token id)."""
        vals, idx = ops.top_candidates(logp, self.k)  # shape: (rows, k) host
        temp = self._temperatures(ctx, vals.shape[0])
        weights = vals if temp is None else vals / temp[:, None]
        if self.with_replacement:
            take = ops.inverse_cdf(weights, self.noise.uniform((vals.shape[0], m), np.empty(0)))  # shape: (rows, m)
        else:
            g = self.noise.gumbel(vals.shape, np.empty(0))
            pert = np.where(np.isfinite(vals), weights + g, NEG_INF)
            take = np.argsort(-pert, axis=1, kind="stable")[:, : min(m, vals.shape[1])]  # shape: (rows, m')
        lp = np.take_along_axis(vals, take, axis=1)
        tok = np.take_along_axis(idx, take, axis=1)
        return lp, tok, parent_key[:, None] + lp


@dataclass
class TopP(RowSampler):
    """Nucleus sampling: each row draws ``m`` tokens from its nucleus, renormalised, without replacement (or with
    it, ``with_replacement=True``).

    The row is tempered first (``log_softmax(logp / temperature)``); the nucleus is then the smallest set of
    most likely tokens whose tempered probability reaches ``p`` (a token is kept when the mass of the tokens
    above it is below ``p``; the best token is always kept). Tokens tied with the last kept one are kept too.
    ``widen=True`` (AllenNLP's rule, without replacement only): a nucleus of fewer than ``m`` tokens is widened
    to the ``m`` most likely tokens, so every row offers ``m`` candidates; with replacement it changes nothing.
    """

    p: float = 0.9
    widen: bool = False

    def __post_init__(self) -> None:
        check_float("TopP p", self.p, above=0, most=1)
        self.widen = check_bool("TopP widen", self.widen)
        super().__post_init__()

    def _choose(
        self, logp: Any, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw from each row's nucleus; see the class docstring."""
        rows, vocab = int(logp.shape[0]), int(logp.shape[1])
        norm = ops.log_softmax(self._tempered(logp, ctx))  # shape: (rows, V), renormalised (processors, temperature)
        srt = ops.sort_desc(norm)  # shape: (rows, V)
        n_keep = ops.nucleus_size(srt, self.p)  # shape: (rows,) host
        if self.widen and not self.with_replacement:
            n_keep = np.maximum(n_keep, min(m, vocab))
        thr = ops.pick(srt, np.arange(rows), n_keep - 1)  # shape: (rows,) the last kept probability
        return self._draw(ops.mask_below(norm, thr), logp, m, parent_key)


def _follow_hugging_face(sel: RowSampler) -> None:
    """Refuse the AllenNLP-style settings in a selector that follows Hugging Face (temperature is a logits
    processor there, and beams are drawn without replacement)."""
    name = type(sel).__name__
    if sel.temperature != 1.0:
        sel.check_temperature(sel.temperature)
    if sel.with_replacement:
        raise ValueError(
            f"{name} draws without replacement, as Hugging Face does; with_replacement=True is for TopK, TopP and "
            "Multinomial (temper scores with processors=[beamkit.processors.Temperature(t)])"
        )


def _refuse_temperature(name: str, temperature: float) -> None:
    """The error of a Hugging Face selector given a temperature other than 1."""
    if temperature != 1.0:
        raise ValueError(
            f"{name} follows Hugging Face, where temperature is a logits processor: temper the scores with "
            f"processors=[beamkit.processors.Temperature({temperature:g})] and leave the selector's temperature "
            "at 1 (and give no per-request temperature)"
        )


@dataclass
class BeamSample(RowSampler):
    """Hugging Face beam sampling: each request draws ``m`` candidates jointly over its beams, without replacement.

    Candidate ``(beam, token)`` is drawn with probability proportional to ``exp(running log-prob)``; the drawn
    candidates are ranked by running log-probability. Use ``policy="pool"`` for Hugging Face's ``2k`` draws.
    ``temperature`` stays 1 and ``with_replacement`` False (a ValueError otherwise): temper the scores with
    ``processors=[beamkit.processors.Temperature(t)]``, as Hugging Face does.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        _follow_hugging_face(self)

    def check_temperature(self, temperature: float) -> None:
        """Only temperature 1: use :class:`beamkit.processors.Temperature` to temper the scores."""
        _refuse_temperature(type(self).__name__, temperature)

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
    ``temperature`` stays 1 and ``with_replacement`` False, as with :class:`BeamSample`.
    """

    max_len: int | None = None
    request_seeds: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _follow_hugging_face(self)

    def check_temperature(self, temperature: float) -> None:
        """Only temperature 1: use :class:`beamkit.processors.Temperature` to temper the scores."""
        _refuse_temperature(type(self).__name__, temperature)

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
