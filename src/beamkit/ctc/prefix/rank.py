"""The beam cut of one frame of the CTC prefix beam search: the merged beams ranked best first (ties to the
lower key), then cut by the threshold, the beam width and (``prune_history``) shared histories
(:func:`rank_frame`)."""

from __future__ import annotations

import numpy as np

from beamkit.ops import NEG_INF

from ..jit import njit
from ..tables import home_slot, next_slot
from .records import BY_HISTORY, BY_THRESHOLD, BY_WIDTH, KEPT, Knobs, Store


@njit
def _before(merged: np.ndarray, a: int, b: int) -> bool:
    """Whether merged beam ``a`` ranks before ``b``: higher total, then the lower (node, ends in a label)."""
    ta, tb = merged[a].total, merged[b].total
    if ta != tb:
        return ta > tb
    return merged[a].node * 2 + merged[a].nb < merged[b].node * 2 + merged[b].nb


@njit
def _sort_ranked(merged: np.ndarray, cand: np.ndarray, P: int) -> None:
    """Sort ``cand[:P]`` (merged beam indices) best first in place (see :func:`_before`)."""
    if P <= 48:  # insertion sort: no allocation, fast for the few beams an LM leaves
        for i in range(1, P):
            m = cand[i]
            j = i - 1
            while j >= 0 and _before(merged, m, cand[j]):
                cand[j + 1] = cand[j]
                j -= 1
            cand[j + 1] = m
        return
    keys = np.empty(P, dtype=np.int64)
    for i in range(P):
        keys[i] = merged[cand[i]].node * 2 + merged[cand[i]].nb
    by_key = cand[:P][np.argsort(keys)]
    neg = np.empty(P, dtype=np.float64)
    for i in range(P):
        neg[i] = -merged[by_key[i]].total
    cand[:P] = by_key[np.argsort(neg, kind="mergesort")]


@njit
def rank_frame(ws: Store, M: int, kn: Knobs) -> int:
    """Write the ``M`` merged beams' ranking into ``ws.order`` (kept first, best first, then the pruned ones)
    and their fates. Returns the number kept."""
    merged, nodes, order, mslot, scratch = ws.merged, ws.nodes, ws.order, ws.mslot, ws.scratch
    width, prune_logp, history, split = kn.width, kn.prune_logp, kn.history, kn.split
    best = NEG_INF
    for m in range(M):
        if merged[m].total > best:
            best = merged[m].total
    cand = scratch[1]
    tail = scratch[2]
    P = 0
    for m in range(M):
        g = merged[m]
        if g.total >= best + prune_logp and g.total > NEG_INF:
            cand[P] = m
            P += 1
        else:
            g.fate = BY_THRESHOLD
    _sort_ranked(merged, cand, P)
    kept = 0
    dropped = 0
    mask = len(mslot) - 1
    for i in range(P):
        m = cand[i]
        g = merged[m]
        if i >= width:
            g.fate = BY_WIDTH
            tail[dropped] = m
            dropped += 1
            continue
        if history:
            flag = 1 if (split and g.pb == NEG_INF) else 0
            hk = np.int64(nodes[g.node].hkey ^ np.uint64(flag))
            s = home_slot(hk, mask)
            dup = False
            while mslot[s] != -1:
                o = merged[mslot[s]]
                oflag = 1 if (split and o.pb == NEG_INF) else 0
                if np.int64(nodes[o.node].hkey ^ np.uint64(oflag)) == hk:
                    dup = True
                    break
                s = next_slot(s, mask)
            if dup:
                g.fate = BY_HISTORY
                tail[dropped] = m
                dropped += 1
                continue
            mslot[s] = m
            g.slot = s
        g.fate = KEPT
        order[kept] = m
        kept += 1
    if history:
        for i in range(kept):
            mslot[merged[order[i]].slot] = -1
    for i in range(dropped):
        order[kept + i] = tail[i]
    w = kept + dropped
    for m in range(M):
        if merged[m].fate == BY_THRESHOLD:
            order[w] = m
            w += 1
    return kept
