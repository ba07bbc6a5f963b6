"""The shipped dates models in the step-wise Engine: requests that join a running search mid-flight (caches of
different lengths, sources of different lengths) get what they get decoded alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from beamkit import Engine, search_batch  # noqa: E402
from beamkit.models import load_model  # noqa: E402
from beamkit.models.common import encode_sources, pad_batch  # noqa: E402

SOURCES = [
    "3rd of March 1999",
    "1/2/03",
    "Tuesday, 14 September 2021",
    "march 7 1987",
    "the 21st of december 2010",
    "12.10.1955",
    "Sat Jan 1 2000",
]


@pytest.fixture(scope="module", params=["dates-seq2seq", "dates-transformer"])
def model(request, one_torch_thread):
    return load_model(request.param)


def _on(model, device):
    """``model`` on ``device`` (a copy: the module's model stays on the CPU)."""
    return model if device.type == "cpu" else copy.deepcopy(model).to(device)


def _state(model, text: str):
    src, lengths = pad_batch(encode_sources(model.src_vocab, [text]), model.src_vocab.pad)
    device = model.out.weight.device
    return model.init_state(torch.as_tensor(src, device=device), torch.as_tensor(lengths, device=device))


@pytest.mark.parametrize("seed", range(3))
def test_requests_joining_mid_flight_equal_alone(model, seed, device):
    model = _on(model, device)
    rng = np.random.default_rng(seed)
    tv = model.tgt_vocab
    plan = [
        {
            "text": text,
            "arrive": int(rng.integers(0, 8)),
            "beam_size": int(rng.integers(1, 6)),
            "length_penalty": float(rng.choice([0.0, 1.0])),
            "cancel": int(rng.integers(1, 6)) if rng.random() < 0.2 else None,
        }
        for text in SOURCES
    ]
    engine = Engine(model.step, max_len=12, policy="pool", early_stopping=bool(seed % 2))
    ids, done, cancelled = {}, {}, set()
    with torch.inference_mode():
        for step in range(60):
            for i, p in enumerate(plan):
                if p["arrive"] == step:
                    opts = {"beam_size": p["beam_size"], "length_penalty": p["length_penalty"]}
                    ids[i] = engine.add(_state(model, p["text"]), tv.bos, tv.eos, **opts)
                if p["cancel"] is not None and p["arrive"] + p["cancel"] == step and engine.cancel(ids[i]):
                    cancelled.add(i)
            for c in engine.step():
                done[c.request_id] = c
            if len(ids) == len(plan) and engine.idle:
                break
        assert engine.idle and len(done) == len(plan)
        assert max(engine.stats.joined_per_call) >= 1 and engine.stats.model_calls > 12
        for i, p in enumerate(plan):
            got = done[ids[i]]
            if i in cancelled:
                assert got.error == "cancelled"
                continue
            assert got.error is None
            alone = search_batch(
                model.step,
                _state(model, p["text"]),
                tv.bos,
                tv.eos,
                p["beam_size"],
                12,
                policy="pool",
                early_stopping=bool(seed % 2),
                length_penalty=p["length_penalty"],
            )[0]
            assert [h.tokens for h in got.hypotheses] == [h.tokens for h in alone]
            np.testing.assert_allclose(
                [h.logprob for h in got.hypotheses], [h.logprob for h in alone], rtol=0, atol=1e-5
            )
            np.testing.assert_allclose([h.score for h in got.hypotheses], [h.score for h in alone], rtol=0, atol=1e-5)


def test_memory_of_finished_requests_is_dropped_when_others_join(model):
    tv = model.tgt_vocab
    engine = Engine(model.step, beam_size=2, max_len=12)
    with torch.inference_mode():
        for text in SOURCES:
            engine.add(_state(model, text), tv.bos, tv.eos)
            engine.step()
            engine.step()
        state = engine._state
        live = len(set(engine._rows.req.tolist()))
        memory = state.memory if hasattr(state, "memory") else state.cross
        rows_of_memory = memory.value[-1].shape[0]  # the source mask: one row per request kept
        assert rows_of_memory <= live + 1  # only requests still decoding (and the one that just joined)
        while not engine.idle:
            engine.step()
