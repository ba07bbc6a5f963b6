"""Helpers shared by the model modules: batching source strings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from beamkit.models.vocab import Vocab


def pad_batch(seqs: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad id sequences to one length; return ids (B, S) int64 and lengths (B,) int64."""
    if not seqs:
        raise ValueError("empty batch")
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    if lengths.min() == 0:
        raise ValueError("empty input: every source needs at least one character")
    out = np.full((len(seqs), int(lengths.max())), pad, dtype=np.int64)  # shape: (B, S)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, lengths


def encode_sources(vocab: Vocab, texts: Sequence[str]) -> list[list[int]]:
    """Encode source strings, rejecting non-strings, empty or blank strings and unknown characters."""
    if isinstance(texts, str):
        raise TypeError("expected a sequence of strings, got one string")
    out = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"expected a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("empty input: give a non-blank string to translate")
        out.append(vocab.encode(text))
    return out
