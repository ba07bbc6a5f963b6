"""The open-addressing hash tables of the CTC searches: one hash formula and one probing rule for every table
(the prefix search's edge map, merge table, final-text groups and LM word table; the lexicon search's LM table and
candidate groups).

A table has a power of two of slots. A 64-bit key's home slot is the high half of the key times the golden-ratio
constant (Fibonacci hashing, :func:`home_slot`); a taken slot sends the search to the next one, wrapping around
(:func:`next_slot`, linear probing). :func:`probe` is the whole lookup for a table whose slots hold the keys
themselves, with a marker for a free slot.
"""

from __future__ import annotations

import numpy as np

from .jit import njit

SALT = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / the golden ratio, odd: the multiplier of every home slot
HIGH = np.uint64(32)  # the product's high half spreads every bit of the key


@njit
def home_slot(key: int | np.integer, mask: int) -> int:
    """The first slot tried for ``key`` in a table of ``mask + 1`` slots (a power of two)."""
    return int((np.uint64(key) * SALT) >> HIGH) & mask


@njit
def next_slot(slot: int, mask: int) -> int:
    """The slot tried after ``slot`` (the next one, wrapping around)."""
    return (slot + 1) & mask


@njit
def probe(keys: np.ndarray, key: int | np.integer, free: int) -> int:
    """The slot of ``keys`` holding ``key``, or the first free slot (holding ``free``) where it would go."""
    mask = len(keys) - 1
    s = home_slot(key, mask)
    while keys[s] != free and keys[s] != key:
        s = next_slot(s, mask)
    return s
