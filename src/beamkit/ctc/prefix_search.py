"""CTC prefix beam search as one function: :func:`prefix_beam_search` is a :class:`~beamkit.ctc.Decoder` made for
the call, over log-probabilities taken as given.

The decoder is where the search lives (a compiled frame loop over a prefix store, :mod:`beamkit.ctc.prefix`: its
kernel, nodes and fusion rules) and what it keeps between calls (the LM's scored words, the search storage): hold
a :class:`~beamkit.ctc.Decoder` for repeated calls, and for recorded searches (:meth:`~beamkit.ctc.Decoder.trace`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .decoder import Decoder, checked
from .greedy import to_numpy_2d_or_3d
from .lm import LanguageModelFusion
from .options import CTCOptions
from .posteriors import collect_candidates, dense_part
from .search import CTCHypothesis
from .vocab import Vocabulary

__all__ = ["prefix_beam_search"]


def _as_batch(log_probs: Any, lengths: Sequence[int] | np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`prefix_beam_search`'s input as one zero-padded ``(N, T, V)`` batch and the valid frames per
    utterance (one ``(T, V)`` matrix: a batch of one); None for an empty list. Bad shapes or lengths:
    ValueError."""
    if isinstance(log_probs, (list, tuple)):
        mats = [to_numpy_2d_or_3d(m, check_nan=False) for m in log_probs]
        if any(m.ndim != 2 for m in mats):
            raise ValueError("a list of utterances must hold 2-D (T, V) matrices")
        if not mats:
            return None
        lens = np.array([m.shape[0] for m in mats], dtype=np.int64)
        if len({m.shape[1] for m in mats}) != 1:
            raise ValueError("all utterances must have the same number of columns V")
        batch = np.zeros((len(mats), int(lens.max(initial=0)), mats[0].shape[1]))  # shape: (N, T, V)
        for i, m in enumerate(mats):
            batch[i, : m.shape[0]] = m
        if lengths is not None:
            raise ValueError("lengths must not be given with a list of matrices")
    else:
        batch = to_numpy_2d_or_3d(log_probs, check_nan=False)
        if batch.ndim == 2:
            batch = batch[None]
        if lengths is None:
            lens = np.full(batch.shape[0], batch.shape[1], dtype=np.int64)
        else:
            lens = np.asarray(lengths, dtype=np.int64)
            if lens.shape != (batch.shape[0],):
                raise ValueError(f"lengths must have shape ({batch.shape[0]},), got {lens.shape}")
            if (lens < 0).any() or (lens > batch.shape[1]).any():
                raise ValueError(f"lengths must lie in [0, {batch.shape[1]}]")
    return batch, lens


def prefix_beam_search(
    log_probs: Any,
    vocab: Vocabulary | Sequence[str],
    options: CTCOptions | None = None,
    *,
    lm: LanguageModelFusion | None = None,
    lengths: Sequence[int] | np.ndarray | None = None,
) -> list[list[CTCHypothesis]]:
    """CTC prefix beam search of a batch of per-frame log-probabilities, taken as given (no normalisation:
    use :func:`beamkit.ops.log_softmax` on logits, or a :class:`~beamkit.ctc.Decoder`, which normalises).

    ``log_probs``: a list of ``(T_i, V)`` matrices, an ``(N, T, V)`` array with ``lengths`` (valid frames per
    utterance; default: all), or one ``(T, V)`` matrix (a batch of one). Returns the hypotheses of each
    utterance, best first. ``options``: the search knobs (:class:`~beamkit.ctc.CTCOptions`; default: its
    defaults); ``lm``: an optional word n-gram fusion. Scores accumulate in float64. An utterance holding NaN
    raises :class:`~beamkit.ctc.errors.CTCBatchDecodeError` after the others are searched (it carries their
    results). Each call builds a :class:`~beamkit.ctc.Decoder`: hold one to keep its caches between calls."""
    decoder = Decoder(vocab, lm, options)
    shaped = _as_batch(log_probs, lengths)
    if shaped is None:  # an empty list of utterances
        return []
    batch, lens = shaped
    if batch.shape[2] != decoder.vocab.size:
        raise ValueError(f"log_probs has {batch.shape[2]} columns but the vocabulary has {decoder.vocab.size} labels")
    nan = [bool(np.isnan(batch[i, :n]).any()) for i, n in enumerate(lens.tolist())]
    lens = np.where(nan, 0, lens)  # searched as empty; reported after the others, whose results are kept
    token_min_logp = decoder.options.token_min_logp
    parts = (dense_part(batch[i, :n], token_min_logp, decoder.vocab.blank) for i, n in enumerate(lens.tolist()))
    results = decoder.search_candidates(collect_candidates(parts, lens))
    return checked(results, {i: ValueError("log_probs contains NaN") for i, bad in enumerate(nan) if bad})
