"""Word n-gram models in ARPA form: :class:`ArpaLM`, a pure-Python reader with KenLM's back-off semantics
(``log10 p(w | h) = log10 p(w | h') + bow(h)`` when ``h w`` is absent; a missing context has ``bow = 0``), and
the :class:`NGramModel` interface every back-end offers (base-10 log-probabilities, as ARPA files and KenLM
give them)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from beamkit.textfiles import text_lines

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
        """Read an ARPA file (UTF-8 text; ``.gz`` is decompressed). A file that is not UTF-8 text, or a path that
        is not a regular file, is an error naming it (see :func:`beamkit.textfiles.text_lines`)."""
        path = os.fspath(path)
        return cls.from_lines(text_lines(path, "ARPA file"), source=path)

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


def arpa_order(path: str) -> int:
    """The highest order an ARPA file's header declares (0 for a binary or headerless file)."""
    order = 0
    try:
        for i, raw in enumerate(text_lines(path, "language model file")):
            line = raw.strip()
            if line.startswith("ngram ") and "=" in line:
                head = line[6:].split("=")[0].strip()
                order = max(order, int(head)) if head.isdigit() else order
            elif line.startswith("\\1-grams") or i > 100:
                break
    except (ValueError, OSError):  # not text (a KenLM binary file), or not readable
        return 0
    return order


def load_unigrams_from_arpa(path: str | os.PathLike[str]) -> list[str]:
    """The words of an ARPA file's 1-gram section, without ``<s>``, ``</s>``, ``<unk>``."""
    words: list[str] = []
    in_unigrams = False
    for raw in text_lines(path, "ARPA file"):
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
