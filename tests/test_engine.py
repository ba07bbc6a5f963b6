"""The step-wise Engine (continuous batching): every request gets what it gets decoded alone.

The oracle for each request is ``search_batch`` on that request alone (a fresh search, nothing else in the batch),
so these tests hold whatever the engine does with the rows of other requests: joins at any step, leaves,
cancellations, failures, different options per request.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beamkit import BatchDecodeError, Deterministic, Engine, LengthPenalty, NoRepeatNGram, search_batch
from beamkit.processors import StepContext
from tests.toy import BOS, ToyModel, all_outputs, prefix_logits

EOS = 0


class Seeded:
    """A prefix-dependent toy: each row's state is (request seed, prefix); seeds in ``nan_at`` give NaN logits
    once their prefix reaches that length (the request fails)."""

    def __init__(self, v: int, nan_at: dict[int, int] | None = None, scale: float = 1.5):
        self.v, self.nan_at, self.scale = v, nan_at or {}, scale
        self.calls: list[int] = []

    @staticmethod
    def init(seed: int) -> np.ndarray:
        state = np.empty(1, dtype=object)
        state[0] = (seed, ())
        return state

    def step(self, state, y_prev):
        y = np.asarray(y_prev)
        new = np.empty(len(state), dtype=object)
        for i, ((s, p), t) in enumerate(zip(state, y, strict=True)):
            new[i] = (s, p if int(t) == BOS else p + (int(t),))
        self.calls.append(len(state))
        logits = np.stack([prefix_logits(s, p, self.v, self.scale) for s, p in new])
        for i, (s, p) in enumerate(new):
            if self.nan_at.get(s) == len(p):
                logits[i] = np.nan
        return logits, new


class ContextCheck:
    """A processor that checks what it sees is one request-consistent view: a uniform step, and token histories
    of exactly ``step`` tokens that match each row's own state (no padding of one request by another)."""

    def __init__(self) -> None:
        self.seen_steps: set[int] = set()

    def __call__(self, scores, ctx: StepContext):
        assert ctx.tokens.shape == (scores.shape[0], ctx.step)
        assert (ctx.tokens >= 0).all()
        self.seen_steps.add(ctx.step)
        return scores


def _alone(model: Seeded, seed: int, opts: dict, shared: dict):
    try:
        return search_batch(model.step, Seeded.init(seed), BOS, EOS, **opts, **shared)[0], None
    except BatchDecodeError as err:
        return None, err.errors[0]


def _same(got, want) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.logprob for h in got] == [h.logprob for h in want]
    assert [h.score for h in got] == [h.score for h in want]
    assert [h.token_logprobs for h in got] == [h.token_logprobs for h in want]
    assert [h.beam_indices for h in got] == [h.beam_indices for h in want]
    assert [h.finished for h in got] == [h.finished for h in want]


request = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "arrive": st.integers(0, 6),
        "cancel": st.one_of(st.none(), st.integers(0, 8)),
        "fail": st.booleans(),
        "beam_size": st.integers(1, 4),
        "max_len": st.integers(1, 6),
        "min_len": st.integers(0, 2),
        "num_return": st.sampled_from([None, 1]),
        "length_penalty": st.sampled_from([0.0, 1.0, LengthPenalty.gnmt(0.6)]),
        "early_stopping": st.sampled_from([True, False, "never"]),
        "patience": st.sampled_from([1.0, 1.5]),
    }
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(request, min_size=1, max_size=6),
    policy=st.sampled_from(["narrow", "pool", "compete"]),
    ngram=st.sampled_from([0, 2]),
    v=st.integers(3, 6),
    threshold=st.sampled_from([None, 1.5]),
)
def test_every_request_gets_what_it_gets_alone(reqs, policy, ngram, v, threshold):
    if policy != "pool":
        for r in reqs:
            r["early_stopping"], r["patience"] = False, 1.0
    for r in reqs:  # min_len above max_len is refused; at max_len it already keeps eos out throughout
        r["min_len"] = min(r["min_len"], r["max_len"])
    check = ContextCheck()
    procs = [check] + ([NoRepeatNGram(ngram)] if ngram else [])
    shared = {"policy": policy, "processors": procs, "beam_threshold": threshold}
    nan_at = {r["seed"]: 1 for r in reqs if r["fail"]}
    model = Seeded(v, nan_at)
    engine = Engine(model.step, **shared)
    keys = ("beam_size", "max_len", "min_len", "num_return", "length_penalty", "early_stopping", "patience")
    ids: dict[int, int] = {}
    done: dict[int, object] = {}
    cancelled: set[int] = set()
    for step in range(40):
        for i, r in enumerate(reqs):
            if r["arrive"] == step:
                ids[i] = engine.add(Seeded.init(r["seed"]), BOS, EOS, **{k: r[k] for k in keys})
            if r["cancel"] == step and i in ids and engine.cancel(ids[i]):
                cancelled.add(i)
        for c in engine.step():
            assert c.request_id not in done
            done[c.request_id] = c
        if engine.idle and len(ids) == len(reqs):
            break
    assert engine.idle and len(done) == len(reqs)
    assert engine.running == 0
    for i, r in enumerate(reqs):
        got = done[ids[i]]
        if i in cancelled:
            assert got.error == "cancelled" and got.hypotheses == []
            continue
        want, error = _alone(Seeded(v, nan_at), r["seed"], {k: r[k] for k in keys}, shared)
        assert got.error == error
        if error is None:
            _same(got.hypotheses, want)
    assert all(rows <= sum(r["beam_size"] for r in reqs) for rows in model.calls)


def test_requests_join_at_the_next_step_and_leave_at_once():
    model = Seeded(5)
    engine = Engine(model.step, beam_size=2, max_len=3)
    a = engine.add(Seeded.init(1), BOS, EOS)
    assert engine.step() == [] and model.calls == [1]
    b = engine.add(Seeded.init(2), BOS, EOS, max_len=1)
    out = engine.step()
    assert model.calls[1] == 2 + 1  # a's two beams and b's first row in one call
    assert [c.request_id for c in out] == [b]  # b ends at once (max_len 1)
    assert engine.stats.joined_per_call == [1, 1]
    assert engine.stats.left_per_call == [0, 1]
    while not engine.idle:
        out = engine.step()
    assert [c.request_id for c in out] == [a]
    assert model.calls[2] == 2  # b's rows are gone


def test_best_running_hypothesis_for_streaming():
    model = Seeded(5)
    engine = Engine(model.step, beam_size=3, max_len=4, length_penalty=0.0)
    r = engine.add(Seeded.init(7), BOS, EOS)
    assert engine.best(r) is None  # still waiting to join
    seen = []
    while not engine.idle:
        out = engine.step()
        if not out:
            best = engine.best(r)
            seen.append(best)
            assert best is not None and len(best.tokens) >= 1
            want = sum(best.token_logprobs)
            assert best.logprob == pytest.approx(want)
    final = out[0].hypotheses[0]
    assert engine.best(r) is None  # completed
    assert final.score >= max(h.score for h in seen if h.finished) if any(h.finished for h in seen) else True


def test_cancel_of_a_waiting_request_and_of_an_unknown_one():
    model = Seeded(5)
    engine = Engine(model.step, beam_size=2, max_len=5)
    r = engine.add(Seeded.init(3), BOS, EOS)
    assert engine.cancel(r) is True
    assert engine.cancel(r) is False
    out = engine.step()
    assert [(c.request_id, c.error) for c in out] == [(r, "cancelled")]
    assert model.calls == [] and engine.idle
    with pytest.raises(ValueError, match="no request 5"):
        engine.cancel(5)


def test_a_step_function_failure_fails_the_requests_in_the_call_only():
    calls = {"n": 0}
    model = Seeded(5)

    def flaky(state, y):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return model.step(state, y)

    engine = Engine(flaky, beam_size=2, max_len=4)
    a = engine.add(Seeded.init(1), BOS, EOS)
    engine.step()
    out = engine.step()
    assert [(c.request_id, c.error) for c in out] == [(a, "RuntimeError: device lost")]
    b = engine.add(Seeded.init(1), BOS, EOS)  # the engine goes on
    while not engine.idle:
        out = engine.step()
    assert out[0].request_id == b and out[0].error is None
    assert [h.tokens for h in out[0].hypotheses] == [
        h.tokens for h in search_batch(Seeded(5).step, Seeded.init(1), BOS, EOS, 2, 4)[0]
    ]


def test_options_are_checked_when_added():
    engine = Engine(Seeded(5).step, beam_size=2)
    with pytest.raises(ValueError, match="max_len is needed"):
        engine.add(Seeded.init(1), BOS, EOS)
    with pytest.raises(TypeError, match="policy are shared"):
        engine.add(Seeded.init(1), BOS, EOS, max_len=3, policy="pool")
    with pytest.raises(TypeError, match="unknown request options"):
        engine.add(Seeded.init(1), BOS, EOS, max_len=3, beams=3)
    with pytest.raises(ValueError, match="num_return"):
        engine.add(Seeded.init(1), BOS, EOS, max_len=3, num_return=3)
    with pytest.raises(ValueError, match=r"init_state\[1\] has 2 rows on axis 0, expected 1"):
        engine.add((np.zeros(1), np.zeros(2)), BOS, EOS, max_len=3)
    with pytest.raises(ValueError, match="beam_threshold"):
        Engine(Seeded(5).step, beam_threshold=-1.0)
    assert engine.idle


def test_logits_width_must_not_change():
    widths = iter([6, 9, 9, 9])

    def step(state, y):
        return np.zeros((len(state), next(widths))), state

    with pytest.raises(ValueError, match="width 9, but 6 before"):
        search_batch(step, np.zeros(1), 0, 5, 2, 4)
    engine = Engine(step, beam_size=2, max_len=4)
    widths = iter([6, 3])
    r = engine.add(np.zeros(1), 0, 5)
    engine.step()
    out = engine.step()
    assert out[0].request_id == r and "width 3, but 6 before" in out[0].error


def test_state_rows_returned_by_the_step_function_are_checked():
    def step(state, y):
        return np.zeros((len(y), 4)), {"h": np.zeros((len(y) + 1, 2))}

    with pytest.raises(ValueError, match=r"the state step_fn returned\['h'\] has 2 rows on axis 0, expected 1"):
        search_batch(step, {"h": np.zeros((1, 2))}, 0, 3, 2, 4)


def test_threshold_pruning_drops_rows_and_a_huge_threshold_changes_nothing():
    model = Seeded(8, scale=3.0)
    kw = dict(length_penalty=0.0, policy="pool", early_stopping="never")
    plain = search_batch(model.step, Seeded.init(11), BOS, EOS, 5, 6, **kw)[0]
    rows_plain = sum(model.calls)
    model.calls.clear()
    same = search_batch(model.step, Seeded.init(11), BOS, EOS, 5, 6, beam_threshold=1e9, **kw)[0]
    _same(same, plain)
    model.calls.clear()
    engine = Engine(model.step, beam_size=5, max_len=6, beam_threshold=1.0, **kw)
    engine.add(Seeded.init(11), BOS, EOS)
    while not engine.idle:
        engine.step()
    assert engine.stats.pruned > 0 and sum(model.calls) < rows_plain


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), v=st.integers(3, 4), max_len=st.integers(1, 3))
def test_threshold_above_the_gap_never_drops_the_best_brute_force(seed, v, max_len):
    # a beam as wide as every prefix: only the threshold prunes. Brute force gives the best output and, per step,
    # the gap between the best candidate there is and the best output's own prefix; a threshold above every gap
    # can never drop the best output.
    toy = ToyModel(v, seed, scale=2.0)
    outputs = all_outputs(toy, EOS, max_len)
    best = max(outputs, key=lambda o: o[1])
    gap = 0.0
    for t in range(len(best[0])):
        prefixes = {tuple(seq[: t + 1]) for seq, _, _ in outputs if len(seq) > t}
        top = max(toy.path_logprob(list(p)) for p in prefixes)
        gap = max(gap, top - toy.path_logprob(best[0][: t + 1]))
    k = v**max_len
    found = search_batch(toy.step, toy.init(), BOS, EOS, k, max_len, length_penalty=0.0, beam_threshold=gap + 1e-9)
    assert found[0][0].tokens == best[0]
    assert found[0][0].logprob == pytest.approx(best[1])


class SourceAttention(Seeded):
    """Seeded, plus attention over a source of ``1 + seed % 4`` positions (zero-padded to the widest row in the
    call, as a model over padded sources returns it)."""

    @staticmethod
    def attn(seed: int, prefix: tuple) -> np.ndarray:
        rng = np.random.default_rng(seed * 31 + len(prefix) * 7 + sum(prefix))
        a = rng.random(1 + seed % 4)
        return a / a.sum()

    def step(self, state, y_prev):
        logits, new = super().step(state, y_prev)
        rows = [self.attn(s, p) for s, p in new]
        width = max(len(a) for a in rows)
        return logits, new, {"attention": np.stack([np.pad(a, (0, width - len(a))) for a in rows])}


def test_coverage_penalty_of_requests_joining_with_other_source_lengths():
    from beamkit import CoveragePenalty

    model = SourceAttention(5)
    shared = {"coverage_penalty": CoveragePenalty(0.4), "length_penalty": 1.0}
    engine = Engine(model.step, beam_size=3, max_len=5, **shared)
    seeds, ids, done = [4, 7, 2], [], {}
    for s in seeds:  # one joins at each step, each with another source length
        ids.append(engine.add(Seeded.init(s), BOS, EOS))
        for c in engine.step():
            done[c.request_id] = c
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    for s, r in zip(seeds, ids, strict=True):
        alone = search_batch(SourceAttention(5).step, Seeded.init(s), BOS, EOS, 3, 5, **shared)[0]
        _same(done[r].hypotheses, alone)


class PlainTopK(Deterministic):
    """The deterministic rule under another type: the engine asks it once per run of rows at one step."""

    calls = 0

    def candidates(self, scores, offset, parent_key, m, ctx):
        PlainTopK.calls += 1
        assert ctx.tokens.shape == (scores.shape[0], ctx.step)
        return super().candidates(scores, offset, parent_key, m, ctx)


def test_a_selector_is_asked_per_run_of_rows_at_one_step():
    model = Seeded(6)
    engine = Engine(model.step, max_len=5, policy="pool", selector=PlainTopK())
    plan = [(3, 2), (8, 4), (5, 1)]  # (seed, beam): candidate tables of other widths per run
    ids, done = [], {}
    for s, k in plan:
        ids.append(engine.add(Seeded.init(s), BOS, EOS, beam_size=k))
        for c in engine.step():
            done[c.request_id] = c
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    assert PlainTopK.calls > engine.stats.model_calls  # several runs in one call
    for (s, k), r in zip(plan, ids, strict=True):
        _same(done[r].hypotheses, search_batch(Seeded(6).step, Seeded.init(s), BOS, EOS, k, 5, policy="pool")[0])


def test_best_so_far_equals_the_search_cut_at_that_length():
    # narrow policy: after t steps the best hypothesis so far (finished or live) is the top result of the same
    # search with max_len = t, where live hypotheses are returned unfinished and scored at their length
    engine = Engine(Seeded(5).step, beam_size=3, max_len=6, length_penalty=1.0)
    r = engine.add(Seeded.init(21), BOS, EOS)
    t = 0
    while not engine.idle:
        if engine.step():
            break
        t += 1
        want = search_batch(Seeded(5).step, Seeded.init(21), BOS, EOS, 3, t, length_penalty=1.0)[0][0]
        got = engine.best(r)
        assert (got.tokens, got.finished) == (want.tokens, want.finished)
        assert got.score == pytest.approx(want.score) and got.logprob == pytest.approx(want.logprob)
        assert got.token_logprobs == pytest.approx(want.token_logprobs)
    assert t >= 2


def test_add_takes_one_row_and_ids_are_checked():
    from beamkit import beam_search, greedy_decode

    engine = Engine(Seeded(5).step, beam_size=2, max_len=3)
    two = np.empty(2, dtype=object)
    two[0], two[1] = (1, ()), (2, ())
    with pytest.raises(ValueError, match="has 2 rows on axis 0, expected 1"):
        engine.add(two, BOS, EOS)
    with pytest.raises(ValueError, match="has 2 rows on axis 0, expected 1"):
        beam_search(Seeded(5).step, two, BOS, EOS, 2, 3)
    assert engine.add_batch(two, BOS, EOS) == [0, 1]
    with pytest.raises(ValueError, match="no request 2"):
        engine.cancel(2)
    # options reach greedy decoding: min_len keeps eos out of the first two tokens
    assert greedy_decode(Seeded(3).step, Seeded.init(3), BOS, EOS, 4).tokens == [1, EOS]
    assert EOS not in greedy_decode(Seeded(3).step, Seeded.init(3), BOS, EOS, 4, min_len=2).tokens[:2]


def test_concat_state_structures():
    from beamkit import Shared, concat_state

    class Joins:
        def __init__(self, n):
            self.n = n

        def beamkit_concat(self, others):
            return Joins(self.n + sum(o.n for o in others))

    with pytest.raises(ValueError, match="at least one state"):
        concat_state([])
    got = concat_state(
        [(np.zeros(1), [np.ones(2)], {"a": np.zeros((1, 2))}), (np.ones(2), [np.zeros(1)], {"a": np.ones((3, 2))})]
    )
    assert got[0].tolist() == [0, 1, 1] and got[1][0].tolist() == [1, 1, 0] and got[2]["a"].shape == (4, 2)
    assert isinstance(got, tuple) and isinstance(got[1], list)
    assert concat_state([Joins(1), Joins(2), Joins(3)]).n == 6
    shared = Shared(np.zeros(2))
    assert concat_state([shared, shared]) is shared
    assert concat_state([Shared(np.zeros(2)), Shared(np.ones(1))]).value.tolist() == [0, 0, 1]


def test_a_long_running_engine_reclaims_slots_and_keeps_ids():
    # 1,200 requests through one engine, a few running at a time: request ids stay the ones add() returned,
    # results equal each request alone, and the per-request arrays stay as large as the requests held
    model = Seeded(4)
    engine = Engine(model.step, beam_size=2, max_len=3, stats_window=50)
    ids, done = {}, {}
    for i in range(1200):
        ids[engine.add(Seeded.init(i % 7), BOS, EOS)] = i % 7  # request id -> its seed
        if i == 600:
            keep = engine.add(Seeded.init(3), BOS, EOS, max_len=520, min_len=500)  # runs while slots are reclaimed
            ids[keep] = 3
        for c in engine.step():
            done[c.request_id] = c
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    assert sorted(done) == sorted(ids) == list(range(1201))
    assert engine.book.pools == {} and engine.book.size < 1024  # slots were reclaimed
    assert len(engine.stats.rows_per_call) <= 100 and engine.stats.model_calls > 1200
    for rid in (0, 1, 599, 600, 602, 1200, keep):
        opts = {"max_len": 520, "min_len": 500} if rid == keep else {"max_len": 3}
        want = search_batch(Seeded(4).step, Seeded.init(ids[rid]), BOS, EOS, 2, **opts)[0]
        _same(done[rid].hypotheses, want)
    assert engine.cancel(5) is False
    with pytest.raises(ValueError, match="no request 1201"):
        engine.cancel(1201)


def test_requests_with_other_stop_tokens_share_the_engine():
    # each request has its own eos set (one id, two ids, none) and min_len: both are per request
    model = Seeded(6)
    plan = [(3, 0, 0), (8, (1, 2), 2), (5, None, 0), (9, (0, 5), 1)]  # (seed, eos, min_len)
    engine = Engine(model.step, beam_size=3, max_len=5, policy="pool")
    ids, done = [], {}
    for seed, eos, min_len in plan:
        ids.append(engine.add(Seeded.init(seed), BOS, eos, min_len=min_len))
        for c in engine.step():
            done[c.request_id] = c
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    for (seed, eos, min_len), r in zip(plan, ids, strict=True):
        want = search_batch(Seeded(6).step, Seeded.init(seed), BOS, eos, 3, 5, policy="pool", min_len=min_len)[0]
        _same(done[r].hypotheses, want)
        stops = () if eos is None else ((eos,) if isinstance(eos, int) else eos)
        assert all(t not in stops for h in done[r].hypotheses for t in h.tokens[:min_len])


def test_completed_counts_the_calls_a_request_took_part_in():
    model = Seeded(5)
    engine = Engine(model.step, beam_size=2, max_len=4)
    a = engine.add(Seeded.init(1), BOS, EOS, min_len=4)  # runs all 4 steps
    engine.step()
    b = engine.add(Seeded.init(2), BOS, EOS, max_len=2, min_len=2)  # joins at the second call, runs 2
    steps = {}
    while not engine.idle:
        for c in engine.step():
            steps[c.request_id] = c.steps
    assert steps == {a: 4, b: 2}
    c = engine.add(Seeded.init(3), BOS, EOS)
    engine.cancel(c)
    assert [(x.request_id, x.steps) for x in engine.step()] == [(c, 0)]


class Weighed(np.ndarray):
    """An object-array state that reports the bytes of a pretend cache: 100 per row."""

    def kv_bytes(self) -> int:
        return 100 * len(self)


def test_engine_stats_read_kv_bytes_from_the_state():
    model = Seeded(5)

    def step(state, y):
        logits, new = model.step(state, y)
        return logits, new.view(Weighed)

    engine = Engine(step, beam_size=3, max_len=4, min_len=4)
    engine.add(Seeded.init(4), BOS, EOS)
    seen = []
    while not engine.idle:
        engine.step()
        seen.append(engine.stats.kv_bytes)
    assert seen == [100 * r for r in engine.stats.rows_per_call]
    assert engine.stats.kv_peak_bytes == max(seen) == 300


def test_processors_see_each_rows_own_request_fields():
    """A processor's context names, row by row, the request the row belongs to and that request's own options:
    its id (the one ``add`` returned, not the engine's slot), beam size, length limit and temperature (NaN
    where none was set); rows of requests with the same beam size share one call, each with its own fields."""
    import beamkit
    from tests.toy import MultiToy

    model = MultiToy(7, seeds=[0, 1, 2, 3, 4])
    seen = []

    def spy(scores, ctx):
        together = len(set(ctx.request_id.tolist()))
        for i in range(scores.shape[0]):
            row = (int(ctx.request[i]), int(ctx.request_id[i]), int(ctx.beam[i]), int(ctx.max_len[i]))
            seen.append((ctx.step, *row, float(ctx.temperature[i]), together))
        return scores

    options = beamkit.SearchOptions(4, 6, processors=[spy], selector=beamkit.Multinomial(seed=0))
    engine = beamkit.Engine(model.step, options)
    init = model.init()
    done = np.empty(1100, dtype=object)
    done[:] = [(0, ())] * 1100
    # 1,100 requests done at once: the engine renumbers its slots, so the later requests' ids are not their slots
    first = engine.add_batch(done, BOS, 0, request=beamkit.RequestOptions(beam_size=1, max_len=1))[-1]
    while not engine.idle:
        engine.step()
    seen.clear()
    specs = [(2, 3, 0.5), (4, 6, float("nan")), (4, 4, 1.5), (3, 5, 2.0)]  # beam, max_len, temperature
    ids = []
    for i, (beam, max_len, temp) in enumerate(specs, start=1):
        given = {} if temp != temp else {"temperature": temp}
        ids.append(engine.add(init[i : i + 1], BOS, 0, beam_size=beam, max_len=max_len, **given))
    assert ids == [first + 1, first + 2, first + 3, first + 4]
    while not engine.idle:
        engine.step()
    want = dict(zip(ids, specs, strict=True))
    slots = {}
    for step, slot, rid, beam, max_len, temp, _ in seen:
        assert (beam, max_len) == want[rid][:2] and step < max_len
        assert temp == want[rid][2] or (temp != temp and want[rid][2] != want[rid][2])
        assert slots.setdefault(rid, slot) == slot  # one slot per request while it runs
    assert set(slots) == set(ids) and not set(slots.values()) & set(ids)
    assert any(together > 1 for *_, together in seen)  # the two beam-4 requests shared calls


def test_request_ids_and_both_kinds_of_options_are_refused_by_name():
    """Hand-written messages: a negative or non-integer request id (``cancel``, ``best``), and ``add`` given a
    request record and keywords at once."""
    import beamkit

    model = ToyModel(5)
    engine = Engine(model.step, beamkit.SearchOptions(2, 3))
    for call in (engine.cancel, engine.best):
        with pytest.raises(ValueError, match=r"^request_id must be >= 0, got -1$"):
            call(-1)
        with pytest.raises(TypeError, match=r"^request_id must be an integer, got 1\.5$"):
            call(1.5)
    with pytest.raises(
        TypeError, match=r"^give add\(\) either request= or the request's options as keywords, not both$"
    ):
        engine.add(model.init(), BOS, 0, beamkit.RequestOptions(beam_size=2), max_len=3)


def test_best_is_the_best_scoring_finished_hypothesis_so_far():
    """``best`` while a request runs: of its finished hypotheses and its running ones (scored at their length),
    the one of the highest score, worked out by hand; a finished hypothesis that is not the pool's first entry
    is returned when it scores best."""
    import beamkit

    # next-token probabilities by prefix; token 1 ends a hypothesis, 0 is the start token (never chosen)
    probs = {(): [0.0, 0.3, 0.6, 0.1], (2,): [0.0, 0.7, 0.0, 0.3]}

    def step(state, y_prev):
        new = np.empty(len(state), dtype=object)
        for i, (p, t) in enumerate(zip(state, np.asarray(y_prev), strict=True)):
            new[i] = p if int(t) == 0 else (*p, int(t))
        with np.errstate(divide="ignore"):
            return np.log([probs.get(p, [0.0, 0.1, 0.2, 0.7]) for p in new]), new

    engine = Engine(step, beamkit.SearchOptions(3, 6, length_penalty=0.0))
    start = np.empty(1, dtype=object)
    start[0] = ()
    rid = engine.add(start, 0, 1)
    engine.step()  # finished: [1] at log .3; running: [2] at log .6, [3] at log .1
    first = engine.best(rid)
    assert first is not None and first.tokens == [2] and not first.finished
    engine.step()  # finished: [1] at log .3, then [2, 1] at log .42; running ones below log .42
    best = engine.best(rid)
    assert best is not None and best.tokens == [2, 1] and best.finished
    assert best.logprob == pytest.approx(np.log(0.6 * 0.7), abs=1e-12)
