"""The seed-000 contract: every row of its test table, in our own words, with independent oracles.

Pitfalls of seed 000 section 5 and the tests that kill them:

1. best K tokens of each hypothesis (beam grows)      test_beam_never_holds_more_than_beam_size
2. raw logits added instead of log-probabilities      test_logits_need_not_be_normalized, test_exhaustive_*
3. an eos hypothesis that keeps going                 test_eos_finishes_and_shrinks_the_beam
4. live hypotheses dropped at max_len                 test_max_len_returns_unfinished
5. -inf candidates kept to fill the beam              test_masked_tokens_are_never_chosen
6. state rows not gathered by parent                  test_state_follows_parents_in_a_real_search
   eos left out of the length                         test_hand_example_length_penalty
   results ranked by logprob, not score               test_length_penalty_changes_the_winner
   ties to the highest index                          test_ties_go_to_the_lowest_id
   survivors finalized one step early                 test_max_len_returns_unfinished
   a NamedTuple rebuilt as a tuple                    test_select_state_keeps_the_structure
   lists not searched                                 test_select_state_keeps_the_structure
   greedy scored with length penalty 1                test_hand_example_greedy_commits_to_a
   the model called after every hypothesis finished   test_search_stops_when_the_last_hypothesis_finishes
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest

from beamkit import Hypothesis, beam_search, greedy_decode, search_batch, select_state
from tests.toy import BOS, ToyModel, all_outputs

EOS, A, B = 0, 1, 2
HAND = {(): np.log([0.1, 0.5, 0.4]), (A,): np.log([0.2, 0.1, 0.7]), (B,): np.log([0.9, 0.05, 0.05])}


def hand_model() -> ToyModel:
    return ToyModel(3, table=HAND)


def test_hand_example_beam_beats_greedy():
    m = hand_model()
    res = beam_search(m.step, m.init(), BOS, EOS, beam_size=2, max_len=2, length_penalty=0.0)
    assert [h.tokens for h in res] == [[B, EOS], [A, B]]
    assert [h.finished for h in res] == [True, False]
    assert res[0].logprob == pytest.approx(math.log(0.36), abs=1e-12)
    assert res[1].logprob == pytest.approx(math.log(0.35), abs=1e-12)
    assert m.calls == [1, 2]


def test_hand_example_greedy_commits_to_a():
    m = hand_model()
    h = greedy_decode(m.step, m.init(), BOS, EOS, max_len=2)
    assert isinstance(h, Hypothesis)
    assert h.tokens == [A, B] and not h.finished
    assert h.logprob == pytest.approx(math.log(0.35), abs=1e-12)
    assert h.score == h.logprob  # greedy's score is its logprob, not logprob / 2


def test_hand_example_length_penalty():
    m = hand_model()
    res = beam_search(m.step, m.init(), BOS, EOS, beam_size=2, max_len=2, length_penalty=1.0)
    assert [h.tokens for h in res] == [[B, EOS], [A, B]]
    assert res[0].score == pytest.approx(math.log(0.36) / 2, abs=1e-12)
    assert res[1].score == pytest.approx(math.log(0.35) / 2, abs=1e-12)


def own_greedy(m: ToyModel, eos: int, max_len: int) -> tuple[list[int], float]:
    seq: list[int] = []
    total = 0.0
    while len(seq) < max_len:
        lp = [m.logp(tuple(seq), v) for v in range(m.v)]
        t = max(range(m.v), key=lambda v: (lp[v], -v))
        seq.append(t)
        total += lp[t]
        if t == eos:
            break
    return seq, total


@pytest.mark.parametrize("seed", range(6))
def test_beam_one_is_greedy(seed):
    m = ToyModel(5, seed=seed)
    want, lp = own_greedy(m, EOS, 6)
    h = beam_search(m.step, m.init(), BOS, EOS, beam_size=1, max_len=6)[0]
    assert h.tokens == want and h.logprob == pytest.approx(lp, abs=1e-9)
    g = greedy_decode(m.step, m.init(), BOS, EOS, max_len=6)
    assert g.tokens == want and g.score == pytest.approx(lp, abs=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exhaustive_beam_equals_brute_force(alpha, seed):
    m = ToyModel(3, seed=seed, scale=1.0)
    outs = all_outputs(m, EOS, 4)
    assert len(outs) == 31
    want = sorted(((lp / len(s) ** alpha, s, f) for s, lp, f in outs), key=lambda x: -x[0])
    res = beam_search(m.step, m.init(), BOS, EOS, beam_size=81, max_len=4, length_penalty=alpha)
    assert len(res) == 31
    assert [h.tokens for h in res] == [s for _, s, _ in want]
    assert [h.finished for h in res] == [f for _, _, f in want]
    np.testing.assert_allclose([h.score for h in res], [sc for sc, _, _ in want], atol=1e-9)


@pytest.mark.parametrize("min_len", [0, 2])
@pytest.mark.parametrize("policy", ["narrow", "pool", "compete"])
@pytest.mark.parametrize("seed", [0, 1])
def test_several_eos_ids_equal_brute_force(seed, policy, min_len):
    """eos=(0, 2): either id finishes; min_len masks both. Exhaustive beam == brute force, in every policy."""
    m = ToyModel(4, seed=seed, scale=1.0)
    outs = [(s, lp, f) for s, lp, f in all_outputs(m, (0, 2), 3) if not f or len(s) > min_len]
    assert len(outs) == (22 if min_len == 0 else 16)
    want = sorted(((lp / len(s), s, f) for s, lp, f in outs), key=lambda x: -x[0])
    res = search_batch(m.step, m.init(), BOS, (0, 2), 64, 3, policy=policy, min_len=min_len)[0]
    assert [h.tokens for h in res] == [s for _, s, _ in want]
    assert [h.finished for h in res] == [f for _, _, f in want]
    np.testing.assert_allclose([h.score for h in res], [sc for sc, _, _ in want], atol=1e-9)


def test_eos_forms():
    m = ToyModel(3, seed=2)
    none = beam_search(m.step, m.init(), BOS, [], 2, 3)  # no stop token: everything runs to max_len
    assert all(not h.finished and len(h.tokens) == 3 for h in none)
    assert [h.tokens for h in beam_search(m.step, m.init(), BOS, (EOS, EOS), 2, 3)] == [
        h.tokens for h in beam_search(m.step, m.init(), BOS, EOS, 2, 3)
    ]
    with pytest.raises(ValueError, match="eos"):
        beam_search(m.step, m.init(), BOS, [EOS, 7], 2, 3)
    with pytest.raises(TypeError, match="eos"):
        beam_search(m.step, m.init(), BOS, "0", 2, 3)
    with pytest.raises(TypeError, match="eos"):
        beam_search(m.step, m.init(), BOS, [[EOS]], 2, 3)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_small_beam_is_a_prefix_of_the_exhaustive_ranking_at_step_one(k):
    m = ToyModel(6, seed=3)
    first = sorted(range(6), key=lambda v: (-m.logp((), v), v))[:k]
    res = beam_search(m.step, m.init(), BOS, EOS, beam_size=k, max_len=1, length_penalty=0.0)
    assert [h.tokens[0] for h in res] == first


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_beam_never_holds_more_than_beam_size(k):
    m = ToyModel(5, seed=7, scale=0.5)
    beam_search(m.step, m.init(), BOS, EOS, beam_size=k, max_len=6)
    assert max(m.calls) <= k
    assert m.calls[0] == 1


def test_eos_finishes_and_shrinks_the_beam():
    m = ToyModel(4, seed=11, scale=1.0)
    res = beam_search(m.step, m.init(), BOS, EOS, beam_size=4, max_len=6)
    for h in res:
        assert EOS not in h.tokens[:-1]  # eos only last
        assert h.finished == (h.tokens[-1] == EOS)
        assert h.logprob == pytest.approx(m.path_logprob(h.tokens), abs=1e-9)
    # the beam never grows back: rows per call never exceed beam_size - finished so far
    assert all(b <= a for a, b in zip(m.calls[1:], m.calls[2:], strict=False)) or max(m.calls) <= 4
    finished_by_step = sorted(len(h.tokens) for h in res if h.finished)
    for step, rows in enumerate(m.calls[1:], start=1):
        assert rows <= 4 - sum(1 for n in finished_by_step if n <= step)


def test_search_stops_when_the_last_hypothesis_finishes():
    table = {(): [0.0, 1.0, 1.0], (1,): [50.0, -50.0, -50.0], (2,): [50.0, -50.0, -50.0]}
    m = ToyModel(3, table=table)
    res = beam_search(m.step, m.init(), BOS, EOS, beam_size=2, max_len=10)
    assert m.calls == [1, 2]
    assert all(h.finished for h in res) and len(res) == 2


def test_max_len_returns_unfinished():
    m = ToyModel(4, seed=5)
    never_eos = lambda s, y: (lambda lg, st: (np.where(np.arange(4) == EOS, -np.inf, lg), st))(*m.step(s, y))  # noqa: E731
    res = beam_search(never_eos, m.init(), BOS, EOS, beam_size=3, max_len=4)
    assert len(res) == 3
    assert all(not h.finished and len(h.tokens) == 4 for h in res)


def test_length_penalty_changes_the_winner():
    # a eos: 0.5 * 0.7 = 0.35 (short); b b b eos: 0.45 * 0.9^3 = 0.328, but a far better mean per token
    table = {
        (): np.log([0.05, 0.5, 0.45]),
        (1,): np.log([0.7, 0.15, 0.15]),
        (2,): np.log([0.05, 0.05, 0.9]),
        (2, 2): np.log([0.05, 0.05, 0.9]),
        (2, 2, 2): np.log([0.9, 0.05, 0.05]),
    }
    m = ToyModel(3, table=table, scale=0.1)
    r0 = beam_search(m.step, m.init(), BOS, EOS, beam_size=3, max_len=4, length_penalty=0.0)
    r1 = beam_search(m.step, m.init(), BOS, EOS, beam_size=3, max_len=4, length_penalty=1.0)
    assert r0[0].tokens == [A, EOS]
    assert r1[0].tokens == [B, B, B, EOS]
    for res, a in ((r0, 0.0), (r1, 1.0)):
        want = [h.logprob / len(h.tokens) ** a for h in res]
        assert want == sorted(want, reverse=True)


def test_ties_go_to_the_lowest_id():
    m = ToyModel(5, table={(): np.zeros(5)}, scale=0.0)
    res = beam_search(m.step, m.init(), BOS, 4, beam_size=2, max_len=1, length_penalty=0.0)
    assert [h.tokens for h in res] == [[0], [1]]
    g = greedy_decode(m.step, m.init(), BOS, 4, max_len=3)
    assert g.tokens == [0, 0, 0]
    # ties across beams go to the lower beam: two equal parents, equal children
    table = {(): [0.0, 0.0, -9.0], (0,): [0.0, 0.0, -9.0], (1,): [0.0, 0.0, -9.0]}
    m2 = ToyModel(3, table=table)
    res2 = beam_search(m2.step, m2.init(), BOS, 2, beam_size=2, max_len=2, length_penalty=0.0)
    assert [h.tokens for h in res2] == [[0, 0], [0, 1]]


@pytest.mark.parametrize("seed", range(3))
def test_logits_need_not_be_normalized(seed):
    m = ToyModel(4, seed=seed)
    rng = np.random.default_rng(seed)

    def shifted(s, y):
        lg, st = m.step(s, y)
        return lg * 1.0 + rng.normal(0, 50, size=(lg.shape[0], 1)), st

    base = beam_search(m.step, m.init(), BOS, EOS, beam_size=3, max_len=4)
    moved = beam_search(shifted, m.init(), BOS, EOS, beam_size=3, max_len=4)
    assert [h.tokens for h in base] == [h.tokens for h in moved]
    np.testing.assert_allclose([h.score for h in base], [h.score for h in moved], atol=1e-9)
    for h in base:
        assert h.logprob == pytest.approx(m.path_logprob(h.tokens), abs=1e-9)


def test_masked_tokens_are_never_chosen():
    banned = {1, 3}
    m = ToyModel(5, seed=2)

    def masked(s, y):
        lg, st = m.step(s, y)
        lg[:, sorted(banned)] = -np.inf
        return lg, st

    # beam wider than the finite candidates: the beam is not filled with -inf candidates
    res = beam_search(masked, m.init(), BOS, EOS, beam_size=10, max_len=2)
    assert res and all(not banned & set(h.tokens) for h in res)
    assert all(np.isfinite(h.logprob) for h in res)
    assert len(res) == 1 + 2 * 3  # eos, or one of {2, 4} then any of {0, 2, 4}


def test_logprob_is_the_sum_along_the_path():
    m = ToyModel(6, seed=9)
    for alpha in (0.0, 0.5, 1.0):
        for h in beam_search(m.step, m.init(), BOS, EOS, beam_size=4, max_len=5, length_penalty=alpha):
            lp = m.path_logprob(h.tokens)
            assert h.logprob == pytest.approx(lp, abs=1e-9)
            assert h.score == pytest.approx(lp / len(h.tokens) ** alpha, abs=1e-9)
            assert sum(h.token_logprobs) == pytest.approx(lp, abs=1e-9)


class Dec(NamedTuple):
    h: np.ndarray
    c: np.ndarray


def test_select_state_keeps_the_structure():
    h = np.arange(6).reshape(3, 2)
    state = {"dec": Dec(h, h * 10), "layers": [h + 1, (h + 2, "tag")], "step": 7, "name": "x"}
    idx = np.array([2, 2, 0])
    out = select_state(state, idx)
    assert isinstance(out["dec"], Dec)
    np.testing.assert_array_equal(out["dec"].h, h[[2, 2, 0]])
    np.testing.assert_array_equal(out["dec"].c, (h * 10)[[2, 2, 0]])
    assert isinstance(out["layers"], list) and len(out["layers"]) == 2
    np.testing.assert_array_equal(out["layers"][0], (h + 1)[[2, 2, 0]])
    assert out["layers"][1][1] == "tag"
    np.testing.assert_array_equal(out["layers"][1][0], (h + 2)[[2, 2, 0]])
    assert out["step"] == 7 and out["name"] == "x"
    scalar = np.float64(3.0)
    assert select_state((scalar,), idx)[0] == scalar  # 0-d: not gathered
    with pytest.raises(TypeError):
        select_state({"s": {1, 2}}, idx)


def test_state_follows_parents_in_a_real_search():
    m = ToyModel(5, seed=4, scale=1.0)
    res = beam_search(m.step, m.init(), BOS, EOS, beam_size=3, max_len=5)
    # the model was asked to score exactly prefixes of kept hypotheses; every output's prefixes were scored
    seen = set(m.seen)
    for h in res:
        for i in range(len(h.tokens)):
            assert tuple(h.tokens[:i]) in seen
    # and each prefix seen at step t extends a prefix seen at step t-1
    for p in seen:
        assert p == () or p[:-1] in seen


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beam_size=0, max_len=3), "beam_size"),
        (dict(beam_size=2, max_len=0), "max_len"),
    ],
)
def test_validation_sizes(kwargs, match):
    m = ToyModel(3)
    with pytest.raises(ValueError, match=match):
        beam_search(m.step, m.init(), BOS, EOS, **kwargs)


def test_validation_logits_shape_and_values():
    m = ToyModel(3)
    with pytest.raises(ValueError, match="shape"):
        beam_search(lambda s, y: (np.zeros((2, 3)), s), m.init(), BOS, EOS, 2, 3)
    with pytest.raises(ValueError, match="shape"):
        beam_search(lambda s, y: (np.zeros(3), s), m.init(), BOS, EOS, 2, 3)
    for policy in ("narrow", "pool", "compete"):
        with pytest.raises(ValueError, match="no finite candidate"):
            beam_search(lambda s, y: (np.full((len(s), 3), -np.inf), s), m.init(), BOS, EOS, 2, 3, policy=policy)
    with pytest.raises(ValueError, match="NaN"):
        beam_search(lambda s, y: (np.full((len(s), 3), np.nan), s), m.init(), BOS, EOS, 2, 3)
    with pytest.raises(TypeError):
        beam_search(lambda s, y: ([[0.0, 1.0]], s), m.init(), BOS, EOS, 2, 3)


def test_validation_options_and_ids():
    m = ToyModel(3)
    with pytest.raises(ValueError, match="eos"):
        beam_search(m.step, m.init(), BOS, 7, 2, 3)
    with pytest.raises(ValueError, match="eos"):
        beam_search(m.step, m.init(), BOS, -1, 2, 3)
    with pytest.raises(ValueError, match="early_stopping"):
        beam_search(m.step, m.init(), BOS, EOS, 2, 3, policy="pool", early_stopping=1)
    with pytest.raises(ValueError, match="min_len"):
        beam_search(m.step, m.init(), BOS, EOS, 2, 3, min_len=1.5)
    with pytest.raises(ValueError, match="patience"):
        beam_search(m.step, m.init(), BOS, EOS, 2, 3, patience="2")
    with pytest.raises(TypeError, match="bos"):
        beam_search(m.step, m.init(), 1.7, EOS, 2, 3)
