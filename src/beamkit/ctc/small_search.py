"""The prefix beam search of one utterance in plain Python, for small beams.

:func:`beamkit.ctc.prefix_search._search` runs a few hundred numpy calls per searched frame whatever the
number of beams; one utterance with a handful of beams (a single ``decode`` call on peaky posteriors) is
then dominated by that fixed cost. :func:`search_small` runs the same steps on Python lists (pyctcdecode's
beam unit, ``split_blank``): same expansion rows in the same order, merges by log-sum-exp in the same
order (:func:`logaddexp` is numpy's formula on the same C library functions), nodes made by
:meth:`PrefixTrie.children_list` in the same order, pruning and history pruning with the same tie rules,
the same frame skipping, so beams and scores come out identical, bit for bit, and the nodes are the
same: when a step would expand more than ``max_cells`` (beam, candidate) cells, it hands its beams over
to the vectorised search, which goes on from there.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .prefix_search import _WordRecords
    from .prefix_trie import PrefixTrie

NEG_INF = -math.inf
_LOGE2 = math.log(2.0)


def logaddexp(x: float, y: float) -> float:
    """``np.logaddexp`` of two floats (numpy's ``npy_logaddexp``: the same operations, same results)."""
    if x == y:
        return x + _LOGE2  # handles infinities of the same sign
    tmp = x - y
    if tmp > 0:
        return x + math.log1p(math.exp(-tmp))
    if tmp <= 0:
        return y + math.log1p(math.exp(tmp))
    return tmp  # NaN


def _total(pb: float, pnb: float) -> float:
    """``logaddexp(pb, pnb)``, short-cut when one side is -inf (a beam ends either in blank or in a label):
    numpy then gives the other plus ``log1p(exp(-inf)) = 0.0``."""
    if pnb == NEG_INF:
        return pb + 0.0
    if pb == NEG_INF:
        return pnb + 0.0
    return logaddexp(pb, pnb)


def search_small(
    trie: PrefixTrie,
    s_frame: list[int],
    s_tok: list[list[int]],
    s_lpv: list[list[float]],
    s_merge: list[bool],
    cum: list[float],
    length: int,
    beam_width: int,
    beam_prune_logp: float,
    prune_history: bool,
    records: _WordRecords | None,
    max_cells: int,
) -> tuple[bool, tuple[np.ndarray, ...], int, int]:
    """Search one utterance over its listed frames (``s_frame``; candidates ``s_tok``/``s_lpv`` of each,
    without padding; ``s_merge``: merge frames) with pyctcdecode's beam unit; ``cum``: the running sum of
    ``lp(blank)`` over skipped frames (``skip_cum`` of the utterance); ``length``: its frames.

    Returns ``(done, beams, nxt, pos)``: the beams ``(utt, node, pb, pnb[, ps, pe, wf])`` as arrays, best
    first (word offsets when ``records`` is given), as the vectorised search holds them. ``done``: the
    utterance ended (the beams moved over its trailing skipped frames, ready for ``_finalize``); else a
    step would expand more than ``max_cells`` cells, and ``nxt`` (the next listed pair) and ``pos`` (the
    next frame not yet applied) say where the vectorised search goes on."""
    blank = trie.vocab.blank
    starts_word = trie.starts_word_list
    is_bpe = trie.vocab.is_bpe
    last_tok, score, plen, hhash = trie.last_tok, trie.score, trie.plen, trie.hhash
    # beams, best first: [node, pb, pnb, ps, pe, wf]
    beams: list[list] = [[trie.root, 0.0, NEG_INF, -1, -1, -1]]
    pos = 0  # next frame not yet applied to the beams
    nxt = 0  # next listed pair
    end = len(s_frame)
    while nxt < end:
        fr = s_frame[nxt]
        toks, lps = s_tok[nxt], s_lpv[nxt]
        if len(beams) * len(toks) > max_cells:
            return False, _as_arrays(beams, records is not None), nxt, pos
        nxt += 1
        if fr > pos:  # skipped blank-only frames: every beam ends in blank
            gain = cum[fr] - cum[pos]
            for b in beams:
                b[1] = _total(b[1], b[2]) + gain
                b[2] = NEG_INF
        pos = fr + 1
        # rows (beam, label, value, stays on the prefix, ends in a label): main rows in (beam, candidate)
        # order, then repeat rows (the last label again, collapsing onto a beam that ends in it)
        rows: list[tuple[int, int, float, bool, bool]] = []
        reps: list[tuple[int, int, float, bool, bool]] = []
        for i, (nd, pb, pnb, *_) in enumerate(beams):
            tot = _total(pb, pnb)
            lt = last_tok.item(nd)
            for t, lp in zip(toks, lps, strict=True):
                is_rep = t == lt
                v = (pb if is_rep else tot) + lp
                if v > NEG_INF:
                    rows.append((i, t, v, t == blank, t != blank))
                if is_rep and pnb > NEG_INF:
                    reps.append((i, t, pnb + lp, True, True))
        rows += reps
        ext = [j for j, r in enumerate(rows) if not r[3]]
        r_node = [beams[r[0]][0] for r in rows]
        if ext:
            made = trie.children_list([r_node[j] for j in ext], [rows[j][1] for j in ext])
            for j, c in zip(ext, made, strict=True):
                r_node[j] = c
            # creating nodes may grow the trie's storage into new arrays: read them again
            last_tok, score, plen, hhash = trie.last_tok, trie.score, trie.plen, trie.hhash
        # merge rows of equal (prefix, ends in a label), in node order: log-sum-exp in row order, the
        # first row at the maximum represents the merged beam
        groups: dict[int, list[int]] = {}
        for j, nd in enumerate(r_node):
            groups.setdefault(nd * 2 + rows[j][4], []).append(j)
        merged: list[tuple[int, float, float, int]] = []  # (node, value, score total, representative row)
        for key in sorted(groups):
            members = groups[key]
            val = rows[members[0]][2]
            top, rep = val, members[0]
            for j in members[1:]:
                v = rows[j][2]
                val = logaddexp(val, v)
                if v > top:
                    top, rep = v, j
            nd = r_node[rep]
            merged.append((nd, val, val + score.item(nd), rep))
        best = max([m[2] for m in merged], default=NEG_INF)
        sel = [m for m in merged if m[2] >= best + beam_prune_logp and m[2] > NEG_INF]
        sel.sort(key=lambda m: best - m[2])  # stable: ties keep node order
        del sel[beam_width:]
        kept: list[list] = []
        seen: set[int] = set()
        keys: list[int] = []  # the utterance's beams by prefix, or by history key with prune_history
        for nd, val, _, rep in sel:
            i, t, _, stay, nb = rows[rep]
            if prune_history:
                hkey = hhash.item(nd)
                if hkey ^ nb in seen:  # one beam per (history key, ends in a label)
                    continue
                seen.add(hkey ^ nb)
                keys.append(hkey)
            else:
                keys.append(nd)
            src = beams[i]
            ps, pe, wf = src[3], src[4], src[5]
            if records is not None:
                sw = not stay and starts_word[t]
                if not stay:
                    ps = (fr if is_bpe else -1) if sw else (fr if ps < 0 else ps)
                if nb:
                    pe = -1 if sw and not is_bpe else fr + 1
                if sw and plen.item(src[0]) > 0:  # the label closes the partial word: record its frames
                    records.start.append(src[3])
                    records.end.append(src[4])
                    records.prev.append(wf)
                    wf = len(records.start) - 1
            kept.append([nd, NEG_INF if nb else val, val if nb else NEG_INF, ps, pe, wf])
        beams = kept
        # a merge frame next that merges nothing and prunes no history is skipped (see _skip_merge_frames)
        if nxt < end and s_merge[nxt] and len(set(keys)) == len(keys):
            nxt += 1
    if length > pos:
        gain = cum[length] - cum[pos]
        for b in beams:
            b[1] = _total(b[1], b[2]) + gain
            b[2] = NEG_INF
    return True, _as_arrays(beams, records is not None), nxt, pos


def _as_arrays(beams: list[list], word_frames: bool) -> tuple[np.ndarray, ...]:
    """The beams ``[node, pb, pnb, ps, pe, wf]`` as the arrays ``(utt, node, pb, pnb[, ps, pe, wf])``."""
    n = len(beams)
    out: list[np.ndarray] = [
        np.zeros(n, dtype=np.int64),
        np.array([b[0] for b in beams], dtype=np.int64),
        np.array([b[1] for b in beams], dtype=np.float64),
        np.array([b[2] for b in beams], dtype=np.float64),
    ]
    if word_frames:
        out += [np.array([b[k] for b in beams], dtype=np.int64) for k in (3, 4, 5)]
    return tuple(out)
