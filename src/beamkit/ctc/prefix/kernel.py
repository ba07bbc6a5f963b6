"""The frame loop of the CTC prefix beam search (Hannun 2017), compiled by :mod:`beamkit.ctc.jit`.

A beam (:data:`BEAM`) is a prefix (a node of :mod:`beamkit.ctc.nodes`) with two log-probabilities, of all
alignments producing it that end in blank (``pb``) or in its last label (``pnb``). Each frame extends every
beam by each candidate label of the frame (:data:`ROW`):

* blank: same prefix, ``pb' += pb + pnb + lp(blank)``;
* the prefix's last label ``c`` again: same prefix, ``pnb' += pnb + lp(c)`` (repeats collapse), and the
  prefix + ``c`` gets ``pb + lp(c)`` (a repeat needs a blank in between);
* any other label: prefix + label gets ``(pb + pnb) + lp(label)``.

Rows of equal prefixes merge by log-sum-exp in row order (:data:`MERGED`; with ``split_blank``, pyctcdecode's
beam unit, a prefix ending in blank and the same prefix ending in a label are separate beams). Merged beams
rank by ``logaddexp(pb, pnb)`` plus the prefix's fused score, best first, ties to the lower (node, ends in a
label) key; those below ``best + beam_prune_logp`` go, then all past ``beam_width``, then (``prune_history``)
any beam sharing its last words and partial word with a better one. A frame whose only candidate is blank,
where no two beams share a prefix (or a history), only adds ``lp(blank)``: it is applied without re-ranking.

:func:`run_frames` runs frames until the utterance ends, or stops early and says why (storage to grow, LM
queries to answer, a frame to record); the caller then calls it again for the same frame.
"""

from __future__ import annotations

import math

import numpy as np

from beamkit.ops import NEG_INF

from ..jit import njit
from ..tables import home_slot, next_slot
from .fusion import Static
from .nodes import EDGE_FREE, EDGE_MAKING, edge_find, make_node, word_hash
from .rank import rank_frame
from .records import (
    DONE,
    FRAME,
    KEPT,
    N_BEAMS,
    N_EDGES,
    N_KEPT,
    N_MERGED,
    N_NODES,
    N_PENDING,
    N_RECORDS,
    NEED_EDGES,
    NEED_LM,
    NEED_NODES,
    NEED_RECORDS,
    FrameInput,
    Knobs,
    Store,
)

LOGE2 = math.log(2.0)


@njit
def lse(x: float, y: float) -> float:
    """``np.logaddexp`` of two floats (numpy's formula; with one side ``-inf`` it is the other plus 0.0, which is
    what the formula computes, without its ``exp`` and ``log1p``)."""
    if y == NEG_INF:
        return x + 0.0
    if x == NEG_INF:
        return y + 0.0
    if x == y:
        return x + LOGE2
    tmp = x - y
    if tmp > 0:
        return x + math.log1p(math.exp(-tmp))
    if tmp <= 0:
        return y + math.log1p(math.exp(tmp))
    return tmp


@njit
def _blank_frame_is_trivial(
    beams: np.ndarray, n: int, nodes: np.ndarray, mslot: np.ndarray, written: np.ndarray, history: bool
) -> bool:
    """Whether a blank-only frame changes nothing but adding ``lp(blank)``: no two beams share a prefix
    (or, with ``history``, a history key), so nothing merges and ranks stay."""
    every_blank = True
    for e in range(n):
        if beams[e].pnb > NEG_INF:
            every_blank = False
            break
    if every_blank:  # beams were merged by (prefix, ends in blank) and deduplicated by history
        return True
    mask = len(mslot) - 1
    trivial = True
    used = 0
    for e in range(n):
        key = np.int64(nodes[beams[e].node].hkey) if history else beams[e].node
        s = home_slot(key, mask)
        while mslot[s] != -1:
            other = beams[mslot[s]].node
            okey = np.int64(nodes[other].hkey) if history else other
            if okey == key:
                trivial = False
                break
            s = next_slot(s, mask)
        if not trivial:
            break
        mslot[s] = e
        written[used] = s
        used += 1
    for i in range(used):
        mslot[written[i]] = -1
    return trivial


@njit
def _expand(
    beams: np.ndarray, n_beams: int, nodes: np.ndarray, rows: np.ndarray, labs: np.ndarray, lps: np.ndarray, blank: int
) -> int:
    """Write the rows of a frame: every beam by every candidate (beam-major, candidates in label order),
    then the rows repeating a beam's last label onto the same prefix. Returns the row count."""
    n = 0
    K = len(labs)
    for e in range(n_beams):
        b = beams[e]
        tot = lse(b.pb, b.pnb)
        last = nodes[b.node].last
        for k in range(K):
            tok = labs[k]
            v = (b.pb if tok == last else tot) + lps[k]
            if v > NEG_INF:
                r = rows[n]
                r.src = e
                r.tok = tok
                r.node = b.node
                r.val = v
                r.stay = tok == blank
                r.nb = tok != blank
                n += 1
    for e in range(n_beams):
        b = beams[e]
        if b.pnb > NEG_INF:
            last = nodes[b.node].last
            for k in range(K):
                if labs[k] == last:
                    r = rows[n]
                    r.src = e
                    r.tok = last
                    r.node = b.node
                    r.val = b.pnb + lps[k]
                    r.stay = True
                    r.nb = True
                    n += 1
    return n


@njit
def _children(st: Static, wt: np.ndarray, ws: Store, n: int, V: int) -> None:
    """Point every extending row of ``ws.rows[:n]`` at its child prefix, making the missing ones (numbered in
    the order of the last row asking for each); LM pairs not yet scored go to ``ws.pend``."""
    nodes, whist, ek, ev, rows, pend, cnt = ws.nodes, ws.whist, ws.ek, ws.ev, ws.rows, ws.pend, ws.cnt
    made = ws.scratch[0]
    n_made = 0
    for j in range(n - 1, -1, -1):  # backwards: the first row met for a new pair is the last to ask
        r = rows[j]
        if r.stay:
            continue
        s = r.node
        if st.loop_tok[r.tok] and nodes[s].plen == 0:
            continue  # a delimiter after a completed word changes nothing
        key = s * V + r.tok
        slot = edge_find(ek, key)
        if ek[slot] == EDGE_FREE:
            ek[slot] = key
            ev[slot] = EDGE_MAKING
            cnt[N_EDGES] += 1
            made[n_made] = key
            n_made += 1
        elif ev[slot] >= 0 and nodes[ev[slot]].sid == -1:  # made before its LM query was answered
            child = ev[slot]
            if not make_node(st, nodes, whist, wt, child, s, r.tok):
                _pend(nodes, pend, cnt, s)
    for q in range(n_made - 1, -1, -1):
        key = made[q]
        s = key // V
        tok = key - s * V
        i = cnt[N_NODES]
        cnt[N_NODES] += 1
        ev[edge_find(ek, key)] = i
        if not make_node(st, nodes, whist, wt, i, s, tok):
            _pend(nodes, pend, cnt, s)
    for j in range(n):
        r = rows[j]
        if r.stay:
            continue
        s = r.node
        if st.loop_tok[r.tok] and nodes[s].plen == 0:
            continue
        r.node = ev[edge_find(ek, s * V + r.tok)]


@njit
def _pend(nodes: np.ndarray, pend: np.ndarray, cnt: np.ndarray, s: int) -> None:
    """Queue the LM query for the partial word of node ``s`` in its context."""
    p = pend[cnt[N_PENDING]]
    p.sid = nodes[s].sid
    p.node = s
    p.whash = word_hash(nodes, s)
    cnt[N_PENDING] += 1


@njit
def _merge(rows: np.ndarray, n: int, nodes: np.ndarray, merged: np.ndarray, mslot: np.ndarray, split: bool) -> int:
    """Merge rows of equal (prefix[, ends in a label]) by log-sum-exp in row order. Returns the count."""
    mask = len(mslot) - 1
    M = 0
    for j in range(n):
        r = rows[j]
        nb = r.nb and split
        key = r.node * 2 + (1 if nb else 0)
        s = home_slot(key, mask)
        while mslot[s] != -1 and not (merged[mslot[s]].node == r.node and merged[mslot[s]].nb == nb):
            s = next_slot(s, mask)
        m = mslot[s]
        if m == -1:
            m = M
            M += 1
            mslot[s] = m
            g = merged[m]
            g.rep = j
            g.node = r.node
            g.nb = nb
            g.pb = NEG_INF
            g.pnb = NEG_INF
            g.best = r.val
            g.n = 0
            g.slot = s
        g = merged[m]
        g.n += 1
        if r.val > g.best:
            g.best = r.val
            g.rep = j
        if r.nb:
            g.pnb = lse(g.pnb, r.val)
        else:
            g.pb = lse(g.pb, r.val)
    for m in range(M):
        g = merged[m]
        mslot[g.slot] = -1
        g.total = lse(g.pb, g.pnb) + nodes[g.node].score
    return M


@njit
def _advance(st: Static, ws: Store, kept: int, t: int, frames: bool) -> None:
    """Make the ``kept`` first merged beams of ``ws.order`` the beams of frame ``t`` (their word offsets follow
    their most probable row; ``frames``: record completed words' frames)."""
    merged, order, rows, beams, nxt = ws.merged, ws.order, ws.rows, ws.beams, ws.nxt
    nodes, recs, cnt = ws.nodes, ws.recs, ws.cnt
    for i in range(kept):
        g = merged[order[i]]
        r = rows[g.rep]
        ob = beams[r.src]
        b = nxt[i]
        b.node = g.node
        b.pb = g.pb
        b.pnb = g.pnb
        b.ps = ob.ps
        b.pe = ob.pe
        b.wf = ob.wf
        if frames:
            is_ext = not r.stay
            sw = is_ext and st.starts_word[r.tok]
            # a word starts at its first label that spells characters: a BPE piece "▁the" starts one there, a
            # bare delimiter (" ", a lone "▁") does not (the next piece does)
            opens = sw and st.piece_len[r.tok] > 0
            if is_ext:
                if opens:
                    b.ps = t
                elif sw:
                    b.ps = -1
                elif ob.ps < 0:
                    b.ps = t
            if r.nb:
                b.pe = -1 if (sw and not opens) else t + 1
            if sw and nodes[ob.node].plen > 0:  # the label closes a word: record its frames
                k = cnt[N_RECORDS]
                cnt[N_RECORDS] += 1
                recs[k].start = ob.ps
                recs[k].end = ob.pe
                recs[k].prev = ob.wf
                b.wf = k
    for i in range(kept):
        beams[i] = nxt[i]
    cnt[N_BEAMS] = kept


@njit
def _label_of_rep(merged: np.ndarray, M: int, rows: np.ndarray, beams: np.ndarray) -> None:
    """For a trace: the label each merged beam's rep row added (-1 when the prefix stayed)."""
    for m in range(M):
        g = merged[m]
        r = rows[g.rep]
        g.label = -1 if (r.stay or g.node == beams[r.src].node) else r.tok


@njit
def run_frames(
    st: Static, wt: np.ndarray, ws: Store, cand: FrameInput, kn: Knobs, row0: int, t: int, T: int
) -> tuple[int, int]:
    """Search frames ``t .. T-1`` of one utterance (frame ``f``'s candidates: ``cand.labels/values[
    cand.offsets[row0 + f] : cand.offsets[row0 + f + 1]]``) over the storage ``ws`` and the LM word table
    ``wt``. Returns ``(DONE, T)``, or ``(reason, frame)`` to be called again from ``frame`` once the reason is
    dealt with (``FRAME``: a frame was searched and may be recorded)."""
    nodes, ek, recs, cnt, beams, rows = ws.nodes, ws.ek, ws.recs, ws.cnt, ws.beams, ws.rows
    merged, mslot, order, scratch = ws.merged, ws.mslot, ws.order, ws.scratch
    c_off, c_lab, c_val = cand.offsets, cand.labels, cand.values
    width, blank, V = kn.width, kn.blank, kn.V
    split, history, frames, trace = kn.split, kn.history, kn.frames, kn.trace
    while t < T:
        n_beams = cnt[N_BEAMS]
        if n_beams == 0:
            return DONE, T
        lo, hi = c_off[row0 + t], c_off[row0 + t + 1]
        K = hi - lo
        need = n_beams * (K + 1)
        if cnt[N_NODES] + need > len(nodes):
            return NEED_NODES, t
        if 2 * (cnt[N_EDGES] + need) > len(ek):
            return NEED_EDGES, t
        if frames and cnt[N_RECORDS] + width > len(recs):
            return NEED_RECORDS, t
        if (
            K == 1
            and c_lab[lo] == blank
            and c_val[lo] > NEG_INF
            and _blank_frame_is_trivial(beams, n_beams, nodes, mslot, scratch[1], history)
        ):
            lp = c_val[lo]
            for e in range(n_beams):
                b = beams[e]
                if trace:
                    g = merged[e]
                    g.rep = e
                    g.node = b.node
                    g.nb = False
                    g.n = 1
                    g.fate = KEPT
                    g.label = -1
                    order[e] = e
                    r = rows[e]
                    r.src = e
                b.pb = lse(b.pb, b.pnb) + lp
                b.pnb = NEG_INF
                if trace:
                    g = merged[e]
                    g.pb = b.pb
                    g.pnb = NEG_INF
                    g.total = b.pb + nodes[b.node].score
            cnt[N_MERGED] = n_beams
            cnt[N_KEPT] = n_beams
            t += 1
            if trace:
                return FRAME, t
            continue
        n = _expand(beams, n_beams, nodes, rows, c_lab[lo:hi], c_val[lo:hi], blank)
        cnt[N_PENDING] = 0
        _children(st, wt, ws, n, V)
        if cnt[N_PENDING] > 0:
            return NEED_LM, t
        M = _merge(rows, n, nodes, merged, mslot, split)
        kept = rank_frame(ws, M, kn)
        if trace:
            _label_of_rep(merged, M, rows, beams)
        _advance(st, ws, kept, t, frames)
        cnt[N_MERGED] = M
        cnt[N_KEPT] = kept
        t += 1
        if trace:
            return FRAME, t
    return DONE, T


@njit
def clear_edges(nodes: np.ndarray, n: int, ek: np.ndarray, ev: np.ndarray, V: int) -> None:
    """Empty the edge map of the ``n`` nodes' edges (faster than clearing the whole table): every slot is
    found first, then all are freed (freeing while probing would cut other keys' probe runs)."""
    slots = np.empty(max(n - 1, 0), dtype=np.int64)
    for i in range(1, n):
        slots[i - 1] = edge_find(ek, nodes[i].parent * V + nodes[i].last)
    for s in slots:
        ek[s] = EDGE_FREE
        ev[s] = EDGE_FREE


@njit
def rehash_edges(ek: np.ndarray, ev: np.ndarray, new_k: np.ndarray, new_v: np.ndarray) -> None:
    """Move every edge into the larger, empty map ``new_k / new_v``."""
    for s in range(len(ek)):
        if ek[s] != EDGE_FREE:
            slot = edge_find(new_k, ek[s])
            new_k[slot] = ek[s]
            new_v[slot] = ev[s]


__all__ = ["clear_edges", "lse", "rehash_edges", "run_frames"]
