"""Constraints (OLMo's ``Constraint`` protocol): rules that edit the step's log-probabilities, each with its own
per-hypothesis state.

A constraint's state is ``[batch][beam]`` of dicts. ``init_state(batch_size)`` makes one hypothesis per batch
element; ``apply(state, log_probabilities [batch, beam, V])`` returns the edited log-probabilities (a banned token
gets the dtype's most negative finite value, as OLMo does); ``update_state(state, last_prediction [batch, beam],
last_backpointer [batch, beam] | None)`` copies each new hypothesis's parent state and lets ``_update_state``
record the token. beamkit calls them one hypothesis at a time (a batch of hypotheses with one beam each), so a
constraint must treat the hypotheses of a batch element independently, as :class:`RepeatedNGramBlockingConstraint`
does.
"""

from __future__ import annotations

import copy
from typing import Any

from beamkit._checks import check_int

ConstraintStateType = list[list[dict[str, Any]]]


class Constraint:
    """The protocol; subclasses implement ``init_state``, ``apply`` and ``_update_state``."""

    def init_state(self, batch_size: int) -> ConstraintStateType:
        """The state before the first step: ``batch_size`` lists of one dict."""
        raise NotImplementedError

    def apply(self, state: ConstraintStateType, class_log_probabilities: Any) -> Any:
        """The step's log-probabilities ``[batch, beam, V]`` with this constraint applied."""
        raise NotImplementedError

    @staticmethod
    def _copy_state(
        state: ConstraintStateType, batch_size: int, beam_size: int, last_backpointer: Any = None
    ) -> ConstraintStateType:
        """Each new hypothesis's own deep copy of its parent's state (the first beam when no backpointer)."""
        out = []
        for i in range(batch_size):
            row = []
            for j in range(beam_size):
                parent = 0 if last_backpointer is None else int(last_backpointer[i, j])
                row.append(copy.deepcopy(state[i][parent]))
            out.append(row)
        return out

    def update_state(
        self, state: ConstraintStateType, last_prediction: Any, last_backpointer: Any = None
    ) -> ConstraintStateType:
        """The state after the step that predicted ``last_prediction`` ``[batch, beam]`` from the parents
        ``last_backpointer``."""
        batch_size, beam_size = last_prediction.size()
        new = self._copy_state(state, batch_size, beam_size, last_backpointer)
        return self._update_state(new, last_prediction)

    def _update_state(self, state: ConstraintStateType, last_prediction: Any) -> ConstraintStateType:
        """Record ``last_prediction`` in the copied ``state`` (subclasses implement it)."""
        raise NotImplementedError


class RepeatedNGramBlockingConstraint(Constraint):
    """No hypothesis repeats an n-gram: after the ``ngram_size - 1`` tokens of a seen n-gram's prefix, the tokens
    that completed it before are banned."""

    def __init__(self, ngram_size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ngram_size = check_int("ngram_size", ngram_size, 1)

    def init_state(self, batch_size: int) -> ConstraintStateType:
        """One hypothesis per batch element: no prefix, no n-gram seen."""
        return [[{"seen_ngrams": {}, "current_prefix": []}] for _ in range(batch_size)]

    def apply(self, state: ConstraintStateType, class_log_probabilities: Any) -> Any:
        """Ban, in place, every token that would complete an n-gram seen before."""
        low = _lowest(class_log_probabilities)
        for i, beams in enumerate(state):
            for j, beam in enumerate(beams):
                banned = beam["seen_ngrams"].get(tuple(beam["current_prefix"]), [])
                if banned:
                    class_log_probabilities[i, j, banned] = low
        return class_log_probabilities

    def _update_state(self, state: ConstraintStateType, last_prediction: Any) -> ConstraintStateType:
        """Record the n-gram each token completes and slide its prefix."""
        for i, beams in enumerate(state):
            for j, beam in enumerate(beams):
                token = int(last_prediction[i, j])
                prefix, seen = beam["current_prefix"], beam["seen_ngrams"]
                if len(prefix) == self.ngram_size - 1:
                    seen.setdefault(tuple(prefix), []).append(token)
                prefix.append(token)
                if len(prefix) == self.ngram_size:
                    prefix.pop(0)
        return state


def _lowest(x: Any) -> float:
    """The most negative finite value of the tensor's dtype (what a banned token gets)."""
    import torch

    return float(torch.finfo(x.dtype).min)
