"""Shallow fusion (beamkit.fuse) and the token-level n-gram LM against brute force on toy models.

Oracles: the toy models' own plain-Python log-softmax (tests/toy.py), a hand-worked bigram ARPA file, and full
enumeration of every output of the fused model; never the fused step function itself.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from beamkit import (
    NGramLM,
    TopK,
    constrained_beam_search,
    diverse_beam_search,
    exact_search,
    fuse,
    search_batch,
    stochastic_beam_search,
)
from beamkit.fusion import FusedState, rescore
from tests.toy import BOS, MultiToy, ToyModel, log_softmax_ref

EOS = 0
W = 0.6


def fused_token(model: ToyModel, lm: ToyModel, prefix: tuple[int, ...], tok: int, weight: float = W) -> float:
    """Oracle: log p_model(tok | prefix) + weight * log p_lm(tok | prefix), both by plain-Python log-softmax."""
    return model.logp(prefix, tok) + weight * lm.logp(prefix, tok)


def fused_path(model: ToyModel, lm: ToyModel, tokens: list[int], weight: float = W) -> float:
    return sum(fused_token(model, lm, tuple(tokens[:i]), t, weight) for i, t in enumerate(tokens))


def enumerate_fused(model: ToyModel, lm: ToyModel, max_len: int, alpha: float) -> list[tuple[float, list[int]]]:
    """Every output (ending in eos, or max_len tokens without it) with its fused score, best first."""
    outs = []
    others = [t for t in range(model.v) if t != EOS]
    for n in range(1, max_len + 1):
        for body in itertools.product(others, repeat=n - 1):
            seq = [*body, EOS]
            outs.append((fused_path(model, lm, seq) / len(seq) ** alpha, seq))
    for body in itertools.product(others, repeat=max_len):
        outs.append((fused_path(model, lm, list(body)) / max_len**alpha, list(body)))
    outs.sort(key=lambda o: -o[0])
    return outs


def pair(seed: int = 3, v: int = 5):
    model, lm = ToyModel(v, seed=seed), ToyModel(v, seed=seed + 100, scale=2.0)
    return model, lm, fuse(model.step, lm.step, W)


def test_fused_logits_are_the_weighted_sums():
    model, lm, fused = pair()
    state = fused.init_state(model.init(2), lm.init(2))
    scores, state, extras = fused(state, np.array([BOS, BOS]))
    assert extras["log_softmax"] is False
    for tok in range(model.v):
        assert scores[0, tok] == pytest.approx(fused_token(model, lm, (), tok), abs=1e-12)
        assert extras["model_logprobs"][1, tok] == pytest.approx(model.logp((), tok), abs=1e-12)
        assert extras["lm_logprobs"][1, tok] == pytest.approx(lm.logp((), tok), abs=1e-12)
    scores, state, _ = fused(state, np.array([2, 4]))
    assert scores[1, 3] == pytest.approx(fused_token(model, lm, (4,), 3), abs=1e-12)
    assert isinstance(state, FusedState) and state.started.all()


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_exact_search_with_a_fused_model_equals_enumeration(alpha):
    model, lm, fused = pair(seed=11)
    truth = enumerate_fused(model, lm, max_len=4, alpha=alpha)
    got = exact_search(fused, (model.init(), lm.init()), BOS, EOS, max_len=4, length_penalty=alpha, n=3)
    assert [h.tokens for h in got] == [t for _, t in truth[:3]]
    for h, (score, _) in zip(got, truth, strict=False):
        assert h.score == pytest.approx(score, abs=1e-9)
        assert h.logprob == pytest.approx(fused_path(model, lm, h.tokens), abs=1e-9)


@pytest.mark.parametrize("policy", ["narrow", "pool"])
def test_beam_search_scores_are_fused_sums_and_an_exhaustive_beam_is_enumeration(policy):
    model, lm, fused = pair(seed=5, v=4)
    max_len = 3
    truth = enumerate_fused(model, lm, max_len=max_len, alpha=0.0)
    hyps = search_batch(fused, (model.init(), lm.init()), BOS, EOS, 64, max_len, length_penalty=0.0, policy=policy)[0]
    for h in hyps:
        assert h.logprob == pytest.approx(fused_path(model, lm, h.tokens), abs=1e-9)
        want = [fused_token(model, lm, tuple(h.tokens[:i]), t) for i, t in enumerate(h.tokens)]
        np.testing.assert_allclose(h.token_logprobs, want, atol=1e-9)
    assert hyps[0].tokens == truth[0][1]
    assert hyps[0].score == pytest.approx(truth[0][0], abs=1e-9)
    if policy == "narrow":  # every output survives a beam wider than the output space
        assert sorted(tuple(h.tokens) for h in hyps) == sorted(tuple(t) for _, t in truth)


def test_fusion_changes_the_winner_and_weight_zero_is_the_model():
    """A hand-made case: the model prefers a (0.6), the LM strongly prefers b: fused, b wins."""
    model = ToyModel(3, table={(): [-50, math.log(0.6), math.log(0.4)], (1,): [0, -50, -50], (2,): [0, -50, -50]})
    lm = ToyModel(3, table={(): [-50, math.log(0.1), math.log(0.9)], (1,): [0, -50, -50], (2,): [0, -50, -50]})
    plain = search_batch(fuse(model.step, lm.step, 0.0), (model.init(), lm.init()), BOS, EOS, 2, 3)[0][0]
    fused = search_batch(fuse(model.step, lm.step, 1.0), (model.init(), lm.init()), BOS, EOS, 2, 3)[0][0]
    assert plain.tokens[0] == 1 and fused.tokens[0] == 2
    # hand-worked: log 0.4 + 1.0 * log 0.9 for the first token of the fused winner
    assert fused.token_logprobs[0] == pytest.approx(math.log(0.4) + math.log(0.9), abs=1e-6)


def test_batched_fused_search_equals_each_request_alone():
    seeds = [1, 2, 3]
    model, lm = MultiToy(5, seeds), MultiToy(5, [s + 50 for s in seeds], scale=2.0)
    fused = fuse(model.step, lm.step, W)
    together = search_batch(fused, (model.init(), lm.init()), BOS, EOS, 3, 5)
    for r in range(3):
        alone_model, alone_lm = model.single(r), lm.single(r)
        alone = search_batch(
            fuse(alone_model.step, alone_lm.step, W), (alone_model.init(), alone_lm.init()), BOS, EOS, 3, 5
        )
        assert [h.tokens for h in together[r]] == [h.tokens for h in alone[0]]
        np.testing.assert_allclose([h.score for h in together[r]], [h.score for h in alone[0]], atol=1e-12)


def oracle_step(model: ToyModel, lm: ToyModel):
    """The fused model written out by hand: plain-Python weighted sums per prefix, used as they are."""

    def step(state, y_prev):
        new = np.empty(len(state), dtype=object)
        for i, (p, t) in enumerate(zip(state, np.asarray(y_prev), strict=True)):
            new[i] = p if int(t) == BOS else p + (int(t),)
        rows = [[fused_token(model, lm, p, v) for v in range(model.v)] for p in new]
        return np.array(rows), new, {"log_softmax": False}

    return step


def same(got, want):
    assert [h.tokens for h in got] == [h.tokens for h in want]
    np.testing.assert_allclose([h.logprob for h in got], [h.logprob for h in want], atol=1e-9)
    np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-9)


def test_diverse_constrained_and_sampling_searches_run_on_the_fused_scores():
    model, lm, fused = pair(seed=8, v=6)
    init, ref = (model.init(), lm.init()), oracle_step(model, lm)
    same(
        diverse_beam_search(fused, init, BOS, EOS, 4, 5, groups=2, diversity=0.5)[0],
        diverse_beam_search(ref, model.init(), BOS, EOS, 4, 5, groups=2, diversity=0.5)[0],
    )
    cons = constrained_beam_search(fused, init, BOS, EOS, 6, 5, constraints=[[3]])[0]
    assert cons and all(3 in h.tokens for h in cons)
    same(cons, constrained_beam_search(ref, model.init(), BOS, EOS, 6, 5, constraints=[[3]])[0])
    samples = stochastic_beam_search(fused, init, BOS, EOS, 4, 5, seed=0)[0]
    assert len({tuple(s.hypothesis.tokens) for s in samples}) == 4
    for s in samples:
        assert s.phi == pytest.approx(fused_path(model, lm, s.hypothesis.tokens), abs=1e-9)
    same(
        [s.hypothesis for s in samples],
        [s.hypothesis for s in stochastic_beam_search(ref, model.init(), BOS, EOS, 4, 5, seed=0)[0]],
    )
    topk = search_batch(fused, init, BOS, EOS, 3, 5, selector=TopK(k=3, seed=1))[0]
    same(topk, search_batch(ref, model.init(), BOS, EOS, 3, 5, selector=TopK(k=3, seed=1))[0])
    for h in topk:
        assert h.logprob == pytest.approx(fused_path(model, lm, h.tokens), abs=1e-9)


def test_rescore_gives_model_only_and_lm_only_token_logprobs():
    seeds = [4, 9]
    model, lm = MultiToy(5, seeds), MultiToy(5, [s + 7 for s in seeds], scale=2.0)
    fused = fuse(model.step, lm.step, W)
    init = (model.init(), lm.init())
    hyps = search_batch(fused, init, BOS, EOS, 3, 4, num_return=3)
    parts = rescore(fused, init, BOS, hyps)
    for r, (hs, ps) in enumerate(zip(hyps, parts, strict=True)):
        m, lmr = model.single(r), lm.single(r)
        assert len(ps) == len(hs) == 3
        for h, p in zip(hs, ps, strict=True):
            np.testing.assert_allclose(p.model, [m.logp(tuple(h.tokens[:i]), t) for i, t in enumerate(h.tokens)])
            np.testing.assert_allclose(p.lm, [lmr.logp(tuple(h.tokens[:i]), t) for i, t in enumerate(h.tokens)])
            assert p.model_logprob == pytest.approx(m.path_logprob(h.tokens), abs=1e-9)
            np.testing.assert_allclose(p.fused, h.token_logprobs, atol=1e-12)
            np.testing.assert_allclose(np.add(p.model, np.multiply(W, p.lm)), p.fused, atol=1e-12)


def test_vocab_map_and_floor():
    """The LM knows 4 of the model's 5 tokens (its ids in another order); eos has no LM entry."""
    model = ToyModel(5, seed=21)
    lm = ToyModel(4, seed=22)
    vmap = [-1, 2, 0, 3, 1]  # model token -> LM id
    fused = fuse(model.step, lm.step, W, vocab_map=vmap)
    scores, state, _ = fused((model.init(), lm.init()), np.array([BOS]))
    lm_lp = log_softmax_ref(lm.logits(()))
    for tok, lid in enumerate(vmap):
        want_lm = min(lm_lp) if lid < 0 else lm_lp[lid]
        assert scores[0, tok] == pytest.approx(model.logp((), tok) + W * want_lm, abs=1e-12)
    scores, _, _ = fused(state, np.array([3]))  # the LM is fed its own id 3 for model token 3
    assert scores[0, 1] == pytest.approx(model.logp((3,), 1) + W * log_softmax_ref(lm.logits((3,)))[2], abs=1e-12)
    fixed = fuse(model.step, lm.step, W, vocab_map=vmap, floor=-7.0)
    scores, _, _ = fixed((model.init(), lm.init()), np.array([BOS]))
    assert scores[0, 0] == pytest.approx(model.logp((), 0) - W * 7.0, abs=1e-12)
    holey = fuse(model.step, lm.step, W, vocab_map=[0, -1, 1, 2, 3])
    _, st, _ = holey((model.init(), lm.init()), np.array([BOS]))
    with pytest.raises(ValueError, match="model token 1 has no LM entry"):
        holey(st, np.array([1]))


def test_lm_bos_is_fed_once_per_row():
    model, lm = ToyModel(4, seed=1), ToyModel(4, seed=2)
    fused = fuse(model.step, lm.step, W, lm_bos=3)  # the LM's sentences start with its token 3
    scores, state, _ = fused(fused.init_state(model.init(), lm.init()), np.array([BOS]))
    assert scores[0, 1] == pytest.approx(model.logp((), 1) + W * lm.logp((3,), 1), abs=1e-12)
    scores, _, _ = fused(state, np.array([2]))
    assert scores[0, 1] == pytest.approx(model.logp((2,), 1) + W * lm.logp((3, 2), 1), abs=1e-12)


def test_fuse_refuses_bad_input():
    model, lm = ToyModel(5), ToyModel(4)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        fuse(model.step, lm.step, -0.5)
    with pytest.raises(ValueError, match="finite"):
        fuse(model.step, lm.step, float("nan"))
    with pytest.raises(ValueError, match="vocab_map"):
        fuse(model.step, lm.step, 0.5, vocab_map=[[0, 1]])
    with pytest.raises(ValueError, match="vocab_map entries"):
        fuse(model.step, lm.step, 0.5, vocab_map=[0, -2, 1, 2, 3])
    with pytest.raises(ValueError, match="floor"):
        fuse(model.step, lm.step, 0.5, floor=1.0)
    with pytest.raises(ValueError, match="pass vocab_map"):
        fuse(model.step, lm.step, 0.5)((model.init(), lm.init()), np.array([BOS]))
    with pytest.raises(ValueError, match="LM id 7"):
        fuse(model.step, lm.step, 0.5, vocab_map=[0, 1, 2, 3, 7])((model.init(), lm.init()), np.array([BOS]))
    with pytest.raises(TypeError, match="init_state"):
        fuse(model.step, model.step, 0.5)(model.init(), np.array([BOS]))


# A bigram ARPA file worked by hand: every number below is read off it with KenLM's back-off rule.
ARPA = """\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-1.0\t</s>
-99\t<s>\t-0.5
-0.5\ta\t-0.3
-0.7\tb\t-0.2

\\2-grams:
-0.2\t<s> a
-0.4\ta b

\\end\\
"""
VOCAB = ["</s>", "a", "b", "<s>", "c"]  # token 4 ("c") is unknown to the LM: <unk>, log10 -100


def ln(log10: float) -> float:
    return log10 * math.log(10.0)


HAND = {  # log10 p(token | context) for contexts () = after <s>, (1,) = after a, (2,) = after b
    (): [-0.5 - 1.0, -0.2, -0.5 - 0.7, -0.5 - 99, -0.5 - 100],
    (1,): [-0.3 - 1.0, -0.3 - 0.5, -0.4, -0.3 - 99, -0.3 - 100],
    (2,): [-0.2 - 1.0, -0.2 - 0.5, -0.2 - 0.7, -0.2 - 99, -0.2 - 100],
    (4,): [-1.0, -0.5, -0.7, -99, -100],  # after an unknown word: no context, no back-off weight
}


@pytest.fixture()
def arpa_file(tmp_path):
    path = tmp_path / "bigram.arpa"
    path.write_text(ARPA)
    return path


def test_ngram_lm_step_reads_the_arpa_by_hand(arpa_file):
    lm = NGramLM(arpa_file, VOCAB)
    assert lm.bos == 3 and lm.order == 2
    logits, state = lm.step(lm.init_state(2), np.array([3, -1]))  # both rows start a sentence
    for row in range(2):
        np.testing.assert_allclose(logits[row], [ln(x) for x in HAND[()]], atol=1e-9)
    logits, state = lm.step(state, np.array([1, 2]))
    np.testing.assert_allclose(logits[0], [ln(x) for x in HAND[(1,)]], atol=1e-9)
    np.testing.assert_allclose(logits[1], [ln(x) for x in HAND[(2,)]], atol=1e-9)
    logits, _ = lm.step(state[[1, 1, 0]], np.array([1, 2, 3]))  # gathered rows; bos restarts a sentence
    np.testing.assert_allclose(logits[0], [ln(x) for x in HAND[(1,)]], atol=1e-9)
    np.testing.assert_allclose(logits[2], [ln(x) for x in HAND[()]], atol=1e-9)


def test_exact_search_fused_with_an_ngram_lm_equals_enumeration(arpa_file):
    lm = NGramLM(arpa_file, VOCAB)
    model = ToyModel(5, seed=31)
    fused = fuse(model.step, lm, 0.8)
    max_len = 3

    def lm_token(prefix: tuple[int, ...], tok: int) -> float:  # the hand table, renormalised over the 5 tokens
        last = prefix[-1] if prefix else 3  # feeding <s> (token 3) starts a sentence again
        row = [ln(x) for x in HAND[() if last == 3 else (last,)]]
        return log_softmax_ref(np.array(row))[tok]

    def score(seq: list[int]) -> float:
        return sum(model.logp(tuple(seq[:i]), t) + 0.8 * lm_token(tuple(seq[:i]), t) for i, t in enumerate(seq))

    outs = [
        (score([*body, EOS]), [*body, EOS]) for n in range(max_len) for body in itertools.product(range(1, 5), repeat=n)
    ]
    outs += [(score(list(body)), list(body)) for body in itertools.product(range(1, 5), repeat=max_len)]
    outs.sort(key=lambda o: -o[0])
    got = exact_search(fused, (model.init(), lm.init_state(1)), BOS, EOS, max_len, length_penalty=0.0, n=3)
    assert [h.tokens for h in got] == [t for _, t in outs[:3]]
    np.testing.assert_allclose([h.logprob for h in got], [s for s, _ in outs[:3]], atol=1e-9)


def test_ngram_lm_from_a_corpus_is_a_distribution(tmp_path):
    corpus = ["a b a", "b b", "a a b", "b a"]
    vocab = ["</s>", "a", "b", "<unk>", "<s>"]
    lm = NGramLM(corpus, vocab, order=3)
    state = lm.init_state(1)
    for tok in [-1, 1, 2, 2]:
        logits, state = lm.step(state, np.array([tok]))
        # Kneser-Ney: the words, </s> and <unk> share all the mass; <s> has none
        assert math.fsum(math.exp(x) for x in logits[0][:4]) == pytest.approx(1.0, abs=1e-6)
        assert logits[0][4] < -200
    path = tmp_path / "c.arpa"
    from beamkit.lm import build_arpa

    path.write_text(build_arpa(corpus, order=3))
    from_file = NGramLM(path, vocab)
    a, _ = lm.step(lm.init_state(1), np.array([-1]))
    b, _ = from_file.step(from_file.init_state(1), np.array([-1]))
    np.testing.assert_allclose(a, b)


def test_ngram_lm_refuses_bad_input(arpa_file):
    with pytest.raises(TypeError, match="vocab"):
        NGramLM(arpa_file, "abc")
    with pytest.raises(TypeError, match="ARPA path"):
        NGramLM(42, VOCAB)
    with pytest.raises(FileNotFoundError):
        NGramLM(arpa_file.parent / "missing.arpa", VOCAB)
    lm = NGramLM(arpa_file, VOCAB)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lm.step(lm.init_state(1), np.array([5]))
    with pytest.raises(ValueError, match="2 state rows but 1 tokens"):
        lm.step(lm.init_state(2), np.array([1]))


def test_ngram_lm_names_each_bad_argument(arpa_file):
    # each was accepted (then failed later, or ran out of memory) or failed without naming the argument
    with pytest.raises(ValueError, match=r"^NGramLM order must be between 1 and 20, got 21$"):
        NGramLM(["a b"], VOCAB, order=21)
    with pytest.raises(ValueError, match=r"^NGramLM order must be between 1 and 20, got 1000000000$"):
        NGramLM(["a b"], VOCAB, order=10**9)  # allocated a table per order before counting anything
    lm = NGramLM(arpa_file, VOCAB)
    with pytest.raises(ValueError, match=r"^NGramLM.init_state n must be >= 0, got -1$"):
        lm.init_state(-1)
    with pytest.raises(TypeError, match=r"^NGramLM.init_state n must be an integer, got 'a'$"):
        lm.init_state("a")
    with pytest.raises(ValueError, match=r"source 'a b' names no file: .*a corpus a list of sentences"):
        NGramLM("a b", VOCAB)  # a corpus string read as a path
    with pytest.raises(ValueError, match=r"^NGramLM bos must be <= 4, got 999$"):
        NGramLM(arpa_file, VOCAB, bos=999)
    assert NGramLM(arpa_file, VOCAB, bos=-1).bos == -1  # a negative id: no bos token


def test_ngram_lm_that_knows_no_token_is_refused_and_few_is_a_warning(arpa_file):
    import warnings

    # the LM's words are a, b, c: a vocabulary of other words scored every token as <unk>, silently
    with pytest.raises(ValueError, match=r"knows none of the vocabulary's 3 words .*change nothing"):
        NGramLM(arpa_file, ["<s>", "x", "y", "z", "</s>"])
    many = ["<s>", "a", *[f"w{i}" for i in range(10)], "</s>"]  # 1 known word of 11: under a tenth
    with pytest.warns(UserWarning, match=r"knows only 1 of the vocabulary's 11 words \(9\.1%\)"):
        NGramLM(arpa_file, many)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NGramLM(arpa_file, ["<s>", "a", *[f"w{i}" for i in range(9)], "</s>"])  # 1 of 10: no warning


def test_continuous_engine_with_a_fused_model_equals_each_request_alone(arpa_file):
    """Requests join a running fused search mid-flight (FusedState rows at different steps are concatenated)."""
    from beamkit import Engine

    seeds = [12, 13, 14]
    models = [ToyModel(5, seed=s) for s in seeds]
    lm = NGramLM(arpa_file, VOCAB)
    model = MultiToy(5, seeds)
    fused = fuse(model.step, lm, 0.5)
    engine = Engine(fused, beam_size=3, max_len=5)
    init = model.init()
    ids, done = [], {}
    for r in range(3):
        ids.append(engine.add(fused.init_state(init[r : r + 1], lm.init_state(1)), BOS, EOS, beam_size=2 + r))
        for c in engine.step():
            done[c.request_id] = c
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    for r, rid in enumerate(ids):
        alone = fuse(models[r].step, lm, 0.5)
        want = search_batch(alone, (models[r].init(), lm.init_state(1)), BOS, EOS, 2 + r, 5)[0]
        assert done[rid].error is None
        same(done[rid].hypotheses, want)
