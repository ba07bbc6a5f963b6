"""The trie's edges: ``(parent node, label) -> child node`` as an open-addressing hash table in numpy arrays.

Memory is O(edges), whatever the vocabulary size (a dense ``nodes x V`` child table costs 26.5 KB a node at
V = 6,625). Keys are ``parent * V + label`` (int64); lookups and inserts of many keys at once probe linearly,
all keys of a round together, so a call costs a few numpy operations per probe round (the table is kept at
most half full, so rounds are few).
"""

from __future__ import annotations

import numpy as np

_EMPTY = -1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class EdgeMap:
    """A hash map from non-negative int64 keys to int64 values (``-1``: absent)."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        """An empty map with room for ``capacity`` keys before it grows."""
        bits = max(4, int(2 * max(capacity, 1) - 1).bit_length())
        self._alloc(bits)
        self.count = 0

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        self.mask = (1 << bits) - 1
        self.keys = np.full(1 << bits, _EMPTY, dtype=np.int64)  # shape: (slots,)
        self.vals = np.empty(1 << bits, dtype=np.int64)  # shape: (slots,)

    @property
    def nbytes(self) -> int:
        """Bytes held by the table."""
        return self.keys.nbytes + self.vals.nbytes

    def clear(self, keys: np.ndarray | None = None) -> None:
        """Remove every key (the table keeps its size). ``keys``: all the keys in the map, when known: then only
        their slots are emptied, which costs less than emptying a big table that holds few keys."""
        if keys is None or 4 * len(keys) > len(self.keys):
            self.keys.fill(_EMPTY)
        else:
            self.keys[self._find(keys)] = _EMPTY
        self.count = 0

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """The slots of keys that are in the map."""
        out = np.empty(len(keys), dtype=np.int64)
        pending = np.arange(len(keys))
        slot = self._slots(keys)
        while len(pending):
            s = slot[pending]
            hit = self.keys[s] == keys[pending]
            out[pending[hit]] = s[hit]
            go = (~hit).nonzero()[0]
            pending = pending[go]
            slot[pending] = (s[go] + 1) & self.mask
        return out

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Home slot of each key (Fibonacci hashing: the top ``bits`` of ``key * golden``)."""
        return ((keys.astype(np.uint64) * _GOLDEN) >> np.uint64(64 - self.bits)).astype(np.int64)

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The value of each key, ``-1`` where absent."""
        out = np.full(len(keys), -1, dtype=np.int64)
        pending = np.arange(len(keys))
        slot = self._slots(keys)
        while len(pending):
            s = slot[pending]
            found = self.keys[s]
            hit = found == keys[pending]
            out[pending[hit]] = self.vals[s[hit]]
            go = (~hit & (found != _EMPTY)).nonzero()[0]
            pending = pending[go]
            slot[pending] = (s[go] + 1) & self.mask
        return out

    def put(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Insert distinct keys that are not in the map yet."""
        if 2 * (self.count + len(keys)) > len(self.keys):
            self._grow(self.count + len(keys))
        self._insert(keys, vals)
        self.count += len(keys)

    def _insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        pending = np.arange(len(keys))
        slot = self._slots(keys)
        while len(pending):
            s = slot[pending]
            free = self.keys[s] == _EMPTY
            cand, cs = pending[free], s[free]
            self.keys[cs] = keys[cand]  # keys racing for one slot: one of them wins it
            won = self.keys[cs] == keys[cand]
            self.vals[cs[won]] = vals[cand[won]]
            placed = np.zeros(len(keys), dtype=bool)
            placed[cand[won]] = True
            left = ~placed[pending]
            pending, s = pending[left], s[left]
            slot[pending] = (s + 1) & self.mask

    def _grow(self, need: int) -> None:
        """Rehash into a table at most half full with ``need`` keys."""
        live = (self.keys != _EMPTY).nonzero()[0]
        keys, vals = self.keys[live], self.vals[live]
        bits = self.bits
        while (1 << bits) < 2 * need:
            bits += 1
        self._alloc(bits)
        self._insert(keys, vals)

    def put_one(self, key: int, val: int) -> None:
        """:meth:`put` of one key that is not in the map, in plain Python (for the small-beam search)."""
        if 2 * (self.count + 1) > len(self.keys):
            self._grow(self.count + 1)
        slot = ((key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> (64 - self.bits)
        keys = self.keys
        while keys.item(slot) != _EMPTY:
            slot = (slot + 1) & self.mask
        keys[slot] = key
        self.vals[slot] = val
        self.count += 1

    def get_one(self, key: int) -> int:
        """:meth:`get` of one key, in plain Python (for the small-beam search)."""
        slot = ((key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> (64 - self.bits)
        keys = self.keys
        while True:
            found = keys.item(slot)
            if found == key:
                return int(self.vals.item(slot))
            if found == _EMPTY:
                return -1
            slot = (slot + 1) & self.mask
