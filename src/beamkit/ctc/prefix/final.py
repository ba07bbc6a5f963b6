"""The end of an utterance of the CTC prefix beam search: beams with the same final text merge by log-sum-exp
(:func:`_final_groups`), the end-of-utterance LM scores are added and the hypotheses ranked (:func:`_rank_final`),
then spelled with their word frames (:func:`end_utterance`)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..jit import njit
from ..options import CTCOptions
from ..search import CTCHypothesis
from ..tables import home_slot, next_slot
from . import kernel as K
from . import records as R
from .fusion import HAS_HOT, HAS_LM, HOT_WEIGHT, Fusion, Static, word_lookup
from .lmarrays import eos_score as array_eos_score
from .lmarrays import word_score as array_word_score
from .nodes import final_key, node_labels, word_hash

if TYPE_CHECKING:
    from .run import Workspace


@njit
def _final_groups(
    nodes: np.ndarray, beams: np.ndarray, n: int, mslot: np.ndarray, last: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Group the beams by final text, in order of first occurrence: each group's log-sum-exp of its beams'
    log-probs (in beam order) and the beam representing it (the first, or the ``last``)."""
    mask = len(mslot) - 1
    logit = np.empty(n, dtype=np.float64)
    rep = np.empty(n, dtype=np.int64)
    keys = np.empty(n, dtype=np.int64)
    slots = np.empty(n, dtype=np.int64)
    G = 0
    for e in range(n):
        v = K.lse(beams[e].pb, beams[e].pnb)
        key = np.int64(final_key(nodes, beams[e].node))
        s = home_slot(key, mask)
        while mslot[s] != -1 and keys[mslot[s]] != key:
            s = next_slot(s, mask)
        g = mslot[s]
        if g == -1:
            g = G
            G += 1
            mslot[s] = g
            slots[g] = s
            keys[g] = key
            logit[g] = v
            rep[g] = e
        else:
            logit[g] = K.lse(logit[g], v)
            if last:
                rep[g] = e
    for g in range(G):
        mslot[slots[g]] = -1
    return logit[:G], rep[:G]


class EndKnobs(NamedTuple):
    """The settings of an utterance's end (see :class:`~beamkit.ctc.options.CTCOptions`)."""

    compat: bool  # pyctcdecode's end-of-utterance scoring
    prune_logp: float  # the beam threshold
    out_k: int  # hypotheses returned


@njit
def _rank_final(
    st: Static, wt: np.ndarray, eos: np.ndarray, ws: R.Store, end: EndKnobs
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The end of an utterance: beams grouped by final text (:func:`_final_groups`), each group scored as
    a finished text (the partial word as a completed word: hotword bonus, LM score; with an LM the
    end-of-sentence score ``eos[context]``), ranked best first (ties: first occurrence), pruned by
    ``prune_logp`` below the best, cut to ``out_k`` (``end``'s knobs), over the ``ws.cnt[N_BEAMS]`` beams.

    Returns ``(pending, rep_beam, logit, total, context)`` for the kept groups, best first; ``pending > 0``
    means LM queries were written to ``pend`` instead (a word: its node; an end-of-sentence score: node -1):
    answer them and call again."""
    nodes, beams, mslot, pend = ws.nodes, ws.beams, ws.mslot, ws.pend
    compat, prune_logp, out_k = end.compat, end.prune_logp, end.out_k
    logit, rep = _final_groups(nodes, beams, ws.cnt[R.N_BEAMS], mslot, compat)
    G = len(logit)
    has_lm = st.flags[HAS_LM]
    score = np.empty(G, dtype=np.float64)
    sid = np.empty(G, dtype=np.int64)
    n_pend = 0
    for g in range(G):
        i = beams[rep[g]].node
        s = nodes[i].tscore
        c = nodes[i].sid
        if st.flags[HAS_HOT] and nodes[i].plen > 0 and nodes[i].hot >= 0 and st.hot_is_word[nodes[i].hot]:
            s = s + st.floats[HOT_WEIGHT]
        if has_lm and st.lm.flags[0]:  # a compiled model: the same rules, nothing to ask
            if compat or nodes[i].plen > 0:
                delta, c = array_word_score(st.lm, c, word_hash(nodes, i))
                s = s + delta
            score[g] = s + array_eos_score(st.lm, c)
            sid[g] = c
            continue
        if has_lm and (compat or nodes[i].plen > 0):  # the partial (with compat: even an empty) word
            wh = word_hash(nodes, i)
            slot = word_lookup(st, wt, c, wh)
            if slot < 0:
                p = pend[n_pend]
                p.sid = c
                p.node = i
                p.whash = wh
                n_pend += 1
                continue
            s = s + wt[slot].delta
            c = wt[slot].nsid
        if has_lm:
            if c >= len(eos) or np.isnan(eos[c]):
                p = pend[n_pend]
                p.sid = c
                p.node = -1
                p.whash = 0
                n_pend += 1
                continue
            s = s + eos[c]
        score[g] = s
        sid[g] = c
    if n_pend:
        return n_pend, rep[:0], logit[:0], score[:0], sid[:0]
    total = logit + score
    order = np.argsort(-total, kind="mergesort")  # ties keep first-occurrence order
    k = 0
    best = total[order[0]]
    while k < G and k < out_k and total[order[k]] >= best + prune_logp:
        k += 1
    order = order[:k]
    return 0, rep[order], logit[order], total[order], sid[order]


def end_utterance(ws: Workspace, fusion: Fusion, opts: CTCOptions) -> tuple[list[CTCHypothesis], list[int]]:
    """Finish an utterance (:func:`_rank_final`) and spell its hypotheses. Returns them and their prefixes."""
    n = int(ws.cnt[R.N_BEAMS])
    if n == 0:
        return [], []
    cache = fusion.cache
    ws.fit(ws.width, n)
    store = ws.store()
    knobs = EndKnobs(opts.pyctcdecode_compat, float(opts.beam_prune_logp), opts.out_k)
    while True:
        eos = cache.eos if cache is not None else _NO_EOS
        with cache.lock.shared() if cache is not None and cache.arrays is None else nullcontext():  # arrays: no writer
            n_pend, rep_beam, logit, totals, sids = _rank_final(fusion.static, fusion.table, eos, store, knobs)
        if not n_pend:
            break
        assert cache is not None
        pend = ws.pend[:n_pend]
        known = len(cache.states)
        fusion.resolve(ws.nodes, pend)  # the words (end-of-utterance queries are skipped)
        # the end-of-utterance scores asked for, and those of the contexts the words just made (asked now, in
        # the same batch, they spare the next round a stop)
        eos = np.concatenate((pend["sid"][pend["node"] < 0], np.arange(known, len(cache.states), dtype=np.int64)))
        if len(eos):
            cache.eos_scores(eos)
    out_nodes = ws.beams["node"][rep_beam]
    texts = texts_of(ws, fusion, out_nodes)
    plen = ws.nodes["plen"]
    hyps: list[CTCHypothesis] = []
    for j, text in enumerate(texts):
        frames: list[tuple[int, int]] = []
        if opts.word_frames:
            b = ws.beams[rep_beam[j]]
            frames = _word_frames(ws.recs, int(b["wf"]))
            if plen[out_nodes[j]] > 0:
                frames.append((int(b["ps"]), int(b["pe"])))
        tot, gl = float(totals[j]), float(logit[j])
        hyps.append(
            CTCHypothesis(
                text=text,
                score=tot,
                logit_score=gl,
                lm_score=tot - gl,
                word_frames=list(zip(text.split(), frames, strict=False)),
                lm_state=cache.state_of(int(sids[j])) if cache is not None else None,
            )
        )
    return hyps, out_nodes.tolist()


_NO_EOS = np.zeros(0, dtype=np.float64)


def _word_frames(recs: np.ndarray, pointer: int) -> list[tuple[int, int]]:
    """The completed words' frames along a record chain, first word first."""
    out: list[tuple[int, int]] = []
    while pointer >= 0:
        r = recs[pointer]
        out.append((int(r["start"]), int(r["end"])))
        pointer = int(r["prev"])
    out.reverse()
    return out


def texts_of(ws: Workspace, fusion: Fusion, targets: np.ndarray) -> list[str]:
    """The whitespace-normalised text of each target node."""
    labels, offsets = node_labels(ws.nodes, targets.astype(np.int64), 0)
    piece = fusion.text_piece
    flat = [piece[i] for i in labels.tolist()]
    bounds = offsets.tolist()
    return [" ".join("".join(flat[a:b]).split()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
