"""Samplers against the exact distributions of small toy models (chi-square and binomial z over many seeds)."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from beamkit import search_batch
from beamkit.hypothesis import BatchDecodeError
from beamkit.samplers import BeamSample, Multinomial, Noise, TopK, TopP
from beamkit.variants import GumbelTopK, stochastic_beam_search

BOS = 99


def chi2_critical(df: int, z: float = 3.29) -> float:
    """Upper critical value of chi-square (Wilson-Hilferty), z = 3.29 is p ~ 0.0005."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * np.sqrt(a)) ** 3


def chi2(counts: dict, probs: dict, n: int) -> float:
    assert set(counts) <= set(probs), f"drew an impossible outcome: {set(counts) - set(probs)}"
    return sum((counts.get(o, 0) - n * p) ** 2 / (n * p) for o, p in probs.items())


def fixed_step(probs: np.ndarray):
    """Every row gets the same next-token distribution; the state is a dummy column."""

    def step(state, y_prev):
        rows = state.shape[0]
        return np.tile(np.log(probs), (rows, 1)), state

    return step


def table_model(vocab: int, seed: int, max_len: int):
    """Logits depend on the step and the last two tokens; state = generated tokens (starts empty)."""
    table = np.random.default_rng(seed).normal(size=(max_len + 1, vocab + 1, vocab + 1, vocab)) * 1.2

    def logits_of(hist: np.ndarray) -> np.ndarray:
        t = hist.shape[1]
        last = hist[:, -1] if t >= 1 else np.full(hist.shape[0], vocab)
        prev = hist[:, -2] if t >= 2 else np.full(hist.shape[0], vocab)
        return table[t, last, prev]

    def step(state, y_prev):
        y = np.asarray(y_prev, dtype=np.int64)
        hist = state[:, 1:]
        if state[0, 0] == 1:  # started: append the previous token
            hist = np.concatenate([hist, y[:, None]], axis=1)
        new = np.concatenate([np.ones((state.shape[0], 1), dtype=np.int64), hist], axis=1)
        return logits_of(hist), new

    return step, logits_of


def enumerate_outputs(logits_of, vocab: int, eos: int, max_len: int) -> dict[tuple[int, ...], float]:
    """Probability of every output (finished, or unfinished at max_len) by recursion."""
    out: dict[tuple[int, ...], float] = {}

    def rec(tokens: list[int], p: float) -> None:
        x = logits_of(np.array([tokens], dtype=np.int64).reshape(1, -1))[0]
        q = np.exp(x - x.max())
        q /= q.sum()
        for v in range(vocab):
            seq = tokens + [v]
            if v == eos or len(seq) == max_len:
                out[tuple(seq)] = p * q[v]
            else:
                rec(seq, p * q[v])

    rec([], 1.0)
    return out


P5 = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
N = 4000


def first_tokens(selector, probs=P5, n=N, beam=1) -> Counter:
    init = np.zeros((n, 1), dtype=np.int64)
    res = search_batch(fixed_step(probs), init, BOS, len(probs) - 1, beam, 1, selector=selector)
    return Counter(h.tokens[0] for hyps in res for h in hyps)


def test_topk_matches_renormalised_top_k() -> None:
    counts = first_tokens(TopK(k=3, seed=1))
    expect = {i: P5[i] / P5[:3].sum() for i in range(3)}
    assert chi2(counts, expect, N) < chi2_critical(2)


def test_topk_is_not_the_full_distribution() -> None:
    # the test above can fail: the full distribution is rejected by the same statistic
    counts = first_tokens(Multinomial(seed=1))
    expect = {i: P5[i] / P5[:3].sum() for i in range(3)}
    with pytest.raises(AssertionError):
        assert chi2(counts, expect, N) < chi2_critical(2)


def test_topp_nucleus() -> None:
    # mass before each token: 0, .4, .65, .85 -> p = 0.7 keeps the first three
    counts = first_tokens(TopP(p=0.7, seed=2))
    expect = {i: P5[i] / P5[:3].sum() for i in range(3)}
    assert chi2(counts, expect, N) < chi2_critical(2)
    counts = first_tokens(TopP(p=0.3, seed=2))
    assert counts == Counter({0: N})


def test_multinomial_single_step() -> None:
    counts = first_tokens(Multinomial(seed=3))
    assert chi2(counts, dict(enumerate(P5)), N) < chi2_critical(4)


def test_multinomial_ancestral_sequences() -> None:
    vocab, eos, max_len = 3, 2, 3
    step, logits_of = table_model(vocab, 4, max_len)
    probs = enumerate_outputs(logits_of, vocab, eos, max_len)
    init = np.zeros((N, 1), dtype=np.int64)
    res = search_batch(step, init, BOS, eos, 1, max_len, selector=Multinomial(seed=5))
    counts = Counter(tuple(h[0].tokens) for h in res)
    assert chi2(counts, probs, N) < chi2_critical(len(probs) - 1)


def test_beam_sample_pairs_without_replacement() -> None:
    # beam 2, one step: the pair of kept tokens is two draws without replacement
    p = np.array([0.4, 0.3, 0.2, 0.1])
    init = np.zeros((N, 1), dtype=np.int64)
    res = search_batch(fixed_step(p), init, BOS, 3, 2, 1, selector=BeamSample(seed=6))
    counts = Counter(tuple(sorted(h.tokens[0] for h in hyps)) for hyps in res)
    expect = {
        (i, j): p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j]) for i, j in itertools.combinations(range(4), 2)
    }
    assert chi2(counts, expect, N) < chi2_critical(len(expect) - 1)


def test_beam_sample_draws_jointly_over_beams() -> None:
    # pool policy, 2 beams: at step 2 the engine gets 4 draws per request over both beams together
    vocab, eos, max_len = 3, 2, 2
    step, _ = table_model(vocab, 8, max_len)
    init = np.zeros((50, 1), dtype=np.int64)
    res = search_batch(step, init, BOS, eos, 2, max_len, policy="pool", selector=BeamSample(seed=9))
    for hyps in res:
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)  # without replacement: all distinct


def inclusion_probabilities(probs: dict, k: int) -> dict:
    """P(x in sample) for k successive draws without replacement, by enumerating ordered samples."""
    items = list(probs)
    incl = dict.fromkeys(items, 0.0)
    for tup in itertools.permutations(items, k):
        pr, left = 1.0, 1.0
        for x in tup:
            pr *= probs[x] / left
            left -= probs[x]
        for x in tup:
            incl[x] += pr
    return incl


@pytest.mark.parametrize("k", [1, 3])
def test_stochastic_beam_search_inclusion(k: int) -> None:
    vocab, eos, max_len = 3, 2, 3
    step, logits_of = table_model(vocab, 1, max_len)
    probs = enumerate_outputs(logits_of, vocab, eos, max_len)
    n = 3000
    init = np.zeros((n, 1), dtype=np.int64)
    res = stochastic_beam_search(step, init, BOS, eos, k, max_len, seed=11)
    incl = inclusion_probabilities(probs, k)
    seen: Counter = Counter()
    for samples in res:
        seqs = [tuple(s.hypothesis.tokens) for s in samples]
        assert len(seqs) == k and len(set(seqs)) == k  # without replacement
        keys = [s.key for s in samples]
        assert keys == sorted(keys, reverse=True)
        for s in samples:
            assert s.hypothesis.logprob == pytest.approx(np.log(probs[tuple(s.hypothesis.tokens)]), abs=1e-9)
            assert s.hypothesis.finished == (s.hypothesis.tokens[-1] == eos)
        seen.update(seqs)
    assert set(seen) <= set(probs)
    for x, p in incl.items():
        z = (seen[x] / n - p) / np.sqrt(max(p * (1 - p), 1e-12) / n)
        assert abs(z) < 4.5, (x, seen[x] / n, p)


def test_stochastic_beam_search_first_key_is_root() -> None:
    # the best sample keeps the root's perturbed value (0), as in Kool et al.'s top-down construction
    step, _ = table_model(3, 2, 3)
    res = stochastic_beam_search(step, np.zeros((5, 1), dtype=np.int64), BOS, 2, 2, 3, seed=1)
    for samples in res:
        assert samples[0].key == pytest.approx(0.0, abs=1e-12)
        assert samples[1].key < 0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: TopK(k=2, seed=4),
        lambda: TopP(p=0.8, seed=4),
        lambda: Multinomial(seed=4),
        lambda: BeamSample(seed=4),
        lambda: GumbelTopK(seed=4),
    ],
)
def test_seed_is_reproducible(make) -> None:
    step, _ = table_model(4, 3, 4)
    init = np.zeros((20, 1), dtype=np.int64)
    sel = make()
    a = search_batch(step, init, BOS, 3, 2, 4, selector=sel)
    b = search_batch(step, init, BOS, 3, 2, 4, selector=sel)  # the same object restarts its seed
    c = search_batch(step, init, BOS, 3, 2, 4, selector=make())
    toks = [[h.tokens for h in hyps] for hyps in a]
    assert toks == [[h.tokens for h in hyps] for hyps in b] == [[h.tokens for h in hyps] for hyps in c]


def test_numpy_generator_advances() -> None:
    step, _ = table_model(4, 3, 4)
    init = np.zeros((20, 1), dtype=np.int64)
    sel = Multinomial(generator=np.random.default_rng(0))
    a = search_batch(step, init, BOS, 3, 1, 4, selector=sel)
    b = search_batch(step, init, BOS, 3, 1, 4, selector=sel)
    assert [h[0].tokens for h in a] != [h[0].tokens for h in b]


def test_torch_logits_and_generator(device) -> None:
    """Torch logits on ``device`` with torch generators there (and a seeded numpy stream): the same seed draws
    the same, the draws follow the distribution (chi-square at p ~ 0.0005 for the fixed seeds)."""
    torch = pytest.importorskip("torch")
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05], dtype=torch.float32, device=device)

    def step(state, y_prev):
        return torch.log(p).repeat(state.shape[0], 1), state

    init = torch.zeros((N, 1), device=device)
    for sel_a, sel_b in [
        (
            TopK(k=3, generator=torch.Generator(device).manual_seed(1)),
            TopK(k=3, generator=torch.Generator(device).manual_seed(1)),
        ),
        (TopP(p=0.7, seed=1), TopP(p=0.7, seed=1)),
        (
            GumbelTopK(generator=torch.Generator(device).manual_seed(2)),
            GumbelTopK(generator=torch.Generator(device).manual_seed(2)),
        ),
    ]:
        a = search_batch(step, init, BOS, 4, 1, 1, selector=sel_a)
        b = search_batch(step, init, BOS, 4, 1, 1, selector=sel_b)
        assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
        counts = Counter(h[0].tokens[0] for h in a)
        if isinstance(sel_a, GumbelTopK):
            expect = dict(enumerate(P5))
        else:
            expect = {i: P5[i] / P5[:3].sum() for i in range(3)}
        assert chi2(counts, expect, N) < chi2_critical(len(expect) - 1)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"^TopK k must be >= 1, got 0$"):
        TopK(k=0)
    with pytest.raises(ValueError, match=r"^TopP p must be > 0 and <= 1, got 0.0$"):
        TopP(p=0.0)
    with pytest.raises(ValueError, match="not both"):
        Noise(seed=1, generator=np.random.default_rng(1))
    with pytest.raises(TypeError, match="seed must be an int"):
        Noise(seed="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator"):
        Noise(generator=42)


def test_stochastic_beam_search_stops_calling_the_model() -> None:
    # eos is certain at the second step: once every sample has finished, the model is not called again
    calls = []

    def step(state, y_prev):
        calls.append(state.shape[0])
        t = len(calls)
        logits = np.zeros((state.shape[0], 3))
        if t >= 2:
            logits[:, :2] = -np.inf
        return logits, state

    res = stochastic_beam_search(step, np.zeros((4, 1)), BOS, 2, 2, 10, seed=0)
    assert len(calls) == 2
    for samples in res:
        assert all(s.hypothesis.finished and len(s.hypothesis.tokens) <= 2 for s in samples)
        assert [s.hypothesis.tokens for s in samples] != [[2], [2]]


def test_stochastic_beam_search_one_failing_request_keeps_the_others() -> None:
    # request 1's logits are NaN: it fails alone, the others' samples come back in BatchDecodeError.results
    vocab, eos, max_len, k = 3, 2, 3, 2
    inner, logits_of = table_model(vocab, 5, max_len)
    probs = enumerate_outputs(logits_of, vocab, eos, max_len)

    def step(state, y_prev):
        req, hist = state
        logits, new = inner(hist, y_prev)
        logits = np.where((req == 1)[:, None], np.nan, logits)  # shape: (rows, V)
        return logits, (req, new)

    init = (np.arange(3), np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(BatchDecodeError) as info:
        stochastic_beam_search(step, init, BOS, eos, k, max_len, seed=3)
    assert set(info.value.errors) == {1} and "request 1" in str(info.value)
    results = info.value.results
    assert len(results) == 3 and results[1] == []
    for r in (0, 2):
        seqs = [tuple(s.hypothesis.tokens) for s in results[r]]
        assert len(seqs) == k and len(set(seqs)) == k
        for s in results[r]:
            assert s.hypothesis.logprob == pytest.approx(np.log(probs[tuple(s.hypothesis.tokens)]), abs=1e-9)


@pytest.mark.parametrize("name", ["GumbelTopK", "stochastic_beam_search", "PrefixTable", "Sample", "truncated_gumbel"])
def test_stochastic_names_live_only_in_variants(name: str) -> None:
    import beamkit.samplers
    import beamkit.variants.stochastic

    assert hasattr(beamkit.variants.stochastic, name)
    with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
        getattr(beamkit.samplers, name)


def test_samplers_has_no_other_hidden_names() -> None:
    import beamkit.samplers

    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        beamkit.samplers.Nothing  # noqa: B018


def test_positional_argument_is_the_samplers_own_parameter() -> None:
    """``TopK(5)`` keeps 5 tokens and ``TopP(0.9)`` is a nucleus of 0.9, as the docs write them; ``seed`` and
    ``generator`` are keyword-only in every sampler (a positional seed is a TypeError, never a silent seed)."""
    assert TopK(5).k == 5 and TopK(5).seed is None
    assert TopP(0.9).p == 0.9 and TopP(0.9).seed is None
    assert set(first_tokens(TopK(2, seed=1), n=400)) == {0, 1}  # only the two most likely tokens are drawn
    assert set(first_tokens(TopP(0.3, seed=1), n=50)) == {0}  # P5[0] = 0.4 reaches p alone
    for make in (Multinomial, BeamSample, GumbelTopK):
        with pytest.raises(TypeError):
            make(5)  # type: ignore[misc]


def test_negative_seed_is_named() -> None:
    step = fixed_step(np.array([0.5, 0.3, 0.2]))
    with pytest.raises(ValueError, match=r"^seed must be >= 0, got -1$"):
        stochastic_beam_search(step, np.zeros((1, 1)), BOS, 2, 2, 3, seed=-1)
    with pytest.raises(ValueError, match=r"^seed must be >= 0, got -3$"):
        TopK(k=3, seed=-3)
    with pytest.raises(TypeError):
        stochastic_beam_search(step, np.zeros((1, 1)), BOS, 2, 2, 3, 7)  # type: ignore[misc]
