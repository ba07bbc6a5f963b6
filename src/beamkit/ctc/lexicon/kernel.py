"""The compiled frame loop of :mod:`beamkit.ctc.lexicon.search` (numba; see :mod:`beamkit.ctc.jit`).

The search's state lives in arrays: the beam (one row per hypothesis), the back-pointers of every frame, the
lexicon trie in CSR form, and the LM's tree of states as integer ids in an open-addressing table mapping
``(state id, word or token index)`` to the child's id and its score. :func:`run_lexicon_frames` decodes frames until the
emissions end, an LM score is missing (a language model in Python: the caller asks it and resumes the same frame)
or the table needs to grow. A compiled ARPA model (:class:`LMArrays`) is scored inside the loop from the parent's
n-gram state; without an LM or with such a model a state (a table entry) is made only for the hypotheses a frame
keeps, after the beam cut. The arithmetic is the interpreted search's, operation for operation. A frame's
candidates, their merging and the beam cut are :mod:`beamkit.ctc.lexicon.candidates`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..jit import njit, njit_inline
from ..ngram import NGramArrays, backoff_score
from ..tables import home_slot, next_slot
from .candidates import add, insert_best, store

DONE, MISSES, GROW = 0, 1, 2  # run_lexicon_frames's status
EMPTY = -1  # an unused slot of the LM table
NO_LM, PYTHON_LM, ARRAY_LM = 0, 1, 2  # Table.meta[3]: no LM (scores 0), a LM in Python, a compiled ARPA model


class LMArrays(NamedTuple):
    """A compiled ARPA model as the loop reads it (:mod:`beamkit.ctc.ngram`): the n-gram arrays, the model's word
    id of each word (lexicon) or token (lexicon-free) index, and the n-gram state of every LM state id."""

    ngram: NGramArrays
    word_ids: np.ndarray  # shape: (indices,) int64, index -> the model's word id (0: <unk>)
    context: np.ndarray  # shape: (state ids,) int64, LM state id -> n-gram state (grown with the table)


UNMADE = 1 << 62  # UNMADE + key: the LM state of transition ``key``, not made yet (ids are below it)


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
    keys: np.ndarray,
    child: np.ndarray,
    score: np.ndarray,
    meta: np.ndarray,
    misses: np.ndarray,
    parent: int,
    index: int,
    n_miss: int,
) -> tuple[int, float, int]:
    """The child of LM state ``parent`` after ``index`` and its score; -1 when a Python LM has not scored it yet
    (recorded as a miss). Without an LM (score 0) or with a compiled ARPA model (the caller scores it from the
    parent's n-gram state), a child not made yet is returned as ``UNMADE + key``: the states the new beam keeps
    are made after the beam cut, so a frame adds at most ``beam_size`` states. Plain arrays, not the table's
    tuple: each array an inlined helper unpacks costs atomic reference counts in the hot loop."""
    key = parent * meta[2] + index + 1
    slot = table_find(keys, key)
    if slot >= 0:
        return child[slot], score[slot], n_miss
    if meta[3] == PYTHON_LM:
        if n_miss < misses.shape[0]:
            misses[n_miss, 0] = parent
            misses[n_miss, 1] = index
        return -1, 0.0, n_miss + 1
    return UNMADE + key, 0.0, n_miss  # a state not made yet: made only if the beam keeps it


@njit_inline
def _f32(x: float) -> float:
    return float(np.float32(x))


@njit_inline
def _best_tokens(row: np.ndarray, k: int, order: np.ndarray, tried: np.ndarray) -> None:
    """The frame's ``k`` best tokens into ``order[:k]``, best first (the lower id first among equals, as a stable
    sort), and ``tried`` set for them alone."""
    n = 0
    for tok in range(row.shape[0]):
        tried[tok] = False
        n = insert_best(row, order, n, k, tok)
    for r in range(k):
        tried[order[r]] = True


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
    cand = work.cand
    t_keys, t_child, t_score, t_meta, misses = table.keys, table.child, table.score, table.meta, work.misses
    arrays = table.meta[3] == ARRAY_LM  # a compiled ARPA model scores a transition not made yet here
    ngram, word_ids, context = lm.ngram, lm.word_ids, lm.context
    b_score, b_lm, b_lex, b_token, b_blank, b_am, b_lm_sum = beam[:7]  # Beam's hypothesis columns, in field order
    child_start, child_token, child_node = trie.child_start, trie.child_token, trie.child_node
    max_score, word_start, words = trie.max_score, trie.word_start, trie.words
    order, tried = work.tokens, work.tried
    if N == k:  # every token, in column order
        for tok in range(N):
            order[tok] = tok
            tried[tok] = True
    for t in range(start, T):
        if 2 * (table.meta[0] + beam_size) > table.keys.shape[0]:
            return GROW, t
        row = emissions[t]
        if N > k:
            _best_tokens(row, k, order, tried)
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
                        c, s, n_miss = _lm_step(t_keys, t_child, t_score, t_meta, misses, plm, tok, n_miss)
                        if c < 0:
                            continue
                        if arrays and c >= UNMADE:
                            s, _ = backoff_score(ngram, context[plm], word_ids[tok])
                        n, best = add(
                            cand, n, best, thr, (score + w * s, c, -1, tok, -1, False, pam + e, plmsum + s, h)
                        )
                    else:
                        n, best = add(
                            cand, n, best, thr, (score, plm, -1, tok, -1, tok == blank_id, pam + e, plmsum, h)
                        )
                continue
            at_root = plex == 0
            unk_c, unk_s = -2, 0.0  # not asked yet
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
                        n, best = add(
                            cand, n, best, thr, (score + w * s, plm, lex, tok, -1, False, pam + e, plmsum + s, h)
                        )
                w0, w1 = word_start[lex], word_start[lex + 1]
                for j in range(w0, w1):
                    if at_root and ptok == tok:
                        continue
                    label = words[j]
                    c, s, n_miss = _lm_step(t_keys, t_child, t_score, t_meta, misses, plm, label, n_miss)
                    if c < 0:
                        continue
                    if arrays and c >= UNMADE:
                        s, _ = backoff_score(ngram, context[plm], word_ids[label])
                    s = _f32(s - lex_max)
                    n, best = add(
                        cand,
                        n,
                        best,
                        thr,
                        (score + w * s + word_score, c, 0, tok, label, False, pam + e, plmsum + s, h),
                    )
                if w0 == w1 and allow_unk:
                    if unk_c == -2:  # the unknown word after this hypothesis's state: the same for every token
                        unk_c, unk_s, n_miss = _lm_step(t_keys, t_child, t_score, t_meta, misses, plm, unk, n_miss)
                        if arrays and unk_c >= UNMADE:
                            unk_s, _ = backoff_score(ngram, context[plm], word_ids[unk])
                    c, s = unk_c, unk_s
                    if c < 0:
                        continue
                    s = _f32(s - lex_max)
                    n, best = add(
                        cand, n, best, thr, (score + w * s + unk_score, c, 0, tok, unk, False, pam + e, plmsum + s, h)
                    )
            if not pblank or at_root:
                tok = sil if at_root else ptok
                e = float(row[tok])
                score = pscore + e
                if tok == sil:
                    score += sil_score
                n, best = add(cand, n, best, thr, (score, plm, plex, tok, -1, False, pam + e, plmsum, h))
            e = float(row[blank_id])
            n, best = add(cand, n, best, thr, (pscore + e, plm, plex, blank_id, -1, True, pam + e, plmsum, h))
        if n_miss > 0:
            table.meta[4] = n_miss
            return MISSES, t
        store(work, n, best, thr, beam_size, log_add == 1, beam)
        _make_kept_states(beam, table, lm)
    return DONE, T


@njit_inline
def _make_kept_states(beam: Any, table: Any, lm: LMArrays) -> None:
    """Make the LM states not made yet (``UNMADE + key``) that the new beam holds (with a compiled ARPA model, with
    their n-gram state and score)."""
    b_lm, keys, child, score, meta = beam.lm, table.keys, table.child, table.score, table.meta
    arrays = meta[3] == ARRAY_LM
    ngram, word_ids, context = lm.ngram, lm.word_ids, lm.context
    stride = meta[2]
    for r in range(beam.size[0]):
        if b_lm[r] < UNMADE:
            continue
        key = b_lm[r] - UNMADE
        slot = table_find(keys, key)
        if slot >= 0:  # another kept hypothesis made it
            b_lm[r] = child[slot]
            continue
        c = meta[1]
        meta[1] += 1
        s = 0.0
        if arrays:
            index = key % stride - 1  # -1: the end of sentence
            word = ngram.sizes[3] if index < 0 else word_ids[index]
            s, context[c] = backoff_score(ngram, context[key // stride], word)
        slot = -slot - 1
        keys[slot] = key
        child[slot] = c
        score[slot] = s
        meta[0] += 1
        b_lm[r] = c


@njit
def finish_frames(
    beam: Any, lm_ids: np.ndarray, scores: np.ndarray, nice: bool, options: Any, work: Any, table: Any, lm: LMArrays
) -> None:
    """The end of an utterance: each hypothesis (with ``nice``, only those at a word boundary) with the LM's
    end-of-sentence score (``scores[h]``; its LM state after it: ``lm_ids[h]``; with a compiled ARPA model both come
    from the model here: ``</s>`` after the hypothesis's n-gram state) stored as one more step on the silence token,
    merged, cut and sorted best first as a frame's candidates are."""
    if table.meta[3] == ARRAY_LM:
        stride, eos = table.meta[2], lm.ngram.sizes[3]
        for h in range(beam.size[0]):
            parent = beam.lm[h]
            scores[h], _ = backoff_score(lm.ngram, lm.context[parent], eos)
            lm_ids[h] = UNMADE + parent * stride  # the state after </s> (index -1), made if the beam keeps it
    thr, w = options.values[0], options.values[1]
    beam_size, sil, log_add = options.ints[0], options.ints[2], options.ints[5]
    b_score, b_lex, b_am, b_lm_sum = beam.score, beam.lex, beam.am, beam.lm_sum
    cand = work.cand
    n = 0
    best = -math.inf
    for h in range(beam.size[0]):
        if nice and b_lex[h] != 0:
            continue
        s = scores[h]
        entry = (b_score[h] + w * s, lm_ids[h], b_lex[h], sil, -1, False, b_am[h], b_lm_sum[h] + s, h)
        n, best = add(cand, n, best, thr, entry)
    store(work, n, best, thr, beam_size, log_add == 1, beam)
    _make_kept_states(beam, table, lm)  # the states after </s> the beam keeps (a later step starts from them)


@njit
def backtrace(beam: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The token and word of every step (the start, each frame, the end) of the hypotheses ``rows`` of the beam:
    two arrays of shape ``(len(rows), steps + 1)``."""
    last = beam.step[0]
    tokens = np.empty((rows.shape[0], last + 1), dtype=np.int64)
    words = np.empty((rows.shape[0], last + 1), dtype=np.int64)
    for i in range(rows.shape[0]):
        row = rows[i]
        for step in range(last, -1, -1):
            tokens[i, step] = beam.back_token[step, row]
            words[i, step] = beam.back_word[step, row]
            row = beam.back_parent[step, row]
    return tokens, words


@njit
def read_paths(beam: Any, rows: np.ndarray, blank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The hypotheses ``rows`` of the beam as torchaudio reads a path: a step whose token differs from the step
    before and is not the blank holds a token. Returns the tokens, their steps (int32) and the words ending, of
    every hypothesis one after the other, and the offsets (shape: (len(rows) + 1, 2): tokens, words) of each."""
    last = beam.step[0]
    back_token, back_word, back_parent = beam.back_token, beam.back_word, beam.back_parent
    path = np.empty(last + 1, dtype=np.int64)
    ends = np.empty(last + 1, dtype=np.int64)
    tokens = np.empty(rows.shape[0] * (last + 1), dtype=np.int64)
    steps = np.empty(rows.shape[0] * (last + 1), dtype=np.int32)
    words = np.empty(rows.shape[0] * (last + 1), dtype=np.int64)
    offsets = np.zeros((rows.shape[0] + 1, 2), dtype=np.int64)
    n_tok = n_word = 0
    for i in range(rows.shape[0]):
        row = rows[i]
        for step in range(last, -1, -1):
            path[step] = back_token[step, row]
            ends[step] = back_word[step, row]
            row = back_parent[step, row]
        for step in range(last + 1):
            tok = path[step]
            if tok != blank and (step == 0 or tok != path[step - 1]):
                tokens[n_tok] = tok
                steps[n_tok] = step
                n_tok += 1
            if ends[step] >= 0:
                words[n_word] = ends[step]
                n_word += 1
        offsets[i + 1, 0] = n_tok
        offsets[i + 1, 1] = n_word
    return tokens[:n_tok], steps[:n_tok], words[:n_word], offsets
