"""A pyctcdecode-shaped front end: ``build_ctcdecoder(labels, kenlm_model_path, ...)`` and ``.decode(...)``.

The decoder reproduces pyctcdecode's behaviour (input normalisation, beam unit, pruning knobs, LM fusion
rules, ``decode`` pruning beams by shared history) on top of the vectorised prefix beam search,
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
from .prefix_search import CTCHypothesis, _check_params, _search_checked, to_numpy_2d_or_3d
from .prefix_trie import keep_scratch, take_scratch
from .vocab import Vocabulary

MIN_TOKEN_CLIP_P = 1e-15
_BLOCK_ROWS = 2048  # rows per block of the batched normalisation (whole utterances)

WordFrames = tuple[str, tuple[int, int]]
OutputBeam = tuple[str, Any, list[WordFrames], float, float]
OutputBeamMPSafe = tuple[str, list[WordFrames], float, float]


def normalize_logits(logits: Any) -> np.ndarray:
    """pyctcdecode's input rule: rows summing to 1 are probabilities (log taken, clipped at 1e-15);
    anything else is logits (log-softmax, clipped to ``[log 1e-15, 0]``). Returns float64 ``(T, V)``."""
    arr = to_numpy_2d_or_3d(logits, "logits")
    if arr.ndim != 2:
        raise ValueError(f"logits must be 2-D (time, vocabulary), got shape {arr.shape}")
    if _holds_probabilities(arr):
        return np.log(np.clip(arr, MIN_TOKEN_CLIP_P, 1.0))
    out = np.array(arr, dtype=np.float64, order="C")  # shape: (T, V) a copy, normalised in place
    with np.errstate(divide="ignore"):
        _clipped_log_softmax_(out, _row_max(out))
    return out


def _holds_probabilities(arr: np.ndarray) -> bool:
    """pyctcdecode's test of a ``(T, V)`` matrix: its rows sum to 1 on average (``math.isclose``)."""
    return arr.shape[0] > 0 and math.isclose(float(arr.sum(axis=1).mean()), 1.0)


def _row_max(rows: np.ndarray) -> np.ndarray:
    """``np.max(rows, axis=1)`` of a C-contiguous 2-D float64 array (NaN where a row holds one), as one
    ``maximum.reduceat`` over the flat array: much faster for short rows. Only the sign of a zero maximum
    may differ from ``np.max`` (which of ``0.0`` and ``-0.0`` a row holding both gives)."""
    if rows.size == 0:
        return np.zeros(len(rows))
    flat = rows.reshape(-1)
    return np.maximum.reduceat(flat, np.arange(0, len(flat), rows.shape[1]))  # shape: (R,)


def _clipped_log_softmax_(rows: np.ndarray, row_max: np.ndarray, tmp: np.ndarray | None = None) -> None:
    """:func:`normalize_logits`' logit rule in place over the rows of a C-contiguous 2-D float64 array,
    given the maximum of each row (``(R,)``, see :func:`_row_max`); ``tmp``: room for the exponentials
    (at least ``rows.shape``; allocated when None). The steps are :func:`log_softmax_`'s (pyctcdecode's),
    so the values are the same bit for bit, but for the sign of a zero at a row's maximum when the maximum
    is a zero of the other sign (see :func:`_row_max`).

    The clip at 0 is left out: a log-softmax value ``(x - max) - log(sum)`` is a non-positive number minus
    a non-negative one (the sum holds ``exp(0) = 1``), so it is never above 0 (NaN for rows with infinities
    stays NaN either way), and ``-0.0`` only comes out where ``log(sum)`` is 0, i.e. for the max alone, as
    ``+0.0 - 0.0``."""
    m = row_max[:, None].copy()  # shape: (R, 1)
    m[~np.isfinite(m)] = 0.0
    rows -= m
    e = np.exp(rows, out=None if tmp is None else tmp.reshape(-1)[: rows.size].reshape(rows.shape))
    s = np.sum(e, axis=1, keepdims=True)  # shape: (R, 1)
    rows -= np.log(s, out=s)  # a row of -inf: log(0), the caller silences that warning
    np.maximum(rows, math.log(MIN_TOKEN_CLIP_P), out=rows)


def _release_batch(batch: np.ndarray) -> None:
    """Hand the scratch buffer under ``batch`` (from :meth:`CTCDecoder._normalize_batch`) back for the next
    call."""
    keep_scratch(batch.base if batch.base is not None else batch)


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
        """:func:`normalize_logits` of every matrix, padded into one ``(N, T_max, V)`` array (with the
        lengths; padding rows hold no meaning), with the same values bit for bit. Utterances are copied in
        and normalised a block of about ``_BLOCK_ROWS`` rows at a time, so that each block stays in cache
        through all the steps.

        The array lives in a scratch buffer kept between calls (fresh memory costs page faults, see
        :func:`keep_scratch`): hand it back with :func:`_release_batch` when done."""
        arrs = [to_numpy_2d_or_3d(x, "logits", check_nan=False) for x in logits_list]
        for arr in arrs:
            if arr.ndim != 2:
                raise ValueError(f"logits must be 2-D (time, vocabulary), got shape {arr.shape}")
            self._check(arr)
        lens = np.array([arr.shape[0] for arr in arrs], dtype=np.int64)
        N, T, V = len(arrs), int(lens.max(initial=0)), self.vocab.size
        batch = take_scratch(N * T * V)[: N * T * V].reshape(N, T, V)  # shape: (N, T, V)
        per = max(1, _BLOCK_ROWS // max(T, 1))  # utterances per block
        tmp = np.empty(min(min(N, per) * T, _BLOCK_ROWS) * V)  # room for the exponentials of _BLOCK_ROWS rows
        with np.errstate(divide="ignore"):
            for u0 in range(0, N, per):
                u1 = min(N, u0 + per)
                for i in range(u0, u1):
                    n = len(arrs[i])
                    batch[i, :n] = arrs[i]
                    if n < T:
                        batch[i, n:] = 0.0
                block = batch[u0:u1].reshape(-1, V)  # shape: ((u1 - u0) * T, V)
                row_max = _row_max(block)  # shape: ((u1 - u0) * T,) NaN in every row that holds a NaN
                if not np.isfinite(row_max).all():  # padding rows are 0: only real rows fail
                    _release_batch(batch)
                    if np.isnan(row_max).any():
                        raise ValueError("logits contains NaN")
                    raise ValueError("logits has a frame that is all -inf or holds +inf (it normalises to NaN)")
                # rows without a positive value sum to at most 0: only matrices with one may hold
                # probabilities (their rows sum to 1 on average); those are normalised again below
                maybe = (row_max.reshape(u1 - u0, T) > 0).any(axis=1).nonzero()[0] + u0
                for r0 in range(0, len(block), _BLOCK_ROWS):  # more than one part only for a long utterance
                    r1 = r0 + _BLOCK_ROWS
                    _clipped_log_softmax_(block[r0:r1], row_max[r0:r1], tmp)
                for i in maybe.tolist():
                    if _holds_probabilities(arrs[i]):
                        n = len(arrs[i])
                        batch[i, :n] = np.log(np.clip(arrs[i], MIN_TOKEN_CLIP_P, 1.0))
                        batch[i, n:] = 0.0
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
        word_frames: bool = True,
    ) -> list[list[CTCHypothesis]]:
        if not logits_list:
            return []
        _check_params(beam_width, beam_prune_logp, token_min_logp)
        out_k = beam_width if num_hypotheses is None else min(beam_width, num_hypotheses)
        batch, lens = self._normalize_batch(logits_list)
        try:
            return _search_checked(
                batch,
                lens,
                self.vocab,
                beam_width,
                beam_prune_logp,
                token_min_logp,
                self.language_model,
                list(hotwords) if hotwords is not None else None,
                hotword_weight,
                prune_history,
                True,
                self.pyctcdecode_compat,
                out_k,
                word_frames,
            )
        finally:
            _release_batch(batch)

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
        hyps = self._search(
            [logits], beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight, 1, False
        )[0]
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
            list(logits_list), beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight, 1, False
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
