"""The compiled frame loop of :mod:`beamkit.ctc.lexicon.search` (numba; see :mod:`beamkit.ctc.jit`).

The search's state lives in arrays: the beam (one row per hypothesis), the back-pointers of every frame, the
lexicon trie in CSR form, and the LM's tree of states as integer ids in an open-addressing table mapping
``(state id, word or token index)`` to the child's id and its score. :func:`run_lexicon_frames` decodes frames until the
emissions end, an LM score is missing (a language model in Python: the caller asks it and resumes the same frame)
or the table needs to grow. The arithmetic is the interpreted search's, operation for operation.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..jit import njit, njit_inline
from ..ngram import NGramArrays, backoff_score
from ..tables import home_slot, next_slot

DONE, MISSES, GROW = 0, 1, 2  # run_lexicon_frames's status
EMPTY = -1  # an unused slot of the LM table
NO_LM, PYTHON_LM, ARRAY_LM = 0, 1, 2  # Table.meta[3]: no LM (scores 0), a LM in Python, a compiled ARPA model


class LMArrays(NamedTuple):
    """A compiled ARPA model as the loop reads it (:mod:`beamkit.ctc.ngram`): the n-gram arrays, the model's word
    id of each word (lexicon) or token (lexicon-free) index, and the n-gram state of every LM state id."""

    ngram: NGramArrays
    word_ids: np.ndarray  # shape: (indices,) int64, index -> the model's word id (0: <unk>)
    context: np.ndarray  # shape: (state ids,) int64, LM state id -> n-gram state (grown with the table)


class TrieArrays(NamedTuple):
    """A lexicon trie as arrays (node 0 is the root; ``n_nodes == 0``: lexicon-free)."""

    child_start: np.ndarray  # shape: (n_nodes + 1,) int64, CSR offsets into child_token / child_node
    child_token: np.ndarray  # shape: (n_edges,) int64
    child_node: np.ndarray  # shape: (n_edges,) int64
    max_score: np.ndarray  # shape: (n_nodes,) float64, the float32 look-ahead score
    word_start: np.ndarray  # shape: (n_nodes + 1,) int64, CSR offsets into words
    words: np.ndarray  # shape: (n_labels,) int64


class Table(NamedTuple):
    """The LM's transitions: ``key = parent * stride + index + 1`` -> child id and score; ``meta``: [used,
    next free state id, stride, where scores come from (:data:`NO_LM`, :data:`PYTHON_LM`, :data:`ARRAY_LM`),
    misses found]."""

    keys: np.ndarray  # shape: (capacity,) int64, EMPTY where unused
    child: np.ndarray  # shape: (capacity,) int64
    score: np.ndarray  # shape: (capacity,) float64
    meta: np.ndarray  # shape: (5,) int64


class Options(NamedTuple):
    """The float knobs (``values``: beam_threshold, lm_weight, word_score, unk_score, sil_score) and the integer
    ones (``ints``: beam_size, beam_size_token, sil, blank, unk, log_add)."""

    values: np.ndarray  # shape: (5,) float64
    ints: np.ndarray  # shape: (6,) int64


class Beam(NamedTuple):
    """The hypotheses after the last decoded frame (``size[0]`` rows used) and the back-pointers of every
    step (``step[0]``: the step the beam is at; row ``s`` of ``back_*`` holds step ``s``'s hypotheses)."""

    score: np.ndarray  # shape: (beam,) float64
    lm: np.ndarray  # shape: (beam,) int64
    lex: np.ndarray  # shape: (beam,) int64, -1 without a lexicon
    token: np.ndarray  # shape: (beam,) int64
    blank: np.ndarray  # shape: (beam,) bool
    am: np.ndarray  # shape: (beam,) float64
    lm_sum: np.ndarray  # shape: (beam,) float64
    size: np.ndarray  # shape: (1,) int64
    step: np.ndarray  # shape: (1,) int64
    back_token: np.ndarray  # shape: (steps, beam) int64
    back_word: np.ndarray  # shape: (steps, beam) int64
    back_parent: np.ndarray  # shape: (steps, beam) int64


class Work(NamedTuple):
    """Scratch rows for one frame's candidates and the misses found (pairs of state id and index)."""

    score: np.ndarray  # shape: (cap,) float64
    lm: np.ndarray  # shape: (cap,) int64
    lex: np.ndarray  # shape: (cap,) int64
    token: np.ndarray  # shape: (cap,) int64
    word: np.ndarray  # shape: (cap,) int64
    blank: np.ndarray  # shape: (cap,) bool
    am: np.ndarray  # shape: (cap,) float64
    lm_sum: np.ndarray  # shape: (cap,) float64
    parent: np.ndarray  # shape: (cap,) int64
    next: np.ndarray  # shape: (cap,) int64, the next member of a candidate's group
    head: np.ndarray  # shape: (cap,) int64, a group's first member (after merging: its best)
    tail: np.ndarray  # shape: (cap,) int64
    merged: np.ndarray  # shape: (cap,) float64, a group's merged score
    members: np.ndarray  # shape: (cap,) int64, one group's members sorted
    order: np.ndarray  # shape: (cap,) int64, the kept groups sorted
    gkeys: np.ndarray  # shape: (G,) int64, G a power of two >= 2 * cap: the group table's keys
    ggroup: np.ndarray  # shape: (G,) int64
    gstamp: np.ndarray  # shape: (G,) int64, the frame stamp a slot was written in
    stamp: np.ndarray  # shape: (1,) int64
    misses: np.ndarray  # shape: (cap, 2) int64


def new_table(capacity: int, stride: int, external: bool, first_free: int) -> Table:
    """An empty LM table of ``capacity`` slots (a power of two)."""
    return Table(
        np.full(capacity, EMPTY, dtype=np.int64),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.float64),
        np.array([0, first_free, stride, int(external), 0], dtype=np.int64),
    )


@njit_inline
def table_find(keys: np.ndarray, key: int) -> int:
    """The slot holding ``key``, or the empty slot where it would go (as ``-slot - 1``)."""
    mask = keys.shape[0] - 1
    slot = home_slot(key, mask)
    while True:
        k = keys[slot]
        if k == key:
            return slot
        if k == EMPTY:
            return -slot - 1
        slot = next_slot(slot, mask)


@njit
def table_put(
    keys: np.ndarray, child: np.ndarray, score: np.ndarray, meta: np.ndarray, key: int, c: int, s: float
) -> None:
    """Insert ``key`` -> (c, s) (the key must be absent)."""
    slot = -table_find(keys, key) - 1
    keys[slot] = key
    child[slot] = c
    score[slot] = s
    meta[0] += 1


@njit
def table_put_many(
    keys: np.ndarray,
    child: np.ndarray,
    score: np.ndarray,
    meta: np.ndarray,
    new: np.ndarray,
    c: np.ndarray,
    s: np.ndarray,
) -> None:
    """Insert the (absent, distinct) keys ``new`` -> (``c``, ``s``) in one call."""
    for i in range(new.shape[0]):
        table_put(keys, child, score, meta, new[i], c[i], s[i])


@njit
def table_move(keys: np.ndarray, child: np.ndarray, score: np.ndarray, into: Any) -> None:
    """Copy every entry into the (larger, empty) table ``into``."""
    for i in range(keys.shape[0]):
        if keys[i] != EMPTY:
            table_put(into.keys, into.child, into.score, into.meta, keys[i], child[i], score[i])


@njit_inline
def _lm_step(
    table: Table, misses: np.ndarray, lm: LMArrays, parent: int, index: int, n_miss: int
) -> tuple[int, float, int]:
    """The child of LM state ``parent`` after ``index`` (-1: the end of sentence) and its score; -1 when a Python
    LM has not scored it yet (recorded as a miss). Without a LM the child is made with score 0; with a compiled
    ARPA model it is made with the model's score (index -1: ``</s>``)."""
    keys, child, score, meta = table.keys, table.child, table.score, table.meta
    key = parent * meta[2] + index + 1
    slot = table_find(keys, key)
    if slot >= 0:
        return child[slot], score[slot], n_miss
    if meta[3] == PYTHON_LM:
        if n_miss < misses.shape[0]:
            misses[n_miss, 0] = parent
            misses[n_miss, 1] = index
        return -1, 0.0, n_miss + 1
    c = meta[1]
    meta[1] += 1
    s = 0.0
    if meta[3] == ARRAY_LM:
        word = lm.ngram.sizes[3] if index < 0 else lm.word_ids[index]
        s, lm.context[c] = backoff_score(lm.ngram, lm.context[parent], word)
    slot = -slot - 1
    keys[slot] = key
    child[slot] = c
    score[slot] = s
    meta[0] += 1
    return c, s, n_miss


@njit
def lm_finish(table: Table, misses: np.ndarray, lm: LMArrays, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The end-of-sentence state and score of each LM state in ``parents`` (no LM or a compiled model)."""
    ids = np.empty(parents.shape[0], dtype=np.int64)
    scores = np.empty(parents.shape[0], dtype=np.float64)
    for i in range(parents.shape[0]):
        ids[i], scores[i], _ = _lm_step(table, misses, lm, parents[i], -1, 0)
    return ids, scores


@njit_inline
def _f32(x: float) -> float:
    return float(np.float32(x))


@njit_inline
def _add(cand: tuple, n: int, best: float, thr: float, entry: tuple) -> tuple[int, float]:
    """flashlight's candidatesAdd: track the best; keep the candidate ``entry`` if within the threshold of it.
    ``cand``: the candidate arrays (score, lm, lex, token, word, blank, am, lm_sum, parent), unpacked once per
    frame loop; ``entry``: one value for each, in that order (inlined: the tuple costs nothing)."""
    score, lm, lex, token, word, blank, am, lm_sum, parent = entry
    if score >= best:
        best = score
    if score >= best - thr:
        c_score, c_lm, c_lex, c_token, c_word, c_blank, c_am, c_lm_sum, c_parent = cand
        c_score[n] = score
        c_lm[n] = lm
        c_lex[n] = lex
        c_token[n] = token
        c_word[n] = word
        c_blank[n] = blank
        c_am[n] = am
        c_lm_sum[n] = lm_sum
        c_parent[n] = parent
        n += 1
    return n, best


@njit
def run_lexicon_frames(
    emissions: np.ndarray, start: int, beam: Any, trie: Any, table: Any, options: Any, work: Any, lm: LMArrays
) -> tuple[int, int]:  # noqa: E501
    """Decode frames ``start ..`` of ``emissions`` (shape: (T, N) float32); return (status, next frame)."""
    thr, w, word_score, unk_score, sil_score = (
        options.values[0],
        options.values[1],
        options.values[2],
        options.values[3],
        options.values[4],
    )
    beam_size, k_tokens, sil, blank_id, unk, log_add = (
        options.ints[0],
        options.ints[1],
        options.ints[2],
        options.ints[3],
        options.ints[4],
        options.ints[5],
    )
    lexicon = trie.max_score.shape[0] > 0
    allow_unk = unk_score > -math.inf
    T, N = emissions.shape
    k = min(k_tokens, N)
    cap = work.score.shape[0]
    cand = (work.score, work.lm, work.lex, work.token, work.word, work.blank, work.am, work.lm_sum, work.parent)
    misses = work.misses
    b_score, b_lm, b_lex, b_token, b_blank, b_am, b_lm_sum = (
        beam.score,
        beam.lm,
        beam.lex,
        beam.token,
        beam.blank,
        beam.am,
        beam.lm_sum,
    )
    child_start, child_token, child_node = trie.child_start, trie.child_token, trie.child_node
    max_score, word_start, words = trie.max_score, trie.word_start, trie.words
    for t in range(start, T):
        if 2 * (table.meta[0] + cap) > table.keys.shape[0]:
            return GROW, t
        row = emissions[t]
        if N > k:
            order = np.argsort(-row, kind="mergesort")[:k]
        else:
            order = np.arange(N)
        tried = np.zeros(N, dtype=np.bool_)
        for r in range(k):
            tried[order[r]] = True
        n = 0
        best = -math.inf
        n_miss = 0
        for h in range(beam.size[0]):
            pscore, plm, plex, ptok = b_score[h], b_lm[h], b_lex[h], b_token[h]
            pblank, pam, plmsum = b_blank[h], b_am[h], b_lm_sum[h]
            if not lexicon:
                for r in range(k):
                    tok = order[r]
                    e = float(row[tok])
                    score = pscore + e
                    if tok == sil:
                        score += sil_score
                    if tok != blank_id and (tok != ptok or pblank):
                        c, s, n_miss = _lm_step(table, misses, lm, plm, tok, n_miss)
                        if c < 0:
                            continue
                        n, best = _add(
                            cand, n, best, thr, (score + w * s, c, -1, tok, -1, False, pam + e, plmsum + s, h)
                        )
                    else:
                        n, best = _add(
                            cand, n, best, thr, (score, plm, -1, tok, -1, tok == blank_id, pam + e, plmsum, h)
                        )
                continue
            at_root = plex == 0
            lex_max = 0.0 if at_root else max_score[plex]
            c0, c1 = child_start[plex], child_start[plex + 1]
            for j in range(c0, c1):  # the node's children among the frame's tried tokens
                tok = child_token[j]
                if tok >= N or not tried[tok]:
                    continue
                lex = child_node[j]
                e = float(row[tok])
                score = pscore + e
                if tok == sil:
                    score += sil_score
                if pblank or tok != ptok:
                    if child_start[lex + 1] > child_start[lex]:
                        s = _f32(max_score[lex] - lex_max)
                        n, best = _add(
                            cand, n, best, thr, (score + w * s, plm, lex, tok, -1, False, pam + e, plmsum + s, h)
                        )
                w0, w1 = word_start[lex], word_start[lex + 1]
                for j in range(w0, w1):
                    if at_root and ptok == tok:
                        continue
                    label = words[j]
                    c, s, n_miss = _lm_step(table, misses, lm, plm, label, n_miss)
                    if c < 0:
                        continue
                    s = _f32(s - lex_max)
                    n, best = _add(
                        cand,
                        n,
                        best,
                        thr,
                        (score + w * s + word_score, c, 0, tok, label, False, pam + e, plmsum + s, h),
                    )
                if w0 == w1 and allow_unk:
                    c, s, n_miss = _lm_step(table, misses, lm, plm, unk, n_miss)
                    if c < 0:
                        continue
                    s = _f32(s - lex_max)
                    n, best = _add(
                        cand, n, best, thr, (score + w * s + unk_score, c, 0, tok, unk, False, pam + e, plmsum + s, h)
                    )
            if not pblank or at_root:
                tok = sil if at_root else ptok
                e = float(row[tok])
                score = pscore + e
                if tok == sil:
                    score += sil_score
                n, best = _add(cand, n, best, thr, (score, plm, plex, tok, -1, False, pam + e, plmsum, h))
            e = float(row[blank_id])
            n, best = _add(cand, n, best, thr, (pscore + e, plm, plex, blank_id, -1, True, pam + e, plmsum, h))
        if n_miss > 0:
            table.meta[4] = n_miss
            return MISSES, t
        store(work, n, best, thr, beam_size, log_add == 1, beam, N)
    return DONE, T


@njit
def store(work: Any, n: int, best: float, thr: float, beam_size: int, log_add: bool, beam: Any, n_tokens: int) -> None:
    """flashlight's candidatesStore: drop candidates below best - threshold, merge equal states (max or log-sum,
    in descending score order), keep the ``beam_size`` best as the next beam (best first, earlier first among
    equals) and record the back-pointers. Groups are found with a hash table stamped per frame."""
    floor = best - thr
    work.stamp[0] += 1
    stamp = work.stamp[0]
    mask = work.gkeys.shape[0] - 1
    n_lex = 1
    for i in range(n):
        if work.lex[i] + 2 > n_lex:
            n_lex = work.lex[i] + 2
    g = 0
    for i in range(n):
        if work.score[i] < floor:
            continue
        key = ((work.lm[i] * n_lex + work.lex[i] + 1) * n_tokens + work.token[i]) * 2 + (1 if work.blank[i] else 0)
        slot = home_slot(key, mask)
        while work.gstamp[slot] == stamp and work.gkeys[slot] != key:
            slot = next_slot(slot, mask)
        if work.gstamp[slot] == stamp:
            grp = work.ggroup[slot]
            work.next[work.tail[grp]] = i
            work.tail[grp] = i
        else:
            work.gstamp[slot] = stamp
            work.gkeys[slot] = key
            work.ggroup[slot] = g
            work.head[g] = i
            work.tail[g] = i
            g += 1
        work.next[i] = -1
    # merge each group: its members by descending score (earlier first among equals)
    members = work.members
    for grp in range(g):
        c = work.head[grp]
        if work.next[c] < 0:
            work.merged[grp] = work.score[c]
            continue
        size = 0
        while c >= 0:
            j = size
            while j > 0 and work.score[members[j - 1]] < work.score[c]:
                members[j] = members[j - 1]
                j -= 1
            members[j] = c
            size += 1
            c = work.next[c]
        acc = work.score[members[0]]
        for j in range(1, size):
            s = work.score[members[j]]
            hi, lo = (acc, s) if acc >= s else (s, acc)
            acc = hi + math.log1p(math.exp(lo - hi)) if log_add else hi
        work.head[grp] = members[0]
        work.merged[grp] = acc
    # the beam_size best groups, best first (earlier first among equals)
    keep = min(g, beam_size)
    order = work.order
    for grp in range(g):
        v = work.merged[grp]
        if grp >= keep and v <= work.merged[order[keep - 1]]:
            continue
        j = min(grp, keep - 1)
        while j > 0 and work.merged[order[j - 1]] < v:
            order[j] = order[j - 1]
            j -= 1
        order[j] = grp
    step = beam.step[0] + 1
    for r in range(keep):
        grp = order[r]
        c = work.head[grp]
        beam.score[r] = work.merged[grp]
        beam.lm[r] = work.lm[c]
        beam.lex[r] = work.lex[c]
        beam.token[r] = work.token[c]
        beam.blank[r] = work.blank[c]
        beam.am[r] = work.am[c]
        beam.lm_sum[r] = work.lm_sum[c]
        beam.back_token[step, r] = work.token[c]
        beam.back_word[step, r] = work.word[c]
        beam.back_parent[step, r] = work.parent[c]
    beam.size[0] = keep
    beam.step[0] = step


@njit
def backtrace(beam: Any, rows: np.ndarray, sil: int) -> tuple[np.ndarray, np.ndarray]:
    """The token and word of every step of each final hypothesis (``rows``: their places in the last step's beam),
    followed by the end's silence token (no word): two arrays of shape ``(len(rows), steps + 1)``."""
    last = beam.step[0]
    tokens = np.empty((rows.shape[0], last + 2), dtype=np.int64)
    words = np.empty((rows.shape[0], last + 2), dtype=np.int64)
    for i in range(rows.shape[0]):
        row = rows[i]
        for step in range(last, -1, -1):
            tokens[i, step] = beam.back_token[step, row]
            words[i, step] = beam.back_word[step, row]
            row = beam.back_parent[step, row]
        tokens[i, last + 1] = sil
        words[i, last + 1] = -1
    return tokens, words
