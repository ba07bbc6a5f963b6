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

from beamkit.ctc import (
    ArpaLM,
    LanguageModelFusion,
    Vocabulary,
    build_arpa,
    greedy_decode,
    log_softmax,
    prefix_beam_search,
)

WIDE = {"beam_width": 10_000, "beam_prune_logp": -math.inf, "token_min_logp": -math.inf}


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
    got = as_dict(prefix_beam_search(lp, Vocabulary(labels, 0, False), split_blank=split_blank, **WIDE))
    assert set(got) == set(expected)
    for text, value in expected.items():
        assert got[text] == pytest.approx(value, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_wide_beam_with_word_delimiter_normalises_spaces(seed: int) -> None:
    rng = np.random.default_rng(10 + seed)
    labels = ["", " ", "a", "b"]
    lp = random_log_probs(rng, 5, 4)
    expected = oracle(lp, labels, 0)
    got = as_dict(prefix_beam_search(lp, Vocabulary(labels, 0, False), **WIDE))
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
    got = as_dict(prefix_beam_search(lp, vocab, **WIDE))
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
    hyps = prefix_beam_search(lp, labels, **WIDE)
    assert hyps[0].text == best_text
    assert hyps[0].logit_score == pytest.approx(expected[best_text], abs=1e-9)
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)


def test_greedy_hand_worked() -> None:
    # frames: a a _ a b b _ -> "aab"
    ids = [1, 1, 0, 1, 2, 2, 0]
    lp = np.log(np.full((7, 3), 0.1))
    lp[np.arange(7), ids] = np.log(0.8)
    assert greedy_decode(lp) == [1, 1, 2]
    assert greedy_decode(lp, ["", "a", "b"]) == "aab"
    assert greedy_decode(lp[:, [1, 2, 0]], blank=2) == [0, 0, 1]


@pytest.mark.parametrize("seed", range(5))
def test_greedy_equals_beam_search_restricted_to_argmax(seed: int) -> None:
    rng = np.random.default_rng(40 + seed)
    labels = ["", " ", "a", "b", "c"]
    lp = random_log_probs(rng, 30, 5, peaky=0.3)
    for width in (1, 5):
        hyps = prefix_beam_search(lp, labels, beam_width=width, token_min_logp=0.0)
        assert hyps[0].text == greedy_decode(lp, labels)
    # on a peaky input where the best path dominates, beam 1 agrees with greedy too
    ids = rng.integers(0, 5, size=25)
    peaky = np.full((25, 5), math.log(0.01 / 4))
    peaky[np.arange(25), ids] = math.log(0.99)
    assert prefix_beam_search(peaky, labels, beam_width=1)[0].text == greedy_decode(peaky, labels)


def test_batch_of_different_lengths_matches_single_calls() -> None:
    rng = np.random.default_rng(50)
    labels = ["", " ", "a", "b", "c"]
    mats = [random_log_probs(rng, T, 5, peaky=0.4) for T in (7, 12, 1, 9)]
    batched = prefix_beam_search(mats, labels, beam_width=8)
    for m, hyps in zip(mats, batched, strict=False):
        single = prefix_beam_search(m, labels, beam_width=8)
        assert [h.text for h in hyps] == [h.text for h in single]
        np.testing.assert_allclose([h.score for h in hyps], [h.score for h in single], atol=1e-12)
    padded = np.zeros((4, 12, 5))
    for i, m in enumerate(mats):
        padded[i, : len(m)] = m
    again = prefix_beam_search(padded, labels, lengths=[7, 12, 1, 9], beam_width=8)
    assert [[h.text for h in u] for u in again] == [[h.text for h in u] for u in batched]


def test_empty_utterance_gives_empty_text() -> None:
    hyps = prefix_beam_search([np.zeros((0, 3)), np.log(np.full((2, 3), 1 / 3))], ["", "a", "b"])
    assert hyps[0][0].text == "" and hyps[0][0].logit_score == 0.0
    assert len(hyps[1]) > 0


def test_word_frames_follow_the_alignment() -> None:
    labels = ["", " ", "a", "b"]
    ids = [2, 2, 0, 3, 1, 1, 3, 0]  # "ab b": word 1 frames 0..4, word 2 frames 6..7
    lp = np.full((8, 4), math.log(0.01))
    lp[np.arange(8), ids] = math.log(0.97)
    hyp = prefix_beam_search(lp, labels, beam_width=5)[0]
    assert hyp.text == "ab b"
    assert hyp.word_frames == [("ab", (0, 4)), ("b", (6, 7))]


def test_pruning_knobs_drop_hypotheses() -> None:
    rng = np.random.default_rng(60)
    lp = random_log_probs(rng, 6, 4)
    wide = prefix_beam_search(lp, ["", " ", "a", "b"], **WIDE)
    narrow = prefix_beam_search(lp, ["", " ", "a", "b"], beam_width=3)
    assert len(narrow) <= 3 < len(wide)
    pruned = prefix_beam_search(lp, ["", " ", "a", "b"], beam_width=1000, beam_prune_logp=-1.0)
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
    got = prefix_beam_search(lp, labels, lm=fusion, **WIDE)
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
    hyps = prefix_beam_search(lp, ["", " ", "a", "b"], lm=fusion, **WIDE)
    assert hyps[0].text in ("a", "")
    by_text = {h.text: h for h in prefix_beam_search(lp, ["", " ", "a", "b"], **WIDE)}
    assert by_text["a"].logit_score == pytest.approx(math.log(0.45))


def test_hotwords_add_their_weight() -> None:
    labels = ["", " ", "a", "b"]
    ids = [2, 0, 3, 1, 3]  # "ab b"
    lp = np.full((5, 4), math.log(0.02))
    lp[np.arange(5), ids] = math.log(0.94)
    plain = {h.text: h.score for h in prefix_beam_search(lp, labels, **WIDE)}
    hot = {h.text: h.score for h in prefix_beam_search(lp, labels, hotwords=["b"], hotword_weight=3, **WIDE)}
    assert hot["ab b"] - plain["ab b"] == pytest.approx(3.0)
    assert hot["b b"] - plain["b b"] == pytest.approx(6.0)
    assert hot["ab"] - plain["ab"] == pytest.approx(0.0)
    assert hot["ab b"] > plain["ab b"]


def test_logits_need_log_softmax_and_torch_input_is_accepted() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(80)
    logits = rng.normal(size=(6, 4)) * 3
    lp = log_softmax(logits)
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0)
    a = prefix_beam_search(lp, ["", " ", "a", "b"], beam_width=10)
    b = prefix_beam_search(torch.tensor(lp), ["", " ", "a", "b"], beam_width=10)
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
        prefix_beam_search(np.zeros((2, 3)), ["", "a", "b"], **kwargs)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="columns"):
        prefix_beam_search(np.zeros((2, 4)), ["", "a", "b"])
    with pytest.raises(ValueError, match="2-D"):
        prefix_beam_search(np.zeros(3), ["", "a", "b"])
    with pytest.raises(ValueError, match="NaN"):
        prefix_beam_search(np.full((2, 3), np.nan), ["", "a", "b"])
    with pytest.raises(ValueError, match="lengths"):
        prefix_beam_search(np.zeros((2, 3, 3)), ["", "a", "b"], lengths=[1, 5])
    with pytest.raises(TypeError, match="LanguageModelFusion"):
        prefix_beam_search(np.zeros((2, 3)), ["", "a", "b"], lm="model.arpa")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="blank"):
        greedy_decode(np.zeros((2, 3)), blank=5)
