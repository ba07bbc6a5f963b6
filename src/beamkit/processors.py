"""Logit processors: small classes that edit the ``[rows, V]`` log-probabilities of one step.

A processor is any callable ``processor(scores, ctx) -> scores``: ``scores`` are the step's log-probabilities
(numpy or torch, edited in place or replaced), ``ctx`` a :class:`StepContext`. Per-row state is derived from the
token history in ``ctx``, which the engine gathers by parent like the model state, so no processor keeps a
Python object per beam. A processor whose per-row state is cheaper to carry than to derive (a dictionary trie's
node) sets the class attribute ``carries = True``: the engine then keeps one int64 per row for it, hands it in
``ctx.carry`` (the value it stored for the row's parent at the previous step, ``-1`` for a row it has not seen),
and gathers what it stores there by parent with the row. Masked entries are ``-inf`` and are never chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from beamkit import ops
from beamkit._checks import check_float, check_id_lists, check_ids, check_int, check_number
from beamkit.ops import NEG_INF


def _check_prompts(self: Any) -> None:
    """Normalise a frozen processor's ``prompts`` to a tuple of id tuples (None stays None)."""
    if self.prompts is not None:
        object.__setattr__(self, "prompts", check_id_lists(f"{type(self).__name__} prompts", self.prompts))


@dataclass(frozen=True)
class StepContext:
    """What a processor or selector may look at: the step, each row's tokens, request and log-probability."""

    step: int  # tokens generated so far (the new token gets index ``step``)
    tokens: np.ndarray  # shape: (rows, step) int64, generated tokens of each live row
    request: np.ndarray  # shape: (rows,) int64, the request (input index) of each row
    eos: tuple[int, ...]  # the stop tokens; empty: none (the search runs to max_len)
    logprob: np.ndarray | None = None  # shape: (rows,) float64, running log-probability of each row
    finished: np.ndarray | None = None  # shape: (rows,) int64, finished hypotheses of each row's request
    # the finished pools of the requests: (request, key) of every entry, grouped by request, in pool order
    pool: tuple[np.ndarray, np.ndarray] | None = None  # shape: (P,), (P,)
    # the temperature each row's request set (Engine.add(..., temperature=T)), NaN where it set none; samplers
    # draw with it instead of their own, the deterministic selector and processors may ignore it
    temperature: np.ndarray | None = None  # shape: (rows,) float64
    # a carrying processor's own per-row value (see the module docstring): the parent's at the previous step, -1
    # for a new row; the processor writes the row's value in place, the engine gathers it by parent
    carry: np.ndarray | None = None  # shape: (rows,) int64, writable
    # each row's request's own options and id, for processors of an engine shared by requests (a server's): the
    # beam width, the longest output (max_len), the engine's request id (Engine.add's return value)
    beam: np.ndarray | None = None  # shape: (rows,) int64
    max_len: np.ndarray | None = None  # shape: (rows,) int64
    request_id: np.ndarray | None = None  # shape: (rows,) int64

    def sequences(self, prompts: Sequence[Sequence[int]] | None) -> np.ndarray:
        """Each row's prompt + generated tokens, left-padded with ``-1`` to one width ``[rows, P + step]``."""
        if not prompts:
            return self.tokens
        if len(self.request) and int(self.request.max()) >= len(prompts):
            raise ValueError(f"prompts has {len(prompts)} entries but the batch has request {int(self.request.max())}")
        width = max(len(p) for p in prompts)
        pad = np.full((len(prompts), width), -1, dtype=np.int64)
        for i, p in enumerate(prompts):
            if len(p):
                pad[i, width - len(p) :] = np.asarray(p, dtype=np.int64)
        return np.concatenate([pad[self.request], self.tokens], axis=1)

    def is_eos(self, tok: np.ndarray) -> np.ndarray:
        """Whether each token of ``tok`` is a stop token (boolean array of its shape)."""
        return is_stop(tok, self.eos)


def is_stop(tok: np.ndarray, eos: tuple[int, ...]) -> np.ndarray:
    """Whether each token of ``tok`` is one of the stop tokens ``eos`` (none: all False)."""
    if len(eos) == 1:
        return tok == eos[0]
    return np.isin(tok, eos)


class LogitsProcessor(Protocol):
    """Edits one step's ``[rows, V]`` log-probabilities."""

    def __call__(self, scores: Any, ctx: StepContext) -> Any: ...


@dataclass(frozen=True)
class MinLength:
    """Mask every stop token until ``min_len`` tokens have been generated (eos itself not counted)."""

    min_len: int

    def __post_init__(self) -> None:
        check_int("MinLength min_len", self.min_len, 0)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        if ctx.step >= self.min_len or not ctx.eos:
            return scores
        rows = np.repeat(np.arange(scores.shape[0]), len(ctx.eos))
        return ops.fill(scores, rows, np.tile(np.asarray(ctx.eos, dtype=np.int64), scores.shape[0]), NEG_INF)


def _ngram_bans(seq: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, token) pairs that would repeat an n-gram already in ``seq`` ``[rows, L]`` (-1 is padding)."""
    rows, length = seq.shape
    if n < 1 or length < n:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if n == 1:
        r, c = np.nonzero(seq >= 0)
        return r.astype(np.int64), seq[r, c]
    # shape: (rows, L - n + 1, n) every n-gram of every row
    grams = np.lib.stride_tricks.sliding_window_view(seq, n, axis=1)
    prefix = seq[:, length - (n - 1) :]  # shape: (rows, n - 1), the last n-1 tokens
    real = np.all(prefix >= 0, axis=1)  # shape: (rows,) the prefix holds no padding
    match = np.all(grams[:, :, : n - 1] == prefix[:, None, :], axis=2) & real[:, None]
    r, j = np.nonzero(match)
    return r.astype(np.int64), grams[r, j, n - 1].astype(np.int64)


@dataclass(frozen=True)
class NoRepeatNGram:
    """Never generate an n-gram that already occurs in the row's sequence (Hugging Face ``no_repeat_ngram_size``).

    ``prompts`` (one token list per request) are counted as part of the sequence, as Hugging Face does for
    decoder-only models. Vectorised over rows: one sliding-window comparison per step.
    """

    n: int
    prompts: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        check_int("NoRepeatNGram n", self.n, 1)
        _check_prompts(self)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        rows, cols = _ngram_bans(ctx.sequences(self.prompts), self.n)
        return ops.fill(scores, rows, cols, NEG_INF)


def _rows_ending_with(seq: np.ndarray, head: tuple[int, ...]) -> np.ndarray:
    """Rows of ``seq`` ``[rows, L]`` whose last tokens are ``head`` (every row for an empty head; none when
    ``head`` is longer than the sequences): the rows where a word ``head + (t,)`` would be completed by t."""
    nrows, length = seq.shape
    if len(head) > length:
        return np.zeros(0, dtype=np.int64)
    if not head:
        return np.arange(nrows)
    return np.flatnonzero((seq[:, length - len(head) :] == np.asarray(head, dtype=np.int64)).all(axis=1))


@dataclass(frozen=True)
class BadWords:
    """Never complete one of the token sequences ``bad`` (a one-token sequence is banned everywhere)."""

    bad: tuple[tuple[int, ...], ...]
    prompts: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bad", check_id_lists("BadWords", self.bad))
        if any(len(b) == 0 for b in self.bad):
            raise ValueError("BadWords: a banned sequence is empty")
        _check_prompts(self)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        seq = ctx.sequences(self.prompts)
        words = [word for word in self.bad if word[-1] < scores.shape[1]]  # a last id past V cannot be generated
        all_rows = [_rows_ending_with(seq, word[:-1]) for word in words]
        all_cols = [np.full_like(r, word[-1]) for r, word in zip(all_rows, words, strict=True)]
        if not all_rows:
            return scores
        return ops.fill(scores, np.concatenate(all_rows), np.concatenate(all_cols), NEG_INF)


@dataclass(frozen=True)
class SuppressTokens:
    """Mask ``tokens`` at every step (Hugging Face ``suppress_tokens``), or only at generated step ``at_step``
    (``begin_suppress_tokens``: the first step)."""

    tokens: tuple[int, ...]
    at_step: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", check_ids("SuppressTokens", self.tokens))
        if self.at_step is not None:
            check_int("SuppressTokens at_step", self.at_step, 0)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        if not self.tokens or (self.at_step is not None and ctx.step != self.at_step):
            return scores
        nrows, vocab = scores.shape
        cols = np.asarray([t for t in self.tokens if t < vocab], dtype=np.int64)  # ids past V: nothing to mask
        return ops.fill(scores, np.repeat(np.arange(nrows), len(cols)), np.tile(cols, nrows), NEG_INF)


@dataclass(frozen=True)
class SequenceBias:
    """Add ``bias`` to the last token of each token sequence wherever the rest of it ends the row's sequence
    (Hugging Face ``sequence_bias``): a one-token sequence is biased at every step; biases of the same token
    add up. ``prompts`` count as part of the sequence, as for :class:`BadWords`. A positive bias can make a
    step score positive, so a search with one cannot use ``exact_exit`` (``raises_scores``)."""

    biases: tuple[tuple[tuple[int, ...], float], ...]
    prompts: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.biases, (str, bytes)) or not isinstance(self.biases, Sequence):
            raise TypeError(f"SequenceBias takes (token ids, bias) pairs, got {self.biases!r}")
        pairs = []
        for pair in self.biases:
            if not isinstance(pair, Sequence) or isinstance(pair, (str, bytes)) or len(pair) != 2:
                raise TypeError(f"SequenceBias takes (token ids, bias) pairs, got {pair!r}")
            seq, bias = check_ids("SequenceBias", pair[0]), check_number("SequenceBias bias", pair[1])
            if math.isnan(bias) or bias == math.inf:
                raise ValueError(f"SequenceBias: a bias must be a number or -inf, got {bias}")
            pairs.append((seq, bias))
        object.__setattr__(self, "biases", tuple(pairs))
        if any(len(seq) == 0 for seq, _ in self.biases):
            raise ValueError("SequenceBias: a biased sequence is empty")
        _check_prompts(self)

    @property
    def raises_scores(self) -> bool:
        """Whether some bias is positive (step scores may then exceed 0)."""
        return any(b > 0 for _, b in self.biases)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        beyond = sorted({t for word, _ in self.biases for t in word if t >= scores.shape[1]})
        if beyond:
            raise ValueError(f"SequenceBias: token ids {beyond} are outside the vocabulary of {scores.shape[1]}")
        seq = ctx.sequences(self.prompts)
        all_rows = [_rows_ending_with(seq, word[:-1]) for word, _ in self.biases]
        all_cols = [np.full_like(r, word[-1]) for r, (word, _) in zip(all_rows, self.biases, strict=True)]
        all_vals = [np.full(r.shape, b, dtype=np.float64) for r, (_, b) in zip(all_rows, self.biases, strict=True)]
        if not all_rows:
            return scores
        # one addition per entry (biases of the same entry summed first), as Hugging Face adds a bias table
        keys = np.concatenate(all_rows) * scores.shape[1] + np.concatenate(all_cols)
        uniq, inverse = np.unique(keys, return_inverse=True)
        total = np.bincount(inverse.reshape(-1), weights=np.concatenate(all_vals))
        return ops.add_at(scores, uniq // scores.shape[1], uniq % scores.shape[1], total)


@dataclass(frozen=True)
class ForcedPrefix:
    """Force request ``r`` to start with ``prefixes[r]``: at step t < len, only that token is allowed."""

    prefixes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefixes", check_id_lists("ForcedPrefix", self.prefixes))

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        if len(ctx.request) and int(ctx.request.max()) >= len(self.prefixes):
            raise ValueError(
                f"ForcedPrefix has {len(self.prefixes)} prefixes but the batch has request {int(ctx.request.max())}"
            )
        lengths = np.array([len(p) for p in self.prefixes], dtype=np.int64)
        rows = np.flatnonzero(lengths[ctx.request] > ctx.step)
        cols = np.array([self.prefixes[ctx.request[r]][ctx.step] for r in rows], dtype=np.int64)
        if cols.size and int(cols.max()) >= scores.shape[1]:
            raise ValueError(f"ForcedPrefix: token id {int(cols.max())} is outside the vocabulary of {scores.shape[1]}")
        return ops.keep_only(scores, rows, cols)


@dataclass(frozen=True)
class PrefixAllowedTokens:
    """Hugging Face's ``prefix_allowed_tokens_fn``: ``fn(request, tokens) -> allowed ids`` for each row (its
    generated tokens). A callable made by :meth:`beamkit.Trie.prefix_allowed_tokens_fn` (with ``prompt_len=0``:
    the rows here hold generated tokens only) is applied vectorised, as :class:`beamkit.TrieMask`."""

    fn: Callable[[int, list[int]], Sequence[int]]

    @property
    def carries(self) -> bool:
        """Whether the engine carries a per-row value for it (a trie's node, for a Trie's callable)."""
        return callable(getattr(self.fn, "vectorised", None))

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        vectorised = getattr(self.fn, "vectorised", None)
        if callable(vectorised):
            return vectorised()(scores, ctx)
        nrows, vocab = scores.shape
        mask = np.ones((nrows, vocab), dtype=bool)  # shape: (rows, V), True = banned
        for r in range(nrows):
            allowed = np.asarray(list(self.fn(int(ctx.request[r]), ctx.tokens[r].tolist())), dtype=np.int64)
            if allowed.size and (allowed.min() < 0 or allowed.max() >= vocab):
                raise ValueError(f"prefix_allowed_tokens_fn returned ids outside [0, {vocab})")
            mask[r, allowed] = False
        banned_rows, banned_cols = np.nonzero(mask)
        return ops.fill(scores, banned_rows, banned_cols, NEG_INF)


@dataclass(frozen=True)
class RepetitionPenalty:
    """CTRL's repetition penalty on log-probabilities, as Hugging Face applies it in beam search.

    A token already in the row's sequence has its score multiplied by ``penalty`` when negative, divided
    when positive. ``penalty > 1`` discourages repeats.
    """

    penalty: float
    prompts: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        check_float("repetition penalty", self.penalty, above=0)
        _check_prompts(self)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        seq = ctx.sequences(self.prompts)
        r, c = np.nonzero((seq >= 0) & (seq < scores.shape[1]))  # prompt ids past V: nothing to penalise
        if r.size == 0:
            return scores
        pairs = np.unique(np.stack([r, seq[r, c]], axis=1), axis=0)
        return ops.penalize_at(scores, pairs[:, 0], pairs[:, 1], self.penalty)


@dataclass(frozen=True)
class Temperature:
    """Divide the step scores by ``temperature`` (Hugging Face applies it to log-probabilities in beam search)."""

    temperature: float

    def __post_init__(self) -> None:
        check_float("temperature", self.temperature, above=0)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        return scores / self.temperature
