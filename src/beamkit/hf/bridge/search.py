"""Dispatch of :func:`beamkit.hf.generate` to beamkit's engine or one of its variants."""

from __future__ import annotations

from typing import Any

from beamkit.hf.bridge.settings import Settings
from beamkit.hf.errors import Unsupported
from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.samplers import HuggingFaceSample
from beamkit.scoring import LengthPenalty
from beamkit.search import BeamSearch, make_options


def search_options(settings: Settings, processors: list[Any], request_seeds: list[Any] | None = None) -> dict[str, Any]:
    """The :class:`beamkit.SearchOptions` keywords (besides beam size and length) for ``settings``: Hugging
    Face's beam search is the ``"pool"`` policy; its greedy search processes raw logits, its beam search
    log-probabilities; the caller's own ``processors`` run after the mapped ones. ``do_sample`` adds the
    :class:`beamkit.samplers.HuggingFaceSample` selector with one noise stream per request (``request_seeds``)."""
    extra = dict(settings.search_options)
    if settings.do_sample:
        if "selector" in extra:
            raise ValueError("do_sample=True sets its own selector")
        extra["selector"] = HuggingFaceSample(max_len=settings.max_new_tokens, request_seeds=request_seeds)
    return {
        "length_penalty": LengthPenalty.power(settings.length_penalty),
        "policy": "pool",
        "early_stopping": True if settings.num_beams == 1 else settings.early_stopping,
        "min_len": min(settings.min_new_tokens, settings.max_new_tokens),  # more than max: eos never comes (HF)
        "process_logits": settings.num_beams == 1,
        **extra,
        "processors": [*processors, *extra.get("processors", ())],
    }


def run_search(
    step: Any,
    state: Any,
    settings: Settings,
    batch: int,
    processors: list[Any],
    request_seeds: list[Any] | None = None,
) -> tuple[list[list[Hypothesis]], list[Any] | None]:
    """Hypotheses per request (best first, at most ``num_return`` each): diverse beam search with beam groups,
    constrained beam search with forced words, else plain beam search; and the plain search's traces when it
    records them (``record_trace=True``), else None. A failing request raises :class:`beamkit.BatchDecodeError`
    (the others' hypotheses kept on it)."""
    s = settings
    common = search_options(s, processors, request_seeds)
    if s.do_sample and (s.groups > 1 or s.force_words):
        raise Unsupported("do_sample=True with num_beam_groups or force_words_ids")
    stop = s.eos
    start = [s.start] * batch  # one per request: the state (a Prompt) has no array leaf to count rows by
    if s.groups > 1:
        from beamkit.variants import diverse_beam_search

        hyps = diverse_beam_search(
            step, state, start, stop, s.num_beams, s.max_new_tokens, s.groups, s.diversity, num_return=s.num_return,
            **common,
        )  # fmt: skip
        return hyps, None
    if s.force_words:
        from beamkit.variants import constrained_beam_search

        found = constrained_beam_search(
            step, state, start, stop, s.num_beams, s.max_new_tokens, constraints=list(s.force_words), **common
        )
        return [h[: s.num_return] for h in found], None
    options = make_options(s.num_beams, s.max_new_tokens, num_return=s.num_return, **common)
    result = BeamSearch(options).search(step, state, s.start, stop, batch)
    BatchDecodeError.raise_if(result.errors, result.hypotheses)
    return result.hypotheses, result.trace
