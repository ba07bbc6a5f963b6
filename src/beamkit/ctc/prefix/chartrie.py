"""Character tries over words (the LM's unigrams, the hotwords), as arrays a compiled search can walk.

A state is a prefix of some word (0: the empty prefix; -1: left the trie, no word starts so). Transitions are
a sorted array of ``state * A + char`` keys (binary search), or a dense table when it is small enough.
"""

from __future__ import annotations

from array import array
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
        trans: dict[int, int] = {}
        min_len = [1 << 30]
        is_word = [False]
        parent = array("q", [0])  # each state's parent state and the character leading to it (for string())
        char = array("q", [0])
        for word in sorted(set(words), key=len):
            state = 0
            for ch in word:
                c = alphabet.get(ch)
                if c is None:
                    break
                key = state * self.alphabet_size + c
                nxt = trans.get(key)
                if nxt is None:
                    nxt = len(min_len)
                    trans[key] = nxt
                    min_len.append(len(word))
                    is_word.append(False)
                    parent.append(state)
                    char.append(c)
                state = nxt
            else:
                min_len[state] = min(min_len[state], len(word))
                is_word[state] = True
        self._parent, self._char = parent, char
        self._letters = dict(zip(alphabet.values(), alphabet.keys(), strict=True))
        self._spelled: dict[int, str] = {0: ""}
        keys = np.array(sorted(trans), dtype=np.int64)
        self.keys = keys  # shape: (K,)
        self.values = np.array([trans[int(k)] for k in keys], dtype=np.int64)  # shape: (K,)
        self.min_len = np.array(min_len, dtype=np.float64)  # shape: (states,)
        self.is_word = np.array(is_word, dtype=bool)  # shape: (states,)
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
