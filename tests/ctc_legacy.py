"""A test-side front end over :class:`beamkit.ctc.Decoder`: pyctcdecode's method family (tuples, ``pool``,
``decode_beams``, ``reset_params``) with beamkit's defaults (the correct end-of-utterance score, a named blank,
``input_kind``). The CTC tests were written against this shape (beamkit's first CTC front end, no longer part
of the package); it keeps their assertions while every call runs the package's ``Decoder``."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from beamkit.ctc.compat.decoder import OutputBeamMPSafe, beams_of, call_options, mp_safe_beams_of, raise_single
from beamkit.ctc.decoder import Decoder, checked
from beamkit.ctc.lm import LanguageModelFusion, fusion_of
from beamkit.ctc.options import CTCOptions
from beamkit.ctc.vocab import Vocabulary


class CTCDecoder:
    """pyctcdecode's method family (tuples, ``pool``, ``decode_beams``) over a :class:`~beamkit.ctc.Decoder`
    (``self.decoder``), with beamkit's defaults (see :func:`build_legacy_decoder`)."""

    def __init__(
        self,
        vocab: Vocabulary,
        language_model: LanguageModelFusion | None = None,
        pyctcdecode_compat: bool = False,
        input_kind: str = "auto",
    ) -> None:
        """Decode over ``vocab`` with an optional fused ``language_model``; ``pyctcdecode_compat`` keeps
        pyctcdecode's end-of-utterance quirks, ``input_kind`` says what the matrices hold."""
        self.decoder = Decoder(
            vocab, language_model, CTCOptions(pyctcdecode_compat=bool(pyctcdecode_compat)), input_kind=input_kind
        )

    @property
    def vocab(self) -> Vocabulary:
        """The labels, the blank and the word rule of the decoder."""
        return self.decoder.vocab

    @property
    def language_model(self) -> LanguageModelFusion | None:
        """The fused LM (None without one)."""
        return self.decoder.lm

    @property
    def pyctcdecode_compat(self) -> bool:
        """Whether pyctcdecode's end-of-utterance quirk is kept."""
        return self.decoder.options.pyctcdecode_compat

    @property
    def input_kind(self) -> str:
        """What the matrices hold: ``"auto"`` (detected), ``"logits"``, ``"log_probs"`` or ``"probs"``."""
        return self.decoder.input_kind

    def reset_params(
        self,
        alpha: float | None = None,
        beta: float | None = None,
        unk_score_offset: float | None = None,
        lm_score_boundary: bool | None = None,
    ) -> None:
        """Change LM fusion weights in place (no effect without an LM)."""
        lm = self.decoder.lm
        if lm is None:
            return
        for name, value in (("alpha", alpha), ("beta", beta), ("unk_score_offset", unk_score_offset)):
            if value is not None:
                setattr(lm, name, float(value))
        if lm_score_boundary is not None:
            lm.score_boundary = bool(lm_score_boundary)

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
        """Beams ``(text, lm_state, word_frames, logit_score, combined_score)`` of one matrix, best first;
        ``record_trace=True`` returns ``(beams, trace)``."""
        knobs = (beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight)
        opts = call_options(self.decoder.options, knobs)
        if record_trace:
            results, traces, errors = self.decoder.traced_search([logits], opts)
            raise_single(errors)
            return beams_of(results[0]), traces[0]
        results, errors = self.decoder.search([logits], opts)
        raise_single(errors)
        return beams_of(results[0])

    def decode(
        self,
        logits: Any,
        beam_width: int = 100,
        beam_prune_logp: float = -10.0,
        token_min_logp: float = -5.0,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = 10.0,
    ) -> str:
        """The best text of one matrix (history pruning on, as in pyctcdecode)."""
        return self.decode_batch(
            None, [logits], beam_width, beam_prune_logp, token_min_logp, hotwords, hotword_weight, single=True
        )[0]

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
        *,
        single: bool = False,
    ) -> list[str]:
        """The best text of each matrix; ``pool`` is ignored."""
        del pool
        knobs = (beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight)
        opts = call_options(self.decoder.options, knobs, best_only=True)
        results, errors = self.decoder.search(list(logits_list), opts, threads=threads)
        if single:
            raise_single(errors)
        texts = [hyps[0].text if hyps else "" for hyps in results]
        return checked(texts, errors)

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
        """Beams ``(text, word_frames, logit_score, combined_score)`` of each matrix; ``pool`` is ignored."""
        del pool
        knobs = (beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight)
        opts = call_options(self.decoder.options, knobs)
        results, errors = self.decoder.search(list(logits_list), opts, threads=threads)
        return checked([mp_safe_beams_of(hyps) for hyps in results], errors)


def build_legacy_decoder(
    labels: Sequence[str],
    kenlm_model_path: Any = None,
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
    """A :class:`CTCDecoder` of labels, an LM path or model, the
    fusion weights, ``pyctcdecode_compat``, ``blank`` and ``input_kind``, as :class:`~beamkit.ctc.Decoder`
    and :func:`~beamkit.ctc.lm.fusion_of` take them."""
    vocab = Vocabulary.from_labels(labels, blank=blank)
    fusion = None
    if kenlm_model_path is not None:
        if not isinstance(kenlm_model_path, (str, os.PathLike)) and not hasattr(kenlm_model_path, "score"):
            raise TypeError(
                f"kenlm_model_path must be a path or an n-gram model, got {type(kenlm_model_path).__name__}"
            )
        fusion = fusion_of(
            kenlm_model_path,
            unigrams,
            alpha=alpha,
            beta=beta,
            unk_score_offset=unk_score_offset,
            score_boundary=lm_score_boundary,
            backend=lm_backend,
        )
    return CTCDecoder(vocab, fusion, pyctcdecode_compat=pyctcdecode_compat, input_kind=input_kind)
