"""Greedy decoding without the beam machinery (beamkit.search.greedy), against two oracles: the engine's own
one-beam search (the full machinery: candidates, ranking, pools), which must give identical tokens, scores and
errors, and Hugging Face's greedy ``model.generate(do_sample=False, num_beams=1)`` on tiny seeded models."""

from __future__ import annotations

import os

import numpy as np
import pytest

from beamkit import Engine, SearchOptions
from beamkit.processors import RepetitionPenalty, StepContext
from beamkit.search import drivers
from beamkit.search.drivers import BeamSearch
from beamkit.search.greedy import greedy_applies, greedy_search
from tests.toy import BOS, ToyModel


def engine_search(options: SearchOptions, step, init, bos, eos, n: int):
    """The engine's one-beam results (every request added at once, stepped until idle): the full machinery."""
    engine = Engine(step, options, on_step_error="raise")
    ids = engine.add_batch(init, bos, eos, n)
    done = {}
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    return [done[i].hypotheses for i in ids], {k: done[i].error for k, i in enumerate(ids) if done[i].error}


def fields(hyps):
    """Everything a hypothesis reports, for an exact comparison."""
    return [
        [(h.tokens, h.logprob, h.score, h.finished, h.token_logprobs, h.beam_indices, h.key) for h in hs] for hs in hyps
    ]


class Ban:
    """A processor that bans token 3 on odd steps and records the contexts it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[list[int]], list[int]]] = []

    def __call__(self, scores, ctx: StepContext):
        self.seen.append((ctx.step, ctx.tokens.tolist(), ctx.request.tolist()))
        if ctx.step % 2:
            scores[:, 3] = -np.inf
        return scores


class Counter:
    """A carrying processor: each row counts its own steps in ``ctx.carry`` and bans token ``count % 5``."""

    carries = True

    def __call__(self, scores, ctx: StepContext):
        ctx.carry[:] = np.where(ctx.carry < 0, 0, ctx.carry + 1)
        scores[np.arange(scores.shape[0]), ctx.carry % 5] = -np.inf
        return scores


CASES = {
    "plain": dict(max_len=9),
    "narrow": dict(max_len=9, policy="narrow"),
    "compete": dict(max_len=9, policy="compete"),
    "pool-early": dict(max_len=9, policy="pool", early_stopping=True),
    "pool-bound": dict(max_len=9, policy="pool", length_penalty=1.0),
    "min_len": dict(max_len=9, min_len=4),
    "alpha": dict(max_len=6, length_penalty=0.7),
    "processors": dict(max_len=9, processors=(Ban(),)),
    "process-logits": dict(max_len=9, processors=(RepetitionPenalty(1.8),), process_logits=True, min_len=2),
    "carry": dict(max_len=9, processors=(Counter(),)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("eos", [0, (0, 4), None])
def test_greedy_equals_the_engine_with_one_beam(case, eos):
    """Tokens, log-probabilities, token log-probabilities, scores, finished flags, beam indices and keys are
    identical, float for float, to the engine's one-beam search; requests end at varied steps (an eos bias)."""
    opts = SearchOptions(beam_size=1, **CASES[case])
    assert greedy_applies(opts)
    want_model, got_model = ToyModel(12, seed=3, eos_bias=1.5), ToyModel(12, seed=3, eos_bias=1.5)
    bos = [1, 2, 3, 5, 6, 7, 8]  # distinct start tokens: the requests' prefixes differ
    n = len(bos)
    want, want_err = engine_search(opts, want_model.step, want_model.init(n), bos, eos, n)
    got = greedy_search(opts, got_model.step, got_model.init(n), bos, eos)
    assert fields(got.hypotheses) == fields(want)
    assert got.errors == want_err
    assert got_model.calls == want_model.calls  # the same rows sent at each call (finished requests leave)
    lengths = {len(h[0].tokens) for h in got.hypotheses}
    assert eos is None or len(lengths) > 1  # the case exercises requests ending at different steps


def test_beam_search_takes_the_greedy_path_for_one_beam(monkeypatch):
    """BeamSearch runs plain one-beam searches through greedy_search (same results); a beam of two, a pool
    that can hold more than one, or a recorded trace go to the engine."""
    calls = []
    real = drivers.greedy_search
    monkeypatch.setattr(drivers, "greedy_search", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = ToyModel(9, seed=1, eos_bias=1.0)
    for opts, greedy in [
        (SearchOptions(beam_size=1, max_len=6), True),
        (SearchOptions(beam_size=1, max_len=6, policy="narrow"), True),
        (SearchOptions(beam_size=2, max_len=6), False),
        (SearchOptions(beam_size=1, max_len=6, policy="pool", patience=3.0), False),
        (SearchOptions(beam_size=1, max_len=6, policy="pool", early_stopping="never"), False),
        (SearchOptions(beam_size=1, max_len=6, record_trace=True), False),
        (SearchOptions(beam_size=1, max_len=6, keep_state=True), False),
    ]:
        calls.clear()
        result = BeamSearch(opts).search(model.step, model.init(4), BOS, 0)
        assert bool(calls) is greedy, opts
        assert greedy_applies(opts) is greedy
        want, _ = engine_search(opts, model.step, model.init(4), BOS, 0, 4)
        assert fields(result.hypotheses) == fields(want)


def test_greedy_errors_as_the_engine():
    """A request whose logits turn NaN, one whose every token is masked, and a stop token outside the vocabulary
    fail as in the engine (same messages), the other requests' results kept."""

    def step(state, y):
        y = np.asarray(y)
        out = np.tile(np.linspace(0.0, 1.0, 6), (len(state), 1))
        for i, s in enumerate(state):
            if s == 1 and y[i] == 5:
                out[i] = np.nan
            if s == 2:
                out[i] = -np.inf
        return out, state

    init = np.array([0, 1, 2, 3])
    opts = SearchOptions(beam_size=1, max_len=4)
    got = greedy_search(opts, step, init, 9, 0)
    want, want_err = engine_search(opts, step, init, 9, 0, 4)
    assert fields(got.hypotheses) == fields(want)
    assert got.errors == want_err and set(want_err) == {1, 2}
    got = greedy_search(opts, step, init, 9, 6)
    want, want_err = engine_search(opts, step, init, 9, 6, 4)
    assert got.errors == want_err and len(want_err) == 4


def test_greedy_refuses_options_it_cannot_run():
    """greedy_search called directly with a beam of two is a clear error, not a silent beam-one search."""
    model = ToyModel(5)
    with pytest.raises(ValueError, match="greedy_applies"):
        greedy_search(SearchOptions(beam_size=2, max_len=3), model.step, model.init(1), BOS, 0)


# ----------------------------------------------------------------------------------------------- Hugging Face
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("name", ["gpt2", "t5"])
@pytest.mark.parametrize(
    "extra",
    [{}, {"repetition_penalty": 1.5, "min_new_tokens": 3}, {"no_repeat_ngram_size": 2}],
    ids=["plain", "penalty-min", "ngram"],
)
def test_hf_greedy_matches_hugging_face(name, extra, monkeypatch, device, kinds):
    """beamkit.hf.generate with num_beams=1 (the greedy path, a dense cache) gives Hugging Face's greedy
    sequences exactly, and the engine's one-beam search gives the same hypotheses."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import beamkit.hf as bh
    from tests.test_hf import setup

    model, ids, mask, eos, pad = setup(name, device)
    kw = dict(num_beams=1, do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=pad, **extra)
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    got = bh.generate(model, input_ids=ids, attention_mask=mask, return_dict_in_generate=True, **kw)
    assert torch.equal(got.sequences, want)
    assert kinds == ([] if name == "t5" else ["dense"])
    # the full machinery (the engine's one-beam search) on the same call: identical hypotheses
    monkeypatch.setattr(drivers, "greedy_applies", lambda options: False)
    full = bh.generate(model, input_ids=ids, attention_mask=mask, return_dict_in_generate=True, **kw)
    assert torch.equal(full.sequences, want)
    assert fields(full.hypotheses) == fields(got.hypotheses)


def test_greedy_hands_y_prev_in_the_state_library(device):
    """As in the engine, ``y_prev`` follows the state's library (and device) at the first call and the logits'
    after."""
    torch = pytest.importorskip("torch")
    seen: dict[str, list[tuple[str, str]]] = {"engine": [], "greedy": []}

    def make(kind):
        def step(state, y):
            seen[kind].append((type(y).__module__.split(".")[0], y.device.type))
            return torch.zeros(state.shape[0], 5, dtype=torch.float64, device=device), state

        return step

    opts = SearchOptions(beam_size=1, max_len=3)
    engine_search(opts, make("engine"), torch.zeros(2, 1, device=device), 1, None, 2)
    greedy_search(opts, make("greedy"), torch.zeros(2, 1, device=device), 1, None)
    assert seen["greedy"] == seen["engine"] == [("torch", device.type)] * 3


def test_greedy_below_min_len_takes_the_best_other_token():
    """Hand-worked: logits [3, 2, 3, 2, 1] with stop ids 0 and 2 tied at the top: below min_len the token is 1
    (value 2, tied with 3: the lower id), its log-probability normalised over all five logits; from min_len on
    the stop token 0 wins (tied with 2: the lower id). A vocabulary of stop tokens only has nothing to choose."""
    import math

    row = np.array([3.0, 2.0, 3.0, 2.0, 1.0])
    lse = math.log(sum(math.exp(x) for x in row))

    def step(state, y_prev):
        return np.tile(row, (len(y_prev), 1)), state

    got = greedy_search(SearchOptions(beam_size=1, max_len=5, min_len=2), step, np.zeros((1, 1)), BOS, (0, 2))
    (hyp,) = got.hypotheses[0]
    assert hyp.tokens == [1, 1, 0] and hyp.finished
    assert hyp.token_logprobs == pytest.approx([2.0 - lse, 2.0 - lse, 3.0 - lse], abs=1e-12)

    def stops_only(state, y_prev):
        return np.zeros((len(y_prev), 2)), state

    bad = greedy_search(SearchOptions(beam_size=1, max_len=3, min_len=1), stops_only, np.zeros((1, 1)), BOS, (0, 1))
    assert "no finite candidate at step 0" in bad.errors[0]
