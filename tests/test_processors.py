"""Logit processors, each checked by an exhaustive beam against brute force over the sequences it allows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from beamkit import (
    BadWords,
    ForcedPrefix,
    LengthPenalty,
    MinLength,
    NoRepeatNGram,
    PrefixAllowedTokens,
    RepetitionPenalty,
    SearchOptions,
    SequenceBias,
    SuppressTokens,
    Temperature,
    search_batch,
)
from tests.toy import BOS, MultiToy, ToyModel, log_softmax_ref

EOS = 0


def brute(model: ToyModel, max_len: int, step_score, allowed, alpha: float = 0.0):
    """Every output whose every token is allowed, scored with ``step_score(prefix, token)``; ranked."""
    out = []
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(model.v), repeat=n):
            if EOS in seq[:-1] or (n < max_len and seq[-1] != EOS):
                continue
            if not all(allowed(seq[:i], seq[i]) for i in range(n)):
                continue
            lp = sum(step_score(seq[:i], seq[i]) for i in range(n))
            out.append((lp / n**alpha, list(seq)))
    out.sort(key=lambda x: -x[0])
    return out


def exhaustive(model: ToyModel, max_len: int, **kw):
    return search_batch(model.step, model.init(), BOS, EOS, model.v**max_len, max_len, **kw)[0]


def check(model, max_len, kw, allowed, step_score=None):
    step_score = step_score or (lambda p, t: model.logp(tuple(p), t))
    want = brute(model, max_len, step_score, allowed)
    got = exhaustive(model, max_len, length_penalty=0.0, **kw)
    assert [h.tokens for h in got] == [s for _, s in want]
    np.testing.assert_allclose([h.score for h in got], [sc for sc, _ in want], atol=1e-9)


def has_repeat(seq, n):
    grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(n):
    m = ToyModel(3, seed=1, scale=1.0)
    check(m, 4, {"processors": [NoRepeatNGram(n)]}, lambda p, t: not has_repeat(list(p) + [t], n))


def test_no_repeat_ngram_counts_the_prompt():
    m = ToyModel(3, seed=2, scale=1.0)
    prompt = (1, 2)
    check(
        m,
        3,
        {"processors": [NoRepeatNGram(2, prompts=(prompt,))]},
        lambda p, t: not has_repeat(list(prompt) + list(p) + [t], 2),
    )


def test_bad_words():
    m = ToyModel(3, seed=3, scale=1.0)
    bad = ((2,), (1, 1))

    def ok(p, t):
        s = list(p) + [t]
        return t != 2 and s[-2:] != [1, 1]

    check(m, 4, {"processors": [BadWords(bad)]}, ok)
    with pytest.raises(ValueError):
        BadWords(((),))


def test_forced_prefix_and_min_len():
    m = ToyModel(3, seed=4, scale=1.0)
    check(m, 4, {"processors": [ForcedPrefix(((2, 1),))]}, lambda p, t: len(p) >= 2 or t == (2, 1)[len(p)])
    check(m, 4, {"min_len": 2}, lambda p, t: not (t == EOS and len(p) < 2))


def test_prefix_allowed_tokens():
    m = ToyModel(4, seed=5, scale=1.0)
    fn = lambda req, toks: [0, 1] if len(toks) % 2 else [0, 2, 3]  # noqa: E731
    check(m, 3, {"processors": [PrefixAllowedTokens(fn)]}, lambda p, t: t in fn(0, list(p)))
    with pytest.raises(ValueError, match="outside"):
        exhaustive(m, 2, processors=[PrefixAllowedTokens(lambda r, t: [9])])


def test_repetition_penalty_and_temperature():
    m = ToyModel(3, seed=6, scale=1.0)

    def rep(p, t, pen=1.5):
        s = m.logp(tuple(p), t)
        return s * pen if t in p and s < 0 else (s / pen if t in p else s)

    check(m, 3, {"processors": [RepetitionPenalty(1.5)]}, lambda p, t: True, rep)
    check(m, 3, {"processors": [Temperature(0.5)]}, lambda p, t: True, lambda p, t: m.logp(tuple(p), t) / 0.5)
    with pytest.raises(ValueError):
        Temperature(0.0)
    with pytest.raises(ValueError):
        RepetitionPenalty(-1.0)


def test_suppress_tokens_always_and_at_one_step():
    m = ToyModel(4, seed=8, scale=1.0)
    check(m, 3, {"processors": [SuppressTokens((2, 3))]}, lambda p, t: t not in (2, 3))
    check(m, 3, {"processors": [SuppressTokens((1,), at_step=1)]}, lambda p, t: not (len(p) == 1 and t == 1))
    with pytest.raises(ValueError):
        SuppressTokens((-1,))


@pytest.mark.parametrize("prompt", [None, (3, 1)])
def test_sequence_bias_matches_the_end_of_the_sequence(prompt):
    # one-token, two-token (its head possibly in the prompt) and three-token sequences; token 2 biased twice
    m = ToyModel(4, seed=9, scale=1.0)
    biases = (((2,), -0.7), ((1, 2), 1.3), ((1, 1, 3), 2.0), ((3,), 0.4))

    def score(p, t):
        seq = list(prompt or ()) + list(p) + [t]
        extra = sum(b for word, b in biases if len(word) <= len(seq) and seq[-len(word) :] == list(word))
        return m.logp(tuple(p), t) + extra

    prompts = None if prompt is None else (prompt,)
    check(m, 4, {"processors": [SequenceBias(biases, prompts)]}, lambda p, t: True, score)
    with pytest.raises(ValueError):
        SequenceBias((((), 1.0),))  # an empty sequence


@pytest.mark.parametrize("backend,device", [("numpy", "cpu"), ("torch", "cpu"), ("torch", "cuda")], indirect=["device"])
def test_sequence_bias_adds_repeated_tokens_up(backend, device):
    torch = pytest.importorskip("torch")
    from beamkit.processors import StepContext

    x = np.zeros((2, 4))
    scores = torch.tensor(x, device=device) if backend == "torch" else x.copy()
    ctx = StepContext(step=1, tokens=np.array([[1], [2]]), request=np.array([0, 0]), eos=(0,))
    out = SequenceBias((((3,), 1.0), ((1, 3), 2.0), ((2, 3), 4.0), ((1, 3), 0.5)))(scores, ctx)
    if backend == "torch":
        assert out.device == device  # edited on the scores' own device
    got = out.cpu().numpy() if backend == "torch" else out
    np.testing.assert_array_equal(got, [[0, 0, 0, 3.5], [0, 0, 0, 5.0]])


def test_processors_on_raw_logits():
    # process_logits=True: the repetition penalty edits the raw logits, which are normalised afterwards
    # (Hugging Face's greedy order); the brute-force score is log_softmax(penalised logits)
    m = ToyModel(3, seed=10, scale=1.5)

    def score(p, t, pen=1.7):
        z = m.logits(tuple(p)).copy()
        for tok in set(p):
            z[tok] = z[tok] * pen if z[tok] < 0 else z[tok] / pen
        return log_softmax_ref(z)[t]

    check(m, 3, {"processors": [RepetitionPenalty(1.7)], "process_logits": True}, lambda p, t: True, score)
    # without process_logits the same penalty acts on log-probabilities: a different search
    got = exhaustive(m, 3, length_penalty=0.0, processors=[RepetitionPenalty(1.7)])
    assert [h.score for h in got] != pytest.approx([sc for sc, _ in brute(m, 3, score, lambda p, t: True)], abs=1e-9)


def test_exact_exit_refuses_processors_that_raise_scores():
    flat = LengthPenalty(0.0)
    with pytest.raises(ValueError, match="SequenceBias"):
        SearchOptions(3, 5, flat, policy="pool", exact_exit=True, processors=(SequenceBias((((1,), 0.5),)),))
    SearchOptions(3, 5, flat, policy="pool", exact_exit=True, processors=(SequenceBias((((1,), -0.5),)),))


def test_processors_see_each_request():
    # per-request forced prefixes in one batch
    multi = MultiToy(4, [1, 2])
    res = search_batch(multi.step, multi.init(), BOS, EOS, 2, 3, processors=[ForcedPrefix(((3,), (2, 2)))])
    assert all(h.tokens[:1] == [3] for h in res[0])
    assert all(h.tokens[:2] == [2, 2] for h in res[1])


def test_masks_are_never_chosen_in_the_pool_policy():
    m = ToyModel(5, seed=7, scale=0.3)
    res = search_batch(
        m.step,
        m.init(),
        BOS,
        EOS,
        3,
        5,
        policy="pool",
        processors=[BadWords(((1,), (2,)))],
        early_stopping="never",
    )[0]
    assert res and all(not {1, 2} & set(h.tokens) for h in res)
    for h in res:
        assert h.logprob == pytest.approx(
            sum(log_softmax_ref(m.logits(tuple(h.tokens[:i])))[t] for i, t in enumerate(h.tokens))
        )


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: MinLength("3"), TypeError, "MinLength min_len must be an integer"),
        (lambda: NoRepeatNGram(2.0), TypeError, "NoRepeatNGram n must be an integer"),
        (lambda: BadWords("ab"), TypeError, "BadWords must be a sequence"),
        (lambda: BadWords([[1, "2"]]), TypeError, "token ids must be integers"),
        (lambda: SuppressTokens([True]), TypeError, "token ids must be integers"),
        (lambda: SuppressTokens([1], at_step=-1), ValueError, "at_step must be >= 0"),
        (lambda: SequenceBias([((1,), "2")]), TypeError, "SequenceBias bias must be a number"),
        (lambda: SequenceBias([((1,), float("nan"))]), ValueError, "a bias must be a number or -inf"),
        (lambda: SequenceBias([(1, 2, 3)]), TypeError, "(token ids, bias) pairs"),
        (lambda: ForcedPrefix([[1], [-2]]), ValueError, "token ids must be >= 0"),
        (lambda: RepetitionPenalty("1.2"), TypeError, "repetition penalty must be a number"),
        (lambda: RepetitionPenalty(float("inf")), ValueError, "repetition penalty must be a finite number, got inf"),
        (lambda: RepetitionPenalty(0), ValueError, "repetition penalty must be > 0, got 0.0"),
        (lambda: Temperature(None), TypeError, "temperature must be a number"),
        (lambda: Temperature(float("inf")), ValueError, "temperature must be a finite number, got inf"),
        (lambda: Temperature(-1.0), ValueError, "temperature must be > 0, got -1.0"),
        (lambda: NoRepeatNGram(2, prompts=[[1, None]]), TypeError, "NoRepeatNGram prompts"),
    ],
)
def test_processor_arguments_of_the_wrong_type_are_refused_by_name(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert message in str(info.value)


def test_processor_lists_are_normalised_to_tuples():
    # frozen processors stay hashable and immune to the caller mutating its lists afterwards
    bad = [[3, 4]]
    proc = BadWords(bad)
    bad[0].append(5)
    assert proc.bad == ((3, 4),) and hash(proc) == hash(BadWords(((3, 4),)))


@pytest.mark.parametrize(
    ("proc", "message"),
    [
        (ForcedPrefix([[1]]), "ForcedPrefix has 1 prefixes but the batch has request 1"),
        (ForcedPrefix([[1], [9]]), "token id 9 is outside the vocabulary of 4"),
        (NoRepeatNGram(2, prompts=[[1]]), "prompts has 1 entries but the batch has request 1"),
    ],
)
def test_processors_that_do_not_fit_the_batch_give_a_clear_error(proc, message):
    # once an IndexError from numpy (ForcedPrefix with fewer prefixes than requests)
    def step(state, y_prev):
        return np.zeros((len(state), 4)), state

    with pytest.raises(ValueError) as info:
        search_batch(step, np.zeros(2), -1, 0, 2, 3, processors=[proc])
    assert message in str(info.value)


def test_bad_words_and_repetition_ids_past_the_vocabulary_change_nothing():
    # a banned word ending past V can never be generated; a prompt id past V has no logit to penalise
    def step(state, y_prev):
        return np.log(np.array([[0.1, 0.2, 0.3, 0.4]] * len(state))), state

    for proc, same in ((BadWords([[7]]), None), (RepetitionPenalty(2.0, prompts=[[9]]), RepetitionPenalty(2.0))):
        plain = search_batch(step, np.zeros(1), -1, 0, 2, 2, processors=[same] if same else [])
        got = search_batch(step, np.zeros(1), -1, 0, 2, 2, processors=[proc])
        assert [(h.tokens, h.logprob) for h in got[0]] == [(h.tokens, h.logprob) for h in plain[0]]
