"""CTC greedy decoding and vectorised prefix beam search with word-level LM fusion.

Prefix beam search (Hannun 2017): a hypothesis is a label prefix carrying two log-probabilities, of all
alignments that produce it and end in blank (``p_b``) or in its last label (``p_nb``). At each frame every
hypothesis is extended by the candidate labels of that frame:

* blank: same prefix, ``p_b' += p_b + p_nb + lp(blank)``;
* the prefix's last label ``c`` again: same prefix ``p_nb' += p_nb + lp(c)`` (repeats collapse), and the
  prefix + ``c`` gets ``p_b + lp(c)`` (a repeat needs a blank in between);
* any other label: prefix + label gets ``(p_b + p_nb) + lp(label)``.

Equal prefixes are merged by log-sum-exp. Prefixes are normalised like pyctcdecode: words are separated by
one delimiter (leading, trailing and repeated delimiters collapse), so the prefix is (completed words,
partial word). With ``split_blank=True`` the beam unit is instead a (prefix, ends-in-blank) pair, each
competing for its own beam slot: that is pyctcdecode's exact beam semantics.

Implementation: prefixes are integer nodes of a trie shared by all utterances of a call
(:mod:`beamkit.ctc.prefix_trie`); the beams of all utterances are flat arrays (utterance, node, p_b, p_nb,
frame offsets); a frame's expansion, merging (sort + ``logaddexp.reduceat``) and pruning are numpy array
operations over all utterances at once, and candidate children are only stored when they survive pruning.
A frame whose only candidate is blank just shifts the scores of an utterance. Python runs per item only
for an LM query of a new (context, word) pair and for building the returned hypotheses. The fixed cost per
frame is a few hundred microseconds of numpy calls, so the speed comes from batching utterances.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .lm import HotwordScorer, LanguageModelFusion
from .prefix_trie import PrefixTrie
from .vocab import Vocabulary

NEG_INF = -math.inf
_UTT_SALT = np.uint64(0xFF51AFD7ED558CCD)


@dataclass
class CTCHypothesis:
    """One decoded hypothesis.

    ``text``: whitespace-normalised output; ``score``: combined score (logit + LM + hotwords);
    ``logit_score``: log-probability of the prefix under the CTC model (sum over the kept alignments);
    ``lm_score``: ``score - logit_score``; ``word_frames``: ``(word, (start_frame, end_frame))`` per word
    along the best alignment; ``lm_state``: the LM state after the last word (None without an LM).
    """

    text: str
    score: float
    logit_score: float
    lm_score: float
    word_frames: list[tuple[str, tuple[int, int]]] = field(default_factory=list)
    lm_state: Any = None


def to_numpy_2d_or_3d(x: Any, name: str = "log_probs") -> np.ndarray:
    """Convert a numpy array, torch tensor or nested list to a float64 numpy array (2-D or 3-D)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim not in (2, 3):
        raise ValueError(f"{name} must be 2-D (T, V) or 3-D (N, T, V), got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    return arr


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log-softmax in float64."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    z = x - m
    with np.errstate(divide="ignore"):
        return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def greedy_decode(log_probs: Any, vocab: Vocabulary | Sequence[str] | None = None, blank: int = 0) -> list[int] | str:
    """Best-path CTC decoding of one ``(T, V)`` matrix: argmax per frame, collapse repeats, drop blanks.

    Returns the label ids when ``vocab`` is None (``blank`` gives the blank id), else the text with
    delimiters normalised as in :func:`prefix_beam_search`.
    """
    arr = to_numpy_2d_or_3d(log_probs)
    if arr.ndim != 2:
        raise ValueError(f"greedy_decode takes one (T, V) matrix, got shape {arr.shape}")
    voc = None if vocab is None else _as_vocab(vocab)
    if voc is not None:
        blank = voc.blank
        if arr.shape[1] != voc.size:
            raise ValueError(f"log_probs has {arr.shape[1]} columns but the vocabulary has {voc.size}")
    if not 0 <= blank < arr.shape[1]:
        raise ValueError(f"blank index {blank} out of range for V={arr.shape[1]}")
    best = np.argmax(arr, axis=1)  # shape: (T,)
    keep = np.ones(len(best), dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    keep &= best != blank
    ids = [int(i) for i in best[keep]]
    if voc is None:
        return ids
    return labels_to_text(ids, voc)


def labels_to_text(ids: Sequence[int], vocab: Vocabulary) -> str:
    """Join collapsed label ids into whitespace-normalised text (BPE ``▁`` starts a word)."""
    if vocab.is_bpe:
        pieces = [vocab.labels[i].replace("▁", " ") for i in ids]
    else:
        pieces = [vocab.labels[i] for i in ids]
    return " ".join("".join(pieces).split())


def _as_vocab(vocab: Vocabulary | Sequence[str]) -> Vocabulary:
    if isinstance(vocab, Vocabulary):
        return vocab
    return Vocabulary.from_labels(vocab)


def _check_params(beam_width: int, beam_prune_logp: float, token_min_logp: float) -> None:
    if isinstance(beam_width, bool) or not isinstance(beam_width, (int, np.integer)) or beam_width < 1:
        raise ValueError(f"beam_width must be a positive integer, got {beam_width!r}")
    for name, value in (("beam_prune_logp", beam_prune_logp), ("token_min_logp", token_min_logp)):
        if not isinstance(value, (int, float)) or math.isnan(value) or value > 0:
            raise ValueError(f"{name} must be a number <= 0 (or -inf), got {value!r}")


def _segment_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in a sorted 1-D array."""
    if len(sorted_keys) == 0:
        return np.zeros(0, dtype=np.int64)
    flag = np.empty(len(sorted_keys), dtype=bool)
    flag[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=flag[1:])
    return np.flatnonzero(flag)


def prefix_beam_search(
    log_probs: Any,
    vocab: Vocabulary | Sequence[str],
    lengths: Sequence[int] | np.ndarray | None = None,
    beam_width: int = 100,
    beam_prune_logp: float = -10.0,
    token_min_logp: float = -5.0,
    lm: LanguageModelFusion | None = None,
    hotwords: Sequence[str] | None = None,
    hotword_weight: float = 10.0,
    prune_history: bool = False,
    split_blank: bool = False,
    pyctcdecode_compat: bool = False,
    num_hypotheses: int | None = None,
) -> list[CTCHypothesis] | list[list[CTCHypothesis]]:
    """CTC prefix beam search over ``(T, V)`` log-probabilities, or a batch of utterances.

    ``log_probs``: one ``(T, V)`` matrix (returns one list of hypotheses, best first), or a ``(N, T, V)``
    array with ``lengths`` (valid frames per utterance), or a list of ``(T_i, V)`` matrices (returns one
    list per utterance). Values are per-frame log-probabilities (use :func:`log_softmax` on logits).

    Pruning (pyctcdecode's knobs): per frame only labels with ``lp >= token_min_logp`` (plus the argmax)
    are tried; hypotheses scoring below ``best + beam_prune_logp`` are dropped; at most ``beam_width``
    are kept. ``lm`` adds word-level n-gram fusion, ``hotwords`` a bonus per listed word.
    ``prune_history`` keeps only the best hypothesis among those sharing the last ``order - 1`` words and
    the partial word (pyctcdecode's ``decode`` does this). ``split_blank`` selects pyctcdecode's beam unit
    (see the module docstring). ``pyctcdecode_compat`` reproduces two pyctcdecode quirks at the end of an
    utterance: equal final texts take the word offsets and LM scoring of their *lowest*-scoring member,
    and an utterance ending on a delimiter has an empty word scored by the LM (an unknown word).
    ``num_hypotheses`` limits the hypotheses returned per utterance (default: all, up to ``beam_width``;
    ``1`` skips building text and word offsets for the others). Scores accumulate in float64.
    """
    voc = _as_vocab(vocab)
    _check_params(beam_width, beam_prune_logp, token_min_logp)
    if num_hypotheses is not None and (isinstance(num_hypotheses, bool) or num_hypotheses < 1):
        raise ValueError(f"num_hypotheses must be a positive integer or None, got {num_hypotheses!r}")
    out_k = beam_width if num_hypotheses is None else min(beam_width, int(num_hypotheses))
    if lm is not None and not isinstance(lm, LanguageModelFusion):
        raise TypeError("lm must be a LanguageModelFusion (wrap the n-gram model) or None")
    single = False
    if isinstance(log_probs, (list, tuple)):
        mats = [to_numpy_2d_or_3d(m) for m in log_probs]
        if any(m.ndim != 2 for m in mats):
            raise ValueError("a list of utterances must hold 2-D (T, V) matrices")
        if not mats:
            return []
        lens = np.array([m.shape[0] for m in mats], dtype=np.int64)
        if len({m.shape[1] for m in mats}) != 1:
            raise ValueError("all utterances must have the same number of columns V")
        batch = np.zeros((len(mats), int(lens.max(initial=0)), mats[0].shape[1]))  # shape: (N, T, V)
        for i, m in enumerate(mats):
            batch[i, : m.shape[0]] = m
        if lengths is not None:
            raise ValueError("lengths must not be given with a list of matrices")
    else:
        batch = to_numpy_2d_or_3d(log_probs)
        if batch.ndim == 2:
            single = True
            batch = batch[None]
        if lengths is None:
            lens = np.full(batch.shape[0], batch.shape[1], dtype=np.int64)
        else:
            lens = np.asarray(lengths, dtype=np.int64)
            if lens.shape != (batch.shape[0],):
                raise ValueError(f"lengths must have shape ({batch.shape[0]},), got {lens.shape}")
            if (lens < 0).any() or (lens > batch.shape[1]).any():
                raise ValueError(f"lengths must lie in [0, {batch.shape[1]}]")
    if batch.shape[2] != voc.size:
        raise ValueError(f"log_probs has {batch.shape[2]} columns but the vocabulary has {voc.size} labels")
    history = max(1, lm.order - 1) if lm is not None else 1
    # about the number of nodes a search creates (at most beam_width new ones per utterance and frame)
    capacity = min(1 << 22, max(1 << 15, int(lens.sum()) * min(beam_width, 16)))
    trie = PrefixTrie(voc, lm, HotwordScorer(hotwords, hotword_weight), history, pyctcdecode_compat, capacity)
    results = _search(
        batch,
        lens,
        trie,
        beam_width,
        beam_prune_logp,
        token_min_logp,
        prune_history,
        split_blank,
        pyctcdecode_compat,
        out_k,
    )
    return results[0] if single else results


def _search(
    batch: np.ndarray,
    lens: np.ndarray,
    trie: PrefixTrie,
    beam_width: int,
    beam_prune_logp: float,
    token_min_logp: float,
    prune_history: bool,
    split_blank: bool,
    last_rep: bool,
    out_k: int,
) -> list[list[CTCHypothesis]]:
    N, T, V = batch.shape
    voc = trie.vocab
    blank = voc.blank
    starts_word = voc.starts_word
    is_bpe = voc.is_bpe
    # flat beam arrays, sorted by utterance then score (best first)
    utt: np.ndarray = np.arange(N, dtype=np.int64)  # shape: (E,)
    node: np.ndarray = np.full(N, trie.root, dtype=np.int64)
    pb: np.ndarray = np.zeros(N)
    pnb: np.ndarray = np.full(N, NEG_INF)
    ps: np.ndarray = np.full(N, -1, dtype=np.int64)  # partial-word start frame (-1: none)
    pe: np.ndarray = np.full(N, -1, dtype=np.int64)  # partial-word end frame (exclusive)
    wf: np.ndarray = np.full(N, -1, dtype=np.int64)  # pointer into the word-frame records
    rec_start: list[int] = []
    rec_end: list[int] = []
    rec_prev: list[int] = []
    results: list[list[CTCHypothesis]] = [[] for _ in range(N)]
    if (lens == 0).any():
        z = np.flatnonzero(lens[utt] == 0)
        _finalize(
            utt[z],
            node[z],
            pb[z],
            pnb[z],
            ps[z],
            pe[z],
            wf[z],
            trie,
            results,
            rec_start,
            rec_end,
            rec_prev,
            out_k,
            beam_prune_logp,
            last_rep,
        )
        keep = lens[utt] > 0
        utt, node, pb, pnb, ps, pe, wf = (a[keep] for a in (utt, node, pb, pnb, ps, pe, wf))
    # candidate labels of every (frame, utterance), computed up front: lp >= token_min_logp, plus the argmax
    frames_first = batch.transpose(1, 0, 2)  # shape: (T, N, V)
    cand_all = np.empty(frames_first.shape, dtype=bool)  # shape: (T, N, V)
    np.greater_equal(frames_first, token_min_logp, out=cand_all)
    if T and N:
        np.put_along_axis(cand_all, np.argmax(frames_first, axis=2)[:, :, None], True, axis=2)
    # utterances whose only candidate is blank and whose beams all end in blank (any beam in
    # prefix mode): every beam just adds lp(blank); ranks and pruning do not change
    only_blank_all = cand_all.sum(axis=2) == 1  # shape: (T, N)
    only_blank_all &= cand_all[:, :, blank]
    any_only_blank = only_blank_all.any(axis=1).tolist()
    for t in range(T):
        if len(utt) == 0:
            break
        lp_t = batch[:, t, :]  # shape: (N, V)
        cand = cand_all[t]  # shape: (N, V)
        if any_only_blank[t]:
            only_blank = only_blank_all[t]
            if split_blank:
                has_nb = np.bincount(utt[pnb > NEG_INF], minlength=N) > 0
                only_blank &= ~has_nb
            triv = only_blank[utt]
            if triv.any():
                idx = np.flatnonzero(triv)
                pb[idx] = np.logaddexp(pb[idx], pnb[idx]) + lp_t[utt[idx], blank]
                pnb[idx] = NEG_INF
                if triv.all():
                    done = lens[utt] == t + 1
                    if done.any():
                        utt, node, pb, pnb, ps, pe, wf = _finish(
                            done,
                            utt,
                            node,
                            pb,
                            pnb,
                            ps,
                            pe,
                            wf,
                            trie,
                            results,
                            rec_start,
                            rec_end,
                            rec_prev,
                            out_k,
                            beam_prune_logp,
                            last_rep,
                        )
                    continue
                hold = (utt[idx], node[idx], pb[idx], pnb[idx], ps[idx], pe[idx], wf[idx])
                busy = ~triv
                utt, node, pb, pnb, ps, pe, wf = (a[busy] for a in (utt, node, pb, pnb, ps, pe, wf))
                cand[only_blank] = False
            else:
                hold = None
        else:
            hold = None
        cu, ctok = np.nonzero(cand)  # sorted by utterance
        ccount = np.bincount(cu, minlength=N)
        cstart = np.concatenate(([0], np.cumsum(ccount)[:-1]))
        # expand each beam by its utterance's candidates
        per = ccount[utt]
        ei = np.repeat(np.arange(len(utt)), per)  # shape: (rows,)
        offs = np.arange(len(ei)) - np.repeat(np.cumsum(per) - per, per)
        tok = ctok[np.repeat(cstart[utt], per) + offs]
        r_utt = utt[ei]
        r_node = node[ei]
        lpv = lp_t[r_utt, tok]
        r_pb, r_pnb = pb[ei], pnb[ei]
        tot = np.logaddexp(r_pb, r_pnb)
        is_blank = tok == blank
        is_rep = (~is_blank) & (tok == trie.last_tok[r_node])
        ext = ~is_blank
        # A: blank rows
        a_idx = np.flatnonzero(is_blank)
        # B: repeat rows staying on the prefix
        b_idx = np.flatnonzero(is_rep & (r_pnb > NEG_INF))
        # C: extension rows
        c_idx = np.flatnonzero(ext)
        c_val = np.where(is_rep, r_pb, tot)[c_idx] + lpv[c_idx]
        finite = c_val > NEG_INF
        c_idx, c_val = c_idx[finite], c_val[finite]
        c_node_src = r_node[c_idx]
        c_tok = tok[c_idx]
        c_node, preview = trie.lookup(c_node_src, c_tok, node)
        # assemble rows (blank rows, repeat rows, extension rows); ``rows_ops``/``rows_ope`` keep the
        # source beam's partial-word frames (the record a word completion pushes once the row survives)
        na, nb = len(a_idx), len(b_idx)
        nab = na + nb
        src_rows = np.concatenate((a_idx, b_idx, c_idx))
        e_src = ei[src_rows]
        rows_utt = r_utt[src_rows]
        rows_node = r_node[src_rows]
        rows_node[nab:] = c_node
        rows_flag = np.ones(len(rows_node), dtype=np.int64)
        rows_flag[:na] = 0
        rows_val = np.concatenate((tot[a_idx] + lpv[a_idx], r_pnb[b_idx] + lpv[b_idx], c_val))
        rows_ops = ps[e_src]
        rows_ope = pe[e_src]
        rows_wf = wf[e_src]
        c_ps = rows_ops[nab:]
        sw = starts_word[c_tok]
        rows_push = np.zeros(len(rows_node), dtype=bool)
        rows_push[nab:] = sw & (trie.plen[c_node_src] > 0)
        rows_ps = rows_ops.copy()
        rows_ps[nab:] = np.where(sw, t if is_bpe else -1, np.where(c_ps < 0, t, c_ps))
        rows_pe = rows_ope.copy()
        rows_pe[na:nab] = t + 1
        rows_pe[nab:] = np.where(sw & (not is_bpe), -1, t + 1)
        # merge equal (utterance, prefix[, flag]) by log-sum-exp
        nn = trie.n + len(preview.score) + 1
        key = rows_utt * nn + rows_node
        if split_blank:
            key = key * 2 + rows_flag
        order = np.argsort(key, kind="stable")
        skey = key[order]
        starts = _segment_starts(skey)
        val_sorted = rows_val[order]
        # word offsets of a merged prefix come from its most probable row (first one on ties)
        glens = np.diff(np.append(starts, len(skey)))
        seg_best = np.repeat(np.maximum.reduceat(val_sorted, starts), glens)
        at_best = np.flatnonzero(val_sorted >= seg_best)
        seg_of = np.repeat(np.arange(len(starts)), glens)[at_best]
        first_best = at_best[np.flatnonzero(np.diff(np.concatenate(([-1], seg_of))))]
        rep = order[first_best]
        flag_sorted = rows_flag[order]
        m_pb = np.logaddexp.reduceat(np.where(flag_sorted == 0, val_sorted, NEG_INF), starts)
        m_pnb = np.logaddexp.reduceat(np.where(flag_sorted == 1, val_sorted, NEG_INF), starts)
        m_utt, m_node = rows_utt[order[starts]], rows_node[order[starts]]
        total = np.logaddexp(m_pb, m_pnb) + trie.scores(m_node, preview)
        # prune per utterance (merged rows are grouped by utterance): threshold, then top beam_width
        gstart = _segment_starts(m_utt)
        glen = np.diff(np.append(gstart, len(m_utt)))
        best = np.repeat(np.maximum.reduceat(total, gstart), glen)
        sel = np.flatnonzero((total >= best + beam_prune_logp) & (total > NEG_INF))
        s_utt, s_tot = m_utt[sel], total[sel]
        span = float(s_tot.max() - s_tot.min()) + 1.0 if len(sel) else 1.0
        composite = s_utt * span + (best[sel] - s_tot)  # utterance first, then best score first
        order = sel[np.argsort(composite, kind="stable")]
        s_utt = m_utt[order]
        gstart = _segment_starts(s_utt)
        rank = np.arange(len(order)) - np.repeat(gstart, np.diff(np.append(gstart, len(order))))
        order = order[rank < beam_width]
        kept_node = trie.commit(m_node[order], preview)
        if prune_history:
            hkey = trie.history_hash(kept_node) ^ (m_utt[order].astype(np.uint64) * _UTT_SALT)
            if split_blank:
                hkey = hkey ^ (m_pb[order] == NEG_INF).astype(np.uint64)
            _, first_pos = np.unique(hkey, return_index=True)
            first_pos.sort()
            order, kept_node = order[first_pos], kept_node[first_pos]
        r = rep[order]
        utt, node, pb, pnb = m_utt[order], kept_node, m_pb[order], m_pnb[order]
        ps, pe, wf = rows_ps[r], rows_pe[r], rows_wf[r]
        pushed = np.flatnonzero(rows_push[r])
        if len(pushed):
            base = len(rec_start)
            rec_start.extend(rows_ops[r[pushed]].tolist())
            rec_end.extend(rows_ope[r[pushed]].tolist())
            rec_prev.extend(wf[pushed].tolist())
            wf = wf.copy()
            wf[pushed] = base + np.arange(len(pushed))
        if hold is not None:
            utt, node, pb, pnb, ps, pe, wf = (
                np.concatenate((a, b)) for a, b in zip((utt, node, pb, pnb, ps, pe, wf), hold, strict=False)
            )
        # finalize utterances whose last frame this was
        done = lens[utt] == t + 1
        if done.any():
            utt, node, pb, pnb, ps, pe, wf = _finish(
                done,
                utt,
                node,
                pb,
                pnb,
                ps,
                pe,
                wf,
                trie,
                results,
                rec_start,
                rec_end,
                rec_prev,
                out_k,
                beam_prune_logp,
                last_rep,
            )
    return results


def _finish(
    done: np.ndarray,
    utt: np.ndarray,
    node: np.ndarray,
    pb: np.ndarray,
    pnb: np.ndarray,
    ps: np.ndarray,
    pe: np.ndarray,
    wf: np.ndarray,
    trie: PrefixTrie,
    results: list[list[CTCHypothesis]],
    rec_start: list[int],
    rec_end: list[int],
    rec_prev: list[int],
    beam_width: int,
    beam_prune_logp: float,
    last_rep: bool,
) -> tuple[np.ndarray, ...]:
    """Finalize the utterances of the ``done`` beams (all at once); return the remaining beams."""
    idx = np.flatnonzero(done)  # every beam of a finished utterance is done
    _finalize(
        utt[idx],
        node[idx],
        pb[idx],
        pnb[idx],
        ps[idx],
        pe[idx],
        wf[idx],
        trie,
        results,
        rec_start,
        rec_end,
        rec_prev,
        beam_width,
        beam_prune_logp,
        last_rep,
    )
    live = ~done
    return tuple(a[live] for a in (utt, node, pb, pnb, ps, pe, wf))


def _finalize(
    utt: np.ndarray,
    node: np.ndarray,
    pb: np.ndarray,
    pnb: np.ndarray,
    ps: np.ndarray,
    pe: np.ndarray,
    wf: np.ndarray,
    trie: PrefixTrie,
    results: list[list[CTCHypothesis]],
    rec_start: list[int],
    rec_end: list[int],
    rec_prev: list[int],
    beam_width: int,
    beam_prune_logp: float,
    last_rep: bool,
) -> None:
    """Merge ended utterances' beams by final text, add end-of-utterance LM scores, rank.

    The beams of each utterance come in frame order (best first), the order pyctcdecode's final merge
    sees; equal texts merge by log-sum-exp in that order, and are represented by their first member (last
    with ``last_rep``). Fills ``results[u]`` for every utterance ``u`` in ``utt``.
    """
    if len(utt) == 0:
        return
    logit = np.logaddexp(pb, pnb)
    keys = trie.final_key(node)
    # group equal (utterance, final text), keeping frame order inside each group
    o = np.argsort(keys, kind="stable")
    o = o[np.argsort(utt[o], kind="stable")]
    k_sorted, u_sorted = keys[o], utt[o]
    flag = np.empty(len(o), dtype=bool)
    flag[0] = True
    np.not_equal(k_sorted[1:], k_sorted[:-1], out=flag[1:])
    flag[1:] |= u_sorted[1:] != u_sorted[:-1]
    starts = np.flatnonzero(flag)
    ends = np.append(starts[1:], len(o))
    g_logit = np.logaddexp.reduceat(logit[o], starts)
    g_first = o[starts]
    g_rep = o[ends - 1] if last_rep else g_first
    g_utt = u_sorted[starts]
    f_score, f_sid = trie.final_many(node[g_rep])
    totals = g_logit + f_score
    # per utterance: groups in first-occurrence order, then best total first (stable), pruned, top-k
    go = np.argsort(g_first, kind="stable")
    go = go[np.argsort(-totals[go], kind="stable")]
    go = go[np.argsort(g_utt[go], kind="stable")]
    su = g_utt[go]
    ustart = _segment_starts(su)
    ulen = np.diff(np.append(ustart, len(su)))
    best = np.repeat(np.maximum.reduceat(totals[go], ustart), ulen)
    keep = totals[go] >= best + beam_prune_logp
    go, su = go[keep], su[keep]
    ustart = _segment_starts(su)
    rank = np.arange(len(go)) - np.repeat(ustart, np.diff(np.append(ustart, len(go))))
    keep = rank < beam_width
    go = go[keep]
    for u in np.unique(utt).tolist():
        results[u] = []
    states = trie.states
    has_lm = trie.lm is not None
    for u, i, tot, gl, sid in zip(
        g_utt[go].tolist(),
        g_rep[go].tolist(),
        totals[go].tolist(),
        g_logit[go].tolist(),
        f_sid[go].tolist(),
        strict=True,
    ):
        frames: list[tuple[int, int]] = []
        p = int(wf[i])
        while p >= 0:
            frames.append((rec_start[p], rec_end[p]))
            p = rec_prev[p]
        frames.reverse()
        nd = int(node[i])
        if trie.plen[nd] > 0:
            frames.append((int(ps[i]), int(pe[i])))
        text = trie.text(nd)
        results[u].append(
            CTCHypothesis(
                text=text,
                score=tot,
                logit_score=gl,
                lm_score=tot - gl,
                word_frames=list(zip(text.split(), frames, strict=False)),
                lm_state=states[sid] if has_lm else None,
            )
        )
