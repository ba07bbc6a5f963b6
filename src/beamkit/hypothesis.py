"""What a search returns: hypotheses, per-request results and counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Hypothesis:
    """One output sequence.

    ``tokens`` are the generated tokens after bos (eos included when ``finished``); ``logprob`` is the sum of
    the step scores along the path (log-probabilities, after any logit processor); ``score`` is what results
    are ranked by (``logprob / lp(len(tokens))`` plus any coverage term, or a final scorer's value).
    ``token_logprobs[i]`` is the step score of ``tokens[i]``; ``beam_indices[i]`` is the beam slot (rank within
    its request at step ``i - 1``) of the hypothesis that ``tokens[i]`` extended, ``0`` at the first step: a
    caller can rebuild the search path from them. ``key`` is what the selector ranked it by (the running
    log-probability for the deterministic selector, a perturbed one for stochastic beam search). ``state`` is
    its final state row when the search keeps it (``SearchOptions.keep_state``), else None.
    """

    tokens: list[int]
    logprob: float
    score: float
    finished: bool
    token_logprobs: list[float] = field(default_factory=list)
    beam_indices: list[int] = field(default_factory=list)
    key: float = float("nan")
    state: Any = field(default=None, compare=False, repr=False)


@dataclass
class SearchStats:
    """Counters of one search (or one :class:`beamkit.Engine`'s life): model calls, the rows sent in each call,
    the requests that joined before and left after each call, candidates dropped by ``beam_threshold``."""

    model_calls: int = 0
    rows_per_call: list[int] = field(default_factory=list)
    joined_per_call: list[int] = field(default_factory=list)
    left_per_call: list[int] = field(default_factory=list)
    pruned: int = 0

    @property
    def rows_total(self) -> int:
        """Total rows the model evaluated."""
        return sum(self.rows_per_call)


class BatchDecodeError(ValueError):
    """Some requests of a batch failed; the others' results are kept.

    ``errors`` maps a request index to the message of what went wrong with it; ``results`` holds every
    request's hypotheses (an empty list for a failed request).
    """

    def __init__(self, errors: dict[int, str], results: list[list[Hypothesis]]):
        self.errors = errors
        self.results = results
        detail = "; ".join(f"request {r}: {msg}" for r, msg in sorted(errors.items()))
        super().__init__(detail)

    @classmethod
    def raise_if(cls, errors: dict[int, str], results: list[Any]) -> None:
        """Raise this error for ``errors`` (with every request's ``results``) when there is any."""
        if errors:
            raise cls(errors, results)
