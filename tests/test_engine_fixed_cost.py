"""A step's host work is a fixed number of operations whatever the number of requests.

Both batches are large enough (rows x V) for the same selection path (the compiled scan where numba is
installed, numpy's otherwise): the count compares one algorithm at two sizes.

Per-request Python runs only on events (a request joins, ends or fails). The check counts the Python-level calls
(functions and builtin methods, as ``sys.setprofile`` reports them) one ``Engine.step`` makes, for a batch of few
requests and for one of many, all with the same dynamics and no event at that step: the two counts must be equal.
A loop over requests (or rows) in the step shows as calls that grow with the batch. No timing is measured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from beamkit import Engine, NoRepeatNGram

V, EOS, BOS, STEPS = 400, 0, 1, 12
CONTEXTS = 50  # the logits depend on the previous token modulo this


def _table() -> np.ndarray:
    """Logits by (step, previous token): every request follows the same model; the stop token is never likely
    enough to be chosen before ``max_len``, so no request ends in the steps counted."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((STEPS + 1, CONTEXTS, V)) * 2.0  # shape: (steps, contexts, V)
    table[:, :, EOS] = -40.0
    return table


TABLE = _table()


def step_fn(state: np.ndarray, y_prev: Any) -> tuple[np.ndarray, np.ndarray]:
    """``state`` holds each row's step count; the logits are ``TABLE[t, y_prev % CONTEXTS]``."""
    t = state[:, 0]
    logits = TABLE[t, np.asarray(y_prev) % CONTEXTS]  # shape: (rows, V)
    return logits, state + 1


def calls_in(fn: Callable[[], Any]) -> int:
    """How many Python functions and builtin functions / methods ``fn`` calls (nested calls included)."""
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(tracer)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def step_calls(n: int, counted_step: int, **options: Any) -> int:
    """The calls of step ``counted_step`` (0-based) of an engine running ``n`` identical requests (the second of
    two such engines: the first pays for what is built once, a compiled kernel or a lazy import)."""
    _step_calls(n, counted_step, **options)
    return _step_calls(n, counted_step, **options)


def _step_calls(n: int, counted_step: int, **options: Any) -> int:
    engine = Engine(step_fn, beam_size=4, max_len=STEPS, **options)
    engine.add_batch(np.zeros((n, 1), np.int64), BOS, EOS)
    for _ in range(counted_step):
        assert engine.step() == []
    count = calls_in(engine.step)
    assert engine.running == n  # nothing ended: the step counted had no event
    return count


@pytest.mark.parametrize("policy", ["narrow", "pool", "compete"])
@pytest.mark.parametrize("counted_step", [1, 4])
def test_a_step_costs_the_same_calls_for_few_and_many_requests(policy: str, counted_step: int) -> None:
    few, many = step_calls(3, counted_step, policy=policy), step_calls(60, counted_step, policy=policy)
    assert few == many, f"{policy}: {few} calls a step with 3 requests, {many} with 60"


def test_the_same_holds_with_processors_and_a_minimum_length() -> None:
    """The processors' path (a normalised copy, stop tokens masked below ``min_len``): one run of rows, so one
    processor call, whatever the number of requests."""
    options = {"policy": "pool", "processors": [NoRepeatNGram(2)], "min_len": 6}
    assert step_calls(3, 3, **options) == step_calls(60, 3, **options)


def test_the_counter_sees_a_loop_over_requests() -> None:
    """The check can fail: a step that does Python work per request counts more calls with more requests."""

    def per_request(n: int) -> Callable[[], None]:
        def step() -> None:
            for r in range(n):
                abs(r)

        return step

    assert calls_in(per_request(3)) < calls_in(per_request(60))
