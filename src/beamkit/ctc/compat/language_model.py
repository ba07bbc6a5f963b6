"""pyctcdecode's language-model classes over beamkit's :class:`~beamkit.ctc.lm.LanguageModelFusion`.

``LanguageModel`` wraps a ``kenlm.Model`` with pyctcdecode's fusion rules (the numbers come from beamkit's
fusion object, which the search uses directly); ``MultiLanguageModel`` averages several; ``HotwordScorer``
and ``load_unigram_set_from_arpa`` keep pyctcdecode's names and rules. Unlike pyctcdecode, a non-finite
``alpha``/``beta``/``unk_score_offset`` is refused (ValueError) by the constructor and by ``reset_params``
alike.
"""

from __future__ import annotations

import abc
import bisect
import json
import logging
import math
import os
import re
import shutil
from collections.abc import Collection, Iterable, Sequence
from re import Pattern
from typing import Any

from beamkit._checks import check_number
from beamkit.lm import KenLMModel
from beamkit.lm.kenlm_model import kenlm_failure
from beamkit.textfiles import check_text_file, text_lines

from ..lm import Hotwords as _Hotwords
from ..lm import LanguageModelFusion
from .constants import (
    AVG_TOKEN_LEN,
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_HOTWORD_WEIGHT,
    DEFAULT_SCORE_LM_BOUNDARY,
    DEFAULT_UNK_LOGP_OFFSET,
)

logger = logging.getLogger(__name__)

__all__ = [
    "AbstractLanguageModel",
    "HotwordScorer",
    "HotwordTrie",
    "LanguageModel",
    "MultiLanguageModel",
    "load_unigram_set_from_arpa",
]


def load_unigram_set_from_arpa(arpa_path: str) -> set[str]:
    """The words of an ARPA file's 1-gram section, pyctcdecode's rule: only tab-separated lines with a
    back-off weight (three fields) count, so words written without one are left out (none: ValueError)."""
    unigrams: set[str] = set()
    inside = False
    for raw in text_lines(arpa_path, "ARPA file"):
        line = raw.strip()
        if line == "\\1-grams:":
            inside = True
        elif line == "\\2-grams:":
            break
        if inside and line:
            parts = line.split("\t")
            if len(parts) == 3:
                unigrams.add(parts[1])
    if not unigrams:
        raise ValueError("No unigrams found in arpa file. Something is wrong with the file.")
    return unigrams


class HotwordTrie:
    """The hotwords as a read-only character trie with ``pygtrie.CharTrie``'s queries (what pyctcdecode's
    ``HotwordScorer._char_trie`` is): ``has_node(s)`` is ``HAS_VALUE`` (1) when ``s`` is a hotword, plus
    ``HAS_SUBTRIE`` (2) when a longer hotword starts with ``s``, 0 otherwise."""

    HAS_VALUE = 1
    HAS_SUBTRIE = 2

    def __init__(self, words: Iterable[str]) -> None:
        """A trie of ``words`` (single words: phrases are split by :meth:`HotwordScorer.build_scorer`)."""
        self._words = frozenset(words)
        self._sorted = sorted(self._words)

    @property
    def words(self) -> frozenset[str]:
        """The hotwords."""
        return self._words

    def has_node(self, key: str) -> int:
        """``HAS_VALUE`` if ``key`` is a hotword, plus ``HAS_SUBTRIE`` if a longer hotword starts with it."""
        i = bisect.bisect_right(self._sorted, key)
        longer = i < len(self._sorted) and self._sorted[i].startswith(key)
        return (self.HAS_VALUE if key in self._words else 0) | (self.HAS_SUBTRIE if longer else 0)

    def has_key(self, key: str) -> bool:
        """Whether ``key`` is a hotword."""
        return key in self._words

    def has_subtrie(self, key: str) -> bool:
        """Whether a hotword longer than ``key`` starts with it."""
        return bool(self.has_node(key) & self.HAS_SUBTRIE)

    def keys(self, prefix: str | None = None) -> list[str]:
        """The hotwords (those starting with ``prefix`` when given)."""
        return [w for w in self._sorted if prefix is None or w.startswith(prefix)]

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is a hotword."""
        return key in self._words

    def __len__(self) -> int:
        """The number of hotwords."""
        return len(self._words)


class HotwordScorer:
    """Bonus per hotword (``weight`` per whole-word match) and for partial words that start one."""

    def __init__(self, match_ptn: Pattern[str], char_trie: Any, weight: float = DEFAULT_HOTWORD_WEIGHT) -> None:
        """``match_ptn`` finds whole hotwords in a text; ``char_trie`` holds the hotwords (beamkit's
        :class:`~beamkit.ctc.lm.Hotwords`, or any mapping/trie whose ``keys()`` are the words)."""
        self._match_ptn = match_ptn
        self._weight = weight
        words = char_trie.words if isinstance(char_trie, (_Hotwords, HotwordTrie)) else list(char_trie.keys())
        self._char_trie = HotwordTrie(words)

    def __contains__(self, item: str) -> bool:
        """Whether ``item`` starts some hotword (or is one)."""
        return self._char_trie.has_node(item) > 0

    def score(self, text: str) -> float:
        """``weight`` times the number of hotword matches in ``text``."""
        return self._weight * len(self._match_ptn.findall(text))

    def score_partial_token(self, token: str) -> float:
        """``weight * len(token) / len(shortest hotword starting with token)``, 0 when none starts so."""
        if token not in self:
            return 0.0
        shortest = min(len(w) for w in self._char_trie.words if w.startswith(token))
        return self._weight * len(token) / shortest

    @classmethod
    def build_scorer(
        cls, hotwords: Iterable[str] | None = None, weight: float = DEFAULT_HOTWORD_WEIGHT
    ) -> HotwordScorer:
        """A scorer for ``hotwords`` (phrases are split into words; blank entries dropped)."""
        phrases = [s.strip() for s in (hotwords or []) if len(s.strip()) > 0]
        words = [w for phrase in phrases for w in phrase.split()]
        if words:
            alternatives = [r"(?<!\S)" + re.escape(w) + r"(?!\S)" for w in sorted(words, key=len, reverse=True)]
            pattern = re.compile("|".join(alternatives))
        else:
            pattern = re.compile(r"^\b$")  # matches nothing
        return cls(pattern, HotwordTrie(words), weight)


class AbstractLanguageModel(abc.ABC):
    """What a decoder needs from a language model (pyctcdecode's interface)."""

    @property
    @abc.abstractmethod
    def order(self) -> int:
        """The n-gram order."""

    @abc.abstractmethod
    def get_start_state(self) -> Any:
        """The LM state at the start of an utterance."""

    @abc.abstractmethod
    def score_partial_token(self, partial_token: str) -> float:
        """Score of an unfinished word."""

    @abc.abstractmethod
    def score(self, prev_state: Any, word: str, is_last_word: bool = False) -> tuple[float, Any]:
        """Fused score of ``word`` after ``prev_state``, and the new state."""

    def save_to_dir(self, filepath: str) -> None:
        """Write the model to a directory (not supported here: NotImplementedError)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be saved")

    @classmethod
    def load_from_dir(cls, filepath: str) -> AbstractLanguageModel:
        """Read a saved model (not supported here: NotImplementedError)."""
        raise NotImplementedError(f"{cls.__name__} cannot be loaded")

    def reset_params(self, **params: Any) -> None:
        """Change fusion parameters in place (here: nothing, as pyctcdecode's base class and
        ``MultiLanguageModel``)."""
        del params


_WARNED: set[str] = set()


def any_weight(name: str, value: Any) -> float:
    """``value`` as a float, any float as pyctcdecode takes (a non-number: ValueError naming ``name``, its
    error type). A value that makes the fused scores meaningless (NaN, or an infinity other than
    ``unk_score_offset=-inf``, which forbids unknown words) logs a warning once per weight."""
    try:
        weight = check_number(name, value)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    meaningful = math.isfinite(weight) or (name == "unk_score_offset" and weight < 0)
    if not meaningful and name not in _WARNED:
        _WARNED.add(name)
        logger.warning(
            "%s=%s makes the language model scores meaningless (infinite or NaN); pyctcdecode takes it, and so "
            "does this module, but the beams' order no longer reflects the language model",
            name,
            weight,
        )
    return weight


class PeerFusion(LanguageModelFusion):
    """The fusion object of pyctcdecode's ``LanguageModel``: it takes any float weight, as pyctcdecode does
    (see :func:`any_weight`); beamkit's own :class:`~beamkit.ctc.lm.LanguageModelFusion` refuses them."""

    @staticmethod
    def check_weight(name: str, value: Any, minus_inf: bool, bound: float | None) -> float:
        """Any float (see :func:`any_weight`)."""
        return any_weight(name, value)


class _FusionWeight:
    """A weight of ``LanguageModel``, held by its fusion object (``_fusion``); a value the fusion refuses is a
    ValueError naming the weight (pyctcdecode's error type)."""

    def __init__(self) -> None:
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj._fusion, self.name)

    def __set__(self, obj: Any, value: float) -> None:
        try:
            setattr(obj._fusion, self.name, value)
        except TypeError as exc:
            raise ValueError(str(exc)) from None


class LanguageModel(AbstractLanguageModel):
    """A ``kenlm.Model`` with pyctcdecode's fusion parameters (``alpha``, ``beta``, ``unk_score_offset``,
    ``score_boundary``) and known-word list; the numbers are those of beamkit's fusion object."""

    JSON_ATTRS = ("alpha", "beta", "unk_score_offset", "score_boundary")
    _ATTRS_SERIALIZED_FILENAME = "attrs.json"
    _UNIGRAMS_SERIALIZED_FILENAME = "unigrams.txt"

    def __init__(
        self,
        kenlm_model: Any,
        unigrams: Collection[str] | None = None,
        alpha: float = DEFAULT_ALPHA,
        beta: float = DEFAULT_BETA,
        unk_score_offset: float = DEFAULT_UNK_LOGP_OFFSET,
        score_boundary: bool = DEFAULT_SCORE_LM_BOUNDARY,
    ) -> None:
        """Wrap ``kenlm_model`` (a ``kenlm.Model``); ``unigrams`` are filtered to words the model knows."""
        self._kenlm_model = kenlm_model
        if unigrams is None:
            logger.warning("No known unigrams provided, decoding results might be a lot worse.")
        self._fusion = PeerFusion(
            KenLMModel.from_model(kenlm_model),
            None if unigrams is None else list(unigrams),
            alpha=alpha,
            beta=beta,
            unk_score_offset=unk_score_offset,
            score_boundary=bool(score_boundary),
        )
        self._unigram_set = set(self._fusion.unigrams)

    # the fusion parameters live on the fusion object the search reads
    alpha = _FusionWeight()
    """LM weight."""
    beta = _FusionWeight()
    """Word insertion bonus."""
    unk_score_offset = _FusionWeight()
    """log10 offset for unknown words."""

    @property
    def score_boundary(self) -> bool:
        """Whether utterances start after ``<s>`` and end with ``</s>``."""
        return self._fusion.score_boundary

    @score_boundary.setter
    def score_boundary(self, value: bool) -> None:
        self._fusion.score_boundary = bool(value)

    def reset_params(self, **params: Any) -> None:
        """Change ``alpha``, ``beta``, ``unk_score_offset`` (floats) or ``score_boundary`` (a bool); a value
        of another type, or a non-finite float: ValueError."""
        for name in ("alpha", "beta", "unk_score_offset"):
            value = params.get(name)
            if value is not None:
                if not isinstance(value, float):
                    raise ValueError(f"{name} must be a float. Got {type(value)}.")
                setattr(self, name, value)
        boundary = params.get("score_boundary")
        if boundary is not None:
            if not isinstance(boundary, bool):
                raise ValueError(f"score_boundary must be a bool. Got {type(boundary)}.")
            self.score_boundary = boundary

    @property
    def order(self) -> int:
        """The n-gram order."""
        return self._fusion.order

    def get_start_state(self) -> Any:
        """The state after ``<s>`` (``score_boundary``) or the empty context."""
        return self._fusion.start_state()

    def score_partial_token(self, partial_token: str) -> float:
        """``unk_score_offset`` when no known word starts with ``partial_token`` (scaled by length beyond
        ``AVG_TOKEN_LEN`` characters), else 0."""
        index = self._fusion.prefix_index
        oov = index is None or not index.has_prefix(partial_token)
        score = self.unk_score_offset if oov else 0.0
        if len(partial_token) > AVG_TOKEN_LEN:
            score = score * len(partial_token) / AVG_TOKEN_LEN
        return score

    def score(self, prev_state: Any, word: str, is_last_word: bool = False) -> tuple[float, Any]:
        """Fused score of ``word`` after ``prev_state`` (plus ``</s>`` when ``is_last_word``), new state."""
        return self._fusion.score_word(prev_state, word, is_last=is_last_word)

    @property
    def serializable_attrs(self) -> dict[str, Any]:
        """The JSON-serialised attributes."""
        return {name: getattr(self, name) for name in self.JSON_ATTRS}

    def save_to_dir(self, filepath: str, unigram_encoding: str | None = None) -> None:
        """Write ``attrs.json``, ``unigrams.txt`` and a copy of the KenLM file into ``filepath``."""
        source = self._kenlm_model.path
        source = source.decode("utf-8") if isinstance(source, bytes) else str(source)
        with open(os.path.join(filepath, self._ATTRS_SERIALIZED_FILENAME), "w") as fh:
            json.dump(self.serializable_attrs, fh)
        with open(os.path.join(filepath, self._UNIGRAMS_SERIALIZED_FILENAME), "w", encoding=unigram_encoding) as fh:
            for word in sorted(self._unigram_set):
                fh.write(word + "\n")
        shutil.copy2(source, os.path.join(filepath, os.path.basename(source)))

    @staticmethod
    def parse_directory_contents(filepath: str) -> dict[str, str]:
        """The three files of a saved model (hidden files ignored); anything else: ValueError."""
        contents = [c for c in os.listdir(filepath) if not c.startswith(".") and not c.startswith("__")]
        if len(contents) != 3:
            raise ValueError(f"Found wrong number of files in directory. Expected 3 files, found {contents}")
        for name in (LanguageModel._ATTRS_SERIALIZED_FILENAME, LanguageModel._UNIGRAMS_SERIALIZED_FILENAME):
            if name not in contents:
                raise ValueError(f"did not find {name} in files: {contents}")
            contents.remove(name)
        kenlm_file = contents[0]
        if os.path.splitext(kenlm_file)[1] not in {".arpa", ".bin", ".binary"}:
            raise ValueError(f"Expected kenlm file to end in `.arpa` or `.bin(ary)`. Found {kenlm_file}")
        return {
            "json_attrs": os.path.join(filepath, LanguageModel._ATTRS_SERIALIZED_FILENAME),
            "unigrams": os.path.join(filepath, LanguageModel._UNIGRAMS_SERIALIZED_FILENAME),
            "kenlm": os.path.join(filepath, kenlm_file),
        }

    @classmethod
    def load_from_dir(cls, filepath: str, unigram_encoding: str | None = None) -> LanguageModel:
        """Read a directory written by :meth:`save_to_dir` (by beamkit or pyctcdecode)."""
        files = cls.parse_directory_contents(filepath)
        with open(files["json_attrs"]) as fh:
            attrs = json.load(fh)
        if set(attrs.keys()) != set(cls.JSON_ATTRS):
            raise ValueError(f"Expected json serialized attributes to be {cls.JSON_ATTRS} but found {attrs.keys()}")
        with open(files["unigrams"], encoding=unigram_encoding) as fh:
            unigrams = fh.read().splitlines()
        return cls(read_kenlm(files["kenlm"]), unigrams, **attrs)


class MultiLanguageModel(AbstractLanguageModel):
    """Several :class:`LanguageModel` objects whose scores are averaged."""

    def __init__(self, language_models: list[LanguageModel]) -> None:
        """Hold at least two language models (fewer: ValueError)."""
        if len(language_models) < 2:
            raise ValueError("This class is meant to contain at least 2 language models.")
        self._language_models = language_models

    @property
    def order(self) -> int:
        """The highest order among the models."""
        return max(lm.order for lm in self._language_models)

    def get_start_state(self) -> list[Any]:
        """One start state per model."""
        return [lm.get_start_state() for lm in self._language_models]

    def score_partial_token(self, partial_token: str) -> float:
        """The mean partial-word score."""
        scores = [lm.score_partial_token(partial_token) for lm in self._language_models]
        return float(sum(scores) / len(scores))

    def score(self, prev_state: Sequence[Any], word: str, is_last_word: bool = False) -> tuple[float, list[Any]]:
        """The mean fused score and one new state per model."""
        pairs = [lm.score(s, word, is_last_word) for s, lm in zip(prev_state, self._language_models, strict=False)]
        return sum(p for p, _ in pairs) / len(self._language_models), [s for _, s in pairs]


def read_kenlm(path: str | os.PathLike[str]) -> Any:
    """``kenlm.Model(path)``, with a file kenlm cannot read (malformed, UTF-16, binary garbage) refused by one
    ValueError naming the file and the reason instead of kenlm's multi-line OSError; a missing file stays
    kenlm's OSError, as in pyctcdecode."""
    import kenlm

    if not os.path.exists(path):
        return kenlm.Model(path)
    check_text_file(path, "language model file")  # a named pipe or device would block kenlm
    try:
        return kenlm.Model(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(kenlm_failure(os.fspath(path), exc)) from None
