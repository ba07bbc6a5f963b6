"""Requests joining the Hugging Face step functions mid-flight in ``beamkit.Engine`` (continuous batching).

Property: whatever joins, leaves or is cancelled around it, at whatever step, every request gets the same
tokens and scores (1e-5) as that request decoded alone with ``beamkit.hf.generate`` (itself checked against
``model.generate`` in ``test_hf.py``). Prompts are rows of a left-padded batch with some of their padding cut,
so the joining prompts have different widths.
"""

from __future__ import annotations

import copy
import functools
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit  # noqa: E402
import beamkit.hf as bh  # noqa: E402
import beamkit.search  # noqa: E402
from tests.test_hf import MODELS, setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NEW = 8


def _requests(ids, mask, rng):
    """Eight requests: a row each, with a random part of its left padding cut; random beam options."""
    out = []
    for i in range(ids.shape[0]):
        pad = int((mask[i] == 0).sum())
        cut = int(rng.integers(0, pad + 1))
        out.append(
            dict(
                ids=ids[i : i + 1, cut:],
                mask=mask[i : i + 1, cut:],
                beam_size=int(rng.integers(1, 5)),
                early_stopping=[True, False, "never"][int(rng.integers(0, 3))],
                length_penalty=float(rng.choice([0.0, 1.0, 2.0])),
                arrival=int(rng.integers(0, 6)),
            )
        )
    return out


@functools.cache
def _plain(name, device=None):
    """The test model with a generation config that adds no processor (BART's forced eos and what other tests
    put in the shared config stay out: the engine here runs without processors), on ``device`` (default: the
    CPU)."""
    model, ids, mask, eos, pad = setup(name, device)
    model = copy.deepcopy(model)
    start = getattr(model.config, "decoder_start_token_id", None)
    model.generation_config = transformers.GenerationConfig(decoder_start_token_id=start)
    return model, ids, mask, eos, pad


def _alone(model, r, eos, pad):
    """The request decoded alone by beamkit.hf.generate: its hypotheses."""
    n = r["beam_size"]
    out = bh.generate(
        model,
        r["ids"],
        r["mask"],
        num_beams=n,
        num_return_sequences=min(2, n),
        max_new_tokens=NEW,
        early_stopping=r["early_stopping"],
        length_penalty=r["length_penalty"],
        eos_token_id=eos,
        pad_token_id=pad,
        return_dict_in_generate=True,
    )
    return out.hypotheses[0]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", MODELS)
def test_joining_requests_decode_as_alone(name, seed, device):
    model, ids, mask, eos, pad = _plain(name, device)
    rng = np.random.default_rng(seed)
    reqs = _requests(ids, mask, rng)
    encdec = bool(model.config.is_encoder_decoder)
    step = bh.EncoderDecoderStep(model) if encdec else bh.DecoderOnlyStep(model)
    start = int(model.config.decoder_start_token_id) if encdec else 0
    engine = beamkit.Engine(step, beam_size=1, max_len=NEW, policy="pool")
    cancelled = int(rng.integers(0, len(reqs)))
    ids_of: dict[int, int] = {}
    done: dict[int, beamkit.search.Completed] = {}
    t = 0
    with torch.inference_mode():
        while len(ids_of) < len(reqs) or not engine.idle:
            for k, r in enumerate(reqs):
                if r["arrival"] == t and k not in ids_of.values():
                    rid = engine.add(
                        step.init_state(r["ids"], r["mask"]),
                        start,
                        eos,
                        beam_size=r["beam_size"],
                        num_return=min(2, r["beam_size"]),
                        early_stopping=True if r["beam_size"] == 1 else r["early_stopping"],
                        length_penalty=r["length_penalty"],
                    )
                    ids_of[rid] = k
            if t == 3 and cancelled in ids_of.values():
                engine.cancel(next(i for i, k in ids_of.items() if k == cancelled))
            for c in engine.step():
                done[c.request_id] = c
            t += 1
            assert t < 100
    assert max(step.stats.rows_per_call) > 1
    joined = engine.stats.joined_per_call
    assert any(n and i for i, n in enumerate(joined)), joined  # some requests joined running rows mid-flight
    for rid, k in ids_of.items():
        got = done[rid]
        if k == cancelled and got.error == "cancelled":
            continue
        assert got.error is None, got.error
        want = _alone(model, reqs[k], eos, pad)
        assert [h.tokens for h in got.hypotheses] == [h.tokens for h in want], (k, reqs[k])
        np.testing.assert_allclose([h.score for h in got.hypotheses], [h.score for h in want], atol=1e-5, rtol=0)
        for g, w in zip(got.hypotheses, want, strict=True):
            np.testing.assert_allclose(g.token_logprobs, w.token_logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kv", ["paged", "dense"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_cache_narrows_to_the_longest_live_request(name, kv, device):
    """A request of 30 new tokens runs alone; at step 20 a request with a 3-token prompt joins; the long one leaves
    after its 30th token. From then on the cache spans the joined request's own positions (3 prompt tokens + the
    tokens it has been fed), not the 7 + 30 columns the engine has run; and it still decodes as alone."""
    model, ids, mask, eos, pad = _plain(name, device)
    step = bh.DecoderOnlyStep(model, kv=kv)
    widths: list[tuple[int, int]] = []  # (rows, cache width) seen by each decoding step

    def recording(state, y_prev):
        if isinstance(state, bh.CacheRows):
            widths.append((int(state.row_request.shape[0]), state.length))
        return step(state, y_prev)

    engine = beamkit.Engine(recording, beam_size=1, max_len=40, policy="pool")
    long_mask = torch.ones_like(ids[:1])
    short = dict(ids=ids[1:2, -3:], mask=torch.ones_like(ids[1:2, -3:]), beam_size=1, early_stopping=True,
                 length_penalty=1.0)  # fmt: skip
    none = []  # no eos: both requests run to their max_len
    done = {}
    with torch.inference_mode():
        first = engine.add(step.init_state(ids[:1], long_mask), 0, none, max_len=30)
        for t in range(60):
            if t == 20:
                second = engine.add(step.init_state(short["ids"], short["mask"]), 0, none, max_len=25)
            for c in engine.step():
                done[c.request_id] = c
            if engine.idle and t > 20:
                break
    assert set(done) == {first, second}
    # decoding call k (call 0 runs the prompt) finds 7 + k - 1 columns; the short request's prompt runs apart at
    # call 20 and merges at call 21 (the long request then spans 7 + 20 columns)
    assert widths[:19] == [(1, 7 + k - 1) for k in range(1, 20)], widths
    assert widths[19] == (2, 27), widths
    last_pair = max(i for i, (rows, _) in enumerate(widths) if rows == 2)
    after = widths[last_pair + 1 :]  # the short request alone again: 24 calls feed its tokens 1..24
    fed = 24 - len(after)  # tokens it had been fed before the long one left
    assert fed > 0 and after, widths
    assert [w for _, w in after] == list(range(3 + fed, 3 + fed + len(after))), widths  # untrimmed: from 36 on
    want = bh.generate(model, short["ids"], short["mask"], num_beams=1, max_new_tokens=25, eos_token_id=None,
                       pad_token_id=pad, return_dict_in_generate=True).hypotheses[0]  # fmt: skip
    got = done[second].hypotheses
    assert [h.tokens for h in got] == [h.tokens for h in want]
    np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5, rtol=0)
