"""Prefix store for the vectorised CTC search: integer nodes with array attributes.

A node is a normalised prefix: completed words plus a partial word. Nodes form a tree (parent, last label)
with its edges in a hash map keyed by (node, label) (:class:`~beamkit.ctc.edges.EdgeMap`: memory O(nodes),
whatever the vocabulary size); the children a frame asks for that do not exist yet are created in bulk
with numpy, and kept for the rest of the call (one node per prefix: equal prefixes always share an id).
Strings are never built on the hot path: a partial word is identified by a 64-bit hash of its labels, a
completed-word sequence by a hash chain, and partial-word scores come from walking character tries kept
as dense transition tables or sorted key arrays (:class:`CharTrie`): one for the LM unigrams
(unknown-prefix penalty) and one for hotwords. New (LM context, word) pairs of a step go to the LM in one
batch (the words' strings are kept per node with an LM); text is rebuilt from the parent chains for the
final hypotheses.

Node storage is reused: :meth:`PrefixTrie.release` keeps the arrays (and the cleared edge map) for the next
trie of the same shape, since first touches of fresh memory (page faults) cost more than a search step. One
set of at most 256 MiB is kept between calls; :func:`release_cached_memory` frees it.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np

from .edges import EdgeMap
from .lm import AVG_TOKEN_LEN, HotwordScorer, LanguageModelFusion
from .vocab import Vocabulary

_NODE_FIELDS = (
    "parent",
    "last_tok",
    "plen",
    "phash",
    "uni",
    "hotst",
    "tscore",
    "score",
    "sid",
    "whist",
    "wkey",
    "thash",
    "hhash",
)
# node arrays released by a finished trie, for the next one (one set, up to _SPARE_MAX_BYTES)
_SPARE: list[tuple[dict[str, np.ndarray], EdgeMap]] = []
_SPARE_LOCK = threading.Lock()
_SPARE_MAX_BYTES = 1 << 28
_HASH_MUL = np.uint64(0x100000001B3)
_HASH_SALT = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))
# the same hash as plain Python ints (uint64 arithmetic wraps modulo 2**64), for the small-beam search
_M64 = (1 << 64) - 1
_MUL_INT = int(_HASH_MUL)
_SALT_INT = int(_HASH_SALT[0])


def release_cached_memory() -> int:
    """Free the node arrays kept for the next CTC search; returns the bytes released."""
    with _SPARE_LOCK:
        freed = sum(sum(a.nbytes for a in arrays.values()) + edges.nbytes for arrays, edges in _SPARE)
        _SPARE.clear()
    return freed


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

    def walk(self, states: np.ndarray, chars: np.ndarray) -> np.ndarray:
        """Advance ``states`` by ``chars`` (``-1``: no character, state kept; ``-2``: unknown character)."""
        if self.table is not None:
            return self.table[(states + 1) * self.width + (chars + 2)]
        out = states.copy()
        move = (states >= 0) & (chars != -1)
        if not move.any() or len(self.keys) == 0:
            out[move] = -1
            return out
        q = states[move] * self.alphabet_size + np.maximum(chars[move], 0)
        pos = np.minimum(np.searchsorted(self.keys, q), len(self.keys) - 1)
        hit = (self.keys[pos] == q) & (chars[move] >= 0)
        out[move] = np.where(hit, self.values[pos], -1)
        return out


def _mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Combine two uint64 hash arrays (order-sensitive)."""
    return _mix_salted(a, b * _HASH_SALT[0])  # uint64 arrays wrap around silently


def _mix_salted(a: np.ndarray, b_salted: np.ndarray) -> np.ndarray:
    """:func:`_mix` of ``a`` and ``b`` given ``b * _HASH_SALT[0]``."""
    h = (a ^ b_salted) * _HASH_MUL
    return h ^ (h >> np.uint64(29))


def _mix_salted_int(a: int, b_salted: int) -> int:
    """:func:`_mix_salted` of two Python ints (as uint64)."""
    h = ((a ^ b_salted) * _MUL_INT) & _M64
    return h ^ (h >> 29)


def _mix_int(a: int, b: int) -> int:
    """:func:`_mix` of two Python ints (as uint64)."""
    return _mix_salted_int(a, (b * _SALT_INT) & _M64)


def _words_key(whist: np.ndarray) -> np.ndarray:
    """A 64-bit key of the last words per node (``whist``: ``(m, H)`` word hashes)."""
    h = whist[:, 0]
    for j in range(1, whist.shape[1]):
        h = _mix(h, whist[:, j])
    return h


def _history_key(wkey: np.ndarray, phash: np.ndarray) -> np.ndarray:
    """A 64-bit key of (last words, partial word) per node, for history pruning, from the words' key
    (:func:`_words_key`) and the partial word's character hash chain (its length is part of the chain)."""
    return _mix(wkey, phash)


class PrefixTrie:
    """Nodes (prefixes) for one decoding call, shared by all its utterances."""

    def __init__(
        self,
        vocab: Vocabulary,
        lm: LanguageModelFusion | None,
        hotwords: HotwordScorer,
        history: int,
        empty_word_at_end: bool = False,
        capacity: int = 1 << 15,
    ) -> None:
        """Prepare tries and the root node. ``history``: words kept for history pruning;
        ``empty_word_at_end``: score an utterance ending on a delimiter as pyctcdecode does (an empty word);
        ``capacity``: initial node storage (grows by 4x when full; untouched storage costs no memory)."""
        self.vocab = vocab
        self.lm = lm
        self.hot = hotwords
        self.history = max(1, history)
        self.empty_word_at_end = empty_word_at_end
        V = vocab.size
        labels = vocab.labels
        # per-label pieces that extend the partial word
        self.clean = [
            (lab[1:] if vocab.is_bpe else "") if vocab.starts_word[i] else ("" if i == vocab.blank else lab)
            for i, lab in enumerate(labels)
        ]
        alphabet: dict[str, int] = {}
        for piece in self.clean:
            for ch in piece:
                alphabet.setdefault(ch, len(alphabet))
        width = max([len(p) for p in self.clean] + [1])
        self.piece_chars = np.full((V, width), -1, dtype=np.int64)  # shape: (V, Lmax)
        for i, piece in enumerate(self.clean):
            for j, ch in enumerate(piece):
                self.piece_chars[i, j] = alphabet[ch]
        self.piece_len = np.array([len(p) for p in self.clean], dtype=np.int64)  # shape: (V,)
        # the characters as hash inputs (see _mix): code + 1, times the first salt
        self.piece_codes = (self.piece_chars + 1).astype(np.uint64) * _HASH_SALT[0]  # shape: (V, Lmax)
        self.starts_word_list: list[bool] = vocab.starts_word.tolist()
        # text pieces per label (a word-starting label opens a new word), and "" for padding (index V)
        starts = vocab.starts_word.tolist()
        self.text_piece = np.array(
            [(" " + p if starts[i] else p) for i, p in enumerate(self.clean)] + [""], dtype=object
        )  # shape: (V + 1,)
        self.uni_trie = None
        if lm is not None and lm.prefix_index is not None:
            cache_key = tuple(sorted(alphabet.items()))
            cached = getattr(lm, "_char_trie_cache", None)
            if cached is None or cached[0] != cache_key:
                cached = (cache_key, CharTrie(lm.unigrams, alphabet))
                lm._char_trie_cache = cached  # type: ignore[attr-defined]
            self.uni_trie = cached[1]
        self.hot_trie = CharTrie(hotwords.words, alphabet) if hotwords else None
        self._small_ok = all(t.table is not None for t in (self.uni_trie, self.hot_trie) if t is not None)
        # node arrays: every field of a node is written when the node is created (zero-filling storage
        # that is mostly never used costs more than the search)
        cap = max(1 << 10, int(capacity))
        self.n = 0
        if not self._reuse_storage(cap):
            self._new_storage(cap)
        # labels that leave a prefix without a partial word unchanged (a delimiter, an empty BPE piece)
        self.loop_tok = vocab.starts_word & (self.piece_len == 0)  # shape: (V,)
        # the same tables as lists, for the small-beam search
        self.loop_list: list[bool] = self.loop_tok.tolist()
        self.piece_len_list: list[int] = self.piece_len.tolist()
        self.piece_chars_list: list[list[int]] = self.piece_chars.tolist()
        self.piece_codes_list: list[list[int]] = self.piece_codes.tolist()
        # LM contexts: id -> state, and the fused score of the word that led there; the context after a
        # (context id, word hash) pair, keyed by ``id << 64 | hash`` (plain ints: nothing for the garbage
        # collector to track)
        self.states: list[Any] = [lm.start_state() if lm is not None else None]
        self.deltas = np.zeros(1 << 10)  # shape: (capacity,) by context id (0: the start)
        self.lm_cache: dict[int, int] = {}
        # partial words as strings (for LM queries), by word hash, built from the parent chain when first asked
        self.word_text: dict[int, str] = {}
        self.root = int(self._alloc(1)[0])
        for name in _NODE_FIELDS:
            getattr(self, name)[self.root] = 0
        self.parent[self.root] = -1
        self.last_tok[self.root] = vocab.space  # -1 without a delimiter: no label repeats the root
        root = np.array([self.root])
        self.wkey[self.root] = _words_key(self.whist[root])[0]
        self.hhash[self.root] = _history_key(self.wkey[root], self.phash[root])[0]

    # ------------------------------------------------------------------ storage
    def _new_storage(self, cap: int) -> None:
        """Allocate node arrays for ``cap`` nodes."""
        self.parent = np.empty(cap, dtype=np.int64)
        self.last_tok = np.empty(cap, dtype=np.int64)
        self.plen = np.empty(cap, dtype=np.int64)  # characters in the partial word
        self.phash = np.empty(cap, dtype=np.uint64)  # hash of the partial word's labels
        self.uni = np.empty(cap, dtype=np.int64)  # unigram-trie state of the partial word (-1: none; LM only)
        self.hotst = np.empty(cap, dtype=np.int64)  # hotword-trie state of the partial word (hotwords only)
        self.tscore = np.empty(cap, dtype=np.float64)  # fused score of the completed words
        self.score = np.empty(cap, dtype=np.float64)  # tscore + partial-word score
        self.sid = np.empty(cap, dtype=np.int64)  # LM context id of the completed words
        self.whist = np.empty((cap, self.history), dtype=np.uint64)  # hashes of the last words
        self.wkey = np.empty(cap, dtype=np.uint64)  # key of the last words (see _words_key)
        self.thash = np.empty(cap, dtype=np.uint64)  # hash chain of all completed words
        self.hhash = np.empty(cap, dtype=np.uint64)  # history-pruning key (see _history_key)
        self.edges = EdgeMap(cap)  # (node, label) -> child node

    def _reuse_storage(self, cap: int) -> bool:
        """Take released node arrays of this trie's shape holding at least ``cap`` nodes, if there are any."""
        with _SPARE_LOCK:
            for i, (arrays, edges) in enumerate(_SPARE):
                if len(arrays["parent"]) >= cap and arrays["whist"].shape[1] == self.history:
                    for name in _NODE_FIELDS:
                        setattr(self, name, arrays[name])
                    self.edges = edges
                    del _SPARE[i]
                    return True
        return False

    def release(self) -> None:
        """Hand the node arrays and the (cleared) edge map over to the next trie; this trie must not be used
        afterwards."""
        arrays = {name: getattr(self, name) for name in _NODE_FIELDS}
        edges = self.edges
        edge_keys = self.parent[1 : self.n] * self.vocab.size + self.last_tok[1 : self.n]  # every node's edge
        for name in _NODE_FIELDS:
            delattr(self, name)
        del self.edges
        if sum(a.nbytes for a in arrays.values()) + edges.nbytes > _SPARE_MAX_BYTES:
            return
        edges.clear(edge_keys)
        with _SPARE_LOCK:
            _SPARE[:] = [(arrays, edges)]

    def _alloc(self, m: int) -> np.ndarray:
        """Ids for ``m`` new nodes (storage grown when full)."""
        lo = self._reserve(m)
        return np.arange(lo, lo + m, dtype=np.int64)

    def _reserve(self, m: int) -> int:
        """The first of ``m`` new consecutive node ids (storage grown when full)."""
        need = self.n + m
        cap = len(self.parent)
        if need > cap:
            while cap < need:
                cap *= 4
            for name in _NODE_FIELDS:
                arr = getattr(self, name)
                new = np.empty((cap, *arr.shape[1:]), dtype=arr.dtype)
                new[: self.n] = arr[: self.n]
                setattr(self, name, new)
        lo = self.n
        self.n = need
        return lo

    def word_hash(self, nodes: np.ndarray) -> np.ndarray:
        """Hash of the partial word of each node (as a word)."""
        return _mix(self.phash[nodes], self.plen[nodes].astype(np.uint64))

    def final_key(self, nodes: np.ndarray) -> np.ndarray:
        """Hash of the final text (completed words plus the partial word) of each node."""
        has = self.plen[nodes] > 0
        return np.where(has, _mix(self.thash[nodes], self.word_hash(nodes)), self.thash[nodes])

    def texts(self, nodes: np.ndarray) -> list[str]:
        """The whitespace-normalised text (completed words and partial word) of each node: the labels of
        all nodes are gathered up the parent chains together, then joined per node."""
        if len(nodes) <= 4:  # a few nodes: walking each chain in Python costs less than the gathers
            return [self._text_of(int(nd)) for nd in nodes.tolist()]
        cur = nodes.astype(np.int64)
        V = self.vocab.size
        toks: list[np.ndarray] = []  # last label of each node's ancestors, deepest first (V: above the root)
        while True:
            up = cur > self.root
            if not up.any():
                break
            toks.append(np.where(up, self.last_tok[cur], V))
            cur = np.where(up, self.parent[cur], self.root)
        if not toks:
            return ["" for _ in range(len(nodes))]
        pieces = self.text_piece[np.stack(toks[::-1], axis=1)]  # shape: (n, depth)
        return [" ".join("".join(row).split()) for row in pieces.tolist()]

    def _text_of(self, node: int) -> str:
        """:meth:`texts` of one node, walking its parent chain in Python."""
        toks: list[int] = []
        while node > self.root:
            toks.append(self.last_tok.item(node))
            node = self.parent.item(node)
        piece = self.text_piece
        return " ".join("".join([piece[t] for t in reversed(toks)]).split())

    def partial_word(self, node: int, word_hash: int) -> str:
        """The partial word of ``node`` (of hash ``word_hash``, see :meth:`word_hash`) as a string: the pieces
        of the labels up the parent chain to the one that started the word (or to the root)."""
        word = self.word_text.get(word_hash)
        if word is None and self.uni_trie is not None:
            state = self.uni.item(node)  # the unigram-trie state spells a partial word that starts a word
            if state >= 0:
                word = self.word_text[word_hash] = self.uni_trie.string(state)
        if word is None:
            pieces: list[str] = []
            while node != self.root:
                tok = self.last_tok.item(node)
                pieces.append(self.clean[tok])
                if self.starts_word_list[tok]:
                    break
                node = self.parent.item(node)
            word = "".join(reversed(pieces))
            self.word_text[word_hash] = word
        return word

    def _lm_steps(self, sids: list[int], hashes: list[int], nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """LM context ids after each (context ``sids[j]``, partial word of ``nodes[j]`` of hash ``hashes[j]``)
        pair and the fused scores of the words (arrays); the pairs not seen before in this call are scored
        in one batch, and get new context ids in order of first occurrence."""
        cache = self.lm_cache
        keys = [sid << 64 | h for sid, h in zip(sids, hashes, strict=True)]
        found: list[int | None] = list(map(cache.get, keys))
        if None in found:
            assert self.lm is not None
            states = self.states
            base = len(states)
            if found.count(None) == len(keys) and len(set(keys)) == len(keys):  # all new, all distinct
                rows: list[int] = list(range(len(keys)))
                fresh = range(base, base + len(keys))
                cache.update(zip(keys, fresh, strict=True))
                found = list(fresh)
            else:
                rows = []  # the first row of each new pair, which gets context id base + its rank
                for j, sid in enumerate(found):
                    if sid is None:
                        sid = cache.setdefault(keys[j], base + len(rows))  # an earlier row may hold the pair
                        if sid == base + len(rows):
                            rows.append(j)
                        found[j] = sid
            known = self.word_text  # words met before, without a call (the empty word takes one)
            words = [known.get(hashes[j]) or self.partial_word(nodes.item(j), hashes[j]) for j in rows]
            deltas, new_states = self.lm.score_words([states[sids[j]] for j in rows], words)
            states.extend(new_states)
            if len(states) > len(self.deltas):
                grown = np.empty(max(len(states), 2 * len(self.deltas)))
                grown[: len(self.deltas)] = self.deltas
                self.deltas = grown
            self.deltas[base : len(states)] = deltas
        new_sids = np.array(found, dtype=np.int64)
        return new_sids, self.deltas[new_sids]

    # ------------------------------------------------------------------ children
    def children(self, src: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """Child node of each (``src``, ``tok``) row (``tok`` never blank): ``src`` itself for a delimiter that
        changes nothing, else the node stored for the pair, created (once per distinct pair) when missing.
        New nodes are numbered in the order of the last row asking for each pair (as
        :meth:`children_list` does)."""
        key = src * self.vocab.size + tok
        out = self.edges.get(key)
        loop = (self.loop_tok[tok] & (self.plen[src] == 0)).nonzero()[0]
        out[loop] = src[loop]
        miss = (out < 0).nonzero()[0]
        if len(miss):
            mkey = key[miss]
            distinct, rev_first = np.unique(mkey[::-1], return_index=True)  # shape: (d,) each
            last = len(mkey) - 1 - rev_first  # shape: (d,) last row (within miss) asking for each pair
            order = np.argsort(last)
            rows = miss[last[order]]  # the rows that create the nodes, in row order
            new = self._create(src[rows], tok[rows])
            self.edges.put(key[rows], new)
            ids = np.empty(len(distinct), dtype=np.int64)
            ids[order] = new
            out[miss] = ids[np.searchsorted(distinct, mkey)]
        return out

    def small_path_ok(self) -> bool:
        """Whether :meth:`children_list` can create nodes here (character tries, if any, are dense tables)."""
        return self._small_ok

    def children_list(self, src: list[int], tok: list[int]) -> list[int]:
        """:meth:`children` of a few rows as lists, in plain Python: the same nodes, created in the same
        order with the same fields (see :meth:`_create_list`), so a search may mix both."""
        V = self.vocab.size
        edges = self.edges
        plen = self.plen
        loop = self.loop_list
        out: list[int] = []
        last: dict[int, int] = {}  # missing (node, label) key -> last row asking for it
        for j, (s, t) in enumerate(zip(src, tok, strict=True)):
            if loop[t] and plen.item(s) == 0:
                out.append(s)
                continue
            key = s * V + t
            c = edges.get_one(key)
            if c < 0:
                last[key] = j
            out.append(c)
        if last:
            # children() numbers new nodes by the last row asking for each (node, label) pair, in row order
            firsts = sorted(last.values())
            ids = self._create_list([src[j] for j in firsts], [tok[j] for j in firsts])
            made = {src[j] * V + tok[j]: i for j, i in zip(firsts, ids, strict=True)}
            for key, i in made.items():
                edges.put_one(key, i)
            out = [c if c >= 0 else made[s * V + t] for c, s, t in zip(out, src, tok, strict=True)]
        return out

    def _create_list(self, src: list[int], tok: list[int]) -> list[int]:
        """:meth:`_create` in plain Python for a few nodes: the same field values (hashes as uint64
        arithmetic on ints, scores by the same float64 operations in the same order)."""
        m = len(src)
        lo = self._reserve(m)
        lm, hot_trie = self.lm, self.hot_trie
        scored = lm is not None or hot_trie is not None
        sw_list, piece_len = self.starts_word_list, self.piece_len_list
        chars_list, codes_list = self.piece_chars_list, self.piece_codes_list
        rows: list[list[Any]] = []  # per node: sw, src plen, whist, wkey, thash, tscore, sid
        completes: list[int] = []
        hashes: list[int] = []
        for s, t in zip(src, tok, strict=True):
            sw, sp = sw_list[t], self.plen.item(s)
            whist = self.whist[s].tolist()
            wkey, thash = self.wkey.item(s), self.thash.item(s)
            tscore = self.tscore.item(s) if scored else 0.0
            sid = self.sid.item(s) if scored else 0
            if sw and sp > 0:  # completes the partial word
                word_hash = _mix_int(self.phash.item(s), sp)
                whist = [*whist[1:], word_hash]
                wkey = whist[0]
                for h in whist[1:]:
                    wkey = _mix_int(wkey, h)
                thash = _mix_int(thash, word_hash)
                if hot_trie is not None:
                    hs = self.hotst.item(s)
                    tscore = tscore + (self.hot.weight if hs >= 0 and hot_trie.is_word[hs] else 0.0)
                completes.append(len(rows))
                hashes.append(word_hash)
            rows.append([sw, sp, whist, wkey, thash, tscore, sid])
        if completes and lm is not None:
            c_src = [src[k] for k in completes]
            new_sid, delta = self._lm_steps([rows[k][6] for k in completes], hashes, np.array(c_src))
            for k, sid, d in zip(completes, new_sid.tolist(), delta.tolist(), strict=True):
                rows[k][6] = sid
                rows[k][5] = rows[k][5] + d
        unk = lm.unk_score_offset if lm is not None else 0.0
        uni_table = self.uni_trie.table if self.uni_trie is not None else None
        uni_width = self.uni_trie.width if self.uni_trie is not None else 0
        for k, (s, t) in enumerate(zip(src, tok, strict=True)):
            sw, sp, whist, wkey, thash, tscore, sid = rows[k]
            i = lo + k
            plen = (0 if sw else sp) + piece_len[t]
            phash = 0 if sw else self.phash.item(s)
            for c, code in zip(chars_list[t], codes_list[t], strict=True):
                if c >= 0:
                    phash = _mix_salted_int(phash, code)
            self.parent[i] = s
            self.last_tok[i] = t
            self.plen[i] = plen
            self.phash[i] = phash
            self.whist[i] = whist
            self.wkey[i] = wkey
            self.thash[i] = thash
            self.hhash[i] = _mix_int(wkey, phash)
            if not scored:
                self.tscore[i] = 0.0
                self.score[i] = 0.0
                self.sid[i] = 0
                continue
            partial = 0.0
            if lm is not None:
                uni = -1
                if uni_table is not None:  # the dense-table walk of CharTrie.walk
                    uni = 0 if sw else self.uni.item(s)
                    for c in chars_list[t]:
                        uni = uni_table.item((uni + 1) * uni_width + (c + 2))
                self.uni[i] = uni
                if plen > 0 and uni < 0:
                    partial = unk * (plen / AVG_TOKEN_LEN if plen > AVG_TOKEN_LEN else 1.0)
            if hot_trie is not None:
                hot = self._walk_int(hot_trie, 0 if sw else self.hotst.item(s), chars_list[t])
                self.hotst[i] = hot
                if plen > 0 and hot >= 0:
                    partial = self.hot.weight * plen / hot_trie.min_len.item(hot)
            self.sid[i] = sid
            self.tscore[i] = tscore
            self.score[i] = tscore + partial
        return list(range(lo, lo + m))

    @staticmethod
    def _walk_int(trie: CharTrie, state: int, chars: list[int]) -> int:
        """:meth:`CharTrie.walk` of one state over a label's characters (dense table)."""
        table = trie.table
        assert table is not None
        for c in chars:
            state = table.item((state + 1) * trie.width + (c + 2))
        return state

    def _create(self, src: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """Store the nodes ``src`` + ``tok`` (distinct pairs without a node yet); return their ids.

        Fields inherited from ``src`` are gathered straight into the new rows, then the rows of nodes
        that complete a word are updated. Without an LM and hotwords the scores and the LM context stay 0
        (no trie states are kept)."""
        m = len(src)
        ids = self._alloc(m)
        lo = int(ids[0])
        new = slice(lo, lo + m)
        scored = self.lm is not None or self.hot_trie is not None
        sw = self.vocab.starts_word[tok]
        src_plen = self.plen[src]
        self.parent[new] = src
        self.last_tok[new] = tok
        inherited = ("whist", "wkey", "thash", "tscore", "sid") if scored else ("whist", "wkey", "thash")
        for name in inherited:
            arr = getattr(self, name)
            arr[new] = arr[src]
        completes = (sw & (src_plen > 0)).nonzero()[0]
        if len(completes):
            csrc = src[completes]
            rows = completes + lo  # the new nodes that complete a word
            word_hash = self.word_hash(csrc)
            c_whist = np.concatenate((self.whist[rows, 1:], word_hash[:, None]), axis=1)  # shape: (c, H)
            self.whist[rows] = c_whist
            self.wkey[rows] = _words_key(c_whist)
            self.thash[rows] = _mix(self.thash[rows], word_hash)
            if self.hot_trie is not None:
                hs = self.hotst[csrc]
                is_hot = (hs >= 0) & self.hot_trie.is_word[np.maximum(hs, 0)]
                self.tscore[rows] += np.where(is_hot, self.hot.weight, 0.0)
            if self.lm is not None:
                new_sid, delta = self._lm_steps(self.sid[rows].tolist(), word_hash.tolist(), csrc)
                self.sid[rows] = new_sid
                self.tscore[rows] += delta
        plen = self.plen[new]  # a view: filled here
        np.add(np.where(sw, 0, src_plen), self.piece_len[tok], out=plen)
        chars = self.piece_chars[tok]  # shape: (m, Lmax)
        codes = self.piece_codes[tok]  # shape: (m, Lmax)
        # hash over characters, not pieces; 0 without a partial word (no character added to 0 or to a
        # prefix without one)
        phash = np.where(sw, np.uint64(0), self.phash[src])
        for j in range(chars.shape[1]):
            phash = np.where(chars[:, j] >= 0, _mix_salted(phash, codes[:, j]), phash)
        self.phash[new] = phash
        self.hhash[new] = _history_key(self.wkey[new], phash)
        if not scored:
            self.tscore[new] = 0.0
            self.score[new] = 0.0
            self.sid[new] = 0
            return ids
        partial = np.zeros(m)
        if self.lm is not None:
            if self.uni_trie is not None:
                uni = np.where(sw, 0, self.uni[src])
                for j in range(chars.shape[1]):
                    uni = self.uni_trie.walk(uni, chars[:, j])
            else:
                uni = np.full(m, -1, dtype=np.int64)
            self.uni[new] = uni
            scale = np.where(plen > AVG_TOKEN_LEN, plen / AVG_TOKEN_LEN, 1.0)
            partial = np.where((plen > 0) & (uni < 0), self.lm.unk_score_offset * scale, 0.0)
        if self.hot_trie is not None:
            hot = np.where(sw, 0, self.hotst[src])
            for j in range(chars.shape[1]):
                hot = self.hot_trie.walk(hot, chars[:, j])
            self.hotst[new] = hot
            in_hot = (plen > 0) & (hot >= 0)
            bonus = self.hot.weight * plen / self.hot_trie.min_len[np.maximum(hot, 0)]
            partial = np.where(in_hot, bonus, partial)
        np.add(self.tscore[new], partial, out=self.score[new])
        return ids

    # ------------------------------------------------------------------ queries
    def history_hash(self, nodes: np.ndarray) -> np.ndarray:
        """A 64-bit key of (last ``history`` words, partial word) per node, for history pruning."""
        return self.hhash[nodes]

    def final_many(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`final`: end-of-utterance fused scores and LM context ids of ``nodes``
        (the LM state is ``self.states[sid]``; context ids are 0 without an LM)."""
        score = self.tscore[nodes]
        sid = self.sid[nodes]
        has_partial = self.plen[nodes] > 0
        if self.hot_trie is not None:
            hs = self.hotst[nodes]
            is_hot = has_partial & (hs >= 0) & self.hot_trie.is_word[np.maximum(hs, 0)]
            score = np.where(is_hot, score + self.hot.weight, score)
        lm = self.lm
        if lm is None:
            return score, np.zeros(len(nodes), dtype=np.int64)
        need = has_partial if not self.empty_word_at_end else np.ones(len(nodes), dtype=bool)
        idx = np.flatnonzero(need)
        if len(idx):
            # a node without a partial word scores the empty word
            nd = nodes[idx]
            new_sid, delta = self._lm_steps(sid[idx].tolist(), self.word_hash(nd).tolist(), nd)
            sid[idx] = new_sid  # fancy indexing above made copies
            score[idx] += delta
        usid, inv = np.unique(sid, return_inverse=True)
        states = self.states
        eos = np.array(lm.score_eos_many([states[x] for x in usid.tolist()]), dtype=np.float64)
        return score + eos[inv.reshape(-1)], sid
