"""The batched engine: batched == individual, Hugging Face's stopping rules, patience, outputs, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beamkit import (
    BatchDecodeError,
    BeamSearch,
    CoveragePenalty,
    LengthPenalty,
    NoRepeatNGram,
    RepetitionPenalty,
    SearchOptions,
    search_batch,
)
from tests.toy import BOS, MultiToy, ToyModel, log_softmax_ref

EOS = 0


def hf_reference(model: ToyModel, k: int, max_len: int, alpha: float, early_stopping, patience: float = 1.0):
    """Hugging Face 5.x ``_beam_search`` for one request, written as a plain per-beam loop.

    Top 2k candidates (ties: lower beam, lower token); eos (or any candidate at max_len) ranked < k goes to the
    pool scored ``logprob / len ** alpha`` unless early_stopping is True and the pool was already full; the
    best k others run on. Stop: pool full and early_stopping True, or the best running beam scored at the
    current length (``max_len`` for "never" with alpha > 0) cannot beat the pool's worst. Returns (pool, calls).
    """
    cap = max(1, round(k * patience))
    running = [((), 0.0)]
    pool: list[tuple[float, tuple, float, bool]] = []
    calls = 0
    for t in range(max_len):
        calls += 1
        cands = []
        for b, (toks, lp) in enumerate(running):
            logp = log_softmax_ref(model.logits(toks))
            cands += [(lp + logp[v], b, v) for v in range(model.v)]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        last = t + 1 == max_len
        new_running, new_fin = [], []
        for rank, (s, b, v) in enumerate(cands[: 2 * k]):
            toks = running[b][0] + (v,)
            if v == EOS or last:
                if rank < k:
                    new_fin.append((s / (t + 1) ** alpha, toks, s, v == EOS))
            elif len(new_running) < k:
                new_running.append((toks, s))
        if not (early_stopping is True and len(pool) >= cap):
            pool = sorted(pool + new_fin, key=lambda h: -h[0])[:cap]
        running = new_running
        if last or not running:
            break
        if len(pool) >= cap:
            if early_stopping is True:
                break
            horizon = max_len if (early_stopping == "never" and alpha > 0) else t + 1
            if running[0][1] / horizon**alpha <= pool[-1][0]:
                break
    return pool, calls


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(4))
def test_pool_matches_the_hugging_face_reference(early_stopping, alpha, seed):
    m = ToyModel(7, seed=seed, scale=1.5)
    k, max_len = 3, 6
    want, calls = hf_reference(m, k, max_len, alpha, early_stopping)
    res = BeamSearch(
        SearchOptions(k, max_len, LengthPenalty(alpha), policy="pool", early_stopping=early_stopping)
    ).search(m.step, m.init(), BOS, EOS)
    got = res.hypotheses[0]
    assert [tuple(h.tokens) for h in got] == [w[1] for w in want]
    np.testing.assert_allclose([h.score for h in got], [w[0] for w in want], atol=1e-9)
    assert [h.finished for h in got] == [w[3] for w in want]
    assert res.stats.model_calls == calls


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_pool_stopping_rules_with_likely_eos(early_stopping, alpha):
    """Models where eos is likely, so pools fill early and each stopping rule decides the step count."""
    early = 0
    for seed in range(12):
        m = ToyModel(6, seed=seed, scale=1.5, eos_bias=1.0)
        k, max_len = 3, 10
        want, calls = hf_reference(m, k, max_len, alpha, early_stopping)
        res = BeamSearch(
            SearchOptions(k, max_len, LengthPenalty(alpha), policy="pool", early_stopping=early_stopping)
        ).search(m.step, m.init(), BOS, EOS)
        assert [tuple(h.tokens) for h in res.hypotheses[0]] == [w[1] for w in want]
        np.testing.assert_allclose([h.score for h in res.hypotheses[0]], [w[0] for w in want], atol=1e-9)
        assert res.stats.model_calls == calls
        early += calls < max_len
    if not (early_stopping == "never" and alpha > 0):  # the exact bound at max_len rarely stops early
        assert early >= 3  # the rules were exercised, not just max_len


def test_stopping_modes_differ():
    calls = {}
    for mode in (True, False, "never"):
        total = 0
        for seed in range(12):
            m = ToyModel(6, seed=seed, scale=1.5, eos_bias=1.0)
            total += hf_reference(m, 3, 10, 1.0, mode)[1]
        calls[mode] = total
    assert calls[True] < calls[False] < calls["never"]


@pytest.mark.parametrize("patience", [0.34, 0.5, 1.0, 1.5, 2.0])
def test_patience_changes_the_stopping_step(patience):
    m = ToyModel(6, seed=3, scale=0.7)
    k, max_len = 4, 12
    want, calls = hf_reference(m, k, max_len, 1.0, True, patience)
    res = BeamSearch(SearchOptions(k, max_len, policy="pool", early_stopping=True, patience=patience)).search(
        m.step, m.init(), BOS, EOS
    )
    assert res.stats.model_calls == calls
    assert len(res.hypotheses[0]) == len(want) == max(1, round(k * patience))
    # by definition: the search stopped at the first step where round(k * p) hypotheses had finished
    finish_steps = sorted(len(h.tokens) for h in res.hypotheses[0])
    assert finish_steps[-1] == calls


def test_patience_factor_counts():
    m = ToyModel(6, seed=3, scale=0.7)
    calls = []
    for p in (0.5, 1.0, 2.0):
        r = BeamSearch(SearchOptions(4, 12, policy="pool", early_stopping=True, patience=p)).search(
            m.step, m.init(), BOS, EOS
        )
        calls.append(r.stats.model_calls)
    assert calls[0] <= calls[1] <= calls[2] and calls[0] < calls[2]


@pytest.mark.parametrize("num_return", [1, 2, 3])
def test_exact_exit_returns_the_same_best_with_fewer_calls(num_return):
    saved = 0
    for seed in range(16):
        m = ToyModel(6, seed=seed, scale=1.0)
        base = BeamSearch(SearchOptions(4, 10, LengthPenalty(0.0), policy="pool", early_stopping="never")).search(
            m.step, m.init(), BOS, EOS
        )
        fast = BeamSearch(
            SearchOptions(
                4,
                10,
                LengthPenalty(0.0),
                policy="pool",
                early_stopping="never",
                exact_exit=True,
                num_return=num_return,
            )
        ).search(m.step, m.init(), BOS, EOS)
        want = [(h.tokens, h.score) for h in base.hypotheses[0][:num_return]]
        assert [(h.tokens, h.score) for h in fast.hypotheses[0]] == want
        assert fast.stats.model_calls <= base.stats.model_calls
        saved += base.stats.model_calls - fast.stats.model_calls
    assert saved > 0
    with pytest.raises(ValueError, match="exact_exit"):
        SearchOptions(4, 10, LengthPenalty(1.0), policy="pool", exact_exit=True)


option_sets = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(["narrow", "pool", "compete"]),
        "early_stopping": st.sampled_from([True, False, "never"]),
        "alpha": st.sampled_from([0.0, 0.5, 1.0, 2.0]),
        "shift": st.sampled_from([0.0, 5.0]),
        "min_len": st.integers(0, 3),
        "ngram": st.sampled_from([0, 2]),
        "rep": st.sampled_from([1.0, 1.3]),
        "num_return": st.sampled_from([None, 1, 2]),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    opts=option_sets,
    seeds=st.lists(st.integers(0, 10_000), min_size=2, max_size=5),
    k=st.integers(2, 4),
    v=st.integers(4, 7),
    max_len=st.integers(1, 6),
)
def test_batched_equals_individual(opts, seeds, k, v, max_len):
    procs = []
    if opts["ngram"]:
        procs.append(NoRepeatNGram(opts["ngram"]))
    if opts["rep"] != 1.0:
        procs.append(RepetitionPenalty(opts["rep"]))
    kw = dict(
        policy=opts["policy"],
        early_stopping=opts["early_stopping"],
        length_penalty=LengthPenalty(opts["alpha"], opts["shift"]),
        min_len=min(opts["min_len"], max_len),  # above max_len is refused
        processors=procs,
        num_return=opts["num_return"],
    )
    multi = MultiToy(v, seeds, scale=1.5)
    together = search_batch(multi.step, multi.init(), BOS, EOS, k, max_len, **kw)
    assert multi.calls[0] == len(seeds)  # one row per request at the first call
    assert all(rows <= k * len(seeds) for rows in multi.calls)
    for r in range(len(seeds)):
        single = multi.single(r)
        alone = search_batch(single.step, single.init(), BOS, EOS, k, max_len, **kw)[0]
        assert [h.tokens for h in together[r]] == [h.tokens for h in alone]
        assert [h.score for h in together[r]] == [h.score for h in alone]
        assert [h.logprob for h in together[r]] == [h.logprob for h in alone]


def test_one_model_call_per_step_and_finished_requests_leave():
    # request 0 ends at step 1 (eos certain), request 1 never says eos
    class Two(MultiToy):
        def step(self, state, y):
            logits, new = super().step(state, y)
            for i, (s, _p) in enumerate(new):
                logits[i] = [50.0, -np.inf, -np.inf, -np.inf] if s == 0 else [-np.inf, 0.0, 0.1, 0.2]
            return logits, new

    m = Two(4, [0, 1])
    res = search_batch(m.step, m.init(), BOS, EOS, 2, 4)
    assert m.calls == [2, 2, 2, 2]  # 1 + 1 rows, then request 0 is gone: request 1's two beams
    assert res[0][0].tokens == [EOS] and len(res[1]) == 2


def test_bos_per_request_and_validation():
    m = MultiToy(5, [1, 2, 3])
    res = search_batch(m.step, m.init(), [BOS, BOS, BOS], EOS, 2, 3)
    assert len(res) == 3
    with pytest.raises(ValueError, match="bos"):
        search_batch(m.step, m.init(), [BOS, BOS], EOS, 2, 3)
    with pytest.raises(ValueError, match="num_return"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, num_return=3)
    with pytest.raises(ValueError, match="policy"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, policy="wide")
    with pytest.raises(ValueError, match="early_stopping"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, early_stopping="sometimes")
    with pytest.raises(TypeError, match="length_penalty"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, length_penalty="big")


def test_one_bad_request_keeps_the_others():
    class Bad(MultiToy):
        def step(self, state, y):
            logits, new = super().step(state, y)
            for i, (s, p) in enumerate(new):
                if s == 99 and len(p) == 1:
                    logits[i] = np.nan
            return logits, new

    m = Bad(5, [1, 99, 2])
    with pytest.raises(BatchDecodeError, match="request 1: .*NaN") as err:
        search_batch(m.step, m.init(), BOS, EOS, 2, 4)
    good = MultiToy(5, [1, 2])
    want = search_batch(good.step, good.init(), BOS, EOS, 2, 4)
    assert set(err.value.errors) == {1}
    assert err.value.results[1] == []
    assert [h.tokens for h in err.value.results[0]] == [h.tokens for h in want[0]]
    assert [h.tokens for h in err.value.results[2]] == [h.tokens for h in want[1]]


def test_outputs_token_logprobs_and_beam_indices_rebuild_the_path():
    m = ToyModel(6, seed=21, scale=1.0)
    res = BeamSearch(SearchOptions(3, 6, policy="pool", early_stopping="never")).search(m.step, m.init(), BOS, EOS)
    assert res.stats.model_calls == len(res.stats.rows_per_call) and res.stats.rows_per_call[0] == 1
    for h in res.hypotheses[0]:
        assert len(h.token_logprobs) == len(h.tokens) == len(h.beam_indices)
        for i, tok in enumerate(h.tokens):
            assert h.token_logprobs[i] == pytest.approx(m.logp(tuple(h.tokens[:i]), tok), abs=1e-9)
        assert h.beam_indices[0] == 0 and all(0 <= b < 3 for b in h.beam_indices)


def test_length_penalty_formulas():
    n = np.array([1, 2, 7])
    np.testing.assert_allclose(LengthPenalty.power(0.7).divisor(n), n**0.7)
    np.testing.assert_allclose(LengthPenalty.gnmt(0.6).divisor(n), ((5 + n) / 6) ** 0.6)
    lp = LengthPenalty.shifted(0.5, 3)
    # seed 003 multiplies logP by ((m + 1) / (m + n)) ** alpha
    np.testing.assert_allclose(lp(-2.0, n), -2.0 * ((3 + 1) / (3 + n)) ** 0.5)
    with pytest.raises(ValueError):
        LengthPenalty(1.0, -1.0)


def test_gnmt_length_penalty_in_search_matches_brute_force():
    m = ToyModel(3, seed=5, scale=1.0)
    from tests.toy import all_outputs

    outs = all_outputs(m, EOS, 3)
    want = sorted(((lp / ((5 + len(s)) / 6) ** 0.8, s) for s, lp, _ in outs), key=lambda x: -x[0])
    res = search_batch(m.step, m.init(), BOS, EOS, 27, 3, length_penalty=LengthPenalty.gnmt(0.8))[0]
    assert [h.tokens for h in res] == [s for _, s in want]


def test_coverage_penalty_uses_attention_from_the_step():
    m = ToyModel(4, seed=2, scale=1.0)
    src = 3

    def attn_of(prefix):  # deterministic attention over 3 source words, from the prefix
        rng = np.random.default_rng(len(prefix) * 7 + sum(prefix))
        a = rng.random(src)
        return a / a.sum()

    def step(state, y):
        logits, new = m.step(state, y)
        return logits, new, {"attention": np.stack([attn_of(p) for p in new])}

    beta = 0.4
    res = search_batch(step, m.init(), BOS, EOS, 3, 4, coverage_penalty=CoveragePenalty(beta))[0]
    for h in res:
        acc = sum(attn_of(tuple(h.tokens[:i])) for i in range(len(h.tokens)))
        cp = beta * sum(math.log(min(a, 1.0)) for a in acc)
        assert h.score == pytest.approx(h.logprob / len(h.tokens) + cp, abs=1e-9)
    with pytest.raises(ValueError, match="attention"):
        search_batch(m.step, m.init(), BOS, EOS, 3, 4, coverage_penalty=CoveragePenalty(beta))


def test_final_scorer_reranks():
    m = ToyModel(5, seed=8, scale=1.0)

    def prefer_long(hyps):
        return [len(h.tokens) + h.logprob * 1e-3 for h in hyps]

    res = search_batch(m.step, m.init(), BOS, EOS, 4, 5, final_scorer=prefer_long)[0]
    lengths = [len(h.tokens) for h in res]
    assert lengths == sorted(lengths, reverse=True)


def compete_reference(model: ToyModel, k: int, max_len: int):
    """Finished and new hypotheses compete for k slots by log-probability each step (plain loops)."""
    beam = [((), 0.0, False)]  # (tokens, logprob, finished)
    for _ in range(max_len):
        cands = [(lp, -i, toks, True) for i, (toks, lp, fin) in enumerate(beam) if fin]
        live = [(toks, lp) for toks, lp, fin in beam if not fin]
        if not live:
            break
        for b, (toks, lp) in enumerate(live):
            logp = log_softmax_ref(model.logits(toks))
            cands += [(lp + logp[v], b * model.v + v + 1, toks + (v,), v == EOS) for v in range(model.v)]
        # finished entries (second key <= 0) win ties against new candidates, then lower beam/token
        cands.sort(key=lambda c: (-c[0], c[1] > 0, abs(c[1])))
        beam = [(toks, lp, fin) for lp, _, toks, fin in cands[:k]]
    return beam


@pytest.mark.parametrize("k, eos_bias", [(3, 0.5), (4, 1.5)])
@pytest.mark.parametrize("seed", range(8))
def test_compete_policy_matches_a_reference(seed, k, eos_bias):
    m = ToyModel(5, seed=seed, scale=1.5, eos_bias=eos_bias)
    want = compete_reference(m, k, 6)
    res = search_batch(m.step, m.init(), BOS, EOS, k, 6, policy="compete", length_penalty=1.0)[0]
    assert sorted(tuple(h.tokens) for h in res) == sorted(w[0] for w in want)
    for h in res:
        assert h.finished == (h.tokens[-1] == EOS)
        assert h.key == pytest.approx(m.path_logprob(h.tokens), abs=1e-9)
        assert h.score == pytest.approx(h.key / len(h.tokens), abs=1e-9)


def test_compete_displaces_a_finished_hypothesis():
    # step 1 keeps a (0.65) and eos (0.30); step 2 has two children of a above 0.30: eos is displaced,
    # whereas the narrow policy keeps its slot
    table = {(): np.log([0.30, 0.65, 0.05]), (1,): np.log([1e-4, 0.5, 0.5 - 1e-4])}
    m = ToyModel(3, table=table, scale=0.1)
    compete = search_batch(m.step, m.init(), BOS, EOS, 2, 2, policy="compete", length_penalty=0.0)[0]
    narrow = search_batch(m.step, m.init(), BOS, EOS, 2, 2, policy="narrow", length_penalty=0.0)[0]
    assert [h.tokens for h in compete] == [[1, 1], [1, 2]]
    assert [h.tokens for h in narrow] == [[1, 1], [0]]
    assert [tuple(h.tokens) for h in compete] == [w[0] for w in compete_reference(m, 2, 2)]


def test_rank_candidates_against_a_sort():
    from beamkit.search import rank_candidates

    rng = np.random.default_rng(4)
    n = 60
    req = np.sort(rng.integers(0, 4, n))
    key = rng.integers(-3, 3, n).astype(float)
    key[rng.random(n) < 0.15] = -np.inf
    key[rng.random(n) < 0.05] = np.nan
    row, tok = rng.integers(0, 5, n), rng.integers(0, 9, n)
    valid = rng.random(n) > 0.1
    order, rank = rank_candidates(req, key, row, tok, valid)
    keep = [i for i in range(n) if np.isfinite(key[i]) and valid[i]]
    want = sorted(keep, key=lambda i: (req[i], -key[i], row[i], tok[i]))
    got = [(req[i], key[i], row[i], tok[i]) for i in order]
    assert got == [(req[i], key[i], row[i], tok[i]) for i in want]
    per_req = [sum(1 for j in want[:p] if req[j] == req[want[p]]) for p in range(len(want))]
    assert rank.tolist() == per_req
    order_all, _ = rank_candidates(req, key, row, tok)  # default: every finite key counts
    assert len(order_all) == int(np.isfinite(key).sum())


@pytest.mark.parametrize("seed", range(5))
def test_rank_candidates_of_ordered_rows_against_a_sort(seed):
    """``ordered=True`` (rows as the deterministic selector returns them) gives the full four-key order."""
    from beamkit.search import rank_candidates

    rng = np.random.default_rng(seed)
    rows, m = 12, 6
    row_req = np.sort(rng.integers(0, 4, rows))
    key = rng.integers(-3, 3, (rows, m)).astype(float)  # many ties, within and across rows
    key[rng.random((rows, m)) < 0.1] = -np.inf
    tok = np.stack([rng.permutation(20)[:m] for _ in range(rows)])
    # each row by key descending, equal keys by token ascending (a row-major flat layout, as the engine builds)
    for r in range(rows):
        o = np.lexsort((tok[r], -key[r]))
        key[r], tok[r] = key[r][o], tok[r][o]
    req, row = np.repeat(row_req, m), np.repeat(np.arange(rows), m)
    order, rank = rank_candidates(req, key.reshape(-1), row, tok.reshape(-1), ordered=True)
    flat_key, flat_tok = key.reshape(-1), tok.reshape(-1)
    keep = [i for i in range(rows * m) if np.isfinite(flat_key[i])]
    want = sorted(keep, key=lambda i: (req[i], -flat_key[i], row[i], flat_tok[i]))
    assert order.tolist() == want
    per_req = [sum(1 for j in want[:p] if req[j] == req[want[p]]) for p in range(len(want))]
    assert rank.tolist() == per_req


def test_group_starts():
    from beamkit.search import group_starts

    assert group_starts(np.array([], dtype=np.int64)).tolist() == []
    assert group_starts(np.array([7])).tolist() == [0]
    assert group_starts(np.array([0, 0, 2, 2, 2, 5])).tolist() == [0, 2, 5]


def test_step_return_shape_and_stateless_batches():
    m = ToyModel(3)
    with pytest.raises(TypeError, match="step_fn must return"):
        search_batch(lambda s, y: [m.step(s, y)[0], s], m.init(), BOS, EOS, 2, 3)
    with pytest.raises(TypeError, match="step_fn must return"):
        search_batch(lambda s, y: (m.step(s, y)[0],), m.init(), BOS, EOS, 2, 3)
    # no array leaf in the state: one request per bos id, the step sees one row per live hypothesis
    res = search_batch(lambda s, y: (np.zeros((len(y), 4)), s), None, [1, 2, 3], EOS, 2, 2)
    assert len(res) == 3 and all(len(r) == 2 for r in res)
    one = search_batch(lambda s, y: (np.zeros((len(y), 4)), s), None, 1, EOS, 2, 2)
    assert len(one) == 1
