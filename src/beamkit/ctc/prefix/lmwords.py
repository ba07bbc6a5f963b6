"""The word table of a compiled ARPA model over a search's alphabet (:class:`~beamkit.ctc.prefix.lmarrays.WordArrays`):
each word of the model that the alphabet can spell, under the hash the prefix store gives it
(:func:`beamkit.ctc.prefix.nodes.word_hash`), with its word id and whether it is known."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..jit import njit
from ..lm import LanguageModelFusion
from ..ngram import CompiledNGram
from ..tables import SALT, probe
from .lmarrays import NO_WORD, WordArrays
from .nodes import mix, mix_salted


@njit
def _hashes(codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The word hash of each word (its alphabet codes ``codes[offsets[j]:offsets[j + 1]]``), as the prefix store
    computes it character by character."""
    out = np.empty(offsets.shape[0] - 1, dtype=np.uint64)
    for j in range(offsets.shape[0] - 1):
        h = np.uint64(0)
        for q in range(offsets[j], offsets[j + 1]):
            h = mix_salted(h, np.uint64(codes[q] + 1) * SALT)
        out[j] = mix(h, np.uint64(offsets[j + 1] - offsets[j]))
    return out


@njit
def _fill(keys: np.ndarray, ids: np.ndarray, known: np.ndarray, hashes: np.ndarray, wid: np.ndarray, kn: np.ndarray):
    for j in range(hashes.shape[0]):
        s = probe(keys, hashes[j], NO_WORD)
        if keys[s] == NO_WORD:  # two words of one hash: the first keeps it
            keys[s] = hashes[j]
            ids[s] = wid[j]
            known[s] = kn[j]


def word_arrays(
    lm: LanguageModelFusion, model: CompiledNGram, alphabet: dict[str, int], alphabet_key: tuple[Any, ...]
) -> WordArrays:
    """The compiled ``model`` of the fusion ``lm`` with its words spelled over ``alphabet`` (character -> code,
    ``alphabet_key`` its sorted items). The word table is built once per model, alphabet and unigram list."""
    unigrams: Any = lm.unigrams
    keys, ids, kn = model.kept(("words", alphabet_key, unigrams), lambda: _table(model, alphabet, unigrams))
    start = model.begin_state() if lm.score_boundary else model.null_state()
    return WordArrays(
        model.arrays,
        keys,
        ids,
        kn,
        np.array([lm.alpha, lm.beta, lm.unk_score_offset], dtype=np.float64),
        np.array([True, lm.score_boundary], dtype=np.bool_),
        np.array([start], dtype=np.int64),
    )


def _table(model: CompiledNGram, alphabet: dict[str, int], unigrams: Any) -> tuple[np.ndarray, ...]:
    """The word table: hash slots, word ids and known flags of every word of ``model`` that ``alphabet`` can
    spell (known: a unigram, or, without unigrams, any word of the model: LanguageModelFusion.score_words's
    rule)."""
    codes: list[int] = []
    offsets = [0]
    wids: list[int] = []
    for wid, word in enumerate(model.word_list):
        if wid == 0 or not word or any(ch not in alphabet for ch in word):
            continue  # <unk> is what a missing word scores as; a word the alphabet cannot spell never comes
        codes.extend(alphabet[ch] for ch in word)
        offsets.append(len(codes))
        wids.append(wid)
    words = model.word_list
    known = [words[w] in unigrams for w in wids] if unigrams else [True] * len(wids)
    slots = 1 << max(4, (2 * len(wids)).bit_length())
    keys = np.zeros(slots, dtype=np.uint64)
    ids = np.zeros(slots, dtype=np.int64)
    kn = np.zeros(slots, dtype=np.bool_)
    with np.errstate(over="ignore"):  # interpreted (no numba), numpy warns when the hashes wrap, as they are meant to
        hashes = _hashes(np.array(codes, dtype=np.int64), np.array(offsets, dtype=np.int64))
        _fill(keys, ids, kn, hashes, np.array(wids, dtype=np.int64), np.array(known, dtype=np.bool_))
    return keys, ids, kn
