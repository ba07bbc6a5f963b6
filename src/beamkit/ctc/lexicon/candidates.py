"""A frame's candidates in the lexicon search's compiled loop (:mod:`beamkit.ctc.lexicon.kernel`): one record per
candidate (:data:`CAND`), flashlight's candidatesAdd (:func:`add`) and candidatesStore (:func:`store`: the
threshold, merging of equal states, the beam cut and the back-pointers), and the scratch arrays they work in
(:class:`Work`, made once per decoder and reused by every call)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..jit import njit, njit_inline, records
from ..tables import home_slot, next_slot

CAND = np.dtype(
    [
        ("score", np.float64),
        ("am", np.float64),  # the emissions' sum
        ("lm_sum", np.float64),  # the LM's sum (unweighted)
        ("lm", np.int64),  # the LM state id, or UNMADE + key for a state not made yet (no LM)
        ("lex", np.int64),  # the trie node (-1 without a lexicon)
        ("token", np.int64),
        ("word", np.int64),  # the word ending here (-1: none)
        ("parent", np.int64),  # the hypothesis extended (its row in the beam)
        ("blank", np.bool_),  # the token is the blank
    ],
    align=True,
)  # one candidate of a frame: one record, so that the loop passes one array around (each array it passes costs
# two atomic reference-count updates)


class Work(NamedTuple):
    """Scratch rows for one frame's candidates (``cap`` of them), their groups of equal states, the frame's tokens
    and the misses found (pairs of state id and index); made once per decoder and reused."""

    cand: np.ndarray  # shape: (cap,) CAND
    next: np.ndarray  # shape: (cap,) int64, the next member of a candidate's group (log-add merging)
    first: np.ndarray  # shape: (cap,) int64, a group's first member
    last: np.ndarray  # shape: (cap,) int64, a group's last member
    top: np.ndarray  # shape: (cap,) int64, a group's best member (the earliest among equals)
    merged: np.ndarray  # shape: (cap,) float64, a group's merged score
    order: np.ndarray  # shape: (cap,) int64, the kept groups sorted (and one group's members, to log-add them)
    ggroup: np.ndarray  # shape: (G,) int64, G a power of two >= 2 * cap: the group table's groups
    gstamp: np.ndarray  # shape: (G,) int64, the frame stamp a slot was written in
    stamp: np.ndarray  # shape: (1,) int64
    tokens: np.ndarray  # shape: (N,) int64, the frame's tried tokens (best first with beam_size_token)
    tried: np.ndarray  # shape: (N,) bool, whether the frame tries a token
    misses: np.ndarray  # shape: (cap, 2) int64


def new_work(cap: int, n_tokens: int) -> Work:
    """Scratch arrays for ``cap`` candidates a frame over ``n_tokens`` tokens."""
    i = lambda: np.empty(cap, dtype=np.int64)  # noqa: E731
    groups = 1 << (2 * cap - 1).bit_length()
    return Work(
        cand=records(cap, CAND),
        next=i(),
        first=i(),
        last=i(),
        top=i(),
        merged=np.empty(cap),
        order=i(),
        ggroup=np.zeros(groups, dtype=np.int64),
        gstamp=np.zeros(groups, dtype=np.int64),
        stamp=np.zeros(1, dtype=np.int64),
        tokens=np.arange(n_tokens, dtype=np.int64),
        tried=np.ones(n_tokens, dtype=np.bool_),
        misses=np.empty((cap, 2), dtype=np.int64),
    )


@njit_inline
def insert_best(values: np.ndarray, order: np.ndarray, n: int, k: int, i: int) -> int:
    """Index ``i`` put in its place in ``order[:n]``, the best ``n <= k`` indices by ``values`` so far (best first,
    earlier first among equals; a partial insertion sort); returns the new count (at most ``k``)."""
    v = values[i]
    if n == k and v <= values[order[k - 1]]:
        return n
    j = min(n, k - 1)
    while j > 0 and values[order[j - 1]] < v:
        order[j] = order[j - 1]
        j -= 1
    order[j] = i
    return min(n + 1, k)


@njit_inline
def add(cand: np.ndarray, n: int, best: float, thr: float, entry: tuple) -> tuple[int, float]:
    """flashlight's candidatesAdd: track the best; keep the candidate ``entry`` (one value for each field of
    :data:`CAND`: score, lm, lex, token, word, blank, am, lm_sum, parent) as ``cand[n]`` if within the threshold
    of it (inlined: the tuple costs nothing)."""
    score, lm, lex, token, word, blank, am, lm_sum, parent = entry
    if score >= best:
        best = score
    if score >= best - thr:
        c = cand[n]
        c.score = score
        c.lm = lm
        c.lex = lex
        c.token = token
        c.word = word
        c.blank = blank
        c.am = am
        c.lm_sum = lm_sum
        c.parent = parent
        n += 1
    return n, best


@njit_inline
def group_slot(cand: np.ndarray, groups: tuple, i: int, stamp: int) -> int:
    """The slot of the group table holding candidate ``i``'s state (same LM state, trie node, token and blank
    flag as the group's first member), or the free slot where its group goes. ``groups``: the arrays (first,
    ggroup, gstamp), unpacked once per frame."""
    first, ggroup, gstamp = groups
    c = cand[i]
    m, x, tk, b = c.lm, c.lex, c.token, c.blank
    mask = gstamp.shape[0] - 1
    slot = home_slot(((m * 1000003 + x) * 8191 + tk) * 2 + (1 if b else 0), mask)
    while gstamp[slot] == stamp:
        f = cand[first[ggroup[slot]]]
        if f.lm == m and f.lex == x and f.token == tk and f.blank == b:
            return slot
        slot = next_slot(slot, mask)
    return slot


@njit
def store(work: Any, n: int, best: float, thr: float, beam_size: int, log_add: bool, beam: Any) -> None:
    """flashlight's candidatesStore: drop candidates below best - threshold, merge equal states (max or log-sum,
    in descending score order), keep the ``beam_size`` best as the next beam (best first, earlier first among
    equals) and record the back-pointers. Groups are found with a hash table stamped per frame (a group's
    members compared field by field, so no two states can be taken for one)."""
    floor = best - thr
    work.stamp[0] += 1
    stamp = work.stamp[0]
    cand = work.cand
    first, last, top, nxt, merged = work.first, work.last, work.top, work.next, work.merged
    ggroup, gstamp, order = work.ggroup, work.gstamp, work.order
    groups = (first, ggroup, gstamp)
    g = 0
    for i in range(n):
        s = cand[i].score
        if s < floor:
            continue
        slot = group_slot(cand, groups, i, stamp)
        if gstamp[slot] == stamp:
            grp = ggroup[slot]
            if s > merged[grp]:  # max merge: the best member (the earliest among equals) leads the group
                merged[grp] = s
                top[grp] = i
            if log_add:
                nxt[last[grp]] = i
                last[grp] = i
        else:
            gstamp[slot] = stamp
            ggroup[slot] = g
            first[g] = i
            top[g] = i
            merged[g] = s
            last[g] = i
            g += 1
        if log_add:
            nxt[i] = -1
    if log_add:
        log_add_groups(work, g)
    # the beam_size best groups, best first (earlier first among equals)
    keep = min(g, beam_size)
    n = 0
    for grp in range(g):
        n = insert_best(merged, order, n, keep, grp)
    step = beam.step[0] + 1
    b_score, b_lm, b_lex, b_token, b_blank, b_am, b_lm_sum = beam[:7]  # Beam's hypothesis columns, in field order
    back_token, back_word, back_parent = beam.back_token, beam.back_word, beam.back_parent
    for r in range(keep):
        grp = order[r]
        c = cand[top[grp]]
        b_score[r] = merged[grp]
        b_lm[r] = c.lm
        b_lex[r] = c.lex
        b_token[r] = c.token
        b_blank[r] = c.blank
        b_am[r] = c.am
        b_lm_sum[r] = c.lm_sum
        back_token[step, r] = c.token
        back_word[step, r] = c.word
        back_parent[step, r] = c.parent
    beam.size[0] = keep
    beam.step[0] = step


@njit
def log_add_groups(work: Any, g: int) -> None:
    """Log-add merging: each group's members summed in descending score order (earlier first among equals)."""
    members, cand, first, nxt, merged = work.order, work.cand, work.first, work.next, work.merged
    for grp in range(g):
        c = first[grp]
        if nxt[c] < 0:
            continue
        size = 0
        while c >= 0:
            j = size
            while j > 0 and cand[members[j - 1]].score < cand[c].score:
                members[j] = members[j - 1]
                j -= 1
            members[j] = c
            size += 1
            c = nxt[c]
        acc = cand[members[0]].score
        for j in range(1, size):
            s = cand[members[j]].score
            hi, lo = (acc, s) if acc >= s else (s, acc)
            acc = hi + math.log1p(math.exp(lo - hi))
        merged[grp] = acc
