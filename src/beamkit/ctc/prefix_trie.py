"""Prefix store for the vectorised CTC search: integer nodes with array attributes.

A node is a normalised prefix: completed words plus a partial word. Nodes form a tree (parent, last label)
with a dense child table (``child[node * V + label]``, 0: no child yet), so finding the child of a
(node, label) pair is one gather; the children a frame asks for that do not exist yet are created in bulk
with numpy, and kept for the rest of the call (one node per prefix: equal prefixes always share an id).
Strings are never built on the hot path: a partial word is identified by a 64-bit hash of its labels, a
completed-word sequence by a hash chain, and partial-word scores come from walking character tries kept
as sorted key arrays (:class:`CharTrie`): one for the LM unigrams (unknown-prefix penalty) and one for
hotwords. Only an LM query for a new (LM context, word) pair goes through Python; text is rebuilt from the
parent chain for the final hypotheses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

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
    "thash",
    "hhash",
)
_HASH_MUL = np.uint64(0x100000001B3)
_HASH_SALT = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))


class CharTrie:
    """A character trie as a sorted array of ``state * A + char`` keys, walked with ``searchsorted``.

    State 0 is the root; ``-1`` means "left the trie" (no word has this prefix). ``min_len[state]`` is the
    length of the shortest word below ``state``;
    ``is_word[state]`` whether a word ends there.
    """

    def __init__(self, words: Iterable[str], alphabet: dict[str, int]) -> None:
        """Index ``words`` over ``alphabet`` (characters outside it end the walk)."""
        self.alphabet_size = len(alphabet) + 1
        trans: dict[int, int] = {}
        min_len = [1 << 30]
        is_word = [False]
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
                state = nxt
            else:
                min_len[state] = min(min_len[state], len(word))
                is_word[state] = True
        keys = np.array(sorted(trans), dtype=np.int64)
        self.keys = keys  # shape: (K,)
        self.values = np.array([trans[int(k)] for k in keys], dtype=np.int64)  # shape: (K,)
        self.min_len = np.array(min_len, dtype=np.float64)  # shape: (states,)
        self.is_word = np.array(is_word, dtype=bool)  # shape: (states,)

    def walk(self, states: np.ndarray, chars: np.ndarray) -> np.ndarray:
        """Advance ``states`` by ``chars`` (``-1``: no character, state kept; ``-2``: unknown character)."""
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
    h = (a ^ (b * _HASH_SALT[0])) * _HASH_MUL  # uint64 arrays wrap around silently
    return h ^ (h >> np.uint64(29))


def _history_key(phash: np.ndarray, plen: np.ndarray, whist: np.ndarray) -> np.ndarray:
    """A 64-bit key of (partial word, last words) per node, for history pruning. ``whist``: ``(m, H)``."""
    h = _mix(phash, plen.astype(np.uint64))
    for j in range(whist.shape[1]):
        h = _mix(h, whist[:, j])
    return h


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
        self.uni_trie = None
        if lm is not None and lm.prefix_index is not None:
            cache_key = tuple(sorted(alphabet.items()))
            cached = getattr(lm, "_char_trie_cache", None)
            if cached is None or cached[0] != cache_key:
                cached = (cache_key, CharTrie(lm.unigrams, alphabet))
                lm._char_trie_cache = cached  # type: ignore[attr-defined]
            self.uni_trie = cached[1]
        self.hot_trie = CharTrie(hotwords.words, alphabet) if hotwords else None
        # node arrays
        cap = max(1 << 10, int(capacity))
        self.n = 0
        self.parent = np.zeros(cap, dtype=np.int64)
        self.last_tok = np.zeros(cap, dtype=np.int64)
        self.plen = np.zeros(cap, dtype=np.int64)  # characters in the partial word
        self.phash = np.zeros(cap, dtype=np.uint64)  # hash of the partial word's labels
        self.uni = np.zeros(cap, dtype=np.int64)  # unigram-trie state of the partial word (-1: none)
        self.hotst = np.zeros(cap, dtype=np.int64)  # hotword-trie state of the partial word
        self.tscore = np.zeros(cap, dtype=np.float64)  # fused score of the completed words
        self.score = np.zeros(cap, dtype=np.float64)  # tscore + partial-word score
        self.sid = np.zeros(cap, dtype=np.int64)  # LM context id of the completed words
        self.whist = np.zeros((cap, self.history), dtype=np.uint64)  # hashes of the last words
        self.thash = np.zeros(cap, dtype=np.uint64)  # hash chain of all completed words
        self.hhash = np.zeros(cap, dtype=np.uint64)  # history-pruning key (see _history_key)
        self.child = np.zeros(cap * V, dtype=np.int32)  # child id + 1 per (node, label); 0: none yet
        # labels that leave a prefix without a partial word unchanged (a delimiter, an empty BPE piece)
        self.loop_tok = vocab.starts_word & (self.piece_len == 0)  # shape: (V,)
        # LM contexts: id -> state; (context id, word hash) -> (new id, score delta)
        self.states: list[Any] = [lm.start_state() if lm is not None else None]
        self.lm_cache: dict[tuple[int, int], tuple[int, float]] = {}
        self.word_text: dict[int, str] = {}  # word hash -> the word (partial words that completed)
        self.text_cache: dict[int, str] = {}
        self.root = int(self._alloc(1)[0])
        self.parent[self.root] = -1
        self.last_tok[self.root] = vocab.space  # -1 without a delimiter: no label repeats the root
        root = np.array([self.root])
        self.hhash[self.root] = _history_key(self.phash[root], self.plen[root], self.whist[root])[0]

    # ------------------------------------------------------------------ storage
    def _alloc(self, m: int) -> np.ndarray:
        need = self.n + m
        cap = len(self.parent)
        if need > cap:
            while cap < need:
                cap *= 4
            V = self.vocab.size
            for name in _NODE_FIELDS:
                arr = getattr(self, name)
                new = np.zeros((cap, *arr.shape[1:]), dtype=arr.dtype)
                new[: self.n] = arr[: self.n]
                setattr(self, name, new)
            child = np.zeros(cap * V, dtype=np.int32)
            child[: self.n * V] = self.child[: self.n * V]
            self.child = child
        ids = np.arange(self.n, need, dtype=np.int64)
        self.n = need
        return ids

    def partial_string(self, node: int) -> str:
        """The partial word of ``node`` (walks up the parents)."""
        parts: list[str] = []
        starts_word = self.vocab.starts_word
        while self.plen[node] > 0:
            tok = int(self.last_tok[node])
            parts.append(self.clean[tok])
            if starts_word[tok]:
                break
            node = int(self.parent[node])
        return "".join(reversed(parts))

    def word_hash(self, nodes: np.ndarray) -> np.ndarray:
        """Hash of the partial word of each node (as a word)."""
        return _mix(self.phash[nodes], self.plen[nodes].astype(np.uint64))

    def final_key(self, nodes: np.ndarray) -> np.ndarray:
        """Hash of the final text (completed words plus the partial word) of each node."""
        has = self.plen[nodes] > 0
        return np.where(has, _mix(self.thash[nodes], self.word_hash(nodes)), self.thash[nodes])

    def text(self, node: int) -> str:
        """The whitespace-normalised text of ``node`` (completed words and partial word)."""
        return " ".join(self._raw_text(node).split())

    def _raw_text(self, node: int) -> str:
        cache = self.text_cache
        path: list[int] = []
        while node > 0 and node not in cache:
            path.append(node)
            node = int(self.parent[node])
        text = cache.get(node, "")
        starts_word = self.vocab.starts_word
        for nd in reversed(path):
            tok = int(self.last_tok[nd])
            text = text + (" " + self.clean[tok] if starts_word[tok] else self.clean[tok])
            cache[nd] = text
        return text

    def _lm_step(self, sid: int, word_hash: int, node: int, word: str | None = None) -> tuple[int, float]:
        """LM context id after ``sid`` + the word ending at ``node``; the fused score of that word."""
        key = (sid, word_hash)
        hit = self.lm_cache.get(key)
        if hit is None:
            assert self.lm is not None
            if word is None:
                word = self.word_text.get(word_hash)
                if word is None:
                    word = self.word_text[word_hash] = self.partial_string(node)
            delta, state = self.lm.score_word(self.states[sid], word)
            hit = (len(self.states), delta)
            self.states.append(state)
            self.lm_cache[key] = hit
        return hit

    # ------------------------------------------------------------------ children
    def children(self, src: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """Child node of each (``src``, ``tok``) row (``tok`` never blank): ``src`` itself for a delimiter that
        changes nothing, else the node stored for the pair, created (once per distinct pair) when missing."""
        key = src * self.vocab.size + tok
        out = self.child[key].astype(np.int64) - 1
        loop = np.flatnonzero(self.loop_tok[tok] & (self.plen[src] == 0))
        out[loop] = src[loop]
        miss = np.flatnonzero(out < 0)
        if len(miss):
            # number the distinct missing pairs: mark each slot with a row that asks for it (duplicates read
            # back one winner), create a node per winner, then store the real ids
            mkey = key[miss]
            self.child[mkey] = -1 - np.arange(len(miss), dtype=np.int32)
            winner = -1 - self.child[mkey].astype(np.int64)
            is_first = winner == np.arange(len(miss))
            first = miss[is_first]
            new = self._create(src[first], tok[first])
            self.child[key[first]] = new + 1
            out[miss] = new[(np.cumsum(is_first) - 1)[winner]]
        return out

    def _create(self, src: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """Store the nodes ``src`` + ``tok`` (distinct pairs without a node yet); return their ids.

        Fields that stay 0 without an LM and hotwords (LM context, scores, trie states) are not written:
        new storage is zero-filled."""
        m = len(src)
        ids = self._alloc(m)
        new = slice(int(ids[0]), int(ids[0]) + m)
        scored = self.lm is not None or self.hot_trie is not None
        sw = self.vocab.starts_word[tok]
        src_plen = self.plen[src]
        whist = self.whist[src]  # shape: (m, H) (a copy)
        thash = self.thash[src]
        if scored:
            tscore = self.tscore[src]
            sid = self.sid[src]
        completes = np.flatnonzero(sw & (src_plen > 0))
        if len(completes):
            csrc = src[completes]
            word_hash = self.word_hash(csrc)
            whist[completes] = np.concatenate((whist[completes, 1:], word_hash[:, None]), axis=1)
            thash[completes] = _mix(thash[completes], word_hash)
            if self.hot_trie is not None:
                hs = self.hotst[csrc]
                is_hot = (hs >= 0) & self.hot_trie.is_word[np.maximum(hs, 0)]
                tscore[completes] += np.where(is_hot, self.hot.weight, 0.0)
            if self.lm is not None:
                for j, (s0, wh, nd) in enumerate(
                    zip(sid[completes].tolist(), word_hash.tolist(), csrc.tolist(), strict=True)
                ):
                    new_sid, delta = self._lm_step(s0, wh, nd)
                    sid[completes[j]] = new_sid
                    tscore[completes[j]] += delta
        plen = np.where(sw, 0, src_plen) + self.piece_len[tok]
        chars = self.piece_chars[tok]  # shape: (m, Lmax)
        phash = np.where(sw, np.uint64(0), self.phash[src])  # hash over characters, not pieces
        for j in range(chars.shape[1]):
            cj = chars[:, j]
            phash = np.where(cj >= 0, _mix(phash, (cj + 1).astype(np.uint64)), phash)
        phash[plen == 0] = 0
        self.parent[new] = src
        self.last_tok[new] = tok
        self.plen[new] = plen
        self.phash[new] = phash
        self.whist[new] = whist
        self.thash[new] = thash
        self.hhash[new] = _history_key(phash, plen, whist)
        if not scored:
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
            self.sid[new] = sid
        if self.hot_trie is not None:
            hot = np.where(sw, 0, self.hotst[src])
            for j in range(chars.shape[1]):
                hot = self.hot_trie.walk(hot, chars[:, j])
            self.hotst[new] = hot
            in_hot = (plen > 0) & (hot >= 0)
            bonus = self.hot.weight * plen / self.hot_trie.min_len[np.maximum(hot, 0)]
            partial = np.where(in_hot, bonus, partial)
        self.tscore[new] = tscore
        self.score[new] = tscore + partial
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
            wh = self.word_hash(nodes[idx])
            new_sid = np.empty(len(idx), dtype=np.int64)
            delta = np.empty(len(idx))
            cache = self.lm_cache
            for j, (s0, h, nd, part) in enumerate(
                zip(sid[idx].tolist(), wh.tolist(), nodes[idx].tolist(), has_partial[idx].tolist(), strict=True)
            ):
                hit = cache.get((s0, h))
                if hit is None:
                    hit = self._lm_step(s0, h, nd, None if part else "")
                new_sid[j], delta[j] = hit
            sid[idx] = new_sid  # fancy indexing above made copies
            score[idx] += delta
        usid, inv = np.unique(sid, return_inverse=True)
        states = self.states
        eos = np.array([lm.score_eos(states[x]) for x in usid.tolist()], dtype=np.float64)
        return score + eos[inv.reshape(-1)], sid
