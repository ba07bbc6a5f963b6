"""Word-level n-gram language models for CTC shallow fusion.

* :class:`ArpaLM`: a pure-Python ARPA reader with KenLM's back-off semantics
  (``log10 p(w | h) = log10 p(w | h')  + bow(h)`` when ``h w`` is absent; a missing context has ``bow = 0``).
* :class:`KenLMModel`: the same interface over the optional ``kenlm`` module (ARPA or binary files).
* :class:`UnigramPrefixIndex`: "is this partial word the start of a known word?" over a sorted word list.
* :class:`LanguageModelFusion`: the scoring rules of pyctcdecode's ``LanguageModel`` (alpha, beta,
  unknown-word offset, partial-word penalty, end-of-sentence).
* :class:`HotwordScorer`: a bonus for listed words and for partial words that start one.

All LM back-ends return base-10 log-probabilities, as ARPA files and KenLM do.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import sys
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any, Protocol

from beamkit._checks import check_float

LOG10_TO_LN = math.log(10.0)
AVG_TOKEN_LEN = 6
KENLM_MAX_ORDER = 6  # the highest n-gram order the kenlm wheel reads (its default build)
SPECIAL_WORDS = frozenset({"<s>", "</s>", "<unk>"})


class NGramModel(Protocol):
    """What the fusion needs from an n-gram model (base-10 log-probabilities)."""

    order: int

    def begin_state(self) -> Any:
        """State after ``<s>``."""

    def null_state(self) -> Any:
        """Empty context."""

    def score(self, state: Any, word: str) -> tuple[float, Any]:
        """Return ``(log10 p(word | state), new_state)``."""

    def eos_score(self, state: Any) -> float:
        """Return ``log10 p(</s> | state)``."""

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is in the model's vocabulary (not ``<unk>``)."""


def _line_at(source: str | None, lineno: int) -> str:
    """Where a line is, for a message: ``FILE, line N`` (``line N`` without a file name)."""
    return f"{source}, line {lineno}" if source else f"line {lineno}"


class ArpaLM:
    """An ARPA back-off n-gram model held in dictionaries; scoring follows KenLM.

    States are tuples of word ids (at most ``order - 1``, most recent last). Unknown words score as
    ``<unk>`` (log10 -100 when the file has no ``<unk>``).
    """

    def __init__(self, ngrams: list[dict[tuple[str, ...], tuple[float, float]]]) -> None:
        """Build from ``ngrams[k]`` = {(w1..wk+1): (log10 p, log10 backoff)} for k = 0 .. order-1."""
        if not ngrams or not ngrams[0]:
            raise ValueError("ARPA model has no unigrams")
        self.order: int = len(ngrams)
        self.vocab: dict[str, int] = {"<unk>": 0}
        for (w,) in ngrams[0]:
            if w not in self.vocab:
                self.vocab[w] = len(self.vocab)
        self._table: dict[tuple[int, ...], tuple[float, float]] = {}
        for level in ngrams:
            for words, value in level.items():
                ids = tuple(self.vocab.get(w, 0) for w in words)
                self._table[ids] = value
        if (0,) not in self._table:
            self._table[(0,)] = (-100.0, 0.0)
        self._bos = self.vocab.get("<s>", 0)
        self._eos = self.vocab.get("</s>", 0)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ArpaLM:
        """Read an ARPA file (plain text; ``.gz`` is decompressed)."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"ARPA file not found: {path}")
        if path.endswith(".gz"):
            import gzip

            with gzip.open(path, "rt", encoding="utf-8") as fh:
                return cls.from_lines(fh, source=path)
        with open(path, encoding="utf-8") as fh:
            return cls.from_lines(fh, source=path)

    @classmethod
    def from_lines(cls, lines: Iterable[str], source: str | None = None) -> ArpaLM:
        """Parse ARPA text given as an iterable of lines (a malformed line: ValueError naming its number, and
        the file ``source`` when given)."""
        declared: dict[int, int] = {}
        levels: list[dict[tuple[str, ...], tuple[float, float]]] = []
        section = "preamble"
        current = 0
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line:
                continue
            if line == "\\data\\":
                section = "data"
                continue
            if line == "\\end\\":
                section = "end"
                break
            if line.startswith("\\") and line.endswith("-grams:"):
                try:
                    current = int(line[1:-7])
                except ValueError as exc:
                    raise ValueError(f"{_line_at(source, lineno)}: bad ARPA section header: {line!r}") from exc
                while len(levels) < current:
                    levels.append({})
                section = "grams"
                continue
            if section == "data":
                if line.startswith("ngram "):
                    key, _, value = line[6:].partition("=")
                    try:
                        declared[int(key)] = int(value)
                    except ValueError:
                        raise ValueError(f"{_line_at(source, lineno)}: bad ARPA count line: {line!r}") from None
                continue
            if section != "grams":
                continue
            parts = line.split()
            if len(parts) < current + 1:
                raise ValueError(f"{_line_at(source, lineno)}: bad {current}-gram line: {line!r}")
            try:
                logp = float(parts[0])
                bow = float(parts[1 + current]) if len(parts) > current + 1 else 0.0
            except ValueError:
                raise ValueError(
                    f"{_line_at(source, lineno)}: a {current}-gram line needs numbers, got {line!r}"
                ) from None
            words = tuple(parts[1 : 1 + current])
            levels[current - 1][words] = (logp, bow)
        if section == "preamble" and not levels:
            raise ValueError("not an ARPA file: no \\data\\ section")
        for n, count in declared.items():
            if n > len(levels) or len(levels[n - 1]) != count:
                got = len(levels[n - 1]) if n <= len(levels) else 0
                raise ValueError(f"ARPA header declares {count} {n}-grams but the file has {got}")
        return cls(levels)

    def begin_state(self) -> tuple[int, ...]:
        """State after ``<s>``."""
        return (self._bos,) if self.order > 1 else ()

    def null_state(self) -> tuple[int, ...]:
        """Empty context."""
        return ()

    def _score_id(self, state: tuple[int, ...], wid: int) -> tuple[float, tuple[int, ...]]:
        table = self._table
        backoff = 0.0
        logp = 0.0
        for start in range(len(state) + 1):
            ctx = state[start:]
            entry = table.get(ctx + (wid,))
            if entry is not None:
                logp = entry[0]
                break
            ctx_entry = table.get(ctx)
            if ctx_entry is not None:
                backoff += ctx_entry[1]
        keep = self.order - 1
        new_state = (state + (wid,))[-keep:] if keep > 0 else ()
        return logp + backoff, new_state

    def score(self, state: tuple[int, ...], word: str) -> tuple[float, tuple[int, ...]]:
        """Return ``(log10 p(word | state), new_state)`` with KenLM back-off semantics."""
        return self._score_id(state, self.vocab.get(word, 0))

    def score_many(self, states: Sequence[tuple[int, ...]], words: Sequence[str]) -> tuple[list[float], list[Any]]:
        """:meth:`score` of each (state, word) pair: the log10 probabilities and the new states."""
        vocab = self.vocab
        pairs = [self._score_id(s, vocab.get(w, 0)) for s, w in zip(states, words, strict=True)]
        return [p for p, _ in pairs], [s for _, s in pairs]

    def eos_score(self, state: tuple[int, ...]) -> float:
        """Return ``log10 p(</s> | state)``."""
        return self._score_id(state, self._eos)[0]

    def eos_many(self, states: Sequence[tuple[int, ...]]) -> list[float]:
        """:meth:`eos_score` of each state."""
        return [self._score_id(s, self._eos)[0] for s in states]

    def sentence_score(self, sentence: str, bos: bool = True, eos: bool = True) -> float:
        """log10 probability of a whitespace-separated sentence (as ``kenlm.Model.score``)."""
        state = self.begin_state() if bos else self.null_state()
        total = 0.0
        for word in sentence.split():
            s, state = self.score(state, word)
            total += s
        if eos:
            total += self.eos_score(state)
        return total

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is a known (non-``<unk>``) word."""
        return isinstance(word, str) and self.vocab.get(word, 0) != 0

    def words(self) -> list[str]:
        """The vocabulary (including ``<s>``/``</s>`` when present, excluding ``<unk>``)."""
        return [w for w in self.vocab if w != "<unk>"]


class KenLMModel:
    """The :class:`ArpaLM` interface over ``kenlm.Model`` (needs the optional ``kenlm`` module)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Load an ARPA or KenLM binary file with the ``kenlm`` module."""
        try:
            import kenlm
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("the kenlm module is not installed (pip install kenlm)") from exc
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"language model file not found: {path}")
        self._kenlm = kenlm
        try:
            with _quiet_stderr():  # kenlm writes loading chatter (and its own error trace) to fd 2
                self.model = kenlm.Model(path)
        except (OSError, RuntimeError) as exc:
            raise ValueError(_kenlm_failure(path, exc)) from None
        self.order: int = int(self.model.order)

    @classmethod
    def from_model(cls, model: Any) -> KenLMModel:
        """Wrap an already-loaded ``kenlm.Model`` (or ``kenlm.LanguageModel``)."""
        import kenlm

        if not isinstance(model, kenlm.Model):
            raise TypeError(f"expected a kenlm.Model, got {type(model).__name__}")
        self = cls.__new__(cls)
        self._kenlm = kenlm
        self.model = model
        self.order = int(model.order)
        return self

    def begin_state(self) -> Any:
        """State after ``<s>``."""
        state = self._kenlm.State()
        self.model.BeginSentenceWrite(state)
        return state

    def null_state(self) -> Any:
        """Empty context."""
        state = self._kenlm.State()
        self.model.NullContextWrite(state)
        return state

    def score(self, state: Any, word: str) -> tuple[float, Any]:
        """Return ``(log10 p(word | state), new_state)``."""
        out = self._kenlm.State()
        return float(self.model.BaseScore(state, word, out)), out

    def score_many(self, states: Sequence[Any], words: Sequence[str]) -> tuple[list[float], list[Any]]:
        """:meth:`score` of each (state, word) pair: the log10 probabilities and the new states."""
        if len(states) != len(words):
            raise ValueError("states and words differ in length")
        new_state = self._kenlm.State
        outs = [new_state() for _ in range(len(words))]
        logps = list(map(float, map(self.model.BaseScore, states, words, outs)))
        return logps, outs

    def eos_score(self, state: Any) -> float:
        """Return ``log10 p(</s> | state)``."""
        out = self._kenlm.State()
        return float(self.model.BaseScore(state, "</s>", out))

    def eos_many(self, states: Sequence[Any]) -> list[float]:
        """:meth:`eos_score` of each state."""
        outs = [self._kenlm.State() for _ in range(len(states))]
        return list(map(float, map(self.model.BaseScore, states, ["</s>"] * len(states), outs)))

    def sentence_score(self, sentence: str, bos: bool = True, eos: bool = True) -> float:
        """log10 probability of a sentence (``kenlm.Model.score``)."""
        return float(self.model.score(sentence, bos=bos, eos=eos))

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is in the KenLM vocabulary."""
        return isinstance(word, str) and word in self.model


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the block (C++ libraries write there directly)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _kenlm_failure(path: str, exc: BaseException) -> str:
    """One line saying why kenlm could not read ``path``: for a text ARPA file, the line-numbered reason
    from beamkit's ARPA reader; else the start of kenlm's message."""
    try:
        ArpaLM.from_file(path)
    except (ValueError, UnicodeDecodeError) as arpa_exc:
        return f"cannot read language model {path}: {arpa_exc}"
    gist = " ".join(str(exc).split())
    return f"kenlm cannot read {path}: {gist[:160]}{'...' if len(gist) > 160 else ''}"


def kenlm_available() -> bool:
    """Whether the optional ``kenlm`` module can be imported."""
    try:
        import kenlm  # noqa: F401
    except ImportError:
        return False
    return True


def load_language_model(path: str | os.PathLike[str], backend: str = "auto") -> ArpaLM | KenLMModel:
    """Load an n-gram model: ``backend`` is ``"arpa"`` (pure Python), ``"kenlm"``, or ``"auto"``.

    ``auto`` uses ``kenlm`` when it is installed (required for binary files) and the file is not an ARPA
    of an order above what kenlm reads (6), else the ARPA reader.
    """
    path = os.fspath(path)
    if backend not in ("auto", "arpa", "kenlm"):
        raise ValueError(f"unknown LM backend {backend!r}; use 'auto', 'arpa' or 'kenlm'")
    if not os.path.exists(path):
        raise FileNotFoundError(f"language model file not found: {path}")
    if backend == "kenlm" or (backend == "auto" and kenlm_available() and _arpa_order(path) <= KENLM_MAX_ORDER):
        return KenLMModel(path)
    return ArpaLM.from_file(path)


def _arpa_order(path: str) -> int:
    """The highest order an ARPA file's header declares (0 for a binary or headerless file)."""
    order = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for i, raw in enumerate(fh):
                line = raw.strip()
                if line.startswith("ngram ") and "=" in line:
                    head = line[6:].split("=")[0].strip()
                    order = max(order, int(head)) if head.isdigit() else order
                elif line.startswith("\\1-grams") or i > 100:
                    break
    except (UnicodeDecodeError, OSError):
        return 0
    return order


def load_unigrams_from_arpa(path: str | os.PathLike[str]) -> list[str]:
    """The words of an ARPA file's 1-gram section, without ``<s>``, ``</s>``, ``<unk>``."""
    words: list[str] = []
    in_unigrams = False
    with open(os.fspath(path), encoding="utf-8") as fh:
        for raw in fh:
            line = raw.strip()
            if line == "\\1-grams:":
                in_unigrams = True
                continue
            if in_unigrams:
                if line.startswith("\\"):
                    break
                parts = line.split()
                if len(parts) >= 2 and parts[1] not in SPECIAL_WORDS:
                    words.append(parts[1])
    if not words:
        raise ValueError(f"no unigrams found in ARPA file {path}")
    return words


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


def _weighted(alpha: float, logp10: float) -> float:
    """``alpha * ln(10) * logp10``, where a word forbidden by ``unk_score_offset=-inf`` (``logp10`` is -inf)
    stays forbidden when ``alpha`` is 0 (instead of 0 * -inf, which is NaN)."""
    if not alpha:
        return 0.0 if logp10 > -math.inf else -math.inf
    return alpha * logp10 * LOG10_TO_LN


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
        model: ArpaLM | KenLMModel | NGramModel,
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
            self.unigrams = frozenset(w for w in unigrams if w in model)
            self.prefix_index = UnigramPrefixIndex(self.unigrams)

    @property
    def alpha(self) -> float:
        """LM weight (a finite number)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = check_float("alpha", value)

    @property
    def beta(self) -> float:
        """Word insertion bonus (a finite number)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = check_float("beta", value)

    @property
    def unk_score_offset(self) -> float:
        """log10 offset for an unknown word (finite, or -inf: unknown words are never output)."""
        return self._unk_score_offset

    @unk_score_offset.setter
    def unk_score_offset(self, value: float) -> None:
        self._unk_score_offset = check_float("unk_score_offset", value, minus_inf=True)

    @property
    def order(self) -> int:
        """Order of the n-gram model."""
        return int(self.model.order)

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


class HotwordScorer:
    """Bonus ``weight`` per hotword in a text, and ``weight * len(s) / len(shortest hotword starting with s)``
    for a partial word ``s`` (pyctcdecode's rule). Multi-word hotwords count word by word."""

    def __init__(self, hotwords: Iterable[str] | None = None, weight: float = 10.0) -> None:
        """Collect the hotword unigrams."""
        if isinstance(hotwords, str):
            raise TypeError("hotwords must be a list of strings, not one string")
        if not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise TypeError(f"hotword_weight must be a finite number, got {weight!r}")
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
