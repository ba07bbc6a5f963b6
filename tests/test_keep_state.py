"""``keep_state``: each returned hypothesis carries the state row of the call that chose its last token.

The oracle is the step function's own bookkeeping: its state counts the calls a row has been through (``h``)
and remembers its request (``id``) and its token history (``seq``), so the row a hypothesis keeps must say
``h == len(tokens)``, the right request and exactly the hypothesis's tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import BeamSearch, Engine, SearchOptions

V, EOS = 6, 5
W = np.random.default_rng(3).normal(size=(V, V)) * 2.0


def step(state, y):
    y = np.asarray(y)
    seq = state["seq"].copy()
    seq[np.arange(y.shape[0]), state["h"]] = y  # the token fed at this call, in column h
    return W[y], {"h": state["h"] + 1, "id": state["id"], "seq": seq}


def start(ids):
    n = len(ids)
    return {"h": np.zeros(n, np.int64), "id": np.asarray(ids), "seq": np.full((n, 8), -1, np.int64)}


def check(hyps, request):
    assert hyps
    for h in hyps:
        assert h.state is not None
        assert h.state["h"].tolist() == [len(h.tokens)]
        assert h.state["id"].tolist() == [request]
        # the row fed the last token's parent path: bos, then every token but the last
        fed = h.state["seq"][0]
        assert fed[1 : len(h.tokens)].tolist() == h.tokens[:-1]
        assert (fed[len(h.tokens) :] == -1).all()


@pytest.mark.parametrize("policy", ["narrow", "pool", "compete"])
def test_each_hypothesis_keeps_its_last_row(policy):
    opts = SearchOptions(beam_size=3, max_len=7, policy=policy, keep_state=True)
    result = BeamSearch(opts).search(step, start([0, 1, 2]), 0, EOS)
    for r, hyps in enumerate(result.hypotheses):
        check(hyps, r)


def test_off_by_default_and_results_unchanged():
    plain = BeamSearch(SearchOptions(beam_size=3, max_len=7)).search(step, start([0, 1]), 0, EOS)
    kept = BeamSearch(SearchOptions(beam_size=3, max_len=7, keep_state=True)).search(step, start([0, 1]), 0, EOS)
    assert all(h.state is None for hs in plain.hypotheses for h in hs)
    assert plain.hypotheses == kept.hypotheses  # the state is not compared: the searches agree


def test_requests_joining_mid_flight_keep_their_own_rows():
    engine = Engine(step, beam_size=2, max_len=6, keep_state=True)
    first = engine.add(start([0]), 0, EOS)
    engine.step()
    second = engine.add(start([1]), 0, EOS)
    done = {}
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    check(done[first].hypotheses, 0)
    check(done[second].hypotheses, 1)


def test_keep_state_must_be_a_bool():
    with pytest.raises(TypeError, match="keep_state"):
        SearchOptions(beam_size=1, max_len=1, keep_state=1)
