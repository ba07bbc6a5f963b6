"""Character tries over words (the LM's unigrams, the hotwords), as arrays a compiled search can walk.

A state is a prefix of some word (0: the empty prefix; -1: left the trie, no word starts so). Transitions are
a sorted array of ``state * A + char`` keys (binary search), or a dense table when it is small enough.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..jit import njit


class CharTrie:
    """A character trie as a sorted array of ``state * A + char`` keys, walked with ``searchsorted``, or
    with a dense transition table when that has at most ``dense_limit`` entries.

    State 0 is the root; ``-1`` means "left the trie" (no word has this prefix). ``min_len[state]`` is the
    length of the shortest word below ``state``;
    ``is_word[state]`` whether a word ends there; :meth:`string` spells the characters that lead there.
    """

    def __init__(self, words: Iterable[str], alphabet: dict[str, int], dense_limit: int = 1 << 22) -> None:
        """Index ``words`` over ``alphabet`` (characters outside it end the walk)."""
        self.alphabet_size = len(alphabet) + 1
        parent, char, min_len, is_word = _build(sorted(set(words)), alphabet, self.alphabet_size)
        self._parent, self._char = parent, char
        self._letters = dict(zip(alphabet.values(), alphabet.keys(), strict=True))
        self._spelled: dict[int, str] = {0: ""}
        keys = parent[1:] * self.alphabet_size + char[1:]
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]  # shape: (K,)
        self.values = (order + 1).astype(np.int64)  # shape: (K,) the state each key leads to
        self.min_len = min_len  # shape: (states,)
        self.is_word = is_word  # shape: (states,)
        keys = self.keys
        # dense table: row state + 1 (row 0: left the trie), column char + 2 (0: unknown, 1: no character)
        self.width = self.alphabet_size + 2
        self.table: np.ndarray | None = None
        n_states = len(min_len)
        if (n_states + 1) * self.width <= dense_limit:
            table = np.full((n_states + 1, self.width), -1, dtype=np.int64)  # shape: (states + 1, A + 2)
            table[1:, 1] = np.arange(n_states)
            table[keys // self.alphabet_size + 1, keys % self.alphabet_size + 2] = self.values
            self.table = table.ravel()

    def string(self, state: int) -> str:
        """The characters that lead from the root to ``state`` (spelled once, then remembered)."""
        got = self._spelled.get(state)
        if got is None:
            chars: list[str] = []
            s = state
            while s > 0:
                chars.append(self._letters[self._char[s]])
                s = self._parent[s]
            got = self._spelled[state] = "".join(reversed(chars))
        return got


def _build(words: list[str], alphabet: dict[str, int], A: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The trie of ``words`` (sorted, distinct) as arrays over its states (0: the root): each state's parent and
    the character leading to it, the length of the shortest word passing through it (a word is inserted up to its
    first character outside ``alphabet``, and counts with its whole length), and whether a word ends there.

    Built with numpy: the words' codes in a matrix (one row a word, in sorted order), a state made where a row
    first differs from the row above it, and the rows below that share the prefix pointed at it."""
    n = len(words)
    lengths = np.array([len(w) for w in words], dtype=np.int64)  # shape: (n,)
    width = int(lengths.max()) if n else 0
    codes = np.full((n, width), -1, dtype=np.int64)  # shape: (n, width): -1 past the word or its unknown character
    flat = _codes("".join(words), alphabet)  # shape: (total characters,)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(flat.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    codes[rows, cols] = flat
    known = np.cumprod(codes >= 0, axis=1).astype(bool)  # shape: (n, width): inserted characters
    same = np.zeros((n, width), dtype=bool)  # the prefix up to here equals the row above's
    if n > 1:
        same[1:] = np.cumprod((codes[1:] == codes[:-1]) & known[:-1] & known[1:], axis=1).astype(bool)
    new = known & ~same  # shape: (n, width): a state is made here
    n_states = int(new.sum()) + 1
    ids = np.zeros((n, width), dtype=np.int64)
    ids[new] = np.arange(1, n_states)  # row-major: a row's new states in depth order, rows in sorted order
    creator = np.where(new, np.arange(n)[:, None], 0)
    creator = np.maximum.accumulate(creator, axis=0)  # shape: (n, width): the row that made the state
    ids = np.where(known, ids[creator, np.arange(width)[None, :]], 0)
    parent = np.zeros(n_states, dtype=np.int64)
    char = np.zeros(n_states, dtype=np.int64)
    up = np.zeros((n, width), dtype=np.int64)
    up[:, 1:] = ids[:, :-1]
    parent[ids[new]] = up[new]
    char[ids[new]] = codes[new]
    min_len = np.full(n_states, float(1 << 30))
    word_len = np.broadcast_to(lengths[:, None], (n, width))
    np.minimum.at(min_len, ids[known], word_len[known].astype(np.float64))
    min_len[0] = float(1 << 30)  # the root counts only the empty word
    is_word = np.zeros(n_states, dtype=bool)
    whole = known.sum(axis=1) == lengths  # every character inserted
    ends = whole & (lengths > 0)
    is_word[ids[np.flatnonzero(ends), lengths[ends] - 1]] = True
    if n and lengths[0] == 0:  # the empty word (sorted first)
        min_len[0], is_word[0] = 0.0, True
    return parent, char, min_len, is_word


def _codes(text: str, alphabet: dict[str, int]) -> np.ndarray:
    """Each character's code in ``alphabet`` (-1 outside it), through the characters' code points (one numpy
    lookup instead of a dictionary lookup per character)."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)  # shape: (len(text),)
    singles = [(ord(ch), code) for ch, code in alphabet.items() if len(ch) == 1]
    if not singles:
        return np.full(points.shape[0], -1, dtype=np.int64)
    known, codes = (np.array(x, dtype=np.int64) for x in zip(*sorted(singles), strict=True))
    at = np.minimum(np.searchsorted(known, points), known.shape[0] - 1)
    return np.where(known[at] == points, codes[at], -1)


@njit
def walk(table: np.ndarray, width: int, keys: np.ndarray, values: np.ndarray, A: int, state: int, c: int) -> int:
    """One step of :meth:`CharTrie.walk` for one state and character (``c == -1``: no character)."""
    if len(table):
        return int(table[(state + 1) * width + (c + 2)])
    if c == -1:
        return state
    if state < 0 or c < 0 or len(keys) == 0:
        return -1
    q = state * A + c
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < q:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(keys) and keys[lo] == q:
        return int(values[lo])
    return -1
