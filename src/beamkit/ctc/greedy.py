"""Greedy (best path) CTC decoding: argmax per frame, repeats collapsed, blanks dropped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .posteriors import as_real_array
from .vocab import Vocabulary

__all__ = ["greedy_ctc", "labels_to_text"]


def to_numpy_2d_or_3d(x: Any, name: str = "log_probs", check_nan: bool = True) -> np.ndarray:
    """Convert a numpy array, torch tensor or nested list of real numbers to a float64 numpy array (2-D or
    3-D); reject booleans and complex numbers (TypeError), and NaN values unless ``check_nan`` is False."""
    arr = as_real_array(x, name)
    if arr.ndim not in (2, 3):
        raise ValueError(f"{name} must be 2-D (T, V) or 3-D (N, T, V), got shape {arr.shape}")
    if check_nan and np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    return arr


def greedy_ctc(log_probs: Any, vocab: Vocabulary | Sequence[str] | None = None, blank: int = 0) -> list[int] | str:
    """Best-path CTC decoding of one ``(T, V)`` matrix: argmax per frame, collapse repeats, drop blanks.

    Returns the label ids when ``vocab`` is None (``blank`` gives the blank id), else the text with
    delimiters normalised as in :func:`labels_to_text`.
    """
    arr = to_numpy_2d_or_3d(log_probs)
    if arr.ndim != 2:
        raise ValueError(f"greedy_ctc takes one (T, V) matrix, got shape {arr.shape}")
    voc = None if vocab is None else _as_vocab(vocab)
    if voc is not None:
        blank = voc.blank
        if arr.shape[1] != voc.size:
            raise ValueError(f"log_probs has {arr.shape[1]} columns but the vocabulary has {voc.size}")
    if not 0 <= blank < arr.shape[1]:
        raise ValueError(f"blank index {blank} out of range for V={arr.shape[1]}")
    best = np.argmax(arr, axis=1)  # shape: (T,)
    keep = np.ones(len(best), dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    keep &= best != blank
    ids = [int(i) for i in best[keep]]
    if voc is None:
        return ids
    return labels_to_text(ids, voc)


def labels_to_text(ids: Sequence[int], vocab: Vocabulary) -> str:
    """Join collapsed label ids into whitespace-normalised text (BPE ``▁`` starts a word)."""
    if vocab.is_bpe:
        pieces = [vocab.labels[i].replace("▁", " ") for i in ids]
    else:
        pieces = [vocab.labels[i] for i in ids]
    return " ".join("".join(pieces).split())


def _as_vocab(vocab: Vocabulary | Sequence[str]) -> Vocabulary:
    if isinstance(vocab, Vocabulary):
        return vocab
    return Vocabulary.from_labels(vocab)
