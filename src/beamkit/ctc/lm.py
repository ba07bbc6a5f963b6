"""The CTC rules of word n-gram fusion, over the generic models of :mod:`beamkit.lm`.

* :class:`UnigramPrefixIndex`: "is this partial word the start of a known word?" over a sorted word list.
* :class:`LanguageModelFusion`: the scoring rules of pyctcdecode's ``LanguageModel`` (alpha, beta,
  unknown-word offset, partial-word penalty, end-of-sentence); :func:`fusion_of` builds one from a path or a
  loaded model.
* :class:`Hotwords`: a bonus for listed words and for partial words that start one.

The n-gram back-ends (:class:`beamkit.lm.ArpaLM`, :class:`beamkit.lm.KenLMModel`) return base-10
log-probabilities, as ARPA files and KenLM do.
"""

from __future__ import annotations

import bisect
import math
import os
import weakref
from collections.abc import Collection, Iterable, Sequence
from typing import Any, overload

from beamkit import lm as ngram  # its names are used as ``ngram.ArpaLM``: none of them is importable from here
from beamkit._checks import check_float
from beamkit.ctc.options import MAX_HOTWORD_WEIGHT

LOG10_TO_LN = math.log(10.0)
AVG_TOKEN_LEN = 6  # characters per word assumed when scaling the unknown-partial-word penalty
MAX_LM_WEIGHT = 1000.0  # |alpha| and |beta| beyond this make sums of word scores leave the float range


class UnigramPrefixIndex:
    """Answers "is ``s`` a prefix of some known word?" by bisection over the sorted word list."""

    def __init__(self, words: Iterable[str]) -> None:
        """Index ``words``."""
        self._words = sorted(set(words))

    def __len__(self) -> int:
        return len(self._words)

    def has_prefix(self, prefix: str) -> bool:
        """True when some indexed word starts with ``prefix`` (the word itself included)."""
        i = bisect.bisect_left(self._words, prefix)
        return i < len(self._words) and self._words[i].startswith(prefix)


class _Weight:
    """A fusion weight of :class:`LanguageModelFusion`: a float, checked by the owner's ``check_weight`` on
    every assignment (``minus_inf``: -inf is allowed; ``bound``: the largest magnitude, None for none)."""

    def __init__(self, minus_inf: bool = False, bound: float | None = None) -> None:
        self.minus_inf = minus_inf
        self.bound = bound
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Weight: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> float: ...
    def __get__(self, obj: object, owner: type | None = None) -> float | _Weight:
        if obj is None:
            return self
        return float(vars(obj)[self.name])

    def __set__(self, obj: Any, value: float) -> None:
        vars(obj)[self.name] = obj.check_weight(self.name, value, self.minus_inf, self.bound)


def _weighted(alpha: float, logp10: float) -> float:
    """``alpha * ln(10) * logp10``, where a word forbidden by ``unk_score_offset=-inf`` (``logp10`` is -inf)
    stays forbidden when ``alpha`` is 0 (instead of 0 * -inf, which is NaN)."""
    if not alpha:
        return 0.0 if logp10 > -math.inf else -math.inf
    return alpha * logp10 * LOG10_TO_LN


MAX_KEPT_UNIGRAMS = 4  # unigram lists whose known words the process keeps (the last ones filtered)
_KNOWN: dict[int, tuple[Any, tuple[str, ...], frozenset[str], UnigramPrefixIndex]] = {}


def _known_unigrams(model: Any, unigrams: Collection[str]) -> tuple[frozenset[str], UnigramPrefixIndex]:
    """The words of ``unigrams`` that ``model`` knows and their prefix index, made once per model and word
    list: a fusion made again over the same model and list (a fresh decoder, a drop-in's per-call fusion)
    takes the same frozen set, so that the tables keyed by it are found at once instead of after comparing
    every word. A model that cannot be weakly referenced is filtered every time (nothing keeps it alive)."""
    words = tuple(unigrams)
    held = _KNOWN.get(id(model))
    if held is not None and held[0]() is model and held[1] == words:
        return held[2], held[3]
    known = frozenset(w for w in words if w in model)
    index = UnigramPrefixIndex(known)
    try:
        ref = weakref.ref(model)
    except TypeError:
        return known, index
    if len(_KNOWN) >= MAX_KEPT_UNIGRAMS:
        _KNOWN.pop(next(iter(_KNOWN)), None)
    _KNOWN[id(model)] = (ref, words, known, index)
    return known, index


class LanguageModelFusion:
    """Shallow fusion of a word n-gram model, with pyctcdecode's scoring rules.

    * completed word ``w``: ``alpha * ln(10) * (log10 p(w | h) + unk) + beta`` where ``unk`` is
      ``unk_score_offset`` for a word outside the unigram list or the model;
    * partial word ``s`` (not yet ended by a delimiter): ``unk_score_offset`` (scaled by ``len(s) / 6``
      beyond 6 characters) when no known word starts with ``s``, else 0;
    * end of utterance: the last word's score also gets ``log10 p(</s> | h)`` (when ``score_boundary``).
    """

    def __init__(
        self,
        model: ngram.ArpaLM | ngram.KenLMModel | ngram.NGramModel,
        unigrams: Collection[str] | None = None,
        alpha: float = 0.5,
        beta: float = 1.5,
        unk_score_offset: float = -10.0,
        score_boundary: bool = True,
    ) -> None:
        """Wrap ``model``; ``unigrams`` (filtered to words the model knows) drive the partial-word check."""
        self.model = model
        self.alpha = alpha
        self.beta = beta
        self.unk_score_offset = unk_score_offset
        self.score_boundary = bool(score_boundary)
        if unigrams is None:
            self.unigrams: frozenset[str] = frozenset()
            self.prefix_index: UnigramPrefixIndex | None = None
        else:
            if isinstance(unigrams, str):
                raise TypeError("unigrams must be a collection of words, not one string")
            self.unigrams, self.prefix_index = _known_unigrams(model, unigrams)

    alpha = _Weight(bound=MAX_LM_WEIGHT)
    """LM weight (a finite number between -1000 and 1000, ``MAX_LM_WEIGHT``)."""
    beta = _Weight(bound=MAX_LM_WEIGHT)
    """Word insertion bonus (a finite number between -1000 and 1000, ``MAX_LM_WEIGHT``)."""
    unk_score_offset = _Weight(minus_inf=True)
    """log10 offset for an unknown word (finite, or -inf: unknown words are never output)."""

    @staticmethod
    def check_weight(name: str, value: Any, minus_inf: bool, bound: float | None) -> float:
        """A fusion weight as a float: finite (or -inf where ``minus_inf``) and within ``bound`` in magnitude
        where given, else ValueError naming it (a non-number: TypeError)."""
        if bound is None:
            return check_float(name, value, minus_inf=minus_inf)
        return check_float(name, value, least=-bound, most=bound)

    @property
    def order(self) -> int:
        """Order of the n-gram model."""
        return int(self.model.order)

    def arrays_model(self) -> Any:
        """The compiled arrays of the model (:class:`beamkit.ctc.ngram.CompiledNGram`) when it is an ARPA file's
        (a path, an :class:`~beamkit.lm.ArpaLM`, or a KenLM model loaded from an ARPA text file) and this class
        scores words by these rules; None otherwise (the search asks the model in Python)."""
        for name in ("score_words", "score_eos_many"):  # rules replaced (on the class or this object): ask them
            if getattr(type(self), name) is not getattr(LanguageModelFusion, name) or name in vars(self):
                return None
        from .ngram import ngram_of

        return ngram_of(self.model)

    def start_state(self) -> Any:
        """The LM state at the start of an utterance."""
        return self.model.begin_state() if self.score_boundary else self.model.null_state()

    def score_word(self, state: Any, word: str, is_last: bool = False) -> tuple[float, Any]:
        """Fused (natural-log, weighted) score of completing ``word`` after ``state``; returns the new state."""
        logp, new_state = self.model.score(state, word)
        if (self.unigrams and word not in self.unigrams) or word not in self.model:
            logp += self.unk_score_offset
        if is_last and self.score_boundary:
            logp += self.model.eos_score(new_state)
        return _weighted(self.alpha, logp) + self.beta, new_state

    def score_words(self, states: Sequence[Any], words: Sequence[str]) -> tuple[list[float], list[Any]]:
        """:meth:`score_word` (``is_last=False``) of each (state, word) pair in one call: the fused scores
        and the new states (uses the model's ``score_many`` when it has one)."""
        model = self.model
        score_many = getattr(model, "score_many", None)
        if score_many is not None:
            logps, new_states = score_many(states, words)
        else:
            pairs = [model.score(s, w) for s, w in zip(states, words, strict=True)]
            logps, new_states = [p for p, _ in pairs], [s for _, s in pairs]
        alpha, beta, unk = self.alpha, self.beta, self.unk_score_offset
        # the unigrams are words of the model (see __init__), so this is score_word's unknown-word test
        known = self.unigrams or model
        if alpha:
            out = [
                alpha * (logp if word in known else logp + unk) * LOG10_TO_LN + beta
                for logp, word in zip(logps, words, strict=True)
            ]
        else:  # 0 * -inf is NaN: see _weighted
            out = [
                _weighted(0.0, logp if word in known else logp + unk) + beta
                for logp, word in zip(logps, words, strict=True)
            ]
        return out, new_states

    def score_eos(self, state: Any) -> float:
        """Fused score of ending the utterance after ``state`` (no word pending)."""
        if not self.score_boundary:
            return 0.0
        return self.alpha * self.model.eos_score(state) * LOG10_TO_LN

    def score_eos_many(self, states: Sequence[Any]) -> list[float]:
        """:meth:`score_eos` of each state (uses the model's ``eos_many`` when it has one)."""
        if not self.score_boundary:
            return [0.0] * len(states)
        eos_many = getattr(self.model, "eos_many", None)
        logps = eos_many(states) if eos_many is not None else [self.model.eos_score(s) for s in states]
        alpha = self.alpha
        return [alpha * logp * LOG10_TO_LN for logp in logps]

    def score_partial(self, partial: str) -> float:
        """Penalty for a partial word that starts no known word (0 when it does)."""
        if not partial:
            return 0.0
        oov = self.prefix_index is None or not self.prefix_index.has_prefix(partial)
        score = self.unk_score_offset if oov else 0.0
        if len(partial) > AVG_TOKEN_LEN:
            score = score * len(partial) / AVG_TOKEN_LEN
        return score


class Hotwords:
    """Bonus ``weight`` per hotword in a text, and ``weight * len(s) / len(shortest hotword starting with s)``
    for a partial word ``s`` (pyctcdecode's rule). Multi-word hotwords count word by word."""

    def __init__(self, hotwords: Iterable[str] | None = None, weight: float = 10.0) -> None:
        """Collect the hotword unigrams."""
        if isinstance(hotwords, str):
            raise TypeError("hotwords must be a list of strings, not one string")
        check_float("hotword_weight", weight, least=-MAX_HOTWORD_WEIGHT, most=MAX_HOTWORD_WEIGHT)
        words: list[str] = []
        for phrase in hotwords or []:
            words.extend(phrase.split())
        self.words = frozenset(words)
        self.weight = float(weight)
        self._sorted = sorted(self.words)

    def __bool__(self) -> bool:
        return bool(self.words)

    def is_prefix(self, partial: str) -> bool:
        """Whether ``partial`` starts some hotword."""
        i = bisect.bisect_left(self._sorted, partial)
        return i < len(self._sorted) and self._sorted[i].startswith(partial)

    def score(self, text: str) -> float:
        """``weight`` times the number of hotwords among the words of ``text``."""
        if not self.words:
            return 0.0
        return self.weight * sum(1 for w in text.split() if w in self.words)

    def score_partial(self, partial: str) -> float:
        """Bonus for a partial word that starts a hotword."""
        if not partial or not self.is_prefix(partial):
            return 0.0
        shortest = min(len(w) for w in self.words if w.startswith(partial))
        return self.weight * len(partial) / shortest


def fusion_of(
    model: str | os.PathLike[str] | ngram.ArpaLM | ngram.KenLMModel | ngram.NGramModel,
    unigrams: Collection[str] | None = None,
    *,
    alpha: float = 0.5,
    beta: float = 1.5,
    unk_score_offset: float = -10.0,
    score_boundary: bool = True,
    backend: str = "auto",
) -> LanguageModelFusion:
    """The fusion of a word n-gram model: ``model`` is a path (an ARPA or KenLM binary file, read as
    ``backend`` says, see :func:`beamkit.lm.load_language_model`) or a loaded model. ``unigrams``: the known
    words of the partial-word check; when omitted, every 1-gram of an ARPA file or an :class:`ArpaLM` (also
    those written without a back-off weight)."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        model = ngram.load_language_model(path, backend=backend)
        if unigrams is None and path.endswith(".arpa"):
            unigrams = ngram.load_unigrams_from_arpa(path)
    if unigrams is None and isinstance(model, ngram.ArpaLM):
        unigrams = [w for w in model.words() if w not in ("<s>", "</s>")]
    return LanguageModelFusion(
        model, unigrams, alpha=alpha, beta=beta, unk_score_offset=unk_score_offset, score_boundary=score_boundary
    )
