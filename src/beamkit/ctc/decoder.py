"""beamkit's CTC decoder: ``Decoder(vocab, lm, CTCOptions(...)).decode(batch)`` returns named hypotheses.

A :class:`Decoder` holds a vocabulary (:class:`~beamkit.ctc.vocab.Vocabulary`, or labels), an optional word
n-gram fusion (:class:`~beamkit.ctc.lm.LanguageModelFusion`, or a model of :mod:`beamkit.lm` fused with the
default weights) and the search knobs (:class:`~beamkit.ctc.options.CTCOptions`). Every method takes a batch
(a list of ``(T_i, V)`` matrices, an ``(N, T, V)`` array, or one ``(T, V)`` matrix as a batch of one) and
returns one result per utterance; utterances that cannot be decoded raise
:class:`~beamkit.ctc.errors.CTCBatchDecodeError` after the others are decoded, carrying their results. The
pyctcdecode drop-in (tuples, ``pool``, ``decode_beams``) is :mod:`beamkit.ctc.compat`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from beamkit._checks import check_choice

from .errors import CTCBatchDecodeError
from .greedy import greedy_ctc
from .lm import LanguageModelFusion, fusion_of
from .options import CTCOptions
from .posteriors import INPUT_KINDS, FrameCandidates, collect_candidates, normalize_posteriors, utterance_parts
from .prefix.run import SearchCaches, search_candidates, spread, thread_count
from .search import CTCHypothesis, CTCRecorder
from .vocab import Vocabulary

if TYPE_CHECKING:
    from .trace import CTCTrace

_R = TypeVar("_R")


def normalize_logits(logits: Any, input_kind: str = "auto") -> np.ndarray:
    """One ``(T, V)`` matrix as float64 log-probabilities (see :mod:`beamkit.ctc.posteriors`: probabilities
    are detected with a tolerance that fits the dtype, logits get a log-softmax; ``input_kind`` says which
    they are instead of detecting)."""
    return normalize_posteriors(logits, input_kind)


def as_batch(logits: Any) -> list[Any]:
    """The utterances of ``logits``: a list (or tuple) of ``(T_i, V)`` matrices, an ``(N, T, V)`` array, or one
    ``(T, V)`` matrix (a batch of one). Other shapes: ValueError; None, a string or anything else that is not an
    array or a list: TypeError."""
    if isinstance(logits, (list, tuple)):
        return list(logits)
    if not hasattr(logits, "shape"):
        raise TypeError(
            "logits must be one (T, V) matrix, an (N, T, V) batch or a list of (T, V) matrices, got "
            f"{type(logits).__name__}"
        )
    shape = tuple(logits.shape)
    if len(shape) == 2:
        return [logits]
    if len(shape) == 3:
        return list(logits)
    raise ValueError(
        f"logits must be one (T, V) matrix, an (N, T, V) batch or a list of (T, V) matrices, got shape {shape}"
    )


class Decoder:
    """CTC prefix beam search over ``vocab`` with an optional word n-gram ``lm`` and the knobs ``options``.

    ``vocab``: a :class:`~beamkit.ctc.vocab.Vocabulary`, or one label per logit column (``" "`` or ``"|"``
    is the word delimiter, ``▁`` pieces make a BPE vocabulary) with ``blank`` naming the CTC blank (its index
    or label; None: the one label spelled ``""``, ``<pad>`` or ``<blank>``, never a guess). ``lm``: None, a
    :class:`~beamkit.ctc.lm.LanguageModelFusion` (see :func:`~beamkit.ctc.lm.fusion_of` for the weights), or
    a model of :mod:`beamkit.lm` (an :class:`~beamkit.lm.ArpaLM`, :class:`~beamkit.lm.KenLMModel`), fused
    with the default weights. ``input_kind``: ``"auto"`` (detect probabilities), ``"logits"``,
    ``"log_probs"`` or ``"probs"``."""

    def __init__(
        self,
        vocab: Vocabulary | Sequence[str],
        lm: Any = None,
        options: CTCOptions | None = None,
        *,
        blank: int | str | None = None,
        input_kind: str = "auto",
    ) -> None:
        """Check and hold the vocabulary, the fusion and the options (see the class docstring)."""
        if isinstance(vocab, Vocabulary):
            if blank is not None:
                raise ValueError("blank is part of the Vocabulary given: pass labels to name the blank")
            self.vocab = vocab
        elif isinstance(vocab, str) or not isinstance(vocab, Sequence):
            raise TypeError(f"vocab must be a Vocabulary or a list of labels, got {type(vocab).__name__}")
        else:
            self.vocab = Vocabulary.from_labels(vocab, blank=blank)
        if lm is None or isinstance(lm, LanguageModelFusion):
            self.lm: LanguageModelFusion | None = lm
        elif isinstance(lm, (str, os.PathLike)) or not all(hasattr(lm, m) for m in ("score", "eos_score", "order")):
            raise TypeError(
                "lm must be None, a LanguageModelFusion (beamkit.ctc.fusion_of) or an n-gram model of beamkit.lm, "
                f"got {type(lm).__name__}"
            )
        else:
            self.lm = fusion_of(lm)
        options = CTCOptions() if options is None else options
        if not isinstance(options, CTCOptions):
            raise TypeError(f"options must be a CTCOptions, got {type(options).__name__}")
        self.options = options
        self.input_kind = check_choice("input_kind", input_kind, INPUT_KINDS)
        self._caches = SearchCaches(self.vocab)  # this decoder's alone: no two decoders share search state

    def with_lm(self, lm: Any) -> Decoder:
        """This decoder over another ``lm`` (None, a fusion or a model, as the constructor takes it): the same
        vocabulary, options and input kind, starting with this decoder's label tables (read-only once built);
        its scored LM words and search storage are its own."""
        other = Decoder(self.vocab, lm, self.options, input_kind=self.input_kind)
        other._caches = self._caches.sharing_labels()
        return other

    def release_cached_memory(self) -> int:
        """Free the search storage this decoder keeps for its next call (the scored LM words stay); returns the
        bytes released."""
        return self._caches.release()

    def decode(
        self, logits: Any, options: CTCOptions | None = None, *, threads: int | None = None
    ) -> list[list[CTCHypothesis]]:
        """The hypotheses of each utterance, best first (``options`` replaces the decoder's for this call).

        The utterances are spread over ``threads`` threads (default: one per available core, at least 8
        utterances each; the results do not depend on it)."""
        mats, opts = as_batch(logits), self._options(options)
        if len(mats) == 1:  # one utterance: no threads to deal it to (what search does, without the dealing)
            thread_count(threads, 1)  # the same check of ``threads``
            try:
                cands = self._candidates(mats, opts.token_min_logp)
            except (ValueError, TypeError) as exc:
                return checked([[]], {0: exc})
            return self.search_candidates(cands, opts, threads=1)
        results, errors = self.search(mats, opts, threads=threads)
        return checked(results, errors)

    def trace(self, logits: Any, options: CTCOptions | None = None) -> list[CTCTrace]:
        """The recorded search of each utterance (:class:`~beamkit.ctc.trace.CTCTrace`: every frame's
        candidates and beams, kept and pruned, and the hypotheses; what ``beamkit ctc explain`` draws)."""
        _, traces, errors = self.traced_search(as_batch(logits), self._options(options))
        return checked(traces, errors)

    def traced_search(
        self, mats: Sequence[Any], options: CTCOptions
    ) -> tuple[list[list[CTCHypothesis]], list[Any], dict[int, Exception]]:
        """:meth:`search` recording every frame: the hypotheses, the trace of each matrix (None for one
        that cannot be decoded) and what is wrong with each such matrix."""
        from .trace import CTCTraceRecorder

        recorder = CTCTraceRecorder(self.vocab.labels, self.vocab.blank)
        results, errors = self.search(mats, options, recorder=recorder)
        traced = iter(recorder.traces())
        return results, [None if i in errors else next(traced) for i in range(len(mats))], errors

    def greedy(self, logits: Any) -> list[str]:
        """The best-path text of each utterance (argmax per frame, repeats collapsed, blanks dropped)."""
        mats = as_batch(logits)
        errors: dict[int, Exception] = {}
        texts = [_caught(i, errors, functools.partial(self._greedy_one, m), "") for i, m in enumerate(mats)]
        return checked(texts, errors)

    def _greedy_one(self, logits: Any) -> str:
        return str(greedy_ctc(self.normalize(logits), self.vocab))

    def normalize(self, logits: Any) -> np.ndarray:
        """One ``(T, V)`` matrix checked against the vocabulary and normalised to log-probabilities."""
        self._check_shape(_shape(logits))
        return normalize_logits(logits, self.input_kind)

    def search(
        self,
        mats: Sequence[Any],
        options: CTCOptions,
        recorder: CTCRecorder | None = None,
        threads: int | None = None,
    ) -> tuple[list[list[CTCHypothesis]], dict[int, Exception]]:
        """The hypotheses of each matrix (none for a matrix that cannot be decoded) and, by index, what is
        wrong with each such matrix (the building block of :meth:`decode` and of the compatibility layer)."""
        if not mats:
            return [], {}
        errors: dict[int, Exception] = {}

        # each thread normalises and searches every n-th matrix (numpy and the compiled loop release the GIL)
        def run(part: range) -> list[list[CTCHypothesis]]:
            idx = list(part)
            try:
                cands = self._candidates([mats[j] for j in idx], options.token_min_logp)
            except (ValueError, TypeError):  # find the bad matrices; the others are decoded
                for j in idx:
                    _caught(j, errors, functools.partial(self._candidates, [mats[j]], options.token_min_logp), None)
                idx = [j for j in idx if j not in errors]
                if not idx:
                    return [[] for _ in part]
                cands = self._candidates([mats[j] for j in idx], options.token_min_logp)
            hyps = self.search_candidates(cands, options, recorder, threads=1)
            found = dict(zip(idx, hyps, strict=True))
            return [found.get(j, []) for j in part]

        return spread(len(mats), 1 if recorder is not None else threads, run), errors

    def search_candidates(
        self,
        cands: FrameCandidates,
        options: CTCOptions | None = None,
        recorder: CTCRecorder | None = None,
        threads: int | None = None,
    ) -> list[list[CTCHypothesis]]:
        """The hypotheses of each utterance of ``cands`` (each frame's candidate labels and log-probabilities,
        taken as given: :func:`~beamkit.ctc.posteriors.collect_candidates`), searched with this decoder's
        vocabulary, LM and caches; what :meth:`search` runs once the matrices are normalised."""
        return search_candidates(cands, self._caches, self.lm, self._options(options), recorder, threads)

    def _options(self, options: CTCOptions | None) -> CTCOptions:
        if options is None:
            return self.options
        if not isinstance(options, CTCOptions):
            raise TypeError(f"options must be a CTCOptions, got {type(options).__name__}")
        return options

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        if len(shape) != 2:
            hint = " (a list is a batch: give one matrix as an array, or as [rows])" if len(shape) == 1 else ""
            raise ValueError(f"logits must be 2-D (time, vocabulary), got shape {shape}{hint}")
        if shape[-1] != self.vocab.size:
            raise ValueError(
                f"logits have shape {shape} but the vocabulary has {self.vocab.size} labels; need (time, vocabulary)"
            )

    def _candidates(self, mats: Sequence[Any], token_min_logp: float) -> FrameCandidates:
        """The candidates of every matrix, normalised as :func:`normalize_logits` does, in blocks of a few
        hundred thousand values (:func:`~beamkit.ctc.posteriors.utterance_parts`)."""
        shapes = [_shape(x) for x in mats]
        for shape in shapes:
            self._check_shape(shape)
        lens = np.array([sh[0] for sh in shapes], dtype=np.int64)
        return collect_candidates(utterance_parts(mats, self.input_kind, token_min_logp, self.vocab.blank), lens)


def _shape(x: Any) -> tuple[int, ...]:
    """The shape of one utterance's matrix: an array, or a list of rows (None, a string, another object:
    TypeError; rows of different lengths: ValueError)."""
    if hasattr(x, "shape"):
        return tuple(x.shape)
    if not isinstance(x, (list, tuple)):
        raise TypeError(
            f"logits: an utterance must be a (T, V) matrix (an array or a list of rows), got {type(x).__name__}"
        )
    try:
        return np.shape(x)
    except ValueError:  # numpy: "inhomogeneous shape"
        raise ValueError(
            "logits: an utterance is a nested list whose rows differ in length, not a (T, V) matrix"
        ) from None


def _caught(index: int, errors: dict[int, Exception], fn: Callable[[], _R], failed: Any) -> _R:
    """``fn()``; a ValueError / TypeError is kept in ``errors[index]`` and ``failed`` returned instead."""
    try:
        return fn()
    except (ValueError, TypeError) as exc:
        errors[index] = exc
        return failed


def checked(results: list[Any], errors: dict[int, Exception]) -> list[Any]:
    """``results`` when no utterance failed, else :class:`CTCBatchDecodeError` carrying them."""
    CTCBatchDecodeError.raise_if({i: str(exc) for i, exc in errors.items()}, results)
    return results
