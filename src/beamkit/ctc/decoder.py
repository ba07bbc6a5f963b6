"""A pyctcdecode-shaped front end: ``build_ctcdecoder(labels, kenlm_model_path, ...)`` and ``.decode(...)``.

The decoder reproduces pyctcdecode's behaviour (input normalisation, beam unit, pruning knobs, LM fusion
rules, ``decode`` pruning beams by shared history) on top of the vectorised :func:`prefix_beam_search`,
so code written for pyctcdecode can switch by changing the import. ``decode_batch`` decodes all
utterances together in one vectorised search (the ``pool`` argument is accepted and ignored).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from .lm import ArpaLM, KenLMModel, LanguageModelFusion, load_language_model, load_unigrams_from_arpa
from .prefix_search import CTCHypothesis, log_softmax, log_softmax_, prefix_beam_search, to_numpy_2d_or_3d
from .vocab import Vocabulary

MIN_TOKEN_CLIP_P = 1e-15
_BLOCK_ROWS = 16384  # rows per block of the batched log-softmax

WordFrames = tuple[str, tuple[int, int]]
OutputBeam = tuple[str, Any, list[WordFrames], float, float]
OutputBeamMPSafe = tuple[str, list[WordFrames], float, float]


def normalize_logits(logits: Any) -> np.ndarray:
    """pyctcdecode's input rule: rows summing to 1 are probabilities (log taken, clipped at 1e-15);
    anything else is logits (log-softmax, clipped to ``[log 1e-15, 0]``). Returns float64 ``(T, V)``."""
    arr = to_numpy_2d_or_3d(logits, "logits")
    if arr.ndim != 2:
        raise ValueError(f"logits must be 2-D (time, vocabulary), got shape {arr.shape}")
    if arr.shape[0] > 0 and math.isclose(float(arr.sum(axis=1).mean()), 1.0):
        return np.log(np.clip(arr, MIN_TOKEN_CLIP_P, 1.0))
    return np.clip(log_softmax(arr, axis=1), math.log(MIN_TOKEN_CLIP_P), 0.0)


def _clipped_log_softmax_(rows: np.ndarray) -> None:
    """:func:`normalize_logits`' logit rule in place over the rows of a C-contiguous 2-D float64 array,
    a block of rows at a time (temporaries the size of a block, not of the whole batch).

    The clip at 0 is left out: a log-softmax value ``(x - max) - log(sum)`` is a non-positive number minus a
    non-negative one (the sum holds ``exp(0) = 1``), so it is never above 0 (NaN for rows with infinities
    stays NaN either way), and ``-0.0`` only comes out where ``log(sum)`` is 0, i.e. for the max alone, as
    ``+0.0 - 0.0``."""
    for start in range(0, len(rows), _BLOCK_ROWS):
        block = rows[start : start + _BLOCK_ROWS]
        log_softmax_(block, axis=1)
        np.maximum(block, math.log(MIN_TOKEN_CLIP_P), out=block)


class CTCDecoder:
    """CTC beam search decoder with optional word n-gram fusion (see :func:`build_ctcdecoder`)."""

    def __init__(
        self,
        vocab: Vocabulary,
        language_model: LanguageModelFusion | None = None,
        pyctcdecode_compat: bool = True,
    ) -> None:
        """Decode over ``vocab`` with an optional fused ``language_model``; ``pyctcdecode_compat`` keeps
        pyctcdecode's end-of-utterance quirks (see :func:`build_ctcdecoder`)."""
        self.vocab = vocab
        self.language_model = language_model
        self.pyctcdecode_compat = pyctcdecode_compat

    def reset_params(
        self,
        alpha: float | None = None,
        beta: float | None = None,
        unk_score_offset: float | None = None,
        lm_score_boundary: bool | None = None,
    ) -> None:
        """Change LM fusion weights in place (no effect without an LM)."""
        lm = self.language_model
        if lm is None:
            return
        if alpha is not None:
            lm.alpha = float(alpha)
        if beta is not None:
            lm.beta = float(beta)
        if unk_score_offset is not None:
            lm.unk_score_offset = float(unk_score_offset)
        if lm_score_boundary is not None:
            lm.score_boundary = bool(lm_score_boundary)

    def _check(self, logits: np.ndarray) -> None:
        if logits.shape[-1] != self.vocab.size:
            raise ValueError(
                f"logits have shape {logits.shape} but the vocabulary has {self.vocab.size} labels; "
                "need (time, vocabulary)"
            )

    def _normalize_batch(self, logits_list: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """:func:`normalize_logits` of every matrix, zero-padded into one ``(N, T_max, V)`` array (with the
        lengths); the log-softmax of the logit matrices runs over blocks of rows (same values)."""
        arrs = [to_numpy_2d_or_3d(x, "logits", check_nan=False) for x in logits_list]
        for arr in arrs:
            if arr.ndim != 2:
                raise ValueError(f"logits must be 2-D (time, vocabulary), got shape {arr.shape}")
            self._check(arr)
        lens = np.array([arr.shape[0] for arr in arrs], dtype=np.int64)
        batch = np.empty((len(arrs), int(lens.max(initial=0)), self.vocab.size))  # shape: (N, T, V)
        for i, arr in enumerate(arrs):
            batch[i, : arr.shape[0]] = arr
            batch[i, arr.shape[0] :] = 0.0
        row_sum = batch.sum(axis=2)  # shape: (N, T) NaN in every row that holds a NaN
        if np.isnan(row_sum).any() and np.isnan(batch).any():
            raise ValueError("logits contains NaN")
        # a matrix whose rows sum to 1 on average holds probabilities (as math.isclose(mean, 1.0))
        mean = row_sum.sum(axis=1) / np.maximum(lens, 1)  # shape: (N,)
        with np.errstate(invalid="ignore"):  # an infinite mean is not close to 1
            is_prob = (lens > 0) & np.isfinite(mean) & (np.abs(mean - 1.0) <= 1e-9 * np.maximum(np.abs(mean), 1.0))
        prob_rows, logit_rows = np.flatnonzero(is_prob), np.flatnonzero(~is_prob)
        if len(prob_rows):
            batch[prob_rows] = np.log(np.clip(batch[prob_rows], MIN_TOKEN_CLIP_P, 1.0))
        if len(logit_rows):
            whole = len(logit_rows) == len(arrs)
            sub = batch if whole else batch[logit_rows]
            _clipped_log_softmax_(sub.reshape(-1, self.vocab.size))
            if not whole:
                batch[logit_rows] = sub
        return batch, lens

    def _search(
        self,
        logits_list: Sequence[Any],
        beam_width: int,
        beam_prune_logp: float,
        token_min_logp: float,
        prune_history: bool,
        hotwords: Iterable[str] | None,
        hotword_weight: float,
        num_hypotheses: int | None = None,
    ) -> list[list[CTCHypothesis]]:
        if not logits_list:
            return []
        batch, lens = self._normalize_batch(logits_list)
        out = prefix_beam_search(
            batch,
            self.vocab,
            lengths=lens,
            beam_width=beam_width,
            beam_prune_logp=beam_prune_logp,
            token_min_logp=token_min_logp,
            lm=self.language_model,
            hotwords=list(hotwords) if hotwords is not None else None,
            hotword_weight=hotword_weight,
            prune_history=prune_history,
            split_blank=True,
            pyctcdecode_compat=self.pyctcdecode_compat,
            num_hypotheses=num_hypotheses,
        )
        return out  # type: ignore[return-value]

    def decode_beams(
        self,
        logits: Any,
        beam_width: int = 100,
        beam_prune_logp: float = -10.0,
        token_min_logp: float = -5.0,
        prune_history: bool = False,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = 10.0,
    ) -> list[OutputBeam]:
        """Decode one ``(T, V)`` matrix; return beams ``(text, lm_state, word_frames, logit_score,
        combined_score)``, best first, as pyctcdecode does."""
        hyps = self._search(
            [logits], beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight
        )[0]
        return [(h.text, h.lm_state, h.word_frames, h.logit_score, h.score) for h in hyps]

    def decode(
        self,
        logits: Any,
        beam_width: int = 100,
        beam_prune_logp: float = -10.0,
        token_min_logp: float = -5.0,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = 10.0,
    ) -> str:
        """Decode one ``(T, V)`` matrix to its best text (history pruning on, as in pyctcdecode)."""
        hyps = self._search([logits], beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight, 1)[0]
        return hyps[0].text if hyps else ""

    def decode_batch(
        self,
        pool: Any,
        logits_list: Sequence[Any],
        beam_width: int = 100,
        beam_prune_logp: float = -10.0,
        token_min_logp: float = -5.0,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = 10.0,
    ) -> list[str]:
        """Decode several utterances (possibly of different lengths) in one vectorised search.

        ``pool`` exists for pyctcdecode compatibility and is ignored."""
        del pool
        results = self._search(
            list(logits_list), beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight, 1
        )
        return [hyps[0].text if hyps else "" for hyps in results]

    def decode_beams_batch(
        self,
        pool: Any,
        logits_list: Sequence[Any],
        beam_width: int = 100,
        beam_prune_logp: float = -10.0,
        token_min_logp: float = -5.0,
        prune_history: bool = False,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = 10.0,
    ) -> list[list[OutputBeamMPSafe]]:
        """Beams ``(text, word_frames, logit_score, combined_score)`` for each utterance; ``pool`` is ignored."""
        del pool
        results = self._search(
            list(logits_list), beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight
        )
        return [[(h.text, h.word_frames, h.logit_score, h.score) for h in hyps] for hyps in results]


def build_ctcdecoder(
    labels: Sequence[str],
    kenlm_model_path: str | os.PathLike[str] | ArpaLM | KenLMModel | None = None,
    unigrams: Collection[str] | None = None,
    alpha: float = 0.5,
    beta: float = 1.5,
    unk_score_offset: float = -10.0,
    lm_score_boundary: bool = True,
    lm_backend: str = "auto",
    pyctcdecode_compat: bool = True,
) -> CTCDecoder:
    """Build a decoder like ``pyctcdecode.build_ctcdecoder``.

    ``labels``: one label per output column (``""``/``<pad>`` is the blank, ``" "`` or ``"|"`` the word
    delimiter; ``▁`` pieces make a BPE vocabulary). ``kenlm_model_path``: an ARPA (read in pure Python, or
    by ``kenlm`` when installed, see ``lm_backend``) or KenLM binary file, or an already-loaded model.
    ``unigrams``: known words for the partial-word check (read from the ARPA file when omitted).

    ``pyctcdecode_compat`` (default True, for identical results) keeps a pyctcdecode quirk: at the end of
    an utterance, hypotheses with the same text are merged and scored through their *lowest*-ranked member;
    when that member ends in a word delimiter, the LM scores an empty word (an unknown word, about
    ``alpha * (unk_score_offset + log10 p(<unk>)) * ln 10``), which can drop the right transcript when a
    faint trailing-delimiter alignment sits in the beam. ``False`` scores the end of utterance correctly.
    """
    vocab = Vocabulary.from_labels(labels)
    language_model = None
    if kenlm_model_path is not None:
        if isinstance(kenlm_model_path, (ArpaLM, KenLMModel)):
            model: ArpaLM | KenLMModel = kenlm_model_path
        else:
            path = os.fspath(kenlm_model_path)
            model = load_language_model(path, backend=lm_backend)
            if unigrams is None and path.endswith(".arpa"):
                unigrams = load_unigrams_from_arpa(path)
        if unigrams is None and isinstance(model, ArpaLM):
            unigrams = [w for w in model.words() if w not in ("<s>", "</s>")]
        language_model = LanguageModelFusion(
            model,
            unigrams,
            alpha=alpha,
            beta=beta,
            unk_score_offset=unk_score_offset,
            score_boundary=lm_score_boundary,
        )
    return CTCDecoder(vocab, language_model, pyctcdecode_compat=pyctcdecode_compat)
