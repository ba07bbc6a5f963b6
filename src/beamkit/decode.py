"""The entry points of the exact beam-search contract: one request, narrow beam, greedy as a beam of one.

Thin wrappers over the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from beamkit.hypothesis import Hypothesis
from beamkit.scoring import LengthPenalty
from beamkit.search import BeamSearch, StepFn, make_options


def beam_search(
    step_fn: StepFn,
    init_state: Any,
    bos: int,
    eos: int | Sequence[int],
    beam_size: int,
    max_len: int,
    length_penalty: float | LengthPenalty = 1.0,
    **options: Any,
) -> list[Hypothesis]:
    """Beam search for one request; returns its hypotheses ranked by score, best first.

    ``step_fn(state, y_prev)`` gets the live rows' previous tokens (int64 ``[k]``; ``bos`` first, with the
    single initial state row) and returns ``(logits [k, V], new_state)``. Each step ranks all ``k * V``
    candidates together (ties to the lower beam, then the lower token id), keeps the first
    ``beam_size - finished`` finite ones, finishes eos candidates (the beam narrows) and gathers the state by
    parent. Stops when nothing is live or after ``max_len`` tokens (live ones are returned unfinished). Scores
    are ``logprob / len(tokens) ** length_penalty`` (eos counted). ``eos`` may be several ids (any of them
    finishes). Extra options are those of :class:`beamkit.SearchOptions` (policy, processors, ...).
    """
    result = BeamSearch(make_options(beam_size, max_len, length_penalty=length_penalty, **options)).search(
        step_fn, init_state, bos, eos, batch_size=1
    )
    if result.errors:
        raise ValueError(result.errors[0])
    return result.hypotheses[0]


def greedy_decode(
    step_fn: StepFn, init_state: Any, bos: int, eos: int | Sequence[int], max_len: int, **options: Any
) -> Hypothesis:
    """Greedy decoding: a beam of one of the same search, ties to the lowest id, score equal to its logprob."""
    return beam_search(step_fn, init_state, bos, eos, 1, max_len, length_penalty=0.0, **options)[0]
