"""The fusion object the search reads, built from compat language models (one or averaged several), with an
optional given start state (``lm_start_state``: streaming across chunks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..lm import LanguageModelFusion
from .language_model import AbstractLanguageModel, LanguageModel, MultiLanguageModel


class SearchLM(LanguageModelFusion):
    """The mean of the members' fused scores (one member: its own), starting from ``start`` when given.

    Members must share their known words, so the mean partial-word penalty is the mean ``unk_score_offset``
    applied to one known-word test (as pyctcdecode's mean of the members' partial scores)."""

    @staticmethod
    def check_weight(name: str, value: Any, minus_inf: bool, bound: float | None) -> float:
        """The members' weights as they are (each member checked its own, as pyctcdecode's LanguageModel)."""
        return float(value)

    def __init__(self, members: Sequence[LanguageModelFusion], start: Any = None) -> None:  # noqa: D107
        first = members[0]
        for other in members[1:]:
            if other.unigrams != first.unigrams or (other.prefix_index is None) != (first.prefix_index is None):
                raise ValueError("the language models of a MultiLanguageModel must share their unigrams")
        self.members = list(members)
        self.model = first.model
        self.unigrams = first.unigrams
        self.prefix_index = first.prefix_index
        self.alpha, self.beta = first.alpha, first.beta
        self.score_boundary = first.score_boundary
        self.unk_score_offset = sum(m.unk_score_offset for m in members) / len(members)
        self._start = start

    def check_scorable(self) -> None:
        """A NaN weight in any member is a ValueError naming it: no beam would have a score to rank by (the
        search would not end; pyctcdecode fails on it with a ValueError too)."""
        for member in self.members:
            for name in ("alpha", "beta", "unk_score_offset"):
                if getattr(member, name) != getattr(member, name):  # NaN
                    raise ValueError(f"cannot decode with {name}=nan: no beam has a score to rank by")

    @property
    def _char_trie_cache(self) -> Any:
        """The search's unigram trie, kept on the first member so that it outlives this per-call object."""
        return getattr(self.members[0], "_char_trie_cache", None)

    @_char_trie_cache.setter
    def _char_trie_cache(self, value: Any) -> None:
        self.members[0]._char_trie_cache = value  # type: ignore[attr-defined]

    def arrays_model(self) -> Any:
        """One member and no given start state: the member's compiled model (see
        :meth:`LanguageModelFusion.arrays_model`); else None."""
        if len(self.members) != 1 or self._start is not None:
            return None
        return self.members[0].arrays_model()

    @property
    def order(self) -> int:
        """The highest member order."""
        return max(m.order for m in self.members)

    def start_state(self) -> Any:
        """The given start state, else the members' (a list for several)."""
        if self._start is not None:
            return self._start
        states = [m.start_state() for m in self.members]
        return states[0] if len(states) == 1 else states

    def score_words(self, states: Sequence[Any], words: Sequence[str]) -> tuple[list[float], list[Any]]:
        """Mean fused word scores and new states."""
        if len(self.members) == 1:
            return self.members[0].score_words(states, words)
        total = [0.0] * len(words)
        per_member = []
        for i, m in enumerate(self.members):
            scores, new = m.score_words([s[i] for s in states], words)
            total = [a + b for a, b in zip(total, scores, strict=True)]
            per_member.append(new)
        n = len(self.members)
        return [t / n for t in total], [list(col) for col in zip(*per_member, strict=True)]

    def score_eos_many(self, states: Sequence[Any]) -> list[float]:
        """Mean end-of-utterance scores."""
        if len(self.members) == 1:
            return self.members[0].score_eos_many(states)
        n = len(self.members)
        cols = [m.score_eos_many([s[i] for s in states]) for i, m in enumerate(self.members)]
        return [sum(v) / n for v in zip(*cols, strict=True)]


def _fusions(language_model: AbstractLanguageModel) -> list[LanguageModelFusion]:
    """The fusion objects of ``language_model`` (a LanguageModel: its own; a MultiLanguageModel: its members');
    other model classes: TypeError."""
    if isinstance(language_model, LanguageModel):
        return [language_model._fusion]
    if isinstance(language_model, MultiLanguageModel):
        members = language_model._language_models
        if not all(isinstance(m, LanguageModel) for m in members):
            raise TypeError("a MultiLanguageModel must hold LanguageModel objects")
        return [m._fusion for m in members]
    raise TypeError(
        f"{type(language_model).__name__} is not supported: beamkit's search fuses LanguageModel or "
        "MultiLanguageModel objects (the scores are computed inside the compiled search)"
    )


def fusion_weights(language_model: AbstractLanguageModel | None) -> tuple[Any, ...]:
    """The fusion weights of ``language_model`` and of its members (each one's model, alpha, beta, unknown-word
    offset and boundary scoring), to tell whether a search built for it still holds; other model classes:
    TypeError (as :func:`search_lm`)."""
    if language_model is None:
        return ()
    return tuple(
        (id(f), id(f.model), f.alpha, f.beta, f.unk_score_offset, f.score_boundary) for f in _fusions(language_model)
    )


def search_lm(language_model: AbstractLanguageModel | None, start: Any = None) -> SearchLM | None:
    """The fusion object for ``language_model`` (None without one); other model classes: TypeError."""
    return None if language_model is None else SearchLM(_fusions(language_model), start)
