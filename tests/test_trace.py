"""Search traces (record_trace=True): the trace is what the search did.

Oracles: the seed-000 worked example by hand; the toy models' own next-token tables (plain-Python log-softmax,
never beamkit) for which candidates each row must have offered; the returned hypotheses and SearchStats of the
same search; the same request decoded alone for requests that joined a running engine.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from beamkit import BeamSearch, Engine, SearchOptions, beam_search
from beamkit.demo import EOS, NAMES, table_step
from beamkit.search import traced_search
from beamkit.trace import Trace
from beamkit.viz import to_dot, to_html, to_svg
from tests.toy import BOS, MultiToy, ToyModel, log_softmax_ref

P = {(): [0.1, 0.5, 0.4], (1,): [0.2, 0.1, 0.7], (2,): [0.9, 0.05, 0.05]}  # seed 000's table, by hand


def _seed000(beam: int, alpha: float = 0.0) -> tuple[list, Trace]:
    init = np.empty(1, dtype=object)
    init[0] = ()
    hyps, traces = traced_search(table_step, init, -1, EOS, beam, 2, length_penalty=alpha)
    return hyps[0], traces[0]


def _shape(trace: Trace) -> set[tuple]:
    """Each node as (prefix tokens, probability to 4 places, rank, status)."""
    return {(tuple(trace.tokens(n.id)), round(math.exp(n.logprob), 4), n.rank, n.status) for n in trace.nodes if n.id}


def test_seed_000_worked_example_beam_2():
    """Section 3: each row offers its 2 best tokens (K = 2 per row already holds the best K overall), so step 1
    considers a .5 and b .4, step 2 b-eos .36, a-b .35, a-eos .10 and b-a .02 (b-a and b-b tie at .02: the lower
    token id). b eos finishes, a b is cut at L = 2, the others are pruned."""
    hyps, trace = _seed000(2)
    a, b, e = 1, 2, 0
    assert _shape(trace) == {
        ((a,), 0.5, 0, "running"),
        ((b,), 0.4, 1, "running"),
        ((b, e), 0.36, 0, "finished"),
        ((a, b), 0.35, 1, "unfinished"),
        ((a, e), 0.1, 2, "pruned"),
        ((b, a), 0.02, 3, "pruned"),
    }
    assert [len(s.rows) for s in trace.steps] == [1, 2]  # the model was called with 1, then 2 rows
    assert [trace.tokens(i) for i in trace.result] == [[b, e], [a, b]]
    assert trace.stop_reason.startswith("max_len")
    assert [h.tokens for h in hyps] == [[b, e], [a, b]]


def test_seed_000_every_extension_with_beam_3():
    """With K = 3 every extension of section 3's table is a node: eos .1 finishes at step 1, then the six
    extensions of a and b are ranked together and the beam (3 - 1 finished = 2 slots) keeps b eos and a b."""
    _, trace = _seed000(3)
    a, b, e = 1, 2, 0
    assert _shape(trace) == {
        ((a,), 0.5, 0, "running"),
        ((b,), 0.4, 1, "running"),
        ((e,), 0.1, 2, "finished"),
        ((b, e), 0.36, 0, "finished"),
        ((a, b), 0.35, 1, "unfinished"),
        ((a, e), 0.1, 2, "pruned"),
        ((a, a), 0.05, 3, "pruned"),
        ((b, a), 0.02, 4, "pruned"),
        ((b, b), 0.02, 5, "pruned"),
    }
    assert [trace.tokens(i) for i in trace.result] == [[b, e], [a, b], [e]]


def test_seed_000_length_penalty_scores():
    """alpha = 1: b eos scores ln .36 / 2, a b ln .35 / 2 (eos counted in the length)."""
    _, trace = _seed000(2, alpha=1.0)
    got = {tuple(trace.tokens(i)): trace.nodes[i].score for i in trace.result}
    assert got[(2, 0)] == pytest.approx(math.log(0.36) / 2)
    assert got[(1, 2)] == pytest.approx(math.log(0.35) / 2)


def _top(logp: list[float], m: int) -> list[int]:
    """The m best finite tokens, ties to the lower id (the search's documented order)."""
    finite = [t for t in range(len(logp)) if logp[t] > -math.inf]
    return sorted(finite, key=lambda t: (-logp[t], t))[:m]


CASES = [
    dict(policy="narrow", length_penalty=0.0),
    dict(policy="narrow", length_penalty=1.0, min_len=2),
    dict(policy="pool", early_stopping=False),
    dict(policy="pool", early_stopping=True),
    dict(policy="pool", early_stopping="never", length_penalty=1.0),
    dict(policy="pool", early_stopping=True, patience=1.5),
    dict(policy="pool", exact_exit=True, length_penalty=0.0),
    dict(policy="pool", beam_threshold=1.5),
    dict(policy="narrow", beam_threshold=0.5),
    dict(policy="compete"),
]


@pytest.mark.parametrize("beam", [2, 3])
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_trace_is_what_the_search_did(case, beam):
    v, max_len, seeds = 5, 5, [3, 11, 29]
    multi = MultiToy(v, seeds, scale=2.0)
    opts = SearchOptions(beam, max_len, record_trace=True, **_options(case))
    result = BeamSearch(opts).search(multi.step, multi.init(), BOS, 0)
    assert result.trace is not None and not result.errors
    m = 2 * beam if case["policy"] == "pool" else beam
    for r, (trace, hyps) in enumerate(zip(result.trace, result.hypotheses, strict=True)):
        assert trace is not None and trace.request_id == r
        model = multi.single(r)
        nodes = trace.nodes
        # every returned hypothesis is a path of the tree, with its numbers
        assert [trace.tokens(i) for i in trace.result] == [h.tokens for h in hyps]
        for i, h in zip(trace.result, hyps, strict=True):
            assert nodes[i].logprob == pytest.approx(h.logprob)
            assert nodes[i].score == pytest.approx(h.score)
            assert nodes[i].status == ("finished" if h.finished else "unfinished")
            assert nodes[i].evicted is None
        # the returned ones are exactly the pool entries never evicted
        kept = {n.id for n in nodes if n.status in ("finished", "unfinished") and n.evicted is None}
        assert kept == set(trace.result)
        # only running nodes (and the root) are ever parents
        for n in nodes[1:]:
            assert nodes[n.parent].status in ("root", "running")
            assert n.step == nodes[n.parent].step + 1
        # each running row offered its m best tokens under the model (eos masked below min_len)
        for parent in (n for n in nodes if n.status in ("root", "running")):
            kids = [n for n in nodes if n.parent == parent.id]
            if parent.step + 1 >= len(trace.steps):
                assert not kids  # the request ended before this row was fed to the model
                continue
            prefix = tuple(trace.tokens(parent.id))
            logp = log_softmax_ref(model.logits(prefix))
            if len(prefix) < case.get("min_len", 0):
                logp[0] = -math.inf
            assert sorted(k.token for k in kids) == sorted(_top(logp, m))
            for k in kids:
                assert k.logprob == pytest.approx(model.path_logprob(list(prefix) + [k.token]))
        # the rows of each call are the running nodes of the step before, in rank order
        assert trace.steps[0].rows == [0]
        for s in range(1, len(trace.steps)):
            running = sorted((n for n in nodes if n.step == s - 1 and n.status == "running"), key=lambda n: n.rank)
            assert trace.steps[s].rows == [n.id for n in running]
        assert not [n for n in nodes if n.step == len(trace.steps) - 1 and n.status == "running"]
        assert trace.stop_reason
    # counts match the search's own counters
    traces = [t for t in result.trace if t is not None]
    stats = result.stats
    assert stats.model_calls == max(len(t.steps) for t in traces)
    per_call = [sum(len(t.steps[c].rows) for t in traces if c < len(t.steps)) for c in range(stats.model_calls)]
    assert per_call == stats.rows_per_call
    assert stats.pruned == sum(1 for t in traces for n in t.nodes if n.reason == "threshold")


def _options(case: dict) -> dict:
    out = dict(case)
    if "length_penalty" in out:
        from beamkit.scoring import LengthPenalty

        out["length_penalty"] = LengthPenalty.power(out["length_penalty"])
    return out


def test_pool_evictions_and_stop_reasons_are_recorded():
    """A pool policy with a small pool evicts entries when better ones end; early_stopping=True says so."""
    seen_evicted = 0
    reasons = set()
    for seed in range(12):
        model = ToyModel(4, seed=seed, scale=2.0, eos_bias=1.0)
        opts = SearchOptions(2, 6, policy="pool", early_stopping=False, record_trace=True)
        result = BeamSearch(opts).search(model.step, model.init(), BOS, 0)
        trace = result.trace[0]
        evicted = [n for n in trace.nodes if n.evicted is not None]
        for n in evicted:
            assert n.status in ("finished", "unfinished") and n.id not in trace.result
            assert n.evicted >= n.step
        seen_evicted += len(evicted)
        reasons.add(trace.stop_reason.split(":")[0].split(" ")[0])
    assert seen_evicted > 0
    assert reasons <= {"pool", "max_len", "no"}


def test_tracing_off_changes_nothing_and_keeps_no_trace():
    multi = MultiToy(5, [1, 2], scale=2.0)
    on = BeamSearch(SearchOptions(3, 5, policy="pool", record_trace=True)).search(multi.step, multi.init(), BOS, 0)
    off = BeamSearch(SearchOptions(3, 5, policy="pool")).search(multi.step, multi.init(), BOS, 0)
    assert off.trace is None
    assert on.hypotheses == off.hypotheses
    assert on.stats == off.stats


def _row(seed: int) -> np.ndarray:
    state = np.empty(1, dtype=object)
    state[0] = (seed, ())
    return state


def test_requests_joining_a_running_engine_trace_as_if_alone():
    """Continuous batching: each request's trace equals its trace decoded alone."""
    multi = MultiToy(5, [], scale=2.0)
    engine = Engine(multi.step, beam_size=3, max_len=6, policy="pool", record_trace=True)
    seeds = {engine.add(_row(7), BOS, 0): 7}
    got = {}
    for step in range(20):
        if step in (1, 3):
            seeds[engine.add(_row(step + 40), BOS, 0, beam_size=2)] = step + 40
        for done in engine.step():
            got[done.request_id] = done.trace
        if engine.idle:
            break
    assert set(got) == set(seeds)
    for rid, seed in seeds.items():
        alone = Engine(multi.step, beam_size=3, max_len=6, policy="pool", record_trace=True)
        beam = 3 if rid == 0 else 2
        alone.add(_row(seed), BOS, 0, beam_size=beam)
        (done,) = [c for _ in range(20) for c in alone.step()][:1]
        want, have = done.trace.to_dict(), got[rid].to_dict()
        want.pop("request_id")
        have.pop("request_id")
        assert have == want


def test_cancelled_request_trace_says_so():
    model = ToyModel(5, seed=2)
    engine = Engine(model.step, beam_size=2, max_len=6, record_trace=True)
    rid = engine.add(model.init(), BOS, 0)
    engine.step()
    engine.cancel(rid)
    (done,) = engine.step()
    assert done.error == "cancelled" and done.trace.stop_reason == "cancelled" and done.trace.result == []


def test_json_round_trip_and_vocabulary():
    _, trace = _seed000(2)
    trace.with_vocab(NAMES)
    raw = json.loads(trace.to_json())
    assert [n.get("text") for n in raw["nodes"]] == ["<s>", "a", "b", "eos", "b", "eos", "a"]
    back = Trace.from_json(trace.to_json())
    assert back == trace
    with pytest.raises(TypeError, match="vocab"):
        trace.with_vocab(42)


def test_beam_search_driver_accepts_record_trace():
    """The option reaches every driver built on the engine (the hypotheses are unchanged)."""
    model = ToyModel(4, seed=5)
    a = beam_search(model.step, model.init(), BOS, 0, 2, 4, record_trace=True)
    b = beam_search(model.step, model.init(), BOS, 0, 2, 4)
    assert a == b


def test_static_drawings_hold_every_node():
    """SVG: one <g class="node"> per trace node (parsed as XML); DOT: one node line per trace node and one edge
    per non-root node; HTML: the same SVG plus the trace as JSON."""
    import xml.etree.ElementTree as ET

    _, trace = _seed000(3)
    trace.greedy = [1, 2]
    svg = ET.fromstring(to_svg(trace))
    ns = "{http://www.w3.org/2000/svg}"
    groups = [g for g in svg.iter(f"{ns}g") if "node" in g.get("class", "").split()]
    assert sorted(int(g.get("data-id")) for g in groups) == [n.id for n in trace.nodes]
    classes = {int(g.get("data-id")): g.get("class").split() for g in groups}
    assert all(f"s-{n.status}" in classes[n.id] for n in trace.nodes)
    assert {i for i, c in classes.items() if "greedy" in c} == {1, 5}  # a, then a b (node ids of the tree)
    dot = to_dot(trace)
    assert sum(1 for line in dot.splitlines() if line.strip().startswith("n") and "[label=" in line) == 10
    assert dot.count("->") == 9
    page = to_html(trace, vocab=NAMES)
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page


def test_jupyter_renders_the_trace():
    """_repr_html_ is a fragment (no document wrapper) holding every node, its script scoped to its own id."""
    _, trace = _seed000(3)
    one, two = trace._repr_html_(), trace._repr_html_()
    assert not one.startswith("<!DOCTYPE") and one.count('<g class="node ') == len(trace.nodes)
    ids = [part.split('"')[0] for part in (one + two).split('class="bk-view" id="')[1:]]
    assert len(set(ids)) == 2  # two outputs in one notebook do not share an id


def test_traced_search_takes_the_options_and_raises_for_failed_requests():
    """``traced_search`` passes its options on (``num_return=1``: one hypothesis per request, the same as
    ``search_batch``'s) and, as ``search_batch``, raises ``BatchDecodeError`` carrying the others' results when
    a request fails (NaN logits)."""
    import beamkit
    from beamkit.search.drivers import traced_search
    from tests.toy import BOS, MultiToy

    model = MultiToy(6, seeds=[0, 1, 2])
    hyps, traces = traced_search(model.step, model.init(), BOS, 0, 3, 4, num_return=1)
    assert [len(h) for h in hyps] == [1, 1, 1] and len(traces) == 3
    want = beamkit.search_batch(model.step, model.init(), BOS, 0, 3, 4, num_return=1)
    assert [[h.tokens for h in r] for r in hyps] == [[h.tokens for h in r] for r in want]

    def failing(state, y_prev):
        logits, new = model.step(state, y_prev)
        logits[[s == 1 for s, _ in new]] = np.nan
        return logits, new

    with pytest.raises(beamkit.BatchDecodeError) as err:
        traced_search(failing, model.init(), BOS, 0, 3, 4)
    assert sorted(err.value.errors) == [1] and len(err.value.results[0]) == 3
