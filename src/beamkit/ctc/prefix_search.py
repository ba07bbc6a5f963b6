"""CTC decoding entry points: greedy (best path) decoding and prefix beam search with word-level LM fusion.

:func:`prefix_beam_search` checks its input, cuts each frame to its candidate labels
(:mod:`beamkit.ctc.posteriors`) and runs the one search there is (:mod:`beamkit.ctc.search`, a compiled frame
loop over a prefix store, :mod:`beamkit.ctc.kernel` and :mod:`beamkit.ctc.nodes`, with the fusion rules of
:mod:`beamkit.ctc.fusion`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .lm import LanguageModelFusion
from .options import CTCOptions, word_tuple
from .posteriors import as_real_array, collect_candidates, dense_part
from .search import CTCHypothesis, search_candidates
from .vocab import Vocabulary

__all__ = ["CTCHypothesis", "greedy_ctc", "labels_to_text", "prefix_beam_search"]


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
    delimiters normalised as in :func:`prefix_beam_search`.
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


def _as_batch(log_probs: Any, lengths: Sequence[int] | np.ndarray | None) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """:func:`prefix_beam_search`'s input as one zero-padded ``(N, T, V)`` batch, the valid frames per utterance
    and whether one ``(T, V)`` matrix was given; None for an empty list. Bad shapes or lengths: ValueError."""
    single = False
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
            single = True
            batch = batch[None]
        if lengths is None:
            lens = np.full(batch.shape[0], batch.shape[1], dtype=np.int64)
        else:
            lens = np.asarray(lengths, dtype=np.int64)
            if lens.shape != (batch.shape[0],):
                raise ValueError(f"lengths must have shape ({batch.shape[0]},), got {lens.shape}")
            if (lens < 0).any() or (lens > batch.shape[1]).any():
                raise ValueError(f"lengths must lie in [0, {batch.shape[1]}]")
    return batch, lens, single


def prefix_beam_search(
    log_probs: Any,
    vocab: Vocabulary | Sequence[str],
    lengths: Sequence[int] | np.ndarray | None = None,
    beam_width: int = 100,
    beam_prune_logp: float = -10.0,
    token_min_logp: float = -5.0,
    lm: LanguageModelFusion | None = None,
    hotwords: Sequence[str] | None = None,
    hotword_weight: float = 10.0,
    prune_history: bool = False,
    split_blank: bool = False,
    pyctcdecode_compat: bool = False,
    num_hypotheses: int | None = None,
    record_trace: bool = False,
) -> Any:
    """CTC prefix beam search over ``(T, V)`` log-probabilities, or a batch of utterances.

    ``log_probs``: one ``(T, V)`` matrix (returns one list of hypotheses, best first), or a ``(N, T, V)``
    array with ``lengths`` (valid frames per utterance), or a list of ``(T_i, V)`` matrices (returns one
    list per utterance). Values are per-frame log-probabilities (use :func:`beamkit.ops.log_softmax` on logits). An
    utterance of a batch holding NaN raises :class:`~beamkit.ctc.decoder.CTCBatchDecodeError` after the
    others are searched (it carries their results).

    Pruning (pyctcdecode's knobs): per frame only labels with ``lp >= token_min_logp`` (plus the argmax)
    are tried; hypotheses scoring below ``best + beam_prune_logp`` are dropped; at most ``beam_width``
    are kept. ``lm`` adds word-level n-gram fusion, ``hotwords`` a bonus per listed word.
    ``prune_history`` keeps only the best hypothesis among those sharing the last ``order - 1`` words and
    the partial word (pyctcdecode's ``decode`` does this). ``split_blank`` selects pyctcdecode's beam unit
    (see the module docstring). ``pyctcdecode_compat`` reproduces two pyctcdecode quirks at the end of an
    utterance: equal final texts take the word offsets and LM scoring of their *lowest*-scoring member,
    and an utterance ending on a delimiter has an empty word scored by the LM (an unknown word).
    ``num_hypotheses`` limits the hypotheses returned per utterance (default: all, up to ``beam_width``;
    ``1`` skips building text and word offsets for the others). Scores accumulate in float64.
    ``record_trace=True`` returns ``(hypotheses, trace)`` instead: the search as it ran, frame by frame
    (:class:`beamkit.ctc.trace.CTCTrace`; a list of them for a batch).
    """
    voc = _as_vocab(vocab)
    opts = CTCOptions(
        beam_width=beam_width,
        beam_prune_logp=beam_prune_logp,
        token_min_logp=token_min_logp,
        prune_history=prune_history,
        split_blank=split_blank,
        pyctcdecode_compat=pyctcdecode_compat,
        hotwords=None if hotwords is None else tuple(word_tuple(hotwords)),
        hotword_weight=hotword_weight,
        num_hypotheses=num_hypotheses,
    )
    if lm is not None and not isinstance(lm, LanguageModelFusion):
        raise TypeError("lm must be a LanguageModelFusion (wrap the n-gram model) or None")
    shaped = _as_batch(log_probs, lengths)
    if shaped is None:  # an empty list of utterances
        return []
    batch, lens, single = shaped
    if batch.shape[2] != voc.size:
        raise ValueError(f"log_probs has {batch.shape[2]} columns but the vocabulary has {voc.size} labels")
    return _run(batch, lens, single, voc, lm, opts, record_trace)


def _run(
    batch: np.ndarray,
    lens: np.ndarray,
    single: bool,
    voc: Vocabulary,
    lm: LanguageModelFusion | None,
    opts: CTCOptions,
    record_trace: bool,
) -> Any:
    """Search the ``(N, T, V)`` ``batch`` (``lens`` valid frames each); an utterance holding NaN is searched as
    empty and reported (a single matrix: ValueError) after the others, whose results are kept."""
    failed = np.flatnonzero([np.isnan(batch[i, :n]).any() for i, n in enumerate(lens.tolist())])
    if single and len(failed):
        raise ValueError("log_probs contains NaN")
    lens = lens.copy()
    lens[failed] = 0  # searched as empty; reported below, the others' results kept
    parts = (dense_part(batch[i, :n], opts.token_min_logp, voc.blank) for i, n in enumerate(lens.tolist()))
    cands = collect_candidates(parts, lens)
    recorder = None
    if record_trace:
        from .trace import CTCTraceRecorder

        recorder = CTCTraceRecorder(voc.labels, voc.blank)
    results = search_candidates(cands, voc, lm, opts, recorder)
    if len(failed):
        from .errors import CTCBatchDecodeError

        bad = failed.tolist()
        for j in bad:
            results[j] = []
        CTCBatchDecodeError.raise_if(dict.fromkeys(bad, "log_probs contains NaN"), results)
    if recorder is None:
        return results[0] if single else results
    traces = recorder.traces()
    return (results[0], traces[0]) if single else (results, traces)
