"""Scores used as given (``extras={"log_softmax": False}``): rows with NaN or +inf fail their request with the
message a normalised step gets, an all ``-inf`` row offers no candidate, and finite rows keep their scores as
they are. Oracles are hand-worked: a two-row toy whose scores are fixed per request and step."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from beamkit import Engine

EOS = 0
V = 4


def _raw_step(rows_of: dict[int, list[float]], torch_out: bool = False, device=None):
    """A step whose row i (request i, one row each while at step 0) returns ``rows_of[i]`` as raw scores (a torch
    tensor on ``device`` with ``torch_out``)."""

    def step(state, y_prev):
        seeds = np.asarray(state).ravel()
        scores = np.array([rows_of[int(s)] for s in seeds], dtype=np.float32)  # shape: (rows, V)
        if torch_out:
            import torch

            scores = torch.from_numpy(scores).to(device)
        return scores, state, {"log_softmax": False}

    return step


def _run(rows_of: dict[int, list[float]], torch_out: bool = False, device=None):
    engine = Engine(_raw_step(rows_of, torch_out, device), beam_size=2, max_len=1)
    ids = engine.add_batch(np.arange(len(rows_of)).reshape(-1, 1), 1, EOS)
    done = {}
    while not engine.idle:
        done.update({c.request_id: c for c in engine.step()})
    return [done[i] for i in ids]


@pytest.mark.parametrize(
    "torch_out,device",
    [pytest.param(False, "cpu", id="numpy"), pytest.param(True, "cpu", id="torch-cpu"),
     pytest.param(True, "cuda", id="torch-cuda")],
    indirect=["device"],
)  # fmt: skip
def test_raw_scores_bad_rows_fail_as_normalised_ones(torch_out: bool, device) -> None:
    if torch_out:
        pytest.importorskip("torch")
    inf, nan = float("inf"), float("nan")
    rows_of = {
        0: [-1.0, -0.5, -2.0, -3.0],  # finite: the two best, as given
        1: [-1.0, nan, -2.0, -3.0],  # NaN: the request fails
        2: [-1.0, inf, -2.0, -3.0],  # +inf: fails
        3: [nan, inf, -2.0, -3.0],  # both: NaN is named
        4: [-inf, -inf, -inf, -inf],  # nothing finite: no candidate
        5: [-inf, -inf, -0.25, -inf],  # one finite candidate
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the failures are reported, not warned about by numpy
        out = _run(rows_of, torch_out, device)
    assert out[0].error is None
    assert [(h.tokens, h.logprob) for h in out[0].hypotheses] == [([1], -0.5), ([0], -1.0)]
    assert out[1].error == "step_fn returned NaN logits at step 0"
    assert out[2].error == "step_fn returned +inf logits at step 0"
    assert out[3].error == "step_fn returned NaN logits at step 0"
    assert out[4].error is not None and out[4].error.startswith("no finite candidate at step 0")
    assert out[5].error is None
    assert [(h.tokens, h.logprob) for h in out[5].hypotheses] == [([2], -0.25)]
