"""Oracle tests for CTC greedy decoding and prefix beam search.

Expected values come from brute force over every alignment of tiny (T, V) problems: the probability of a
label sequence is the sum over the alignments that collapse to it, which is exactly what prefix beam
search computes when nothing is pruned.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from beamkit.ctc import CTCOptions, Decoder, LanguageModelFusion, Vocabulary, greedy_ctc, prefix_beam_search
from beamkit.ctc.prefix.chartrie import CharTrie, walk
from beamkit.lm import ArpaLM, build_arpa
from beamkit.ops import log_softmax

WIDE = {"beam_width": 10_000, "beam_prune_logp": -math.inf, "token_min_logp": -math.inf}


def search(log_probs, vocab, lm=None, lengths=None, **knobs):
    """:func:`prefix_beam_search` with ``knobs`` as :class:`CTCOptions` (``split_blank`` off unless given: the
    alignment-sum oracles merge a prefix's blank and label endings); one ``(T, V)`` matrix gives its own list of
    hypotheses, a batch one list per utterance."""
    got = prefix_beam_search(log_probs, vocab, CTCOptions(**{"split_blank": False, **knobs}), lm=lm, lengths=lengths)
    return got[0] if getattr(log_probs, "ndim", 0) == 2 else got


def random_log_probs(rng: np.random.Generator, T: int, V: int, peaky: float = 1.0) -> np.ndarray:
    """Random per-frame log-probabilities (Dirichlet rows)."""
    return np.log(rng.dirichlet(np.full(V, peaky), size=T))


def oracle(log_probs: np.ndarray, labels: list[str], blank: int) -> dict[str, float]:
    """log P(text) by summing every alignment; text collapses repeats, drops blanks, normalises spaces
    (and maps a leading '▁' to a word break for BPE pieces)."""
    T, V = log_probs.shape
    out: dict[str, float] = {}
    for path in itertools.product(range(V), repeat=T):
        collapsed = [k for i, k in enumerate(path) if k != blank and (i == 0 or path[i - 1] != k)]
        raw = "".join(labels[k].replace("▁", " ") for k in collapsed)
        text = " ".join(raw.split())
        lp = float(sum(log_probs[t, k] for t, k in enumerate(path)))
        out[text] = float(np.logaddexp(out.get(text, -math.inf), lp))
    return out


def as_dict(hyps) -> dict[str, float]:
    return {h.text: h.logit_score for h in hyps}


@pytest.mark.parametrize("split_blank", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_wide_beam_equals_alignment_sum_plain_labels(seed: int, split_blank: bool) -> None:
    rng = np.random.default_rng(seed)
    labels = ["", "a", "b"]
    lp = random_log_probs(rng, 5, 3)
    expected = oracle(lp, labels, 0)
    got = as_dict(search(lp, Vocabulary(labels, 0, False), split_blank=split_blank, **WIDE))
    assert set(got) == set(expected)
    for text, value in expected.items():
        assert got[text] == pytest.approx(value, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_wide_beam_with_word_delimiter_normalises_spaces(seed: int) -> None:
    rng = np.random.default_rng(10 + seed)
    labels = ["", " ", "a", "b"]
    lp = random_log_probs(rng, 5, 4)
    expected = oracle(lp, labels, 0)
    got = as_dict(search(lp, Vocabulary(labels, 0, False), **WIDE))
    assert set(got) == set(expected)
    for text, value in expected.items():
        assert got[text] == pytest.approx(value, abs=1e-9)
    # probabilities of all outputs sum to one
    assert np.logaddexp.reduce(list(got.values())) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_wide_beam_bpe_pieces(seed: int) -> None:
    rng = np.random.default_rng(20 + seed)
    labels = ["▁a", "b", "", "▁b"]  # blank in the middle: configurable blank index
    vocab = Vocabulary.from_labels(labels)
    assert vocab.is_bpe and vocab.blank == 2
    lp = random_log_probs(rng, 5, 4)
    expected = oracle(lp, labels, 2)
    got = as_dict(search(lp, vocab, **WIDE))
    assert set(got) == set(expected)
    for text, value in expected.items():
        assert got[text] == pytest.approx(value, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_best_hypothesis_is_the_exact_argmax(seed: int) -> None:
    rng = np.random.default_rng(30 + seed)
    labels = ["", " ", "a", "b"]
    lp = random_log_probs(rng, 6, 4, peaky=0.5)
    expected = oracle(lp, labels, 0)
    best_text = max(expected, key=expected.__getitem__)
    hyps = search(lp, labels, **WIDE)
    assert hyps[0].text == best_text
    assert hyps[0].logit_score == pytest.approx(expected[best_text], abs=1e-9)
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)


def test_greedy_hand_worked() -> None:
    # frames: a a _ a b b _ -> "aab"
    ids = [1, 1, 0, 1, 2, 2, 0]
    lp = np.log(np.full((7, 3), 0.1))
    lp[np.arange(7), ids] = np.log(0.8)
    assert greedy_ctc(lp) == [1, 1, 2]
    assert greedy_ctc(lp, ["", "a", "b"]) == "aab"
    assert greedy_ctc(lp[:, [1, 2, 0]], blank=2) == [0, 0, 1]


@pytest.mark.parametrize("seed", range(5))
def test_greedy_equals_beam_search_restricted_to_argmax(seed: int) -> None:
    rng = np.random.default_rng(40 + seed)
    labels = ["", " ", "a", "b", "c"]
    lp = random_log_probs(rng, 30, 5, peaky=0.3)
    for width in (1, 5):
        hyps = search(lp, labels, beam_width=width, token_min_logp=0.0)
        assert hyps[0].text == greedy_ctc(lp, labels)
    # on a peaky input where the best path dominates, beam 1 agrees with greedy too
    ids = rng.integers(0, 5, size=25)
    peaky = np.full((25, 5), math.log(0.01 / 4))
    peaky[np.arange(25), ids] = math.log(0.99)
    assert search(peaky, labels, beam_width=1)[0].text == greedy_ctc(peaky, labels)


def test_batch_of_different_lengths_matches_single_calls() -> None:
    rng = np.random.default_rng(50)
    labels = ["", " ", "a", "b", "c"]
    mats = [random_log_probs(rng, T, 5, peaky=0.4) for T in (7, 12, 1, 9)]
    batched = search(mats, labels, beam_width=8)
    for m, hyps in zip(mats, batched, strict=False):
        single = search(m, labels, beam_width=8)
        assert [h.text for h in hyps] == [h.text for h in single]
        np.testing.assert_allclose([h.score for h in hyps], [h.score for h in single], atol=1e-12)
    padded = np.zeros((4, 12, 5))
    for i, m in enumerate(mats):
        padded[i, : len(m)] = m
    again = search(padded, labels, lengths=[7, 12, 1, 9], beam_width=8)
    assert [[h.text for h in u] for u in again] == [[h.text for h in u] for u in batched]


def frame_by_frame(
    lp: np.ndarray, labels: list[str], beam_width: int, prune: float, token_min_logp: float, prune_history: bool
) -> dict[str, float]:
    """pyctcdecode's beam search (beam unit: prefix and whether it ends in blank) in plain Python, one
    frame at a time with no frame skipped; returns ``{text: logit score}`` of the final hypotheses.

    A prefix is (completed words, partial word, last label that changed it; the root counts as a space).
    Per frame: expand (blank keeps the prefix, the prefix's last label again collapses onto a beam that
    ends in it, anything else extends), merge equal beams, keep totals within ``prune`` of the best,
    best first, at most ``beam_width``, then (``prune_history``) the first beam per (last word, partial
    word, ends in blank). At the end equal texts merge and are pruned again."""
    space = labels.index(" ")

    def extend(words: tuple, partial: str, last: int, c: int) -> tuple:
        if c != space:
            return words, partial + labels[c], c
        return (words + (partial,), "", c) if partial else (words, partial, last)

    beams: list[tuple[tuple, float]] = [(((), "", space, False), 0.0)]  # ((words, partial, last, ends in label), logit)
    for row in lp:
        cands = [c for c in range(len(row)) if row[c] >= token_min_logp or c == int(np.argmax(row))]
        merged: dict[tuple, float] = {}
        for (words, partial, last, nb), val in beams:
            for c in cands:
                if c == 0:
                    key = (words, partial, last, False)
                elif c == last and nb:
                    key = (words, partial, last, True)
                else:
                    key = (*extend(words, partial, last, c), True)
                merged[key] = float(np.logaddexp(merged.get(key, -math.inf), val + row[c]))
        best = max(merged.values())
        ranked = sorted(((k, v) for k, v in merged.items() if v >= best + prune), key=lambda kv: -kv[1])
        beams = ranked[:beam_width]
        if prune_history:
            seen: set[tuple] = set()
            kept = []
            for (words, partial, last, nb), val in beams:
                if (words[-1:], partial, nb) not in seen:
                    seen.add((words[-1:], partial, nb))
                    kept.append(((words, partial, last, nb), val))
            beams = kept
    texts: dict[str, float] = {}
    for (words, partial, _, _), val in beams:
        text = " ".join(words + ((partial,) if partial else ()))
        texts[text] = float(np.logaddexp(texts.get(text, -math.inf), val))
    best = max(texts.values())
    ranked = sorted(((t, v) for t, v in texts.items() if v >= best + prune), key=lambda tv: -tv[1])
    return dict(ranked[:beam_width])


def merge_frame_utterance(rng: np.random.Generator, T: int) -> np.ndarray:
    """Peaky ``(T, 5)`` log-probabilities over blank, space, a, b, c: runs of blank-only frames, single
    labels, and uncertain frames (two or three candidates, blank often among them)."""
    lp = np.full((T, 5), math.log(1e-4))
    for t in range(T):
        kind = rng.random()
        if kind < 0.4:
            lp[t, 0] = 0.0
        elif kind < 0.7:
            lp[t, int(rng.integers(1, 5))] = 0.0
        else:
            picks = rng.choice(5, size=int(rng.integers(2, 4)), replace=False)
            lp[t, picks] = np.log(rng.dirichlet(np.ones(len(picks))))
    return lp - np.logaddexp.reduce(lp, axis=1, keepdims=True)


@pytest.mark.parametrize("prune_history", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_split_blank_search_equals_frame_by_frame_search(seed: int, prune_history: bool) -> None:
    # the vectorised search skips blank-only frames, and the merge frame after a busy frame when no beams
    # would merge there; the plain search above runs every frame, so both must keep the same beams
    rng = np.random.default_rng(seed)
    labels = ["", " ", "a", "b", "c"]
    mats = [merge_frame_utterance(rng, int(rng.integers(10, 40))) for _ in range(8)]
    knobs = {"beam_width": 4, "beam_prune_logp": -6.0, "token_min_logp": -4.0}
    got = search(mats, labels, split_blank=True, prune_history=prune_history, **knobs)
    for m, hyps in zip(mats, got, strict=True):
        expected = frame_by_frame(m, labels, knobs["beam_width"], -6.0, -4.0, prune_history)
        assert [h.text for h in hyps] == list(expected)
        np.testing.assert_allclose([h.logit_score for h in hyps], list(expected.values()), atol=1e-9)
        single = search(m, labels, split_blank=True, prune_history=prune_history, **knobs)
        assert [h.text for h in single] == list(expected)


@pytest.mark.parametrize("prune_history", [False, True])
@pytest.mark.parametrize(("beam_width", "prune"), [(2, -0.5), (4, -0.5), (4, -2.0)])
def test_short_split_blank_cases_equal_frame_by_frame_search(
    beam_width: int, prune: float, prune_history: bool
) -> None:
    # many tiny utterances (3-8 frames, blank-only frames between uncertain ones, tight pruning): some
    # have a merge frame where a prefix ending in blank and the same prefix ending in a label merge and
    # raise the best score, which prunes other beams; skipping such a frame would keep them
    rng = np.random.default_rng(int(-prune * 10) + beam_width + 100 * prune_history)
    labels = ["", " ", "a", "b"]
    mats = []
    for _ in range(500):
        lp = np.full((int(rng.integers(3, 9)), 4), math.log(1e-5))
        for row in lp:
            if rng.random() < 0.35:
                row[0] = 0.0
            else:
                picks = rng.choice(4, size=int(rng.integers(1, 4)), replace=False)
                row[picks] = np.log(rng.dirichlet(np.ones(len(picks))))
        mats.append(lp - np.logaddexp.reduce(lp, axis=1, keepdims=True))
    got = search(
        mats,
        labels,
        beam_width=beam_width,
        beam_prune_logp=prune,
        token_min_logp=-4.0,
        prune_history=prune_history,
        split_blank=True,
    )
    for m, hyps in zip(mats, got, strict=True):
        expected = frame_by_frame(m, labels, beam_width, prune, -4.0, prune_history)
        assert [h.text for h in hyps] == list(expected)
        np.testing.assert_allclose([h.logit_score for h in hyps], list(expected.values()), atol=1e-9)


@pytest.mark.parametrize("seed", [3, 1142])
def test_history_pruning_at_merge_frames_equals_frame_by_frame_search(seed: int) -> None:
    # beams of different prefixes with the same last word and partial word, one ending in blank and one
    # not, share a history key once a merge frame makes both end in blank: the worse one goes there, and
    # keeping it would take a beam slot at the next frame (these seeds have such a case)
    rng = np.random.default_rng(seed)
    mats = []
    for _ in range(8):
        lp = np.full((int(rng.integers(8, 16)), 4), math.log(1e-5))
        for row in lp:
            kind = rng.random()
            if kind < 0.45:
                row[0 if kind < 0.3 else 1] = 0.0
            else:
                picks = rng.choice(4, size=int(rng.integers(2, 4)), replace=False)
                row[picks] = np.log(rng.dirichlet(np.ones(len(picks))))
        mats.append(lp - np.logaddexp.reduce(lp, axis=1, keepdims=True))
    labels = ["", " ", "a", "b"]
    knobs = {"beam_width": 3, "beam_prune_logp": -8.0, "token_min_logp": -4.0}
    got = search(mats, labels, prune_history=True, split_blank=True, **knobs)
    for m, hyps in zip(mats, got, strict=True):
        expected = frame_by_frame(m, labels, 3, -8.0, -4.0, True)
        assert [h.text for h in hyps] == list(expected)
        np.testing.assert_allclose([h.logit_score for h in hyps], list(expected.values()), atol=1e-9)


@pytest.mark.parametrize("dense_limit", [0, 1 << 22])
def test_char_trie_walk_follows_the_word_list(dense_limit: int) -> None:
    # both walks (binary search over sorted keys; dense table) against Python prefix sets
    words = ["cat", "car", "cart", "dog", "do", "a", "zebra's"]
    alphabet = {c: i for i, c in enumerate("acdgortz")}  # a partial word never holds 'e', 'b' or "'"
    trie = CharTrie(words, alphabet, dense_limit=dense_limit)
    assert (trie.table is None) == (dense_limit == 0)
    rng = np.random.default_rng(7)
    strings = ["", "c", "ca", "car", "cart", "carts", "do", "dog", "dot", "a", "z", "ze", "x"]
    strings += ["".join(rng.choice(list("acdgortzx"), size=int(rng.integers(1, 5)))) for _ in range(200)]
    width = max(len(s) for s in strings)
    chars = np.full((len(strings), width), -1, dtype=np.int64)  # -1: no character (state kept)
    for i, s in enumerate(strings):
        chars[i, : len(s)] = [alphabet.get(c, -2) for c in s]  # -2: outside the alphabet
    table = trie.table if trie.table is not None else np.zeros(0, dtype=np.int64)
    state = [0] * len(strings)
    for i in range(len(strings)):
        for j in range(width):
            state[i] = walk(table, trie.width, trie.keys, trie.values, trie.alphabet_size, state[i], int(chars[i, j]))
    for s, st in zip(strings, state, strict=True):
        in_alphabet = all(c in alphabet for c in s)  # else the walk leaves the trie
        below = [w for w in words if w.startswith(s)] if in_alphabet else []
        assert (st >= 0) == bool(below), s
        if below:
            assert trie.is_word[st] == (s in words), s
            assert s == "" or trie.min_len[st] == min(len(w) for w in below), s
            assert trie.string(st) == s  # the state spells the walked characters


def test_node_storage_reused_by_later_calls_gives_the_same_results() -> None:
    # a finished search hands its storage (edge map cleared) to the decoder's next one
    rng = np.random.default_rng(11)
    labels = ["", " ", "a", "b", "c"]
    small = [random_log_probs(rng, 20, 5, peaky=0.3) for _ in range(3)]
    big = [random_log_probs(rng, 60, 5, peaky=0.3) for _ in range(6)]
    decoder = Decoder(labels, options=CTCOptions(beam_width=16, split_blank=False), input_kind="log_probs")
    first = decoder.decode(small)
    assert decoder._caches.spare_bytes > 0
    decoder.decode(big, CTCOptions(beam_width=64, split_blank=False))  # takes the arrays, fills many more nodes
    for _ in range(2):
        again = decoder.decode(small)  # on the arrays the big search used
        for a, b in zip(first, again, strict=True):
            assert [h.text for h in a] == [h.text for h in b]
            assert [h.score for h in a] == [h.score for h in b]
        lp = random_log_probs(rng, 5, 5)  # a far wider beam: the arrays grow, and are kept for the next call
        (hyps,) = decoder.decode([lp], CTCOptions(split_blank=False, **WIDE))
        got, expected = as_dict(hyps), oracle(lp, labels, 0)
        assert got.keys() == expected.keys()
        np.testing.assert_allclose([got[t] for t in expected], list(expected.values()), atol=1e-9)

    assert decoder.release_cached_memory() > 0 and decoder._caches.spare_bytes == 0
    assert decoder.release_cached_memory() == 0


def test_empty_utterance_gives_empty_text() -> None:
    hyps = search([np.zeros((0, 3)), np.log(np.full((2, 3), 1 / 3))], ["", "a", "b"])
    assert hyps[0][0].text == "" and hyps[0][0].logit_score == 0.0
    assert len(hyps[1]) > 0


def test_word_frames_follow_the_alignment() -> None:
    labels = ["", " ", "a", "b"]
    ids = [2, 2, 0, 3, 1, 1, 3, 0]  # "ab b": word 1 frames 0..4, word 2 frames 6..7
    lp = np.full((8, 4), math.log(0.01))
    lp[np.arange(8), ids] = math.log(0.97)
    hyp = search(lp, labels, beam_width=5)[0]
    assert hyp.text == "ab b"
    assert hyp.word_frames == [("ab", (0, 4)), ("b", (6, 7))]


def test_pruning_knobs_drop_hypotheses() -> None:
    rng = np.random.default_rng(60)
    lp = random_log_probs(rng, 6, 4)
    wide = search(lp, ["", " ", "a", "b"], **WIDE)
    narrow = search(lp, ["", " ", "a", "b"], beam_width=3)
    assert len(narrow) <= 3 < len(wide)
    pruned = search(lp, ["", " ", "a", "b"], beam_width=1000, beam_prune_logp=-1.0)
    assert all(h.score >= pruned[0].score - 1.0 for h in pruned)


def _lm_model() -> ArpaLM:
    corpus = ["a b", "a a b", "b a", "a b b", "b", "a b a b"] * 2 + ["ab ba", "a ab"]
    return ArpaLM.from_lines(build_arpa(corpus, order=2).splitlines())


@pytest.mark.parametrize("seed", range(4))
def test_lm_fusion_scores_match_independent_sum(seed: int) -> None:
    rng = np.random.default_rng(70 + seed)
    labels = ["", " ", "a", "b"]
    lp = random_log_probs(rng, 5, 4)
    model = _lm_model()
    alpha, beta, unk = 0.7, 1.3, -4.0
    fusion = LanguageModelFusion(model, unigrams=["a", "b", "ab"], alpha=alpha, beta=beta, unk_score_offset=unk)
    expected_logit = oracle(lp, labels, 0)
    got = search(lp, labels, lm=fusion, **WIDE)
    assert {h.text for h in got} == set(expected_logit)
    ln10 = math.log(10)
    for h in got:
        words = h.text.split()
        # independent LM total: log10 P(words, </s> | <s>) with per-word penalties and bonuses
        lm10 = model.sentence_score(h.text) + sum(unk for w in words if w not in ("a", "b", "ab"))
        want = expected_logit[h.text] + alpha * ln10 * lm10 + beta * len(words)
        if not words:
            want = expected_logit[h.text] + alpha * ln10 * model.sentence_score("")
        assert h.score == pytest.approx(want, abs=1e-6), h.text
        assert h.logit_score == pytest.approx(expected_logit[h.text], abs=1e-9)
    best = max(got, key=lambda h: h.score)
    assert got[0].text == best.text


def test_partial_word_penalty_prefers_known_prefixes() -> None:
    # one frame: "a" vs "b"; only "ab" is a known word, so the partial "a" is free and "b" is penalised
    lp = np.log(np.array([[0.1, 0.0001, 0.45, 0.45]]))
    fusion = LanguageModelFusion(_lm_model(), unigrams=["ab"], unk_score_offset=-5.0)
    hyps = search(lp, ["", " ", "a", "b"], lm=fusion, **WIDE)
    assert hyps[0].text in ("a", "")
    by_text = {h.text: h for h in search(lp, ["", " ", "a", "b"], **WIDE)}
    assert by_text["a"].logit_score == pytest.approx(math.log(0.45))


def _hotword_scores(hotwords: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Each text's score without and with ``hotwords`` (weight 3) on a matrix spelling "ab b"."""
    labels = ["", " ", "a", "b"]
    ids = [2, 0, 3, 1, 3]  # "ab b"
    lp = np.full((5, 4), math.log(0.02))
    lp[np.arange(5), ids] = math.log(0.94)
    plain = {h.text: h.score for h in search(lp, labels, **WIDE)}
    hot = {h.text: h.score for h in search(lp, labels, hotwords=hotwords, hotword_weight=3, **WIDE)}
    return plain, hot


def test_hotwords_add_their_weight() -> None:
    plain, hot = _hotword_scores(["b"])
    assert hot["ab b"] - plain["ab b"] == pytest.approx(3.0)
    assert hot["b b"] - plain["b b"] == pytest.approx(6.0)
    assert hot["ab"] - plain["ab"] == pytest.approx(0.0)
    assert hot["ab b"] > plain["ab b"]


def test_a_hotword_phrase_counts_word_by_word() -> None:
    """pyctcdecode's rule, worked by hand: the phrase "ab b" makes "ab" and "b" hotwords, each worth the weight
    wherever it stands as a whole word."""
    plain, hot = _hotword_scores(["ab b"])
    assert hot["ab b"] - plain["ab b"] == pytest.approx(6.0)
    assert hot["b b"] - plain["b b"] == pytest.approx(6.0)
    assert hot["ab"] - plain["ab"] == pytest.approx(3.0)


def test_logits_need_log_softmax_and_torch_input_is_accepted() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(80)
    logits = rng.normal(size=(6, 4)) * 3
    lp = log_softmax(logits)
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0)
    a = search(lp, ["", " ", "a", "b"], beam_width=10)
    b = search(torch.tensor(lp), ["", " ", "a", "b"], beam_width=10)
    assert [h.text for h in a] == [h.text for h in b]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"beam_width": 0}, "beam_width"),
        ({"beam_prune_logp": 1.0}, "beam_prune_logp"),
        ({"token_min_logp": float("nan")}, "token_min_logp"),
    ],
)
def test_bad_parameters_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        search(np.zeros((2, 3)), ["", "a", "b"], **kwargs)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="columns"):
        search(np.zeros((2, 4)), ["", "a", "b"])
    with pytest.raises(ValueError, match="2-D"):
        search(np.zeros(3), ["", "a", "b"])
    with pytest.raises(ValueError, match="NaN"):
        search(np.full((2, 3), np.nan), ["", "a", "b"])
    with pytest.raises(ValueError, match="lengths"):
        search(np.zeros((2, 3, 3)), ["", "a", "b"], lengths=[1, 5])
    with pytest.raises(TypeError, match="LanguageModelFusion"):
        search(np.zeros((2, 3)), ["", "a", "b"], lm="model.arpa")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="blank"):
        greedy_ctc(np.zeros((2, 3)), blank=5)


@pytest.mark.parametrize("backend", ["arpa", "kenlm"])
def test_batched_lm_queries_equal_one_at_a_time(backend: str, tmp_path) -> None:
    # score_many / eos_many (one call for many states) against score / eos_score state by state, and the
    # fusion's score_eos_many against score_eos, with and without the sentence boundary
    from beamkit.lm import kenlm_available, load_language_model

    if backend == "kenlm" and not kenlm_available():
        pytest.skip("kenlm is not installed")
    path = tmp_path / "lm.arpa"
    path.write_text(build_arpa(["a b", "a a b", "b a", "a b b", "ab ba", "a ab"] * 2, order=3))
    model = load_language_model(path, backend=backend)
    states = [model.begin_state(), model.null_state()]
    for word in ["a", "b", "ab", "zz", "a"]:
        states.append(model.score(states[-1], word)[1])
    words = ["a", "b", "ab", "ba", "zz", "", "a"]
    logps, new_states = model.score_many(states, words)
    for state, word, logp, new_state in zip(states, words, logps, new_states, strict=True):
        want, want_state = model.score(state, word)
        assert logp == want and model.eos_score(new_state) == model.eos_score(want_state)
    assert model.eos_many(states) == [model.eos_score(s) for s in states]
    for boundary in (True, False):
        fusion = LanguageModelFusion(model, unigrams=["a", "b"], alpha=0.7, score_boundary=boundary)
        assert fusion.score_eos_many(states) == [fusion.score_eos(s) for s in states]


def _quantised_log_probs(rng: np.random.Generator, T: int, V: int) -> np.ndarray:
    """Peaky rows from small integer weights: many equal values, so beams tie in score (zero weights give
    -inf)."""
    w = rng.integers(0, 4, size=(T, V)) ** 3 + (rng.random((T, V)) < 0.3)
    w[np.arange(T), rng.integers(0, V, T)] += 30
    with np.errstate(divide="ignore"):
        return np.log(w / w.sum(axis=1, keepdims=True))


_INTERPRETED_CASES = r"""
import json, sys
import numpy as np
from beamkit.lm import ArpaLM, build_arpa
from beamkit.ctc import CTCOptions, LanguageModelFusion, prefix_beam_search
from beamkit.ops import log_softmax
corpus = ["a b", "a a b", "b a", "a b b", "b", "a b a b"] * 2 + ["ab ba", "a ab"]
lm = LanguageModelFusion(ArpaLM.from_lines(build_arpa(corpus, order=2).splitlines()), unigrams=["a", "b", "ab"])
rng = np.random.default_rng(5)
out = []
for case in range(12):
    bpe = case % 4 == 3
    labels = ["<pad>", "\u2581a", "\u2581b", "a", "b", "\u2581"] if bpe else ["", " ", "a", "b", "c"]
    lp = log_softmax(rng.normal(0, 2.5, (int(rng.integers(1, 14)), len(labels))))
    options = CTCOptions(
        beam_width=int(rng.integers(1, 8)), split_blank=bool(case % 2), prune_history=case % 3 == 0,
        pyctcdecode_compat=case % 5 == 0, hotwords=["ab"] if case % 3 == 1 else None,
    )
    (hyps,) = prefix_beam_search(lp, labels, options, lm=None if bpe or case % 2 else lm)
    out.append([(h.text, h.score, h.logit_score, h.word_frames) for h in hyps])
json.dump(out, sys.stdout)
"""


def test_interpreted_search_equals_compiled() -> None:
    # the same search code run as plain Python (BEAMKIT_NO_JIT=1: what a machine without numba runs) and
    # compiled by numba: the same hypotheses, scores and word frames, with an LM, hotwords, BPE pieces,
    # both beam units and history pruning
    import json
    import os
    import subprocess
    import sys

    from beamkit.ctc.jit import COMPILED

    if not COMPILED:
        pytest.skip("numba is not installed: only the interpreted search exists here")
    runs = {}
    # the interpreted run raises on any other runtime warning: its hashes wrap uint64 products silently, as numba's
    quiet = ["-W", "error::RuntimeWarning", "-W", "ignore:the CTC search runs as plain Python:RuntimeWarning"]
    for name, extra in (("compiled", {}), ("interpreted", {"BEAMKIT_NO_JIT": "1"})):
        env = {**os.environ, **extra}
        done = subprocess.run(
            [sys.executable, *(quiet if extra else ["-W", "ignore"]), "-c", _INTERPRETED_CASES],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        runs[name] = json.loads(done.stdout)
    assert sum(len(c) for c in runs["compiled"]) > 20
    for got, want in zip(runs["interpreted"], runs["compiled"], strict=True):
        assert [h[0] for h in got] == [h[0] for h in want]
        assert [h[3] for h in got] == [h[3] for h in want]
        np.testing.assert_allclose([h[1:3] for h in got], [h[1:3] for h in want], rtol=0, atol=1e-12)


@pytest.mark.parametrize("threads", [2, 5])
def test_threaded_batch_equals_one_thread(threads: int) -> None:
    # utterances spread over threads (each with its own storage, one shared LM cache filled as they go)
    # give what one thread gives, utterance by utterance: texts, scores, word frames and LM states
    from beamkit.ctc.options import CTCOptions
    from beamkit.ctc.posteriors import collect_candidates, dense_part

    labels = ["", " ", "a", "b", "c"]
    vocab = Vocabulary.from_labels(labels)
    rng = np.random.default_rng(40 + threads)
    mats = [random_log_probs(rng, int(rng.integers(1, 40)), 5, peaky=0.4) for _ in range(40)]
    cands = collect_candidates((dense_part(m, -6.0, 0) for m in mats), np.array([len(m) for m in mats], dtype=np.int64))
    opts = CTCOptions(beam_width=6, token_min_logp=-6.0, prune_history=True, split_blank=True, hotwords=("ab",))
    runs = []
    for n in (1, threads):
        fusion = LanguageModelFusion(_lm_model(), unigrams=["a", "b", "ab"], unk_score_offset=-3.0)  # a fresh cache
        runs.append([_hyps_of(h) for h in Decoder(vocab, fusion, opts).search_candidates(cands, threads=n)])
    assert runs[0] == runs[1] and sum(len(h) for h in runs[0]) > 60


def _hyps_of(hyps: list) -> list[tuple]:
    return [(h.text, h.score, h.logit_score, h.word_frames, h.lm_state) for h in hyps]


def test_kernel_logaddexp_equals_numpy_bit_for_bit() -> None:
    # the search's scalar log-sum-exp (with its short cut for a -inf side) against np.logaddexp, signs of
    # zero, infinities and NaN included
    from beamkit.ctc.prefix.kernel import lse

    rng = np.random.default_rng(13)
    xs = np.concatenate([rng.normal(0, 30, 300), [0.0, -0.0, -np.inf, np.inf, np.nan, 1e-300, -745.0, 709.0]])
    for x in xs.tolist():
        for y in [*rng.choice(xs, 12).tolist(), x, -np.inf, 0.0, -0.0]:
            for a, b in ((x, y), (y, x)):
                with np.errstate(invalid="ignore"):
                    want = float(np.logaddexp(a, b))
                got = lse(a, b)
                if math.isnan(want):
                    assert math.isnan(got), (a, b)
                else:
                    assert got == want and math.copysign(1, got) == math.copysign(1, want), (a, b)


def test_char_trie_states_hold_what_the_word_list_says() -> None:
    # brute force over random word lists (duplicates, the empty word, characters outside the alphabet): every
    # string over the alphabet is a state exactly when it starts the inserted part of some word (a word goes in
    # up to its first unknown character); its min_len is the shortest such word's whole length, is_word whether
    # it is a word, string() spells it
    import itertools

    rng = np.random.default_rng(11)
    alphabet = {c: i for i, c in enumerate("abcd")}
    for _ in range(60):
        words = [
            "".join(rng.choice(list("abcdx"), size=int(rng.integers(0, 5)))) for _ in range(int(rng.integers(0, 25)))
        ]
        trie = CharTrie(words, alphabet)
        inserted = {w: w.split("x")[0] for w in words}
        n_states = 0
        for length in range(5):
            for chars in itertools.product("abcd", repeat=length):
                s = "".join(chars)
                through = [w for w, part in inserted.items() if part.startswith(s) and (s or w == "")]
                state = 0
                for ch in s:
                    state = walk(
                        trie.table, trie.width, trie.keys, trie.values, trie.alphabet_size, state, alphabet[ch]
                    )
                    if state < 0:
                        break
                assert (state >= 0) == (bool(through) or s == ""), (words, s)
                if state < 0:
                    continue
                n_states += 1
                if s:
                    assert trie.min_len[state] == min(len(w) for w in through), (words, s)
                    assert trie.string(state) == s
                assert trie.is_word[state] == (s in words), (words, s)
        assert n_states == len(trie.min_len)
