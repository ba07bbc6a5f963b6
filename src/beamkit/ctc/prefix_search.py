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
(:mod:`beamkit.ctc.prefix_trie`, one node per prefix, children found through a dense child table); the
beams of all utterances are flat arrays (utterance, node, p_b, p_nb, frame offsets). Frames whose only
candidate is blank, while every beam ends in blank, only add ``lp(blank)`` to every beam of the utterance:
they are skipped (one addition over the whole run); with ``split_blank`` so is the blank-only frame right
after a busy one (where a prefix's beams ending in blank and in a label merge) when no two beams would
merge or share a history key there. Each utterance thus searches its own list of frames
(:func:`_schedule`), and each step searches the next such frame of every utterance at once. A step is a
few dozen numpy calls over (beam, candidate) cells: expansion, merging (sort + ``logaddexp.reduceat``) and
pruning. Python runs per item only for an LM query of a new (context, word) pair and for building the
returned hypotheses. The fixed cost per step is a few hundred microseconds, so the speed comes from
batching utterances. A single utterance is searched in plain Python instead (:mod:`beamkit.ctc.small_search`,
same nodes, beams and scores) while its steps stay small, then vectorised from there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .lm import HotwordScorer, LanguageModelFusion
from .options import SearchOptions
from .posteriors import Candidates, as_real_array, collect_candidates, dense_part
from .prefix_trie import PrefixTrie
from .small_search import search_small
from .vocab import Vocabulary

NEG_INF = -math.inf
_UTT_SALT = np.uint64(0xFF51AFD7ED558CCD)
_UNSTABLE_SORT_MIN = 1024  # keys from which an unstable sort plus checks beats a stable sort
_SMALL_SORT = 64  # below this many int keys a stable sort costs less than making the keys distinct
_SMALL_CELLS = 128  # a single utterance is searched in plain Python while steps expand at most this many cells


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


def to_numpy_2d_or_3d(x: Any, name: str = "log_probs", check_nan: bool = True) -> np.ndarray:
    """Convert a numpy array, torch tensor or nested list of real numbers to a float64 numpy array (2-D or
    3-D); reject booleans and complex numbers (TypeError), and NaN values unless ``check_nan`` is False."""
    arr = as_real_array(x, name)
    if arr.ndim not in (2, 3):
        raise ValueError(f"{name} must be 2-D (T, V) or 3-D (N, T, V), got shape {arr.shape}")
    if check_nan and np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    return arr


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log-softmax in float64."""
    return log_softmax_(np.array(x, dtype=np.float64), axis)


def log_softmax_(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """:func:`log_softmax` of a float64 array in place (one temporary of its size); returns ``x``."""
    m = np.max(x, axis=axis, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    x -= m
    with np.errstate(divide="ignore"):
        x -= np.log(np.sum(np.exp(x), axis=axis, keepdims=True))
    return x


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


def _stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for non-negative int64 keys, by a faster unstable sort of the
    distinct keys ``keys * len + position`` where they fit in int64."""
    n = len(keys)
    if n < _SMALL_SORT or int(keys.max()) >= (1 << 62) // n:
        return keys.argsort(kind="stable")
    return (keys * n + np.arange(n)).argsort()


def _stable_argsort_float(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for float64 keys; for many keys (from ``_UNSTABLE_SORT_MIN``), by a
    faster unstable sort where the keys are finite, non-negative and distinct (then there is only one
    ascending order): such floats order like their bit patterns read as int64."""
    if len(keys) < _UNSTABLE_SORT_MIN or not (np.isfinite(keys).all() and keys.min() >= 0.0):
        return keys.argsort(kind="stable")
    bits = (keys + 0.0).view(np.int64)  # adding +0.0 turns -0.0 into +0.0
    order = bits.argsort()
    sorted_bits = bits[order]
    if (sorted_bits[1:] == sorted_bits[:-1]).any():  # ties keep their positions' order
        return keys.argsort(kind="stable")
    return order


def _segment_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in a sorted 1-D array."""
    if len(sorted_keys) == 0:
        return np.zeros(0, dtype=np.int64)
    flag = np.empty(len(sorted_keys), dtype=bool)
    flag[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=flag[1:])
    return flag.nonzero()[0]


def _segment_lengths(starts: np.ndarray, n: int) -> np.ndarray:
    """Length of each segment of a length-``n`` array, from the segment starts (``np.diff`` with an end)."""
    out = np.empty_like(starts)
    if len(starts):
        np.subtract(starts[1:], starts[:-1], out=out[:-1])
        out[-1] = n - starts[-1]
    return out


def _first_occurrences(keys: np.ndarray) -> np.ndarray | None:
    """Positions of the first occurrence of each distinct key, ascending (as ``np.unique(keys,
    return_index=True)`` then sorted); None when the keys are all distinct."""
    if len(keys) < _UNSTABLE_SORT_MIN:
        order = keys.argsort(kind="stable")
        dup = (keys[order[1:]] == keys[order[:-1]]).nonzero()[0]
        if not len(dup):
            return None
        keep = np.ones(len(keys), dtype=bool)
        keep[order[dup + 1]] = False  # a later member of a run of equal keys
        return keep.nonzero()[0]
    order = keys.argsort()  # equal keys in any order: each run's first position is its smallest
    sorted_keys = keys[order]
    if not (sorted_keys[1:] == sorted_keys[:-1]).any():
        return None
    first = np.minimum.reduceat(order, _segment_starts(sorted_keys))
    first.sort()
    return first


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
    opts = SearchOptions(
        beam_width=beam_width,
        beam_prune_logp=beam_prune_logp,
        token_min_logp=token_min_logp,
        prune_history=prune_history,
        split_blank=split_blank,
        pyctcdecode_compat=pyctcdecode_compat,
        hotwords=None if hotwords is None else _word_tuple(hotwords),
        hotword_weight=hotword_weight,
        num_hypotheses=num_hypotheses,
    )
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
    parts = (dense_part(batch[i, :n], token_min_logp, voc.blank) for i, n in enumerate(lens.tolist()))
    cands = collect_candidates(parts, lens)
    results = search_candidates(cands, voc, lm, opts)
    return results[0] if single else results


def _word_tuple(words: Iterable[str]) -> tuple[str, ...]:
    """Hotwords as a tuple (one string is refused: it would be read as its characters)."""
    if isinstance(words, str):
        raise TypeError("hotwords must be a list of strings, not one string")
    return tuple(words)


def search_candidates(
    cands: Candidates, voc: Vocabulary, lm: LanguageModelFusion | None, opts: SearchOptions
) -> list[list[CTCHypothesis]]:
    """Prefix beam search of the candidates of checked log-probabilities (no NaN) over ``voc`` with an
    optional fused ``lm``: one list of hypotheses per utterance, at most ``opts.out_k`` each."""
    history = max(1, lm.order - 1) if lm is not None else 1
    # initial node storage (grows 4x when full): new nodes per utterance and searched frame are about the beam size
    capacity = min(1 << 22, max(1 << 15, int(cands.lens.sum()) * min(opts.beam_width, 16)))
    hot = HotwordScorer(opts.hotwords, opts.hotword_weight)
    trie = PrefixTrie(voc, lm, hot, history, opts.pyctcdecode_compat, capacity)
    try:
        return _search(cands, trie, opts, _SMALL_CELLS)
    finally:
        trie.release()


def _schedule(
    cands: Candidates, split_blank: bool, blank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The frames each utterance may have to search, and its candidate labels there.

    A frame is skipped when its only candidate is blank and every beam then ends in blank (any beam
    without ``split_blank``, where ending in blank or not is no separate beam): all beams just add
    ``lp(blank)``, so ranks and pruning do not change. With ``split_blank`` the first such frame after
    a busy one is listed as a *merge* frame: it merges the beams of a prefix that do and do not end in
    blank, and :func:`_search` skips it too when no two beams would merge or share a history.

    Returns ``(s_utt, s_frame, s_tok, s_lpv, s_count, s_merge, count, skip_cum)``: the listed (utterance,
    frame) pairs, by utterance then frame; their candidate labels (label order, padded with blank) and
    log-probabilities (padded with -inf), and how many there are; whether each is a merge frame; listed
    frames per utterance; and the running sum of ``lp(blank)`` over blank-only frames (merge frames
    included, busy ones 0), so that skipping frames ``a .. b-1`` adds ``skip_cum[u, b] - skip_cum[u, a]``.
    """
    N, T, lens = cands.n, cands.T, cands.lens
    n_cand = cands.count.reshape(N, T)  # shape: (N, T)
    row_start = np.cumsum(cands.count) - cands.count  # shape: (N * T,) first candidate of each row
    first = np.full(N * T, -1, dtype=np.int64)  # shape: (N * T,) first candidate label of each row
    busy = cands.count > 0
    first[busy] = cands.labels[row_start[busy]]
    lp_blank = cands.lp_blank  # shape: (N, T)
    valid = np.arange(T) < lens[:, None]  # shape: (N, T)
    blank_only = valid & (n_cand == 1) & (first.reshape(N, T) == blank) & np.isfinite(lp_blank)  # shape: (N, T)
    listed = valid & ~blank_only
    if split_blank:
        listed[:, 1:] |= listed[:, :-1] & blank_only[:, 1:]  # busy frame, then a merge frame
    s_utt, s_frame = np.nonzero(listed)  # sorted by utterance, then frame
    count = listed.sum(axis=1)  # shape: (N,)
    s_row = s_utt * T + s_frame  # shape: (S,)
    s_count = cands.count[s_row]  # shape: (S,)
    s_merge = blank_only[s_utt, s_frame]  # shape: (S,)
    K = int(s_count.max(initial=1))
    col = np.arange(K)  # shape: (K,)
    real = col < s_count[:, None]  # shape: (S, K)
    src = (row_start[s_row][:, None] + col)[real]  # shape: (sum of s_count,) flat candidate index
    s_tok = np.full((len(s_utt), K), blank, dtype=np.int64)  # shape: (S, K)
    s_tok[real] = cands.labels[src]
    s_lpv = np.full((len(s_utt), K), NEG_INF)  # shape: (S, K) padding (blank) yields no row
    s_lpv[real] = cands.values[src]
    skip_cum = np.zeros((N, T + 1))  # shape: (N, T + 1)
    np.cumsum(np.where(blank_only, lp_blank, 0.0), axis=1, out=skip_cum[:, 1:])
    return s_utt, s_frame, s_tok, s_lpv, s_count, s_merge, count, skip_cum


def _skip_blank_frames(
    pb: np.ndarray, pnb: np.ndarray, utt: np.ndarray, start: np.ndarray, stop: np.ndarray, skip_cum: np.ndarray
) -> None:
    """Move beams (in place) over their utterance's skipped frames ``start .. stop-1`` (per beam)."""
    g = (stop > start).nonzero()[0]
    if len(g):
        row = utt[g] * skip_cum.shape[1]  # flat offset of each beam's utterance in skip_cum
        flat = skip_cum.ravel()
        pb[g] = np.logaddexp(pb[g], pnb[g]) + (flat.take(row + stop[g]) - flat.take(row + start[g]))
        pnb[g] = NEG_INF


def _search(
    cands: Candidates, trie: PrefixTrie, opts: SearchOptions, small_cells: int = 0
) -> list[list[CTCHypothesis]]:
    """Search all utterances together: each step searches the next listed frame (:func:`_schedule`) of
    every utterance that has one (frames between searched ones are skipped in one addition).

    ``opts.word_frames=False`` leaves the word offsets out (the hypotheses get none): they do not steer the
    search, and a caller that only wants texts saves their bookkeeping. ``small_cells > 0`` searches a
    single utterance (with ``split_blank``) in plain Python (:func:`search_small`, same results) while
    its steps expand at most that many (beam, candidate) cells, then goes on vectorised."""
    beam_width, beam_prune_logp, out_k = opts.beam_width, opts.beam_prune_logp, opts.out_k
    prune_history, split_blank, word_frames = opts.prune_history, opts.split_blank, opts.word_frames
    last_rep = opts.pyctcdecode_compat  # equal final texts are represented by their last member
    N, lens = cands.n, cands.lens
    voc = trie.vocab
    blank = voc.blank
    starts_word = voc.starts_word
    is_bpe = voc.is_bpe
    s_utt, s_frame, s_tok, s_lpv, s_count, s_merge, count, skip_cum = _schedule(cands, split_blank, blank)
    s_merge_x = np.append(s_merge, False)  # shape: (S + 1,) see _skip_merge_frames
    end = np.cumsum(count)  # shape: (N,) end of each utterance's listed pairs
    nxt = end - count  # shape: (N,) next listed pair of each utterance
    pos = np.zeros(N, dtype=np.int64)  # shape: (N,) next frame not yet applied to the beams
    # flat beam arrays, grouped by utterance, best first
    utt: np.ndarray = np.arange(N, dtype=np.int64)  # shape: (E,)
    node: np.ndarray = np.full(N, trie.root, dtype=np.int64)
    pb: np.ndarray = np.zeros(N)
    pnb: np.ndarray = np.full(N, NEG_INF)
    ps: np.ndarray = np.full(N, -1, dtype=np.int64)  # partial-word start frame (-1: none)
    pe: np.ndarray = np.full(N, -1, dtype=np.int64)  # partial-word end frame (exclusive)
    wf: np.ndarray = np.full(N, -1, dtype=np.int64)  # pointer into the word-frame records
    records = _WordRecords()
    results: list[list[CTCHypothesis]] = [[] for _ in range(N)]
    ended: list[tuple[np.ndarray, ...]] = []  # beams of the utterances that ended, finalized together
    beams: tuple[np.ndarray, ...] = (utt, node, pb, pnb, ps, pe, wf) if word_frames else (utt, node, pb, pnb)
    if small_cells > 0 and N == 1 and split_blank and trie.small_path_ok():
        k = s_count.tolist()
        done, beams, small_nxt, small_pos = search_small(
            trie,
            s_frame.tolist(),
            [row[:n] for row, n in zip(s_tok.tolist(), k, strict=True)],
            [row[:n] for row, n in zip(s_lpv.tolist(), k, strict=True)],
            s_merge.tolist(),
            skip_cum[0].tolist(),
            int(lens[0]),
            beam_width,
            beam_prune_logp,
            prune_history,
            records if word_frames else None,
            small_cells,
        )
        if done:
            _finalize_ended([beams], word_frames, trie, results, records, out_k, beam_prune_logp, last_rep)
            return results
        nxt[0], pos[0] = small_nxt, small_pos  # the vectorised steps go on from there
    utt, node, pb, pnb, *frames = _finish(nxt[beams[0]] == end[beams[0]], beams, ended, lens, pos, skip_cum)
    while len(utt):
        sb = nxt[utt]  # shape: (E,) searched pair of each beam
        nxt[utt] = sb + 1
        fr = s_frame[sb]  # shape: (E,) its frame
        _skip_blank_frames(pb, pnb, utt, pos[utt], fr, skip_cum)
        pos[utt] = fr + 1
        K = int(s_count[sb].max())
        tok = s_tok.take(sb, axis=0)[:, :K]  # shape: (E, K) candidate labels of each beam's frame
        lpv = s_lpv.take(sb, axis=0)[:, :K]  # shape: (E, K)
        tot = np.logaddexp(pb, pnb)
        is_blank = tok == blank
        is_rep = tok == trie.last_tok[node][:, None]  # the prefix's last label again (never blank)
        # main rows: blank stays on the prefix (ends in blank), a label extends it (a repeat needs p_b)
        main_val = np.where(is_rep, pb[:, None], tot[:, None]) + lpv  # shape: (E, K)
        mi = (main_val > NEG_INF).ravel().nonzero()[0]
        # repeat rows: the last label again, staying on the prefix (ends in a label)
        qi = (is_rep & (pnb > NEG_INF)[:, None]).ravel().nonzero()[0]
        cell = np.concatenate((mi, qi))  # shape: (rows,) flat (beam, candidate) cell of each row
        src = cell // K  # shape: (rows,) source beam
        r_tok = tok.ravel()[cell]
        r_stay = is_blank.ravel()[cell]  # stays on the prefix: blank main rows and every repeat row
        r_stay[len(mi) :] = True
        r_nb = ~r_stay  # ends in a label: label main rows and every repeat row
        r_nb[len(mi) :] = True
        r_val = np.concatenate((main_val.ravel()[mi], pnb[src[len(mi) :]] + lpv.ravel()[qi]))
        r_node = node[src]
        ext = (~r_stay).nonzero()[0]
        r_node[ext] = trie.children(r_node[ext], r_tok[ext])
        # merge rows of equal (utterance, prefix[, ends in a label]) by log-sum-exp; the merged beam
        # takes the word offsets of its most probable row (the first one on ties)
        r_utt = utt[src]
        key = r_utt * trie.n + r_node
        if split_blank:
            key = key * 2 + r_nb
        order = _stable_argsort(key)
        starts = _segment_starts(key[order])
        val_sorted = r_val[order]
        glen = _segment_lengths(starts, len(order))
        at_max = val_sorted == np.maximum.reduceat(val_sorted, starts).repeat(glen)
        rep = order[np.minimum.reduceat(np.where(at_max, np.arange(len(order)), len(order)), starts)]  # shape: (M,)
        if split_blank:
            m_val = np.logaddexp.reduceat(val_sorted, starts)
            nb = r_nb[rep]
            m_pb, m_pnb = np.where(nb, NEG_INF, m_val), np.where(nb, m_val, NEG_INF)
        else:
            nb_sorted = r_nb[order]
            m_pb = np.logaddexp.reduceat(np.where(nb_sorted, NEG_INF, val_sorted), starts)
            m_pnb = np.logaddexp.reduceat(np.where(nb_sorted, val_sorted, NEG_INF), starts)
            m_val = np.logaddexp(m_pb, m_pnb)
        m_utt, m_node = r_utt[rep], r_node[rep]
        total = m_val + trie.score[m_node]
        # prune per utterance (merged beams are grouped by utterance): threshold, then top beam_width
        gstart = _segment_starts(m_utt)
        m_count = _segment_lengths(gstart, len(m_utt))  # shape: (utterances,) merged beams of each
        best = np.maximum.reduceat(total, gstart).repeat(m_count)
        sel = ((total >= best + beam_prune_logp) & (total > NEG_INF)).nonzero()[0]
        s_below = best[sel] - total[sel]
        span = float(s_below.max()) + 1.0 if len(sel) else 1.0
        order = sel[_stable_argsort_float(m_utt[sel] * span + s_below)]  # utterance, then best first
        if int(m_count.max(initial=0)) > beam_width:
            gstart = _segment_starts(m_utt[order])
            rank = np.arange(len(order)) - gstart.repeat(_segment_lengths(gstart, len(order)))
            order = order[rank < beam_width]
        kept_node = m_node[order]
        if prune_history:
            hkey = trie.history_hash(kept_node) ^ (m_utt[order].astype(np.uint64) * _UTT_SALT)
            # with split_blank a beam ending in blank and one ending in a label do not compete
            first_pos = _first_occurrences(hkey ^ (m_pb[order] == NEG_INF).astype(np.uint64) if split_blank else hkey)
            if first_pos is not None:
                order, kept_node, hkey = order[first_pos], kept_node[first_pos], hkey[first_pos]
        if word_frames:
            # word offsets: a label starting a word closes the partial word (pushes its frames)
            ps, pe, wf = frames
            r = rep[order]
            e = src[r]
            f = fr[e]
            o_ps, o_pe, o_wf = ps[e], pe[e], wf[e]
            is_ext = ~r_stay[r]
            sw = is_ext & starts_word[r_tok[r]]
            ps = np.where(is_ext, np.where(sw, f if is_bpe else -1, np.where(o_ps < 0, f, o_ps)), o_ps)
            pe = np.where(r_nb[r], np.where(sw & (not is_bpe), -1, f + 1), o_pe)
            frames = [ps, pe, records.push(o_ps, o_pe, o_wf, sw & (trie.plen[node[e]] > 0))]
        utt, node, pb, pnb = m_utt[order], kept_node, m_pb[order], m_pnb[order]
        if split_blank:
            _skip_merge_frames(utt, hkey if prune_history else node, nxt, s_merge_x, trie.n, prune_history)
        # finalize utterances whose last listed frame this was
        utt, node, pb, pnb, *frames = _finish(
            nxt[utt] == end[utt], (utt, node, pb, pnb, *frames), ended, lens, pos, skip_cum
        )
    _finalize_ended(ended, word_frames, trie, results, records, out_k, beam_prune_logp, last_rep)
    return results


def _finalize_ended(
    ended: list[tuple[np.ndarray, ...]],
    word_frames: bool,
    trie: PrefixTrie,
    results: list[list[CTCHypothesis]],
    records: _WordRecords,
    out_k: int,
    beam_prune_logp: float,
    last_rep: bool,
) -> None:
    """:func:`_finalize` the beams of the ended utterances (parts ``(utt, node, pb, pnb[, ps, pe, wf])``)."""
    if ended:
        utt, node, pb, pnb, *frames = (np.concatenate(parts) for parts in zip(*ended, strict=True))
        offsets = (frames[0], frames[1], frames[2]) if word_frames else None
        _finalize(utt, node, pb, pnb, offsets, trie, results, records, out_k, beam_prune_logp, last_rep)


def _skip_merge_frames(
    utt: np.ndarray,
    beam_key: np.ndarray,
    nxt: np.ndarray,
    s_merge: np.ndarray,
    n_nodes: int,
    prune_history: bool,
) -> None:
    """Move ``nxt`` past the next listed frame of each utterance where it is a merge frame that would
    change nothing: no two of the utterance's beams share a prefix (one ending in blank, one not) or,
    with ``prune_history``, a history key once both end in blank. Every beam then just ends in blank
    and adds ``lp(blank)`` (the frame is in ``skip_cum``), so ranks and pruning do not change.

    ``beam_key``: the node of each beam, or with ``prune_history`` its history key salted by utterance
    (as :func:`_search` computes it, not telling blank from label endings); ``n_nodes``: nodes in the trie;
    ``s_merge``: whether each listed pair is a merge frame, plus a ``False`` at the end. A beam's next pair
    may be the first one of the next utterance (or that end) when its utterance has none left: the first
    listed frame of an utterance is never a merge frame, so no check of the utterance's end is needed."""
    at = s_merge[nxt[utt]].nonzero()[0]  # shape: (A,) beams whose utterance has a merge frame next
    if not len(at):
        return
    a_utt = utt[at]
    if prune_history:  # equal prefixes have equal history keys
        key = beam_key[at]
    else:
        key = a_utt * n_nodes + beam_key[at]
    key_sorted = np.sort(key)
    clash = key_sorted[1:] == key_sorted[:-1]
    if not clash.any():
        nxt[a_utt] += 1  # each utterance once (repeated indices add once)
        return
    skip = np.ones(len(nxt), dtype=bool)
    order = key.argsort()
    skip[a_utt[order[1:][clash]]] = False
    go = a_utt[skip[a_utt]]
    nxt[go] += 1


class _WordRecords:
    """Completed-word frames ``(start, end)`` as a linked list per beam (``prev``: the word before)."""

    def __init__(self) -> None:
        self.start: list[int] = []
        self.end: list[int] = []
        self.prev: list[int] = []

    def push(self, start: np.ndarray, end: np.ndarray, prev: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Record ``(start, end)`` after ``prev`` where ``mask``; return the beams' new record pointers."""
        pushed = mask.nonzero()[0]
        if not len(pushed):
            return prev
        base = len(self.start)
        self.start.extend(start[pushed].tolist())
        self.end.extend(end[pushed].tolist())
        self.prev.extend(prev[pushed].tolist())
        out = prev.copy()
        out[pushed] = base + np.arange(len(pushed))
        return out

    def frames(self, pointer: int) -> list[tuple[int, int]]:
        """The completed words' frames, first word first."""
        out: list[tuple[int, int]] = []
        while pointer >= 0:
            out.append((self.start[pointer], self.end[pointer]))
            pointer = self.prev[pointer]
        out.reverse()
        return out


def _finish(
    done: np.ndarray,
    beams: tuple[np.ndarray, ...],
    ended: list[tuple[np.ndarray, ...]],
    lens: np.ndarray,
    pos: np.ndarray,
    skip_cum: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Move the ``done`` beams (every beam of their utterances) over their trailing skipped frames into
    ``ended``; return the remaining beams. ``beams``: ``(utt, node, pb, pnb, ...)`` (further per-beam
    arrays ride along)."""
    if not done.any():
        return beams
    out = tuple(a[done] for a in beams)
    utt, _, pb, pnb = out[:4]
    _skip_blank_frames(pb, pnb, utt, pos[utt], lens[utt], skip_cum)
    ended.append(out)
    live = ~done
    return tuple(a[live] for a in beams)


def _finalize(
    utt: np.ndarray,
    node: np.ndarray,
    pb: np.ndarray,
    pnb: np.ndarray,
    offsets: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    trie: PrefixTrie,
    results: list[list[CTCHypothesis]],
    records: _WordRecords,
    beam_width: int,
    beam_prune_logp: float,
    last_rep: bool,
) -> None:
    """Merge ended utterances' beams by final text, add end-of-utterance LM scores, rank.

    The beams of each utterance come in frame order (best first), the order pyctcdecode's final merge
    sees; equal texts merge by log-sum-exp in that order, and are represented by their first member (last
    with ``last_rep``). Fills ``results[u]`` for every utterance ``u`` in ``utt``. ``offsets``: the beams'
    ``(ps, pe, wf)`` word offsets (None: the hypotheses get no word frames).
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
    out_rows = g_rep[go]
    texts = trie.texts(node[out_rows])
    for u, i, tot, gl, sid, text in zip(
        g_utt[go].tolist(),
        out_rows.tolist(),
        totals[go].tolist(),
        g_logit[go].tolist(),
        f_sid[go].tolist(),
        texts,
        strict=True,
    ):
        frames: list[tuple[int, int]] = []
        if offsets is not None:
            ps, pe, wf = offsets
            frames = records.frames(int(wf[i]))
            if trie.plen[int(node[i])] > 0:
                frames.append((int(ps[i]), int(pe[i])))
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
