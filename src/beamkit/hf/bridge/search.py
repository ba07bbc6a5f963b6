"""Dispatch of :func:`beamkit.hf.generate` to beamkit's engine or one of its variants, with a call's settings as
the engine's typed options: :func:`request_options` (per request) and :func:`shared_options` (search-wide)."""

from __future__ import annotations

from typing import Any

from beamkit.hf.bridge.settings import Settings
from beamkit.hf.errors import Unsupported
from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.samplers import HuggingFaceSample
from beamkit.scoring import LengthPenalty
from beamkit.search import BeamSearch
from beamkit.search.options import PER_REQUEST, RequestOptions, SharedOptions

REQUEST_FIELDS = frozenset(PER_REQUEST)  # the options each request sets for itself
WIDTH_AND_LENGTH = ("beam_size", "max_len", "num_return")


def request_options(settings: Settings) -> RequestOptions:
    """The per-request :class:`beamkit.RequestOptions` of ``settings``: its beams, lengths and returned
    hypotheses, Hugging Face's length penalty (``logprob / len ** alpha``), greedy search stopping at its first
    finished hypothesis, and the caller's own per-request :class:`beamkit.SearchOptions` keywords over them."""
    s = settings
    mapped = {
        "beam_size": s.num_beams,
        "max_len": s.max_new_tokens,
        "num_return": s.num_return,
        "length_penalty": LengthPenalty.power(s.length_penalty),
        "early_stopping": True if s.num_beams == 1 else s.early_stopping,
        "min_len": min(s.min_new_tokens, s.max_new_tokens),  # more than max: eos never comes (HF)
    }
    extra = {name: value for name, value in s.search_options if name in REQUEST_FIELDS}
    return RequestOptions(**{**mapped, **extra})


def shared_options(settings: Settings, processors: list[Any], request_seeds: list[Any] | None = None) -> SharedOptions:
    """The search-wide :class:`~beamkit.search.options.SharedOptions` of ``settings``: Hugging Face's beam search
    is the ``"pool"`` policy; its greedy search processes raw logits, its beam search log-probabilities; the
    caller's own search-wide :class:`beamkit.SearchOptions` keywords over them, its ``processors`` after the
    mapped ones. ``do_sample`` adds the :class:`beamkit.samplers.HuggingFaceSample` selector with one noise stream
    per request (``request_seeds``)."""
    extra = {name: value for name, value in settings.search_options if name not in REQUEST_FIELDS}
    if settings.do_sample:
        if "selector" in extra:
            raise ValueError("do_sample=True sets its own selector")
        extra["selector"] = HuggingFaceSample(max_len=settings.max_new_tokens, request_seeds=request_seeds)
    mapped = {"policy": "pool", "process_logits": settings.num_beams == 1}
    return SharedOptions(**{**mapped, **extra, "processors": (*processors, *(extra.get("processors") or ()))})


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
    request, shared = request_options(s), shared_options(s, processors, request_seeds)
    # the variants take the search's width, length and returned hypotheses as arguments of their own
    common = {k: v for k, v in request.given().items() if k not in WIDTH_AND_LENGTH} | shared.given()
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
    result = BeamSearch(request.search_options(**shared.given())).search(step, state, s.start, stop, batch)
    BatchDecodeError.raise_if(result.errors, result.hypotheses)
    return result.hypotheses, result.trace
