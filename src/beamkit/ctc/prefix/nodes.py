"""The prefix store of a CTC search: one record per normalised prefix, its children in a hash map.

A node is a prefix: completed words plus a partial word (words are separated by one delimiter; leading,
trailing and repeated delimiters collapse, a BPE ``▁`` starts a word). Nodes form a tree (``parent``,
``last`` label); the edge ``(node, label) -> child`` lives in an open-addressing hash map (memory O(nodes),
whatever the vocabulary size). Strings are never built while searching: a partial word is identified by a
64-bit hash of its characters (its length is part of the word's hash), completed words by a hash chain;
texts are rebuilt from the parent chains for the returned hypotheses. The fused score of a node (LM,
unknown-prefix penalty, hotwords) is set when the node is made, by the rules of :mod:`beamkit.ctc.prefix.fusion`.

Everything here is storage and arithmetic on records, compiled by :mod:`beamkit.ctc.jit`.
"""

from __future__ import annotations

import numpy as np

from ..jit import njit
from ..tables import SALT, probe
from .fusion import SCORED, Static, complete_word, partial_score

NODE = np.dtype(
    [
        ("parent", np.int64),  # the prefix without its last label (-1 at the root)
        ("last", np.int64),  # the last label (the root: the delimiter, or -1 without one)
        ("plen", np.int64),  # characters in the partial word
        ("uni", np.int64),  # unigram-trie state of the partial word (-1: no unigram starts so; LM only)
        ("hot", np.int64),  # hotword-trie state of the partial word (-1: no hotword starts so)
        ("sid", np.int64),  # LM context id after the completed words (-1: waiting for an LM query)
        ("phash", np.uint64),  # hash of the partial word's characters (0: none)
        ("wkey", np.uint64),  # key of the last ``history`` completed words
        ("thash", np.uint64),  # hash chain of all completed words
        ("hkey", np.uint64),  # history-pruning key: (last words, partial word)
        ("tscore", np.float64),  # fused score of the completed words
        ("score", np.float64),  # tscore + the partial word's score
    ]
)
EDGE_FREE = -1  # an empty slot of the edge map
EDGE_MAKING = -2  # a child being made in the current frame

MUL = np.uint64(0x100000001B3)
SHIFT = np.uint64(29)


@njit
def mix_salted(a: np.uint64, b_salted: np.uint64) -> np.uint64:
    """Combine hash ``a`` with ``b * SALT`` (order-sensitive; uint64 arithmetic wraps)."""
    h = (a ^ b_salted) * MUL
    return h ^ (h >> SHIFT)


@njit
def mix(a: np.uint64, b: np.uint64) -> np.uint64:
    """Combine two 64-bit hashes (order-sensitive)."""
    return mix_salted(a, b * SALT)


@njit
def word_hash(nodes: np.ndarray, i: int) -> np.uint64:
    """Hash of node ``i``'s partial word as a word (its characters and its length)."""
    return mix(nodes[i].phash, np.uint64(nodes[i].plen))


@njit
def final_key(nodes: np.ndarray, i: int) -> np.uint64:
    """Hash of node ``i``'s final text (completed words plus the partial word)."""
    if nodes[i].plen > 0:
        return mix(nodes[i].thash, word_hash(nodes, i))
    return nodes[i].thash


@njit
def edge_find(ek: np.ndarray, key: np.int64) -> int:
    """Slot of ``key`` in the edge map, or the free slot where it would go."""
    return probe(ek, key, EDGE_FREE)


@njit
def init_root(nodes: np.ndarray, whist: np.ndarray, root_last: int) -> None:
    """Write the root (the empty prefix) as node 0."""
    r = nodes[0]
    r.parent = -1
    r.last = root_last
    r.plen = 0
    r.uni = 0
    r.hot = 0
    r.sid = 0
    r.phash = 0
    r.thash = 0
    whist[0, :] = 0
    h = whist[0, 0]
    for j in range(1, whist.shape[1]):
        h = mix(h, whist[0, j])
    r.wkey = h
    r.hkey = mix(h, np.uint64(0))
    r.tscore = 0.0
    r.score = 0.0


@njit
def make_node(st: Static, nodes: np.ndarray, whist: np.ndarray, wt: np.ndarray, i: int, s: int, t: int) -> bool:
    """Write node ``i`` = node ``s`` + label ``t`` (``t`` not blank). Returns False when the word it completes
    needs an LM query first (the node's ``sid`` is then -1; make it again once the query is answered)."""
    sw = st.starts_word[t]
    sp = nodes[s].plen
    n = nodes[i]
    n.parent = s
    n.last = t
    H = whist.shape[1]
    whist[i, :] = whist[s, :]
    n.wkey = nodes[s].wkey
    n.thash = nodes[s].thash
    scored = st.flags[SCORED]
    n.tscore = nodes[s].tscore if scored else 0.0
    n.sid = nodes[s].sid if scored else 0
    ok = True
    if sw and sp > 0:  # the label closes the partial word
        wh = word_hash(nodes, s)
        for j in range(H - 1):
            whist[i, j] = whist[i, j + 1]
        whist[i, H - 1] = wh
        key = whist[i, 0]
        for j in range(1, H):
            key = mix(key, whist[i, j])
        n.wkey = key
        n.thash = mix(n.thash, wh)
        if scored:
            ok = complete_word(st, wt, nodes[s].hot, wh, n)
    plen = (0 if sw else sp) + st.piece_len[t]
    n.plen = plen
    ph = np.uint64(0) if sw else nodes[s].phash
    for j in range(st.piece_chars.shape[1]):
        if st.piece_chars[t, j] >= 0:
            ph = mix_salted(ph, st.piece_codes[t, j])
    n.phash = ph
    n.hkey = mix(n.wkey, ph)
    if not scored:
        n.uni = 0
        n.hot = 0
        n.score = 0.0
        return True
    partial_score(st, n, 0 if sw else nodes[s].uni, 0 if sw else nodes[s].hot, t)
    return ok


@njit
def node_labels(nodes: np.ndarray, targets: np.ndarray, root: int) -> tuple[np.ndarray, np.ndarray]:
    """The labels on the path to each target node, first label first, flat with offsets
    (``labels[offsets[j]:offsets[j + 1]]`` belong to ``targets[j]``)."""
    offsets = np.zeros(len(targets) + 1, dtype=np.int64)
    for j in range(len(targets)):
        d = 0
        x = targets[j]
        while x != root:
            d += 1
            x = nodes[x].parent
        offsets[j + 1] = offsets[j] + d
    labels = np.empty(offsets[-1], dtype=np.int64)
    for j in range(len(targets)):
        x = targets[j]
        k = offsets[j + 1]
        while x != root:
            k -= 1
            labels[k] = nodes[x].last
            x = nodes[x].parent
    return labels, offsets
