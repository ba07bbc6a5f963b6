"""Word lexicons for token-level CTC search: the lexicon file (a word, then its spelling in tokens, one spelling a
line) and :class:`LexiconTrie`, a token trie whose nodes hold the words spelled to them and a look-ahead score
(the best word score below the node, kept as float32 as flashlight's trie keeps it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

UNK_WORD = "<unk>"  # the unknown word every lexicon holds (without a spelling)
_MINUS_LOG_THRESHOLD = -39.14  # below this difference, a log-add returns the larger term


def f32(value: float) -> float:
    """``value`` rounded to float32, as a Python float."""
    return float(np.float32(value))


def read_lexicon(path: str | Path) -> dict[str, list[list[str]]]:
    """The words of a lexicon file and their spellings: each non-empty line is a word and its spelling in tokens
    separated by white space (a word on several lines has several spellings). The unknown word ``<unk>`` is always
    present, with no spelling (a spelling given to it in the file is dropped, as torchaudio drops it)."""
    lexicon: dict[str, list[list[str]]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the lexicon file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the lexicon file {str(path)!r} is not UTF-8 text") from None
    for number, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields:
            if line.strip(" \t\r\f\v"):
                raise ValueError(f"lexicon file {str(path)!r} line {number}: expected a word and its spelling")
            continue
        if len(fields) < 2:
            raise ValueError(
                f"lexicon file {str(path)!r} line {number}: expected a word and its spelling, got {line!r}"
            )
        lexicon.setdefault(fields[0], []).append(fields[1:])
    lexicon[UNK_WORD] = []
    return lexicon


def log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)), returning the larger term where the other is negligible (flashlight's trie log-add)."""
    if a < b:
        a, b = b, a
    diff = b - a
    if diff < _MINUS_LOG_THRESHOLD:
        return a
    return a + math.log1p(math.exp(diff))


class TrieNode:
    """One node of a :class:`LexiconTrie`: its children by token id, the words spelled to it with their scores,
    and ``max_score``, the best score of a word at or below it (float32)."""

    __slots__ = ("children", "max_score", "scores", "words")

    def __init__(self) -> None:
        """An empty node."""
        self.children: dict[int, TrieNode] = {}
        self.words: list[int] = []
        self.scores: list[float] = []
        self.max_score = 0.0


class LexiconTrie:
    """The spellings of a lexicon as a token trie: :meth:`insert` each spelling with its word id and score, then
    :meth:`smear` once to fill the look-ahead scores."""

    def __init__(self, num_tokens: int) -> None:
        """An empty trie over token ids ``0 .. num_tokens - 1``."""
        self.num_tokens = num_tokens
        self.root = TrieNode()

    def insert(self, spelling: Sequence[int], word: int, score: float) -> TrieNode:
        """Add one spelling (token ids) of word id ``word`` with the word's score (kept as float32)."""
        node = self.root
        for token in spelling:
            if not 0 <= token < self.num_tokens:
                raise ValueError(f"token id {token} is out of range for {self.num_tokens} tokens")
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = TrieNode()
            node = child
        node.words.append(word)
        node.scores.append(f32(score))
        return node

    def smear(self) -> None:
        """Set each node's ``max_score``: the log-sum of its own words' scores, raised to its best child's."""
        stack: list[tuple[TrieNode, bool]] = [(self.root, False)]
        while stack:  # post-order without recursion (spellings can be long)
            node, done = stack.pop()
            if not done:
                stack.append((node, True))
                stack.extend((child, False) for child in node.children.values())
                continue
            best = -math.inf
            for score in node.scores:
                best = f32(log_add(best, score))
            for child in node.children.values():
                if child.max_score > best:
                    best = child.max_score
            node.max_score = best


def build_trie(
    lexicon: Mapping[str, Sequence[Sequence[str]]],
    token_index: Mapping[str, int],
    word_index: Mapping[str, int],
    word_scores: Mapping[str, float],
    num_tokens: int,
) -> LexiconTrie:
    """The trie of a lexicon: each spelling's tokens looked up in ``token_index`` (an unknown token is a ValueError
    naming it), each word's id from ``word_index`` and its score from ``word_scores``, then smeared."""
    trie = LexiconTrie(num_tokens)
    for word, spellings in lexicon.items():
        for spelling in spellings:
            ids = []
            for token in spelling:
                if token not in token_index:
                    raise ValueError(f"the lexicon spells {word!r} with {token!r}, which is not one of the tokens")
                ids.append(token_index[token])
            trie.insert(ids, word_index[word], word_scores[word])
    trie.smear()
    return trie
