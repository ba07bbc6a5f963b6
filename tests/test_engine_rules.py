"""The engine's rules at their edges, each against hand-worked numbers or a brute force.

Ties between a finished hypothesis and a new candidate, the pool's stopping rules at the step they fire (counted in
model calls), patience under the narrow policy, the streaming ``best`` under a selector whose key is not the
log-probability, and the messages of the errors the search core raises.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import pytest

from beamkit import BeamSearch, Engine, RequestOptions, concat_state, search_batch, select_state
from beamkit.processors import StepContext
from beamkit.search import make_options
from tests.toy import BOS, ToyModel, all_outputs, log_softmax_ref, prefix_logits

EOS = 0
NEG = -np.inf


class Table:
    """Logits by prefix (``default`` for prefixes not in ``table``); ``raw``: the logits are the step scores
    themselves (``extras={"log_softmax": False}``), so sums of small integers tie exactly."""

    def __init__(self, table: dict, default: list[float], raw: bool = False):
        self.table, self.default, self.raw = table, default, raw
        self.calls: list[int] = []
        self.y_kinds: list[str] = []

    def init(self) -> np.ndarray:
        state = np.empty(1, dtype=object)
        state[0] = ()
        return state

    def step(self, state, y_prev):
        y = np.asarray(y_prev)
        self.y_kinds.append(y.dtype.kind)
        new = np.empty(len(state), dtype=object)
        for i, (p, t) in enumerate(zip(state, y.tolist(), strict=True)):
            new[i] = p if t == BOS else p + (t,)
        self.calls.append(len(state))
        logits = np.array([self.table.get(p, self.default) for p in new], dtype=np.float64)
        return (logits, new, {"log_softmax": False}) if self.raw else (logits, new)


def logs(*probs: float, v: int) -> list[float]:
    """Log-probabilities ``probs`` padded with -inf (probability 0) to ``v`` tokens."""
    out = [math.log(p) if p > 0 else NEG for p in probs]
    return out + [NEG] * (v - len(out))


def test_compete_finished_hypotheses_win_key_ties():
    # raw scores: step 1 keeps eos (-1, finished) and token 1 (-2); step 2 offers (1, 1) and (1, 2), both at
    # -2 + 1 = -1, tied with the finished eos. Two slots: the finished one wins the tie, then (1, 1) (lower token).
    m = Table({(): [-1.0, -2.0, -5.0], (1,): [NEG, 1.0, 1.0]}, [NEG, 0.0, 0.0], raw=True)
    res = search_batch(m.step, m.init(), BOS, EOS, 2, 2, policy="compete", length_penalty=0.0)[0]
    assert [h.tokens for h in res] == [[EOS], [1, 1]]
    assert [h.finished for h in res] == [True, False]
    assert [h.logprob for h in res] == [-1.0, -1.0]
    assert m.calls == [1, 1]


def pool_stop_model() -> Table:
    # V = 9, eos = 0. Probabilities of the prefixes the search visits; any other prefix: 1/8 on each of 1..8.
    v = 9
    table = {
        (): logs(0.3, 0.5, 0.2, v=v),
        (1,): logs(0.6, 0.4, v=v),
        (2,): logs(0.0, 0.5, 0.5, v=v),
        (1, 1): logs(0.0, 0.3, *[0.1] * 7, v=v),
    }
    return Table(table, logs(0.0, *[1 / 8] * 8, v=v))


def test_pool_heuristic_stops_at_the_first_step_its_bound_fails():
    # pool policy, beam 2 (pool of 2), length penalty 1, early_stopping=False (stop once the best running beam,
    # scored at the current length, cannot beat the pool's worst). Worked by hand:
    # step 1: [1] -0.693, [0] -1.204 (eos, pool), [2] -1.609                     pool not full
    # step 2: [1 0] -1.204 (eos, pool: full, worst ln .3 = -1.204), [1 1] -1.609: -1.609 / 2 = -0.805 > worst
    # step 3: no eos at all. [1 1 1] -2.813: / 3 = -0.938 > worst (the second, [1 1 2], would be -1.304)
    # step 4: no eos at all. [1 1 1 x] -4.892: / 4 = -1.223 <= worst: stop after 4 calls (max_len is 6)
    m = pool_stop_model()
    res = search_batch(m.step, m.init(), BOS, EOS, 2, 6, policy="pool", early_stopping=False, length_penalty=1.0)[0]
    assert [h.tokens for h in res] == [[1, EOS], [EOS]]
    np.testing.assert_allclose([h.logprob for h in res], [math.log(0.5 * 0.6), math.log(0.3)], rtol=1e-12)
    np.testing.assert_allclose([h.score for h in res], [math.log(0.5 * 0.6) / 2, math.log(0.3)], rtol=1e-12)
    assert m.calls == [1, 2, 2, 2]


def test_pool_heuristic_stops_when_the_bound_ties_the_worst():
    # raw scores, beam 1 (pool of 1), alpha 0: eos and token 1 both score -1 at step 1; eos (lower id) fills the
    # pool, and the running beam can at best tie it: the search stops after one call
    m = Table({(): [-1.0, -1.0, -3.0]}, [-1.0, -1.0, -1.0], raw=True)
    res = search_batch(m.step, m.init(), BOS, EOS, 1, 3, policy="pool", length_penalty=0.0)[0]
    assert [(h.tokens, h.logprob, h.finished) for h in res] == [([EOS], -1.0, True)]
    assert m.calls == [1]


def test_exact_exit_fires_when_the_nth_finished_ties_the_best_running():
    # raw scores, beam 2 (pool of 2, not full after step 1), num_return 1: eos at -1 is the 1st best finished and
    # the best running beam is at -1 too; with raw log-probabilities <= 0 nothing can overtake it: stop
    m = Table({(): [-1.0, -1.0, -3.0]}, [-1.0, -1.0, -1.0], raw=True)
    kw = dict(policy="pool", length_penalty=0.0, exact_exit=True, num_return=1)
    res = search_batch(m.step, m.init(), BOS, EOS, 2, 3, **kw)[0]
    assert [(h.tokens, h.logprob) for h in res] == [([EOS], -1.0)]
    assert m.calls == [1]
    plain = Table({(): [-1.0, -1.0, -3.0]}, [-1.0, -1.0, -1.0], raw=True)
    kw["exact_exit"] = False
    assert [h.tokens for h in search_batch(plain.step, plain.init(), BOS, EOS, 2, 3, **kw)[0]] == [[EOS]]
    assert len(plain.calls) > 1  # without the exit the pool is not full yet


@pytest.mark.parametrize("seed", [0, 1])
def test_narrow_policy_returns_every_finished_hypothesis_whatever_the_patience(seed):
    # patience sizes the pool of the pool policy only: an exhaustive narrow beam still returns all 15 outputs
    m = ToyModel(3, seed=seed, scale=1.0)
    outs = all_outputs(m, EOS, 3)
    assert len(outs) == 15
    want = sorted(((lp / len(s), s, f) for s, lp, f in outs), key=lambda x: -x[0])
    res = search_batch(m.step, m.init(), BOS, EOS, 27, 3, patience=0.1)[0]  # a pool of 3, were it the pool policy
    assert [h.tokens for h in res] == [s for _, s, _ in want]
    assert [h.finished for h in res] == [f for _, _, f in want]
    np.testing.assert_allclose([h.score for h in res], [sc for sc, _, _ in want], atol=1e-9)


class Nudged:
    """A selector whose key is not the log-probability: each token's fixed bonus is added to the key only, so rows
    come in another order than their log-probabilities."""

    BONUS = np.array([0.0, 1.3, -0.4, 0.9, -1.1, 0.2])

    def candidates(self, scores, offset, parent_key, m, ctx: StepContext):
        logp = np.asarray(scores, dtype=np.float64) + offset[:, None]  # shape: (rows, V)
        key = parent_key[:, None] + logp + self.BONUS[: logp.shape[1]]
        tok = np.argsort(-key, axis=1, kind="stable")[:, :m]
        return np.take_along_axis(logp, tok, 1), tok, np.take_along_axis(key, tok, 1)


def _fields(h):
    return (h.tokens, h.finished, h.token_logprobs, h.beam_indices)


def test_best_so_far_under_a_selector_keyed_otherwise_with_a_longer_request_running():
    # the oracle: the same request decoded alone with max_len = t returns, best first, what the engine holds after
    # t steps (narrow policy: the pool, and the live rows returned unfinished and scored at length t)
    from tests.test_engine import Seeded

    shared = dict(selector=Nudged(), length_penalty=1.0)
    engine = Engine(Seeded(6).step, beam_size=3, max_len=6, **shared)
    long = engine.add(Seeded.init(5), BOS, EOS, min_len=6)  # runs every step, so its history is the widest
    engine.step()
    engine.step()
    r = engine.add(Seeded.init(12), BOS, EOS)
    t, checked = 0, 0
    while engine.running == 2:
        engine.step()
        t += 1
        got = engine.best(r)
        if got is None:
            break
        want = search_batch(Seeded(6).step, Seeded.init(12), BOS, EOS, 3, t, **shared)[0][0]
        assert _fields(got) == _fields(want)
        assert got.logprob == pytest.approx(want.logprob) and got.score == pytest.approx(want.score)
        assert got.key == pytest.approx(want.key)
        checked += 1
    assert checked >= 3 and engine.best(long) is None  # both ran to the end


def test_step_function_gets_int64_tokens_after_a_failed_call():
    # a failed call empties the engine; the next request's first call still gets integer y_prev of one row
    m = Table({}, [0.0, 1.0, 2.0])
    fail = {"at": 2}
    seen: list[tuple[int, tuple]] = []

    def history(scores, ctx: StepContext):
        seen.append((ctx.step, ctx.tokens.shape))
        return scores

    def step(state, y):
        fail["at"] -= 1
        if fail["at"] == 0:
            raise RuntimeError("lost")
        return m.step(state, y)

    engine = Engine(step, beam_size=2, max_len=3, processors=[history])
    a = engine.add(m.init(), BOS, EOS)
    engine.step()
    assert [(c.request_id, c.error) for c in engine.step()] == [(a, "RuntimeError: lost")]
    seen.clear()
    b = engine.add(m.init(), BOS, EOS)
    out = []
    while not engine.idle:
        out += engine.step()
    assert [(c.request_id, c.error) for c in out] == [(b, None)]
    assert set(m.y_kinds) == {"i"} and m.calls[1:] == [1, 2, 2]
    assert seen == [(0, (1, 0)), (1, (2, 1)), (2, (2, 2))]  # the new request's own history, no padding


def test_requests_with_other_length_penalties_in_one_call():
    # every call holds rows of the three requests: each is scored with its own penalty (oracle: each alone)
    from tests.test_engine import Seeded, _same

    lps = [0.0, 1.0, 2.0]
    engine = Engine(Seeded(5).step, beam_size=3, max_len=5)
    ids = [engine.add(Seeded.init(s), BOS, EOS, length_penalty=a) for s, a in zip((3, 4, 6), lps, strict=True)]
    done = {}
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    for r, s, a in zip(ids, (3, 4, 6), lps, strict=True):
        _same(done[r].hypotheses, search_batch(Seeded(5).step, Seeded.init(s), BOS, EOS, 3, 5, length_penalty=a)[0])
        for h in done[r].hypotheses:
            assert h.score == pytest.approx(h.logprob / len(h.tokens) ** a)


class Pair(NamedTuple):
    h: np.ndarray
    c: list


def test_concat_state_keeps_named_tuples_and_names_its_error():
    got = concat_state([Pair(np.zeros(1), [np.ones(1)]), Pair(np.ones(2), [np.zeros(2)])])
    assert type(got) is Pair
    assert got.h.tolist() == [0, 1, 1] and got.c[0].tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match=r"^concat_state needs at least one state$"):
        concat_state([])


def test_select_state_refuses_sets_by_name():
    with pytest.raises(TypeError, match=r"^select_state: a set has no order, so its rows cannot be gathered; use a"):
        select_state({np.zeros(2).tobytes()}, np.array([0]))


def test_final_scorer_must_return_one_score_per_hypothesis():
    m = ToyModel(4, seed=1)
    with pytest.raises(ValueError, match=r"^final_scorer must return one score per hypothesis$"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, final_scorer=lambda hyps: [0.0])


def test_make_options_takes_a_list_of_processors():
    from beamkit import NoRepeatNGram

    p = NoRepeatNGram(2)
    assert make_options(2, 3, processors=[p]).processors == (p,)  # a tuple: the options stay hashable


def test_search_result_traces_only_when_asked():
    # the hand example of the contract: beam 2, max_len 2 returns [B, eos] then [A, B] after two calls
    from tests.test_contract import A, B, hand_model

    m = hand_model()
    traced = BeamSearch(make_options(2, 2, length_penalty=0.0, record_trace=True)).search(m.step, m.init(), BOS, EOS)
    assert traced.trace is not None and len(traced.trace) == 1
    trace = traced.trace[0]
    assert [trace.tokens(n) for n in trace.result] == [[B, EOS], [A, B]]
    assert len(trace.steps) == 2
    plain = BeamSearch(make_options(2, 2, length_penalty=0.0)).search(m.step, m.init(), BOS, EOS)
    assert plain.trace is None
    assert [h.tokens for h in plain.hypotheses[0]] == [[B, EOS], [A, B]]


class ByTokenId:
    """An ordered selector whose key ignores the scores: the first m token ids of each row, lowest id first."""

    ordered = True

    def candidates(self, scores, offset, parent_key, m, ctx: StepContext):
        logp = np.asarray(scores, dtype=np.float64) + offset[:, None]  # shape: (rows, V)
        tok = np.tile(np.arange(m), (logp.shape[0], 1))
        return logp[:, :m], tok, parent_key[:, None] - tok


def test_a_masked_token_is_never_chosen_even_when_its_key_is_finite():
    # min_len 2 masks eos (id 0) at the first two steps; the selector still ranks it first by key, so only the
    # engine's own check of the log-probability keeps it out
    m = ToyModel(4, seed=3)
    res = search_batch(m.step, m.init(), BOS, EOS, 2, 3, min_len=2, selector=ByTokenId())[0]
    assert res and all(np.isfinite(h.logprob) for h in res)
    assert all(EOS not in h.tokens[:2] for h in res)
    assert sorted(h.tokens for h in res) == [[1, 1, 0], [1, 1, 1]]  # ids 1 then 0/1 by key, eos allowed at step 3


class Faulty:
    """Rows are (request seed, prefix). Seed 1: NaN logits once its prefix has one token; seed 2: one +inf logit
    at that same step; seed 3: every logit -inf at the first step; other seeds: a plain prefix-dependent table."""

    v = 5

    def step(self, state, y_prev):
        new = np.empty(len(state), dtype=object)
        for i, ((s, p), t) in enumerate(zip(state, np.asarray(y_prev).tolist(), strict=True)):
            new[i] = (s, p if t == BOS else p + (t,))
        logits = np.stack([ToyModel(self.v, seed=s, scale=1.0).logits(p) for s, p in new])
        for i, (s, p) in enumerate(new):
            if s == 1 and len(p) == 1:
                logits[i] = np.nan
            elif s == 2 and len(p) == 1:
                logits[i, 2] = np.inf
            elif s == 3:
                logits[i] = -np.inf
        return logits, new

    @staticmethod
    def init(seed: int) -> np.ndarray:
        state = np.empty(1, dtype=object)
        state[0] = (seed, ())
        return state


def test_each_failure_completes_its_request_alone_with_its_message():
    engine = Engine(Faulty().step, beam_size=2, max_len=3)
    plan = {1: EOS, 2: EOS, 3: EOS, 4: EOS, 5: 5}  # seed -> eos (5 is just outside the vocabulary of 5)
    ids = {engine.add(Faulty.init(s), BOS, eos, min_len=1 if s == 5 else 0): s for s, eos in plan.items()}
    done = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the failures are reported, not warned about by numpy
        while not engine.idle:
            done.update((ids[c.request_id], c) for c in engine.step())
    assert {s: c.error for s, c in done.items()} == {
        1: "step_fn returned NaN logits at step 1",
        2: "step_fn returned +inf logits at step 1",  # in the same call as seed 1's NaN rows
        3: "no finite candidate at step 0 (every continuation is masked or -inf)",
        4: None,
        5: "eos=[5] is not a token id of the model's vocabulary of 5",  # min_len 1 masks it: no index error
    }
    assert all(c.hypotheses == [] for s, c in done.items() if s != 4)
    assert {s: c.steps for s, c in done.items() if s != 4} == {1: 2, 2: 2, 3: 1, 5: 1}  # each ends at its failure
    toy = ToyModel(5, seed=4, scale=1.0)
    alone = search_batch(lambda st, y: Faulty().step(st, y), Faulty.init(4), BOS, EOS, 2, 3)[0]
    assert [h.tokens for h in done[4].hypotheses] == [h.tokens for h in alone]
    np.testing.assert_allclose([h.logprob for h in done[4].hypotheses], [toy.path_logprob(h.tokens) for h in alone])


def test_threshold_keeps_a_candidate_exactly_at_the_threshold():
    # raw scores, every prefix [-5, -1, -2, -3], beam 3, beam_threshold 1, two steps, worked by hand:
    # step 1: [1] -1, [2] -2 (exactly 1 below: kept), [3] -3 pruned                                   pruned 1
    # step 2: [1 1] -2, [1 2] -3 and [2 1] -3 (exactly 1 below: kept), [1 3] -4, [2 2] -4, [2 3] -5   pruned 3
    m = Table({}, [-5.0, -1.0, -2.0, -3.0], raw=True)
    engine = Engine(m.step, beam_size=3, max_len=2, beam_threshold=1.0, length_penalty=0.0)
    engine.add(m.init(), BOS, EOS)
    out = []
    while not engine.idle:
        out += engine.step()
    assert [(h.tokens, h.logprob) for h in out[0].hypotheses] == [([1, 1], -2.0), ([1, 2], -3.0), ([2, 1], -3.0)]
    assert engine.stats.pruned == 4
    plain = Engine(m.step, beam_size=3, max_len=1, length_penalty=0.0)
    plain.add(m.init(), BOS, EOS)
    assert len(plain.step()[0].hypotheses) == 3 and plain.stats.pruned == 0


def test_threshold_prunes_each_request_against_its_own_best():
    # two requests in the same calls whose best keys differ by more than the threshold: each request is pruned
    # against its own best, so each keeps what it keeps alone
    from tests.test_engine import Seeded, _same

    kw = dict(beam_size=4, max_len=4, beam_threshold=1.0, policy="pool")
    engine = Engine(Seeded(6, scale=3.0).step, **kw)
    ids = [engine.add(Seeded.init(s), BOS, EOS) for s in (0, 7)]
    done = {}
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    for r, s in zip(ids, (0, 7), strict=True):
        _same(done[r].hypotheses, search_batch(Seeded(6, scale=3.0).step, Seeded.init(s), BOS, EOS, **kw)[0])
    assert engine.stats.pruned > 0


def test_token_tables_shrink_to_the_longest_running_history():
    # memory: once the long request leaves, the rows' history tables are as wide as the short one's history
    from tests.test_engine import Seeded

    engine = Engine(Seeded(5).step, beam_size=2, max_len=6)
    engine.add(Seeded.init(1), BOS, EOS, min_len=6)  # runs all 6 steps
    for _ in range(3):
        engine.step()
    short = engine.add(Seeded.init(2), BOS, EOS, min_len=5, max_len=5)  # joins at step 3, 5 steps
    widths = []
    while not engine.idle:
        engine.step()
        if engine.running:
            widths.append(engine._rows.tokens.shape[1])
    assert widths == [4, 5, 3, 4]  # the long one's 4 and 5 tokens, then the short one's 3 and 4 alone
    assert engine.best(short) is None


def test_pool_rows_keep_only_their_own_2k_candidates_beside_a_wider_beam():
    # request A: beam 2 (2k = 4 candidates per row), eos = {0, 1, 2, 3}, patience 2 (a pool of 4). Its first row's
    # four best tokens are all stop tokens: two enter the pool, nothing runs on, A ends after one call with
    # [0] and [1]. Beside request B (beam 4: 8 candidates per row) in the same calls, A must still see only 4.
    logits = [4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0]
    m = Table({}, logits)
    engine = Engine(m.step, max_len=3, policy="pool", length_penalty=0.0)
    a = engine.add(m.init(), BOS, (0, 1, 2, 3), beam_size=2, patience=2.0)
    b = engine.add(m.init(), BOS, EOS, beam_size=4)
    done = {}
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    lp = [x - math.log(sum(math.exp(y) for y in logits)) for x in logits]  # plain-Python log-softmax
    assert [(h.tokens, h.finished) for h in done[a].hypotheses] == [([0], True), ([1], True)]
    np.testing.assert_allclose([h.logprob for h in done[a].hypotheses], lp[:2], rtol=1e-12)
    assert done[a].steps == 1 and done[b].steps > 1


def test_a_failing_final_scorer_fails_its_call_and_the_engine_goes_on():
    # the scorer runs when a request completes, inside the step: the error completes the call's requests
    m = ToyModel(4, seed=2)
    calls = {"n": 0}

    def scorer(hyps):
        calls["n"] += 1
        return [0.0] * len(hyps) if calls["n"] > 1 else [0.0]

    engine = Engine(m.step, beam_size=2, max_len=2, final_scorer=scorer)
    a = engine.add(m.init(), BOS, EOS)
    out = []
    while not engine.idle:
        out += engine.step()
    assert [(c.request_id, c.error, c.hypotheses) for c in out] == [
        (a, "ValueError: final_scorer must return one score per hypothesis", [])
    ]
    b = engine.add(m.init(), BOS, EOS)
    while not engine.idle:
        out += engine.step()
    assert out[-1].request_id == b and out[-1].error is None
    alone = search_batch(m.step, m.init(), BOS, EOS, 2, 2)[0]  # equal scores keep the order: same ranking
    assert [h.tokens for h in out[-1].hypotheses] == [h.tokens for h in alone]


def _opts(**kw):
    from beamkit import LengthPenalty, SearchOptions

    kw.setdefault("beam_size", 2)
    kw.setdefault("max_len", 3)
    if "alpha" in kw:
        kw["length_penalty"] = LengthPenalty(kw.pop("alpha"))
    return SearchOptions(**kw)


BIG = 2**31


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(beam_size=0), "beam_size must be an integer between 1 and 2**31 - 1, got 0"),
        (dict(beam_size=BIG), f"beam_size must be an integer between 1 and 2**31 - 1, got {BIG}"),
        (dict(beam_size=True), "beam_size must be an integer between 1 and 2**31 - 1, got True"),
        (dict(beam_size=2.0), "beam_size must be an integer between 1 and 2**31 - 1, got 2.0"),
        (dict(max_len=0), "max_len must be an integer between 1 and 2**31 - 1, got 0"),
        (dict(max_len=BIG), f"max_len must be an integer between 1 and 2**31 - 1, got {BIG}"),
        (dict(policy="wide"), "policy must be 'narrow', 'pool' or 'compete', got 'wide'"),
        (dict(early_stopping=1), "early_stopping must be True, False or 'never', got 1"),
        (dict(early_stopping="always"), "early_stopping must be True, False or 'never', got 'always'"),
        (dict(patience=0), "patience must be > 0, got 0"),
        (dict(patience=True), "patience must be > 0, got True"),
        (dict(patience="2"), "patience must be > 0, got 2"),
        (dict(num_return=0), "num_return must be between 1 and beam_size=2, got 0"),
        (dict(num_return=3), "num_return must be between 1 and beam_size=2, got 3"),
        (dict(min_len=-1), "min_len must be >= 0, got -1"),
        (dict(min_len=True), "min_len must be >= 0, got True"),
        (dict(min_len=1.0), "min_len must be >= 0, got 1.0"),
        (dict(exact_exit=True, alpha=0.0), "exact_exit needs policy='pool' and length penalty alpha == 0"),
        (dict(exact_exit=True, policy="pool"), "exact_exit needs policy='pool' and length penalty alpha == 0"),
        (dict(beam_threshold=-0.5), "beam_threshold must be a finite number >= 0 or None, got -0.5"),
        (dict(beam_threshold=math.inf), "beam_threshold must be a finite number >= 0 or None, got inf"),
        (dict(beam_threshold=True), "beam_threshold must be a finite number >= 0 or None, got True"),
        (dict(beam_threshold="1"), "beam_threshold must be a finite number >= 0 or None, got '1'"),
    ],
)
def test_search_options_name_each_bad_value(kw, message):
    import re

    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        _opts(**kw)


def test_search_options_accept_the_edges():
    from beamkit import SequenceBias

    assert _opts(beam_size=BIG - 1, max_len=BIG - 1).beam_size == BIG - 1
    assert _opts(beam_size=np.int64(1), max_len=np.int64(1)).max_len == 1
    assert _opts(num_return=1).num_return == 1 and _opts(num_return=2).num_return == 2
    assert _opts(min_len=0).min_len == 0 and _opts(min_len=np.int64(2)).min_len == 2
    assert _opts(beam_threshold=0).beam_threshold == 0 and _opts(beam_threshold=2.5).beam_threshold == 2.5
    assert _opts(patience=0.01).pool_size == 1 and _opts(beam_size=4, patience=1.5).pool_size == 6
    assert _opts(early_stopping="never").early_stopping == "never"
    lower = SequenceBias((((1,), -0.5),))
    assert _opts(exact_exit=True, policy="pool", alpha=0.0, processors=(lower,)).exact_exit
    higher = SequenceBias((((1,), 0.5),))
    with pytest.raises(ValueError, match=r"^exact_exit needs step scores <= 0, but \['SequenceBias'\] may raise them$"):
        _opts(exact_exit=True, policy="pool", alpha=0.0, processors=(lower, higher))


class Boost:
    """A processor that returns a new table: token 1 gains ``by`` nats (a shift of one column, not a mask)."""

    def __init__(self, by: float):
        self.by = by

    def __call__(self, scores, ctx: StepContext):
        out = np.array(scores, dtype=np.float64)
        out[:, 1] += self.by
        return out


def test_a_processor_returning_a_new_table_edits_every_run_of_rows():
    # requests at different steps are different runs of rows in one call; the processor's result (a new array)
    # must land in each run. Oracle: each request decoded alone (one run), and brute force for the first.
    from tests.test_engine import Seeded, _same

    proc = Boost(3.0)
    engine = Engine(Seeded(4).step, beam_size=2, max_len=4, min_len=3, processors=[proc])
    ids = [engine.add(Seeded.init(8), BOS, EOS)]
    engine.step()
    ids.append(engine.add(Seeded.init(9), BOS, EOS))  # joins one step later: two runs per call
    done = {}
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    for r, seed in zip(ids, (8, 9), strict=True):
        alone = search_batch(Seeded(4).step, Seeded.init(seed), BOS, EOS, 2, 4, min_len=3, processors=[proc])[0]
        _same(done[r].hypotheses, alone)
    # the first hypothesis' log-probability: the log-probabilities with token 1 shifted (not renormalised, as
    # processors on log-probabilities are), summed along its path
    best = done[ids[0]].hypotheses[0]
    steps = [log_softmax_ref(prefix_logits(8, tuple(best.tokens[:i]), 4, 1.5)) for i in range(len(best.tokens))]
    want = sum(lp[t] + (3.0 if t == 1 else 0.0) for lp, t in zip(steps, best.tokens, strict=True))
    assert best.tokens.count(1) >= 2  # the boost decides the path
    assert best.logprob == pytest.approx(want, abs=1e-9)


def test_a_cancelled_request_returns_no_hypotheses_even_with_finished_ones():
    # eos is the best first token: after one call the request holds a finished [0] in its pool and one running
    # row; cancelled then, it completes with the error and no hypotheses (a failed request has none)
    m = Table({(): [3.0, 1.0, 0.0]}, [0.0, 0.0, 0.0])
    engine = Engine(m.step, beam_size=2, max_len=4)
    r = engine.add(m.init(), BOS, EOS)
    assert engine.step() == []
    assert engine.best(r).tokens == [EOS]  # the finished one is held
    assert engine.cancel(r)
    assert [(c.request_id, c.error, c.hypotheses, c.steps) for c in engine.step()] == [(r, "cancelled", [], 1)]
    assert m.calls == [1] and engine.idle


def test_the_engine_never_writes_into_the_logits_it_was_given():
    # min_len masks eos: the mask goes into a copy, never into the step function's own array
    kept: list[np.ndarray] = []

    def step(state, y):
        logits = np.tile(np.array([2.0, 1.0, 0.5]), (len(state), 1))
        kept.append(logits)
        return logits, state

    res = search_batch(step, np.zeros(1), 0, EOS, 2, 3, min_len=2)[0]
    assert all(h.tokens[:2].count(EOS) == 0 for h in res)
    assert all((a == np.array([2.0, 1.0, 0.5])).all() for a in kept)


def test_rows_with_other_stop_tokens_are_processed_as_their_own_run():
    # two requests at the same step with the same beam, eos 0 and eos 1: a MinLength processor masks each one's
    # own stop token (it reads ctx.eos), so each equals itself alone and never stops before two tokens
    from beamkit import MinLength

    m = ToyModel(4, seed=5, scale=1.0, eos_bias=3.0)
    engine = Engine(m.step, beam_size=2, max_len=3, processors=[MinLength(2)])
    ids = [engine.add(m.init(), BOS, eos) for eos in (0, 1)]
    done = {}
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    for r, eos in zip(ids, (0, 1), strict=True):
        alone = search_batch(m.step, m.init(), BOS, eos, 2, 3, processors=[MinLength(2)])[0]
        assert [h.tokens for h in done[r].hypotheses] == [h.tokens for h in alone]
        assert all(eos not in h.tokens[:2] for h in done[r].hypotheses)


def _exactly(message: str) -> str:
    import re

    return "^" + re.escape(message) + "$"


def test_engine_api_errors_name_the_problem_exactly():
    m = ToyModel(3)
    with pytest.raises(ValueError, match=_exactly("on_step_error must be 'fail' or 'raise', got 'skip'")):
        Engine(m.step, max_len=2, on_step_error="skip")
    with pytest.raises(TypeError, match=_exactly("give Engine either options= or keyword fields, not both")):
        Engine(m.step, make_options(2, 3), beam_size=2)
    engine = Engine(m.step, beam_size=2)
    with pytest.raises(ValueError, match=_exactly("max_len is needed: give it to Engine() or to add()")):
        engine.add(m.init(), BOS, EOS)
    with pytest.raises(
        TypeError, match=_exactly("policy, selector are shared by every request: give them to Engine(), not add()")
    ):
        engine.add(m.init(), BOS, EOS, max_len=3, selector=None, policy="pool")
    unknown = "unknown request options ['beams']; per-request options are ['beam_size', 'max_len', 'min_len', "
    unknown += "'num_return', 'length_penalty', 'early_stopping', 'patience', 'temperature']"
    with pytest.raises(TypeError, match=_exactly(unknown)):
        engine.add(m.init(), BOS, EOS, max_len=3, beams=3)
    with pytest.raises(ValueError, match=_exactly("the number of requests must be an integer >= 0, got -1")):
        engine.add_batch(m.init(), BOS, EOS, -1, request=RequestOptions(max_len=3))
    with pytest.raises(ValueError, match=_exactly("no request 0 was added to this engine")):
        engine.cancel(0)
    with pytest.raises(TypeError, match=_exactly("eos must be an int, a sequence of ints or None, got 'x'")):
        engine.add(m.init(), BOS, "x", max_len=3)
    with pytest.raises(TypeError, match=_exactly("bos must be an int or a sequence of ints, got dtype float64")):
        engine.add(m.init(), 1.5, EOS, max_len=3)
    with pytest.raises(ValueError, match=_exactly("bos must be an int or one id per request (1), got shape (2,)")):
        engine.add(m.init(), [1, 2], EOS, max_len=3)
    assert engine.idle and engine.running == 0


def test_step_function_errors_name_the_problem_exactly():
    m = ToyModel(3)
    shapes = {"w": 3}

    def changing(state, y):
        logits, new = m.step(state, y)
        return np.zeros((len(state), shapes["w"])) + logits[:, :1], new

    engine = Engine(changing, beam_size=2, max_len=3)
    a = engine.add(m.init(), BOS, EOS)
    engine.step()
    shapes["w"] = 4
    width = "ValueError: step_fn returned logits of width 4, but 3 before: the vocabulary must not change"
    assert [(c.request_id, c.error) for c in engine.step()] == [(a, width)]
    engine = Engine(lambda s, y: (np.zeros((len(s), 3)),), beam_size=2, max_len=3)
    b = engine.add(m.init(), BOS, EOS)
    unpack = "TypeError: step_fn must return (logits, new_state) or (logits, new_state, extras)"
    assert [(c.request_id, c.error) for c in engine.step()] == [(b, unpack)]
    from beamkit import CoveragePenalty

    engine = Engine(m.step, beam_size=2, max_len=3, coverage_penalty=CoveragePenalty(0.2))
    c = engine.add(m.init(), BOS, EOS)
    cov = "ValueError: coverage_penalty needs step_fn to return extras={'attention': [rows, S]}"
    assert [(x.request_id, x.error) for x in engine.step()] == [(c, cov)]


def test_processors_see_each_rows_running_logprob_and_its_requests_finished_count():
    # the contract's hand example, beam 2: step 1 keeps A (.5) and B (.4); step 2 finishes [B eos] (.36) and keeps
    # [A B] (.35); so the third call sees one row, log .35, whose request holds one finished hypothesis
    from tests.test_contract import hand_model

    seen = []

    def spy(scores, ctx: StepContext):
        seen.append((ctx.step, np.exp(ctx.logprob).round(12).tolist(), ctx.finished.tolist()))
        return scores

    m = hand_model()
    search_batch(m.step, m.init(), BOS, EOS, 2, 3, processors=[spy])
    assert seen == [(0, [1.0], [0]), (1, [0.5, 0.4], [0, 0]), (2, [0.35], [1])]


def _rows_of(n: int) -> np.ndarray:
    state = np.empty(n, dtype=object)
    for i in range(n):
        state[i] = ()
    return state


def test_slots_are_reclaimed_with_requests_waiting_cancelled_and_running():
    # cancelled requests complete without a model call, so slots pile up cheaply. Reclaiming renumbers the slots of
    # a running request (X), a waiting one (R) and a waiting cancelled one (P); each ends as it would alone.
    m = Table({(): [0.0, 1.0, 0.5]}, [0.2, 0.0, 1.0])
    engine = Engine(m.step, beam_size=2, max_len=4)
    first = engine.add_batch(_rows_of(1030), BOS, EOS)
    for r in first:
        engine.cancel(r)
    assert [c.error for c in engine.step()] == ["cancelled"] * 1030 and m.calls == []
    x = engine.add(m.init(), BOS, EOS, max_len=6, min_len=6)  # reclaims 1030 slots of which none is held
    assert engine.book.size == 1
    engine.step()
    for r in engine.add_batch(_rows_of(1021), BOS, EOS):
        engine.cancel(r)
    done = {c.request_id: c for c in engine.step()}
    assert len(done) == 1021 and engine.book.size == 1022
    r_id = engine.add(m.init(), BOS, EOS)
    p_id = engine.add(m.init(), BOS, EOS)
    engine.cancel(p_id)
    assert engine.book.size == 1024
    q_id = engine.add(m.init(), BOS, EOS, max_len=2)  # 1024 slots, 3 held: reclaimed before Q takes one
    assert engine.book.size == 4
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    assert (done[p_id].error, done[p_id].hypotheses, done[p_id].steps) == ("cancelled", [], 0)
    for rid, kw in ((x, dict(max_len=6, min_len=6)), (r_id, dict(max_len=4)), (q_id, dict(max_len=2))):
        assert done[rid].error is None
        alone = search_batch(m.step, m.init(), BOS, EOS, 2, **kw)[0]
        assert [(h.tokens, h.logprob) for h in done[rid].hypotheses] == [(h.tokens, h.logprob) for h in alone]
    assert (x, r_id, p_id, q_id) == (1030, 2052, 2053, 2054) and engine.running == 0


def test_a_request_whose_state_cannot_join_fails_alone():
    m = Table({}, [0.0, 1.0, 0.5])
    engine = Engine(m.step, beam_size=2, max_len=2)
    a = engine.add(m.init(), BOS, EOS)
    b = engine.add({"h": np.zeros((1, 2))}, BOS, EOS)  # another structure than a's object array
    c = engine.add(m.init(), BOS, EOS)
    out = engine.step()
    assert [x.request_id for x in out] == [b] and out[0].error.startswith("cannot join the running state: ")
    assert out[0].hypotheses == [] and engine.stats.joined_per_call == [2] and m.calls == [2]
    while not engine.idle:
        out += engine.step()
    alone = [h.tokens for h in search_batch(m.step, m.init(), BOS, EOS, 2, 2)[0]]
    assert [x.request_id for x in out[1:]] == [a, c]
    assert [[h.tokens for h in x.hypotheses] for x in out[1:]] == [alone, alone]
    raising = Engine(m.step, beam_size=2, max_len=2, on_step_error="raise")
    raising.add(m.init(), BOS, EOS)
    raising.add({"h": np.zeros((1, 2))}, BOS, EOS)
    with pytest.raises(Exception):  # noqa: B017 - whatever concat_state raises for the mismatch
        raising.step()


def test_stats_window_keeps_the_latest_calls():
    # stats_window 3: the per-call lists are cut back to the last 3 whenever they exceed 6 entries
    m = Table({}, [0.0, 1.0, 0.5])
    engine = Engine(m.step, beam_size=2, max_len=10, min_len=10, stats_window=3)
    engine.add(m.init(), BOS, EOS)
    lengths = []
    while not engine.idle:
        engine.step()
        lengths.append(len(engine.stats.rows_per_call))
    assert lengths == [1, 2, 3, 4, 5, 6, 3, 4, 5, 6]
    assert engine.stats.rows_per_call == [2] * 6 and engine.stats.model_calls == 10  # the 1-row first call is gone


class Held(NamedTuple):
    h: np.ndarray
    c: list


def test_row_checks_name_the_leaf_by_its_path():
    from beamkit.state import check_rows

    def bad(extra_h: int, extra_c1: int):
        def step(state, y):
            n = len(y)
            return np.zeros((n, 3)), Held(np.zeros((n + extra_h, 2)), [np.zeros(n), np.zeros(n + extra_c1)])

        return step

    init = Held(np.zeros((1, 2)), [np.zeros(1), np.zeros(1)])
    expected = "the state step_fn returned.h has 2 rows on axis 0, expected 1 (one per live row)"
    with pytest.raises(ValueError, match=_exactly(expected)):
        search_batch(bad(1, 0), init, 0, EOS, 2, 3)
    expected = "the state step_fn returned.c[1] has 3 rows on axis 0, expected 1 (one per live row)"
    with pytest.raises(ValueError, match=_exactly(expected)):
        search_batch(bad(0, 2), init, 0, EOS, 2, 3)
    with pytest.raises(ValueError, match=_exactly("state has 2 rows on axis 0, expected 1 (one per live row)")):
        check_rows(np.zeros((2, 3)), 1)


def test_add_batch_counts_the_rows_of_a_dict_state():
    engine = Engine(lambda s, y: (np.zeros((len(y), 3)), s), beam_size=2, max_len=2)
    assert engine.add_batch({"h": np.zeros((3, 2))}, 0, EOS) == [0, 1, 2]
    assert engine.add_batch({"n": 7, "h": [np.zeros((2, 2))]}, 0, EOS) == [3, 4]  # the first array leaf counts


def test_exact_exit_accepts_processors_that_do_not_say_they_raise_scores():
    assert _opts(exact_exit=True, policy="pool", alpha=0.0, processors=(Boost(-1.0),)).exact_exit


def test_min_len_keeps_beam_many_other_tokens_normalised_over_the_whole_vocabulary():
    """Hand-worked: logits [3, 2, 3, 1, 1, 0] (ids 0 and 2 stop, tied at the top), beam 2, min_len 1, at most one
    token. The stop tokens may not end the first step, so the beams are ids 1 and 3 (then 4: ties to the lowest
    id), with log-probabilities normalised over all six logits, stop tokens included (as a model gives them)."""
    row = np.array([3.0, 2.0, 3.0, 1.0, 1.0, 0.0])
    lse = math.log(sum(math.exp(x) for x in row))

    def step(state, y_prev):
        return np.tile(row, (len(y_prev), 1)), state

    res = search_batch(step, np.zeros((1, 1)), BOS, (0, 2), 2, 1, min_len=1)[0]
    assert [h.tokens for h in res] == [[1], [3]]
    assert [h.logprob for h in res] == pytest.approx([2.0 - lse, 1.0 - lse], abs=1e-12)


def test_requests_with_different_stop_sets_below_min_len_decode_as_alone():
    """Requests in one batch masking different stop sets below their min_len (and one masking none) give what
    each gives decoded alone."""
    m = ToyModel(7, seed=11, eos_bias=2.0)
    plan = [((0,), 3), ((0, 4, 5), 2), ((3, 1), 4), ((0,), 0)]  # (stop ids, min_len): 0 and 4 are likely picks

    def decode(items):
        engine = Engine(m.step, beam_size=3, max_len=6)
        ids = [engine.add(m.init(), BOS, eos, min_len=n) for eos, n in items]
        done = {}
        while not engine.idle:
            done.update({c.request_id: c.hypotheses for c in engine.step()})
        return [[(h.tokens, h.logprob) for h in done[i]] for i in ids]

    together = decode(plan)
    for item, got in zip(plan, together, strict=True):
        assert got == decode([item])[0]
        assert all(len(tokens) > item[1] or not tokens or tokens[-1] not in item[0] for tokens, _ in got)


def test_stop_sets_of_different_sizes_mask_only_their_own_tokens():
    """Hand-worked, one step, beam 2, logits [0, 3, 1, 2, 0.5] for every row: request A (stops {1}, below
    min_len) takes 3 then 2; B (stops {3, 4}, below min_len) takes 1 then 2; C (stop {0}, past min_len) takes 1
    then 3: a stop set shorter than another masks nothing more, and a row that masks nothing loses no token."""
    row = np.array([0.0, 3.0, 1.0, 2.0, 0.5])

    def step(state, y_prev):
        return np.tile(row, (len(y_prev), 1)), state

    engine = Engine(step, beam_size=2, max_len=1)
    ids = [
        engine.add(np.zeros((1, 1)), BOS, (1,), min_len=1),
        engine.add(np.zeros((1, 1)), BOS, (3, 4), min_len=1),
        engine.add(np.zeros((1, 1)), BOS, (0,), min_len=0),
    ]
    done = {}
    while not engine.idle:
        done.update({c.request_id: [h.tokens for h in c.hypotheses] for c in engine.step()})
    assert [done[i] for i in ids] == [[[3], [2]], [[1], [2]], [[1], [3]]]


def test_many_stop_tokens_below_min_len():
    """Forty stop ids 0-39 on logits falling with the id: below min_len the two beams are ids 40 and 41, next
    to a request that masks nothing and takes 0 (a stop token, finished) and 1."""
    row = -np.arange(60, dtype=np.float64)

    def step(state, y_prev):
        return np.tile(row, (len(y_prev), 1)), state

    engine = Engine(step, beam_size=2, max_len=1)
    masked = engine.add(np.zeros((1, 1)), BOS, tuple(range(40)), min_len=1)
    plain = engine.add(np.zeros((1, 1)), BOS, tuple(range(40)), min_len=0)
    done = {}
    while not engine.idle:
        done.update({c.request_id: [(h.tokens, h.finished) for h in c.hypotheses] for c in engine.step()})
    assert done[masked] == [([40], False), ([41], False)]
    assert done[plain] == [([0], True), ([1], True)]
