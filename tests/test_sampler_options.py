"""The samplers' temperature, with-replacement draws and TopP's widening, and the per-request temperature of the
engine, against distributions worked out here by hand (numpy).

Bounds: a token of exact probability q drawn n times independently is counted c ~ Binomial(n, q), so
``|c / n - q|`` is within 5 standard deviations ``5 * sqrt(q (1 - q) / n)`` except with probability ~6e-7 per
check (every draw here is seeded, so each test is deterministic; the bound says a correct sampler passes for
almost every seed). A token of probability 0 must never be drawn. Each distribution test also checks that the
same counts are rejected against the untempered distribution, so it can fail.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from beamkit import Engine, SearchOptions, search_batch
from beamkit.processors import StepContext
from beamkit.samplers import BeamSample, HuggingFaceSample, Multinomial, TopK, TopP
from beamkit.search import Deterministic
from beamkit.variants import GumbelTopK

BOS = 99
N = 20000  # rows drawn at once
Z = 5.0
LOGITS = np.array([2.0, 1.2, 0.5, 0.0, -0.7, -1.5])
P5 = np.array([0.4, 0.25, 0.2, 0.1, 0.05])


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x - (np.log(np.exp(x - x.max()).sum()) + x.max())


def tempered(logp: np.ndarray, t: float) -> np.ndarray:
    """softmax(logp / t), by hand."""
    w = np.exp(logp / t - (logp / t).max())
    return w / w.sum()


def exact(kind: str, logp: np.ndarray, t: float, k: int = 3, p: float = 0.9) -> np.ndarray:
    """The distribution one draw comes from, worked out independently of the samplers."""
    if kind in ("multinomial", "gumbel"):
        return tempered(logp, t)
    if kind == "topk":
        order = sorted(range(len(logp)), key=lambda i: (-logp[i], i))[:k]
        q = np.zeros(len(logp))
        q[order] = tempered(logp[order], t)
        return q
    assert kind == "topp"
    q = tempered(logp, t)
    keep, mass = [], 0.0
    for i in sorted(range(len(q)), key=lambda i: -q[i]):
        if mass < p or not keep:
            keep.append(i)
        mass += q[i]
    out = np.zeros(len(q))
    out[keep] = q[keep] / q[keep].sum()
    return out


def zmax(counts: np.ndarray, q: np.ndarray, n: int) -> float:
    """The largest |z| of the counts against q; inf when a token of probability 0 was drawn."""
    if (counts[q == 0] > 0).any():
        return float("inf")
    live = (q > 0) & (q < 1)
    if (counts[q == 1] != n).any():
        return float("inf")
    sd = np.sqrt(q[live] * (1 - q[live]) / n)
    return float(np.max(np.abs(counts[live] / n - q[live]) / sd, initial=0.0))


def make(kind: str, **kw):
    return {
        "multinomial": lambda: Multinomial(**kw),
        "topk": lambda: TopK(k=3, **kw),
        "topp": lambda: TopP(p=0.9, **kw),
        "gumbel": lambda: GumbelTopK(**kw),
    }[kind]()


def ctx_of(rows: int, temperature: np.ndarray | None = None) -> StepContext:
    return StepContext(
        step=0,
        tokens=np.zeros((rows, 0), dtype=np.int64),
        request=np.arange(rows),
        eos=(),
        logprob=np.zeros(rows),
        temperature=temperature,
    )


def draw(sel, logp: np.ndarray, n: int, m: int, lib: str = "numpy", temperature: np.ndarray | None = None, device=None):
    """One selector call on n identical rows of log-probabilities ``logp`` (torch: float32 on ``device``)."""
    scores = np.tile(logp, (n, 1))
    if lib == "torch":
        torch = pytest.importorskip("torch")
        scores = torch.tensor(scores, dtype=torch.float32, device=device)
    return sel.candidates(scores, np.zeros(n), np.zeros(n), m, ctx_of(n, temperature))


def counts_of(tok: np.ndarray, lp: np.ndarray, v: int) -> np.ndarray:
    return np.bincount(tok[np.isfinite(lp)], minlength=v)


KINDS = ["multinomial", "topk", "topp", "gumbel"]
# (library, device) of the scores: numpy, torch on the CPU, torch on cuda (skipped without a CUDA device)
LIBS = [pytest.param(lib, d, id=f"{lib}-{d}") for lib, d in (("numpy", "cpu"), ("torch", "cpu"), ("torch", "cuda"))]


# ------------------------------------------------------------------------------------------------ temperature
@pytest.mark.parametrize("lib,device", LIBS, indirect=["device"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t", [0.5, 2.0])
def test_one_draw_follows_the_tempered_distribution(kind: str, t: float, lib: str, device) -> None:
    logp = log_softmax(LOGITS)
    kw = {"generator": __import__("torch").Generator(device).manual_seed(7)} if lib == "torch" else {"seed": 7}
    lp, tok, _ = draw(make(kind, temperature=t, **kw), logp, N, 1, lib, device=device)
    counts = counts_of(tok[:, 0], lp[:, 0], len(logp))
    assert counts.sum() == N
    assert zmax(counts, exact(kind, logp, t), N) < Z
    assert zmax(counts, exact(kind, logp, 1.0), N) > Z  # the untempered distribution is rejected


@pytest.mark.parametrize("t, p, nucleus", [(0.5, 0.7, {0, 1}), (2.0, 0.8, {0, 1, 2, 3})])
def test_topp_tempers_before_taking_the_nucleus(t: float, p: float, nucleus: set) -> None:
    # untempered, p = 0.7 and p = 0.8 both keep the first three tokens of P5 (mass before: 0, .4, .65, .85)
    logp = np.log(P5)
    q = exact("topp", logp, t, p=p)
    assert set(np.flatnonzero(q)) == nucleus  # worked out: T = 0.5 -> [.58, .23, .15, ..]; T = 2 -> [.30, .24, ..]
    lp, tok, _ = draw(TopP(p=p, temperature=t, seed=3), logp, N, 1)
    counts = counts_of(tok[:, 0], lp[:, 0], 5)
    assert zmax(counts, q, N) < Z
    assert set(np.flatnonzero(counts)) == nucleus


@pytest.mark.parametrize("kind", ["multinomial", "topk", "topp"])
def test_two_draws_without_replacement_follow_the_tempered_distribution(kind: str) -> None:
    # P({i, j}) = q_i q_j / (1 - q_i) + q_j q_i / (1 - q_j) for two successive draws without replacement
    logp = log_softmax(LOGITS)
    q = exact(kind, logp, 0.5, p=0.95)
    sel = TopP(p=0.95, temperature=0.5, seed=5) if kind == "topp" else make(kind, temperature=0.5, seed=5)
    lp, tok, _ = draw(sel, logp, N, 2)
    assert np.isfinite(lp).all() and (tok[:, 0] != tok[:, 1]).all()  # never the same token twice
    pairs = Counter(tuple(sorted(r)) for r in tok.tolist())
    live = np.flatnonzero(q)
    for i in live:
        for j in live[live > i]:
            e = q[i] * q[j] / (1 - q[i]) + q[j] * q[i] / (1 - q[j])
            assert abs(pairs[(i, j)] / N - e) < Z * np.sqrt(e * (1 - e) / N), (i, j)
    assert set(pairs) <= {(i, j) for i in live for j in live if i < j}


@pytest.mark.parametrize("kind", KINDS)
def test_accumulated_logprob_is_untempered(kind: str) -> None:
    # a three-step search whose logits depend on the history: logprob is the sum of the model's log-softmax
    rng = np.random.default_rng(0)
    table = rng.normal(size=(4, 6, 5)) * 1.5

    def step(state, y_prev):
        t = state.shape[1] - 1
        last = np.asarray(y_prev, dtype=np.int64) % 5 if t else np.full(state.shape[0], 5)
        new = np.concatenate([state, last[:, None]], axis=1)
        return table[t, last], new

    init = np.zeros((40, 1), dtype=np.int64)
    policy = "compete" if kind == "gumbel" else "narrow"
    res = search_batch(step, init, BOS, None, 2, 3, selector=make(kind, temperature=0.4, seed=1), policy=policy)
    for hyps in res:
        for h in hyps:
            want, last = [], 5
            for t, y in enumerate(h.tokens):
                want.append(log_softmax(table[t, last])[y])
                last = y
            assert h.token_logprobs == pytest.approx(want, abs=1e-12)
            assert h.logprob == pytest.approx(sum(want), abs=1e-12)
            if kind != "gumbel":
                assert h.key == pytest.approx(h.logprob, abs=1e-12)  # the key is the running log-probability


# ------------------------------------------------------------------------------------------------ with replacement
@pytest.mark.parametrize("lib,device", LIBS, indirect=["device"])
@pytest.mark.parametrize("kind", ["multinomial", "topk", "topp"])
def test_draws_with_replacement_are_independent(kind: str, lib: str, device) -> None:
    # P(first = i, second = j) = q_i q_j; P(equal) = sum q_i^2
    logp = log_softmax(LOGITS)
    t = 0.7
    q = exact(kind, logp, t)
    kw = {"generator": __import__("torch").Generator(device).manual_seed(2)} if lib == "torch" else {"seed": 2}
    lp, tok, key = draw(make(kind, temperature=t, with_replacement=True, **kw), logp, N, 2, lib, device=device)
    assert lp.shape == (N, 2) and np.isfinite(lp).all()
    given = logp.astype(np.float32).astype(np.float64) if lib == "torch" else logp  # what the selector was given
    np.testing.assert_array_equal(lp, given[tok])  # the untempered log-probabilities, exactly
    for col in (0, 1):
        assert zmax(np.bincount(tok[:, col], minlength=6), q, N) < Z
    same = q @ q
    assert abs(np.mean(tok[:, 0] == tok[:, 1]) - same) < Z * np.sqrt(same * (1 - same) / N)
    pairs = Counter(map(tuple, tok.tolist()))
    for (i, j), c in pairs.items():
        e = q[i] * q[j]
        assert e > 0 and abs(c / N - e) < Z * np.sqrt(e * (1 - e) / N), (i, j)


def test_with_replacement_draws_m_even_from_a_smaller_top_k() -> None:
    logp = log_softmax(LOGITS)
    lp, tok, _ = draw(TopK(k=2, with_replacement=True, seed=1), logp, 2000, 4)
    assert tok.shape == (2000, 4) and np.isfinite(lp).all() and set(tok.ravel().tolist()) == {0, 1}
    lp, tok, _ = draw(TopK(k=2, seed=1), logp, 10, 4)  # without: at most k
    assert tok.shape == (10, 2)


def test_with_replacement_never_draws_a_masked_token() -> None:
    logp = log_softmax(LOGITS)
    logp[[0, 3]] = -np.inf
    for sel in (Multinomial(with_replacement=True, seed=4), TopP(p=1.0, with_replacement=True, seed=4)):
        lp, tok, _ = draw(sel, logp, 5000, 3)
        assert np.isfinite(lp).all() and not np.isin(tok, [0, 3]).any()
    one = np.full(6, -np.inf)
    one[5] = 0.0  # one token left: every draw is it
    lp, tok, _ = draw(Multinomial(with_replacement=True, seed=4), one, 100, 3)
    assert (tok == 5).all() and (lp == 0).all()


@pytest.mark.parametrize("policy", ["narrow", "pool", "compete"])
@pytest.mark.parametrize("lib,device", LIBS, indirect=["device"])
def test_a_whole_search_with_duplicate_candidates(policy: str, lib: str, device) -> None:
    # a peaked model: with replacement, rows often draw the same token twice; the engine keeps both copies
    rng = np.random.default_rng(1)
    table = rng.normal(size=(5, 5, 4)) * 3.0
    eos = 3

    def step(state, y_prev):
        t = state.shape[1] - 1
        y = np.asarray(y_prev.cpu() if hasattr(y_prev, "cpu") else y_prev, dtype=np.int64)
        last = y % 4 if t else np.full(state.shape[0], 4)
        logits = table[t, last]
        new = np.concatenate([state, last[:, None]], axis=1)
        if lib == "torch":
            import torch

            return torch.tensor(logits, device=device), new
        return logits, new

    pytest.importorskip("torch") if lib == "torch" else None
    beam, max_len = 3, 4
    init = np.zeros((60, 1), dtype=np.int64)
    sel = Multinomial(with_replacement=True, temperature=1.5, seed=8)
    res = search_batch(step, init, BOS, eos, beam, max_len, selector=sel, policy=policy)
    duplicated = 0
    for hyps in res:
        assert 1 <= len(hyps) <= beam
        seqs = [tuple(h.tokens) for h in hyps]
        duplicated += len(seqs) - len(set(seqs))
        for h in hyps:
            want, last = 0.0, 4
            for t, y in enumerate(h.tokens):
                want += log_softmax(table[t, last])[y]
                last = y
            assert h.logprob == pytest.approx(want, abs=1e-12)
            assert h.finished == (h.tokens[-1] == eos)
            assert len(h.tokens) == max_len or h.finished
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert duplicated > 0  # the same hypothesis was returned twice somewhere
    again = search_batch(step, init, BOS, eos, beam, max_len, selector=sel, policy=policy)
    assert [[h.tokens for h in hyps] for hyps in res] == [[h.tokens for h in hyps] for hyps in again]


def test_without_replacement_a_search_never_repeats_a_row_token() -> None:
    # the same model and selector without replacement: one step, beam 3 -> three distinct tokens per request
    logp = log_softmax(LOGITS * 3)
    init = np.zeros((500, 1), dtype=np.int64)

    def step(state, y_prev):
        return np.tile(logp, (state.shape[0], 1)), state

    res = search_batch(step, init, BOS, None, 3, 1, selector=Multinomial(temperature=1.5, seed=8))
    assert all(len({h.tokens[0] for h in hyps}) == 3 for hyps in res)
    res = search_batch(
        step, init, BOS, None, 3, 1, selector=Multinomial(temperature=1.5, seed=8, with_replacement=True)
    )
    assert any(len({h.tokens[0] for h in hyps}) < 3 for hyps in res)


# ------------------------------------------------------------------------------------------------ TopP widen
def test_widen_gives_m_candidates_from_the_most_likely_tokens() -> None:
    logp = np.log(P5)  # p = 0.3: the nucleus is token 0 alone
    lp, tok, _ = draw(TopP(p=0.3, seed=1), logp, 200, 3)
    assert (np.isfinite(lp).sum(axis=1) == 1).all() and (tok[np.isfinite(lp)] == 0).all()
    lp, tok, _ = draw(TopP(p=0.3, widen=True, seed=1), logp, 200, 3)
    assert np.isfinite(lp).all()
    assert all(sorted(r) == [0, 1, 2] for r in tok.tolist())  # the 3 most likely, each once
    lp, tok, _ = draw(TopP(p=0.3, widen=True, with_replacement=True, seed=1), logp, 200, 3)
    assert (tok == 0).all()  # with replacement widen changes nothing: every draw is the nucleus' one token
    lp, tok, _ = draw(TopP(p=0.7, widen=True, seed=1), logp, 200, 2)  # a nucleus of 3 >= m: not widened
    assert set(tok.ravel().tolist()) == {0, 1, 2}


def test_widen_in_a_search() -> None:
    logp = np.log(P5)

    def step(state, y_prev):
        return np.tile(logp, (state.shape[0], 1)), state

    init = np.zeros((20, 1))
    narrow = search_batch(step, init, BOS, None, 3, 1, selector=TopP(p=0.3, seed=2))
    wide = search_batch(step, init, BOS, None, 3, 1, selector=TopP(p=0.3, widen=True, seed=2))
    assert all(len(h) == 1 for h in narrow) and all(len(h) == 3 for h in wide)
    for hyps in wide:
        assert [h.tokens for h in hyps] == [[0], [1], [2]]  # ranked by (untempered) log-probability


# ------------------------------------------------------------------------------------------------ bad values
@pytest.mark.parametrize("cls", [Multinomial, TopK, TopP, GumbelTopK])
def test_bad_values_name_the_field(cls) -> None:
    name = cls.__name__
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=f"^{name} temperature must be"):
            cls(temperature=bad)
    with pytest.raises(TypeError, match=f"^{name} temperature must be a number"):
        cls(temperature="1")
    with pytest.raises(TypeError, match=f"^{name} with_replacement must be True or False"):
        cls(with_replacement=1)
    with pytest.raises(TypeError, match="^TopP widen must be True or False"):
        TopP(widen="yes")


def test_gumbel_top_k_samples_without_replacement_only() -> None:
    with pytest.raises(ValueError, match="GumbelTopK samples without replacement"):
        GumbelTopK(with_replacement=True)


@pytest.mark.parametrize("cls", [BeamSample, HuggingFaceSample])
def test_hugging_face_selectors_point_to_the_temperature_processor(cls) -> None:
    with pytest.raises(ValueError, match=r"beamkit\.processors\.Temperature"):
        cls(temperature=0.5)
    with pytest.raises(ValueError, match=r"without replacement.*beamkit\.processors\.Temperature"):
        cls(with_replacement=True)
    sel = cls(temperature=1.0, seed=0)  # the default is fine
    with pytest.raises(ValueError, match=r"beamkit\.processors\.Temperature"):
        SearchOptions(beam_size=2, max_len=3, selector=sel, temperature=0.5)
    engine = Engine(lambda s, y: (np.zeros((s.shape[0], 3)), s), beam_size=2, max_len=3, selector=sel)
    with pytest.raises(ValueError, match=r"beamkit\.processors\.Temperature"):
        engine.add(np.zeros((1, 1)), BOS, 0, temperature=2.0)
    engine.add(np.zeros((1, 1)), BOS, 0, temperature=1.0)


def test_bad_request_temperature() -> None:
    with pytest.raises(ValueError, match="^temperature must be > 0"):
        SearchOptions(beam_size=1, max_len=2, temperature=0.0)
    with pytest.raises(TypeError, match="^temperature must be a number"):
        SearchOptions(beam_size=1, max_len=2, temperature="hot")
    engine = Engine(lambda s, y: (np.zeros((s.shape[0], 3)), s), beam_size=1, max_len=2, selector=Multinomial())
    with pytest.raises(ValueError, match="^temperature must be a finite number"):
        engine.add(np.zeros((1, 1)), BOS, 0, temperature=float("inf"))
    assert engine.idle  # nothing was added


# ------------------------------------------------------------------------------------------------ per request
def seeded_model(vocab: int, seeds: list[int], max_len: int):
    """Logits depend on the request's model seed (state column 0), the step and the last token."""
    tables = np.stack([np.random.default_rng(s).normal(size=(max_len, vocab + 1, vocab)) * 1.5 for s in seeds])

    def step(state, y_prev):
        t = state.shape[1] - 1
        last = np.asarray(y_prev, dtype=np.int64) if t else np.full(state.shape[0], vocab)
        new = np.concatenate([state, last[:, None]], axis=1)
        return tables[state[:, 0], t, last], new

    return step


def run(step, reqs: list[tuple[int, float | None]], selector, beam: int, max_len: int, eos=None, **shared):
    """Decode requests (model seed index, temperature or None) together in one engine; their hypotheses."""
    engine = Engine(step, beam_size=beam, max_len=max_len, selector=selector, **shared)
    ids = []
    for s, t in reqs:
        given = {} if t is None else {"temperature": t}
        ids.append(engine.add(np.array([[s]], dtype=np.int64), BOS, eos, **given))
    done = {}
    while not engine.idle:
        for c in engine.step():
            assert c.error is None, c.error
            done[c.request_id] = c.hypotheses
    return [[(h.tokens, h.logprob, h.key) for h in done[i]] for i in ids]


@pytest.mark.parametrize("kind", KINDS)
def test_request_temperature_is_the_selector_temperature_for_its_rows(kind: str) -> None:
    # Noise is drawn per step for every row of the batch at once, so a sampled request's draws depend on the rows
    # around it (see the module docstring of beamkit.samplers). Without a stop token every request keeps its
    # rows, so the noise each row gets is the same in all three runs: request 0 (T = 0.5) and request 1 (T = 2)
    # decoded together give exactly what each gets when the selector itself has that temperature.
    step = seeded_model(5, [11, 12], 4)
    policy = "compete" if kind == "gumbel" else "narrow"
    together = run(step, [(0, 0.5), (1, 2.0)], make(kind, seed=3), 2, 4, policy=policy)
    as_half = run(step, [(0, None), (1, None)], make(kind, seed=3, temperature=0.5), 2, 4, policy=policy)
    as_two = run(step, [(0, None), (1, None)], make(kind, seed=3, temperature=2.0), 2, 4, policy=policy)
    assert together[0] == as_half[0] and together[1] == as_two[1]
    plain = run(step, [(0, None), (1, None)], make(kind, seed=3), 2, 4, policy=policy)
    assert together != plain  # the temperatures changed the draws
    # a request without a temperature draws with the selector's own, beside one with its own
    mixed = run(step, [(0, None), (1, 2.0)], make(kind, seed=3, temperature=0.5), 2, 4, policy=policy)
    assert mixed == [as_half[0], as_two[1]]
    # the default for every request: SearchOptions.temperature
    shared = run(step, [(0, None), (1, None)], make(kind, seed=3), 2, 4, policy=policy, temperature=0.5)
    assert shared == as_half


def test_first_request_alone_equals_together() -> None:
    # one step: the first request's row gets the first noise row whatever follows it, so alone == together
    step = seeded_model(5, [11, 12], 1)
    for sel in (Multinomial, lambda **kw: TopP(p=0.9, **kw), lambda **kw: TopK(k=4, **kw)):
        for repl in (False, True):
            together = run(step, [(0, 0.5), (1, 2.0)], sel(seed=9, with_replacement=repl), 3, 1)
            alone = run(step, [(0, 0.5)], sel(seed=9, with_replacement=repl), 3, 1)
            assert together[0] == alone[0]


@pytest.mark.parametrize("kind", ["multinomial", "topp", "topk"])
def test_requests_with_different_temperatures_draw_as_alone_in_distribution(kind: str) -> None:
    # half the requests at T = 0.5, half at T = 2 (given per request), interleaved in one batch: each half's
    # first tokens follow its own tempered distribution, as each request decoded alone does
    logp = log_softmax(LOGITS)

    def step(state, y_prev):
        return np.tile(logp, (state.shape[0], 1)), state

    n = 8000
    engine = Engine(step, beam_size=1, max_len=1, selector=make(kind, seed=4, temperature=1.0))
    temps = [0.5 if i % 2 else 2.0 for i in range(n)]
    ids = [engine.add(np.zeros((1, 1)), BOS, None, temperature=t) for t in temps]
    got = {}
    while not engine.idle:
        got.update({c.request_id: c.hypotheses[0].tokens[0] for c in engine.step()})
    for t in (0.5, 2.0):
        toks = [got[i] for i, tt in zip(ids, temps, strict=True) if tt == t]
        counts = np.bincount(toks, minlength=6)
        assert zmax(counts, exact(kind, logp, t), len(toks)) < Z
        assert zmax(counts, exact(kind, logp, 2.5 - t), len(toks)) > Z  # the other half's is rejected


def test_deterministic_selection_ignores_temperature() -> None:
    step = seeded_model(5, [11, 12, 13], 4)
    reqs = [(0, 0.3), (1, None), (2, 3.0)]
    together = run(step, reqs, Deterministic(), 3, 4, eos=4)
    plain = run(step, [(s, None) for s, _ in reqs], Deterministic(), 3, 4, eos=4)
    assert together == plain
    for i, r in enumerate(reqs):
        assert run(step, [r], Deterministic(), 3, 4, eos=4)[0] == together[i]
