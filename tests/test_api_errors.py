"""Bad input to the Python API: one clear error naming the argument, and one bad request never fails the others.

Each test states the expected outcome by hand (the error type and the words it must name, or the results a
request gets decoded alone), never by calling the code under test for the answer.
"""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import Engine, search_batch
from tests.toy import BOS, ToyModel

EOS = 0


def _drain(engine: Engine) -> dict:
    done = {}
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    return done


# ------------------------------------------------------------------------------------------- joining the engine
@pytest.mark.parametrize("bad", [np.zeros(1), np.zeros(1, dtype=np.int64), np.array([True])])
def test_a_request_joining_with_a_state_of_another_kind_fails_alone(bad):
    m = ToyModel(4)
    engine = Engine(m.step, beam_size=2, max_len=3)
    a = engine.add(m.init(), BOS, EOS)
    engine.step()  # a is running
    b = engine.add(bad, BOS, EOS)  # a number array where the running rows hold prefixes (an object array)
    done = _drain(engine)
    assert done[b].hypotheses == [] and done[b].error.startswith("cannot join the running state: ")
    assert "object" in done[b].error
    alone = search_batch(m.step, m.init(), BOS, EOS, 2, 3)[0]
    assert done[a].error is None
    assert [(h.tokens, h.logprob) for h in done[a].hypotheses] == [(h.tokens, h.logprob) for h in alone]


def test_a_float_state_joining_int_rows_fails_alone():
    def step(state, y_prev):  # the state is a step counter per row
        logits = np.tile(np.array([0.0, 1.0, 0.5]), (state.shape[0], 1))
        assert state.dtype == np.int64, "the running rows' state changed type"
        return logits, state + 1

    engine = Engine(step, beam_size=2, max_len=2)
    a = engine.add(np.zeros(1, dtype=np.int64), BOS, EOS)
    engine.step()
    b = engine.add(np.zeros(1), BOS, EOS)
    done = _drain(engine)
    assert done[a].error is None and [h.tokens for h in done[a].hypotheses] == [[1, 1], [1, 2]]
    assert "float64" in done[b].error and "int64" in done[b].error
