"""A compiled ARPA model as the prefix search reads it inside its compiled loop (:mod:`beamkit.ctc.ngram`): the
n-gram arrays and a table from a word's hash (the hash the prefix store gives a partial word, see
:mod:`beamkit.ctc.prefix.nodes`) to the model's word id and whether the word is known (a unigram, or a word of the
model where no unigram list is given). With it, the search never stops to ask Python for a word's score: the
LM context id of a prefix is the n-gram state itself.

The fused scores are :class:`~beamkit.ctc.lm.LanguageModelFusion`'s (pyctcdecode's) arithmetic, operation for
operation: a completed word ``alpha * (log10 p + unk) * ln(10) + beta``, the end of the utterance
``alpha * log10 p(</s>) * ln(10)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..jit import njit
from ..lm import LOG10_TO_LN as LN10
from ..ngram import NGramArrays
from ..ngram import backoff_score as ngram_score
from ..tables import probe

NO_WORD = np.uint64(0)  # an empty slot of the word table


class WordArrays(NamedTuple):
    """The compiled model and its words as the prefix search spells them."""

    ngram: NGramArrays
    keys: np.ndarray  # shape: (slots,) uint64 word hashes (NO_WORD: empty), a power of two of slots
    ids: np.ndarray  # shape: (slots,) int64 the model's word id of each
    known: np.ndarray  # shape: (slots,) bool: the word gets no unknown-word offset
    floats: np.ndarray  # shape: (3,) float64: alpha, beta, unknown-word offset
    flags: np.ndarray  # shape: (2,) bool: the model is used, the end of the utterance is scored (score_boundary)
    start: np.ndarray  # shape: (1,) int64: the state at the start of an utterance


def no_words() -> WordArrays:
    """The arrays of a search without a compiled model (never read)."""
    z = np.zeros(1, dtype=np.int64)
    f = np.zeros(1, dtype=np.float32)
    ngram = NGramArrays(np.full(16, -1, dtype=np.int64), np.zeros(16, dtype=np.int64), f, f, z, z, np.ones(4, np.int64))
    return WordArrays(
        ngram,
        np.zeros(16, dtype=np.uint64),
        np.zeros(16, dtype=np.int64),
        np.zeros(16, dtype=np.bool_),
        np.zeros(3),
        np.zeros(2, dtype=np.bool_),
        np.zeros(1, dtype=np.int64),
    )


@njit
def word_score(lm: WordArrays, state: int, wh: np.uint64) -> tuple[float, int]:
    """The fused score of completing the word of hash ``wh`` after LM state ``state``, and the state after it."""
    slot = probe(lm.keys, wh, NO_WORD)
    if lm.keys[slot] == wh:
        word, known = lm.ids[slot], lm.known[slot]
    else:
        word, known = 0, False
    logp, after = ngram_score(lm.ngram, state, word)
    if not known:
        logp = logp + lm.floats[2]
    alpha = lm.floats[0]
    if alpha != 0.0:
        return alpha * logp * LN10 + lm.floats[1], after
    return (0.0 if logp > -math.inf else -math.inf) + lm.floats[1], after  # 0 * -inf would be NaN


@njit
def eos_score(lm: WordArrays, state: int) -> float:
    """The fused end-of-utterance score after LM state ``state``."""
    if not lm.flags[1]:
        return 0.0
    return lm.floats[0] * ngram_score(lm.ngram, state, lm.ngram.sizes[3])[0] * LN10
