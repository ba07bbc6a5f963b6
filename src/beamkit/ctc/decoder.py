"""A pyctcdecode-shaped front end: ``build_ctcdecoder(labels, kenlm_model_path, ...)`` and ``.decode(...)``.

The decoder follows pyctcdecode's behaviour (beam unit, pruning knobs, LM fusion rules, ``decode`` pruning
beams by shared history) on top of beamkit's compiled prefix beam search (:mod:`beamkit.ctc.search`), so code
written for pyctcdecode can switch by changing the import. Three things differ by default, each for
correctness: the blank must be named or spelled as one (never guessed), probabilities are detected with a
tolerance that fits the dtype, and the end of an utterance is scored correctly (``pyctcdecode_compat=True``
restores pyctcdecode's quirk). ``decode_batch`` decodes the utterances one after another in one call, sharing
the LM cache and storage (the ``pool`` argument is accepted and ignored).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from ..hypothesis import BatchDecodeError
from .lm import ArpaLM, KenLMModel, LanguageModelFusion, load_language_model, load_unigrams_from_arpa
from .options import SearchOptions
from .posteriors import INPUT_KINDS, Candidates, collect_candidates, normalize_posteriors, utterance_parts
from .prefix_search import _word_tuple
from .search import CTCHypothesis, Recorder, search_candidates, spread
from .vocab import Vocabulary

WordFrames = tuple[str, tuple[int, int]]
OutputBeam = tuple[str, Any, list[WordFrames], float, float]
OutputBeamMPSafe = tuple[str, list[WordFrames], float, float]


def normalize_logits(logits: Any, input_kind: str = "auto") -> np.ndarray:
    """One ``(T, V)`` matrix as float64 log-probabilities (see :mod:`beamkit.ctc.posteriors`: probabilities
    are detected with a tolerance that fits the dtype, logits get a log-softmax; ``input_kind`` says which
    they are instead of detecting)."""
    return normalize_posteriors(logits, input_kind)


class CTCBatchDecodeError(BatchDecodeError):
    """Some utterances of a batch could not be decoded; the others' results are kept.

    ``errors`` maps an utterance index to the message of what went wrong with it; ``results`` is what the
    batch call returns, with an empty result (``""`` or ``[]``) for each failed utterance."""

    def __init__(self, errors: dict[int, str], results: list[Any]) -> None:
        """Hold ``errors`` and ``results``; the message names every failed utterance."""
        self.errors = errors
        self.results = results
        ValueError.__init__(self, "; ".join(f"utterance {i}: {msg}" for i, msg in sorted(errors.items())))


class CTCDecoder:
    """CTC beam search decoder with optional word n-gram fusion (see :func:`build_ctcdecoder`)."""

    def __init__(
        self,
        vocab: Vocabulary,
        language_model: LanguageModelFusion | None = None,
        pyctcdecode_compat: bool = False,
        input_kind: str = "auto",
    ) -> None:
        """Decode over ``vocab`` with an optional fused ``language_model``; ``pyctcdecode_compat`` keeps
        pyctcdecode's end-of-utterance quirks, ``input_kind`` says what the matrices hold (see
        :func:`build_ctcdecoder`)."""
        if input_kind not in INPUT_KINDS:
            raise ValueError(f"input_kind must be one of {', '.join(INPUT_KINDS)}; got {input_kind!r}")
        self.vocab = vocab
        self.language_model = language_model
        self.pyctcdecode_compat = bool(pyctcdecode_compat)
        self.input_kind = input_kind

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

    def _check_width(self, shape: tuple[int, ...]) -> None:
        if shape[-1] != self.vocab.size:
            raise ValueError(
                f"logits have shape {shape} but the vocabulary has {self.vocab.size} labels; need (time, vocabulary)"
            )

    def _candidates(self, logits_list: Sequence[Any], token_min_logp: float) -> Candidates:
        """The candidates (:class:`~beamkit.ctc.posteriors.Candidates`) of every matrix, normalised as
        :func:`normalize_logits` does, in blocks of a few hundred thousand values (:func:`utterance_parts`)."""
        shapes = []
        for x in logits_list:
            shape = np.shape(x) if not hasattr(x, "shape") else tuple(x.shape)
            if len(shape) != 2:
                raise ValueError(f"logits must be 2-D (time, vocabulary), got shape {shape}")
            self._check_width(shape)
            shapes.append(shape)
        lens = np.array([sh[0] for sh in shapes], dtype=np.int64)
        return collect_candidates(utterance_parts(logits_list, self.input_kind, token_min_logp, self.vocab.blank), lens)

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
        recorder: Recorder | None = None,
        threads: int | None = None,
    ) -> tuple[list[list[CTCHypothesis]], dict[int, Exception]]:
        """The hypotheses of each matrix (none for a matrix that cannot be decoded) and, by index, what is
        wrong with each such matrix."""
        opts = SearchOptions(
            beam_width=beam_width,
            beam_prune_logp=beam_prune_logp,
            token_min_logp=token_min_logp,
            prune_history=prune_history,
            split_blank=True,  # pyctcdecode's beam unit
            pyctcdecode_compat=self.pyctcdecode_compat,
            hotwords=None if hotwords is None else _word_tuple(hotwords),
            hotword_weight=hotword_weight,
            num_hypotheses=num_hypotheses,
            word_frames=word_frames,
        )
        if not logits_list:
            return [], {}
        errors: dict[int, Exception] = {}

        # each thread normalises and searches every n-th matrix (numpy and the compiled loop release the GIL)
        def run(part: range) -> list[list[CTCHypothesis]]:
            idx = list(part)
            try:
                cands = self._candidates([logits_list[j] for j in idx], token_min_logp)
            except (ValueError, TypeError):  # find the bad matrices; the others are decoded
                for j in idx:
                    try:
                        self._candidates([logits_list[j]], token_min_logp)
                    except (ValueError, TypeError) as exc:
                        errors[j] = exc
                idx = [j for j in idx if j not in errors]
                if not idx:
                    return [[] for _ in part]
                cands = self._candidates([logits_list[j] for j in idx], token_min_logp)
            hyps = search_candidates(cands, self.vocab, self.language_model, opts, recorder, 1)
            found = dict(zip(idx, hyps, strict=True))
            return [found.get(j, []) for j in part]

        return spread(len(logits_list), 1 if recorder is not None else threads, run), errors

    def _search_one(self, logits: Any, *args: Any, **kwargs: Any) -> list[CTCHypothesis]:
        """:meth:`_search` of one matrix; what is wrong with it is raised."""
        results, errors = self._search([logits], *args, **kwargs)
        if errors:
            raise errors[0]
        return results[0]

    def decode_beams(
        self,
        logits: Any,
        beam_width: int = 100,
        beam_prune_logp: float = -10.0,
        token_min_logp: float = -5.0,
        prune_history: bool = False,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = 10.0,
        record_trace: bool = False,
    ) -> Any:
        """Decode one ``(T, V)`` matrix; return beams ``(text, lm_state, word_frames, logit_score,
        combined_score)``, best first, as pyctcdecode does. ``record_trace=True`` returns ``(beams, trace)``
        (:class:`beamkit.ctc.trace.CTCTrace`: the search as it ran, frame by frame)."""
        recorder = None
        if record_trace:
            from .trace import CTCTraceRecorder

            recorder = CTCTraceRecorder(self.vocab.labels, self.vocab.blank)
        hyps = self._search_one(
            logits,
            beam_width,
            beam_prune_logp,
            token_min_logp,
            prune_history,
            hotwords,
            hotword_weight,
            recorder=recorder,
        )
        beams = [(h.text, h.lm_state, h.word_frames, h.logit_score, h.score) for h in hyps]
        return (beams, recorder.traces()[0]) if recorder is not None else beams

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
        hyps = self._search_one(
            logits, beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight, 1, False
        )
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
        threads: int | None = None,
    ) -> list[str]:
        """Decode several utterances (possibly of different lengths) in one call, spread over ``threads``
        threads (default: one per available core, at least 8 utterances each; the results do not depend on it).

        ``pool`` exists for pyctcdecode compatibility and is ignored."""
        del pool
        results, errors = self._search(
            list(logits_list), beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight, 1, False,
            threads=threads,
        )  # fmt: skip
        texts = [hyps[0].text if hyps else "" for hyps in results]
        return _checked(texts, errors)

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
        threads: int | None = None,
    ) -> list[list[OutputBeamMPSafe]]:
        """Beams ``(text, word_frames, logit_score, combined_score)`` for each utterance; ``pool`` is ignored,
        ``threads`` as in :meth:`decode_batch`."""
        del pool
        results, errors = self._search(
            list(logits_list), beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight,
            threads=threads,
        )  # fmt: skip
        beams = [[(h.text, h.word_frames, h.logit_score, h.score) for h in hyps] for hyps in results]
        return _checked(beams, errors)


def _checked(results: list[Any], errors: dict[int, Exception]) -> list[Any]:
    """``results`` when no utterance failed, else :class:`CTCBatchDecodeError` carrying them."""
    CTCBatchDecodeError.raise_if({i: str(exc) for i, exc in errors.items()}, results)
    return results


def build_ctcdecoder(
    labels: Sequence[str],
    kenlm_model_path: str | os.PathLike[str] | ArpaLM | KenLMModel | None = None,
    unigrams: Collection[str] | None = None,
    alpha: float = 0.5,
    beta: float = 1.5,
    unk_score_offset: float = -10.0,
    lm_score_boundary: bool = True,
    lm_backend: str = "auto",
    pyctcdecode_compat: bool = False,
    *,
    blank: int | str | None = None,
    input_kind: str = "auto",
) -> CTCDecoder:
    """Build a decoder like ``pyctcdecode.build_ctcdecoder``.

    ``labels``: one label per output column (``" "`` or ``"|"`` is the word delimiter; ``▁`` pieces make a
    BPE vocabulary). ``blank``: the CTC blank's column index or label; when None, the one label spelled
    ``""``, ``<pad>`` or ``<blank>`` (none or several: a ValueError, never a guess). ``kenlm_model_path``:
    an ARPA (read in pure Python, or by ``kenlm`` when installed, see ``lm_backend``) or KenLM binary file,
    or an already-loaded model. ``unigrams``: known words for the partial-word check (read from the ARPA
    file when omitted: every 1-gram, also those written without a back-off weight, which pyctcdecode's
    own loader skips). ``input_kind``: ``"auto"`` (detect probabilities, see
    :mod:`beamkit.ctc.posteriors`), ``"logits"``, ``"log_probs"`` or ``"probs"``.

    ``pyctcdecode_compat`` (default False: the correct end-of-utterance score; ``beamkit ctc decode`` has the
    same default, ``--pyctcdecode-compat`` turns it on) keeps a pyctcdecode quirk for exact reproduction: at
    the end of an utterance, hypotheses with the same text are merged and scored through their
    *lowest*-ranked member; when that member ends in a word delimiter, the LM scores an empty word (an
    unknown word, about ``alpha * (unk_score_offset + log10 p(<unk>)) * ln 10``), which can drop the right
    transcript when a faint trailing-delimiter alignment sits in the beam (a margin space after an OCR line).
    """
    vocab = Vocabulary.from_labels(labels, blank=blank)
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
    return CTCDecoder(vocab, language_model, pyctcdecode_compat=pyctcdecode_compat, input_kind=input_kind)
