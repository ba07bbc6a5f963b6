"""The compiled decoding step of Hugging Face models (``compile=``, :mod:`beamkit.hf.steps.compiled`): GPT-2 and Llama
here for the decoder-only families; Marian, BART and T5 for the encoder-decoder ones.

Oracles: the direct eager step of the same model (another code path: Hugging Face's ``DynamicCache`` grown by
concatenation, attention over exactly the filled columns, no row padding) step by step, ``model.generate`` for
whole outputs, and a request decoded alone for requests joining mid-flight. Most tests compile with
torch.compile's ``eager`` backend (dynamo's graph capture and guards, the static shapes and the buckets, without
inductor's C++ build, which takes minutes on a loaded 2-core machine); ``BEAMKIT_TEST_INDUCTOR=1`` adds inductor
(``make gpu-check`` sets it).

Tolerance, float32: the compiled step attends over every column of its buffers (the unfilled ones weigh exact
zeros) and its backend may reorder sums. A sum of n float32 terms reordered moves by at most (n - 1) u sum|terms|
(u = 2^-24); along the deepest path of a step a value passes through sums of E (width), F (feed-forward) and C
(columns) terms in each layer, so logits agree within (E + F + C) * layers * u * (1 + max|logit|).
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import weakref

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit  # noqa: E402
import beamkit.hf as bh  # noqa: E402
from beamkit.hf.steps import compiled as hc  # noqa: E402
from beamkit.hf.steps.step import DecoderOnlyStep, EncoderDecoderStep  # noqa: E402
from beamkit.models import compiled as compiled_mod  # noqa: E402
from tests.test_hf_direct import _seq2seq  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BACKENDS = ["eager"] + (["inductor"] if os.environ.get("BEAMKIT_TEST_INDUCTOR") == "1" else [])
V = 300
U = 2.0**-24
WIDTH, FF, LAYERS = 64, 96, 2


def _model(family: str):
    """A tiny seeded decoder-only model: 2 layers, 64 wide, 4 heads (2 key/value heads for Llama); eos 2."""
    torch.manual_seed(0)
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=LAYERS, n_embd=WIDTH, n_inner=FF, n_head=4, vocab_size=V, n_positions=256, **ids
        )
        return transformers.GPT2LMHeadModel(cfg).eval()
    if family == "opt":
        cfg = transformers.OPTConfig(
            hidden_size=WIDTH, ffn_dim=FF, num_hidden_layers=LAYERS, num_attention_heads=4, vocab_size=V,
            word_embed_proj_dim=WIDTH, max_position_embeddings=256, **ids,
        )  # fmt: skip
        return transformers.OPTForCausalLM(cfg).eval()
    cfg = transformers.LlamaConfig(
        hidden_size=WIDTH, intermediate_size=FF, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=V, max_position_embeddings=256, **ids,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()


def _prompts(device, n: int = 5):
    """``n`` prompts of 8 ids (3 .. V - 1), left-padded by 0, 3, 1, 0, 5, ... columns."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, V, (n, 8), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(n):
        mask[i, : (0, 3, 1, 0, 5)[i % 5]] = 0
    return ids.to(device), mask.to(device)


def tolerance(columns: int, logits) -> float:
    return (WIDTH + FF + columns) * LAYERS * U * (1.0 + float(logits.abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_compiled_logits_within_float32_of_the_eager_step(family, backend, device):
    """Step by step, through forks, rows leaving and the buffers growing past 64 columns and 8 rows, with the
    same random parents and tokens fed to both: the compiled step's logits are the eager direct step's within
    float32 rounding."""
    model = _model(family).to(device)
    fast = DecoderOnlyStep(model, compile=backend)
    slow = DecoderOnlyStep(model, kv="dense")
    assert fast.compiled is not None and fast.kv == "dense"
    ids, mask = _prompts(device)
    rng = np.random.default_rng(0)
    y = torch.zeros(5, dtype=torch.long, device=device)
    with torch.inference_mode():
        a, b = fast.init_state(ids, mask), slow.init_state(ids, mask)
        for t in range(62):
            la, a = fast(a, y)
            lb, b = slow(b, y)
            assert la.shape == lb.shape
            columns = a.cache.columns if isinstance(a.cache, hc.StaticLayers) else 8
            assert (la - lb).abs().max() <= tolerance(columns, lb), f"step {t}"
            rows = la.shape[0]
            size = rows + 4 if t in (1, 5) else max(1, rows - 2) if t == 40 else rows  # forks, then rows leave
            parents = np.sort(rng.integers(0, rows, size=size)) if t else np.arange(rows)
            if t:
                a, b = a.beamkit_select(parents), b.beamkit_select(parents)
            y = torch.from_numpy(rng.integers(0, V, size=parents.shape[0])).to(device)
    assert isinstance(a.cache, hc.StaticLayers) and a.cache.columns == 128 and a.cache.cap == 16
    assert fast.forward_seconds > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["marian", "bart", "t5"])
def test_compiled_encoder_decoder_logits_within_float32_of_the_eager_step(family, backend, device):
    """Marian, BART and T5: step by step, through the encoder's padding, forks, rows leaving and the decoder buffers
    growing past 64 columns, the compiled decoder step's logits are the eager direct step's within float32."""
    model = _seq2seq(family).to(device)
    fast, slow = EncoderDecoderStep(model, compile=backend), EncoderDecoderStep(model)
    assert fast.compiled is not None
    ids, mask = _prompts(device)
    ids, mask = ids.clamp(max=V - 2), mask.flip(1)  # no pad token inside the source; right-padded
    rng = np.random.default_rng(1)
    y = torch.full((5,), int(model.config.decoder_start_token_id), device=device)
    with torch.inference_mode():
        a, b = fast.init_state(ids, mask), slow.init_state(ids, mask)
        for t in range(66):
            la, a = fast(a, y)
            lb, b = slow(b, y)
            # Marian / BART / T5 here: 64 wide, feed-forward 96, 2 decoder layers; self columns and source bucket
            assert (la - lb).abs().max() <= tolerance(128 + 8, lb), f"step {t}"
            rows = la.shape[0]
            size = rows + 3 if t == 0 else max(1, rows - 2) if t == 30 else rows
            parents = np.sort(rng.integers(0, rows, size=size))
            a, b = a.beamkit_select(parents), b.beamkit_select(parents)
            y = torch.from_numpy(rng.integers(0, V, size=parents.shape[0])).to(device)
    assert a.cache.self_attention_cache.columns == 128 and a.cache.cross_attention_cache.columns == 8


# every family and mode with the eager backend; under inductor one decoder-only and one encoder-decoder family, beam
# 4 (each inductor case compiles two or three graphs: it keeps make gpu-check within its minutes)
GENERATE_CASES = [(f, b, "eager") for f in ("gpt2", "llama", "marian", "bart", "t5") for b in (1, 4)] + [
    (f, 4, backend) for f in ("gpt2", "bart") for backend in BACKENDS[1:]
]


@pytest.mark.parametrize(("family", "beams", "backend"), GENERATE_CASES)
def test_generate_compiled_gives_hugging_faces_tokens(family, beams, backend, device):
    """``beamkit.hf.generate(..., compile=...)`` returns ``model.generate``'s sequences; its scores are the eager
    bridge's within float32 rounding of 40 log-probabilities."""
    seq2seq = family in ("marian", "bart", "t5")
    model = (_seq2seq(family) if seq2seq else _model(family)).to(device)
    ids, mask = _prompts(device)
    kw = dict(num_beams=beams, max_new_tokens=40, do_sample=False)
    if seq2seq:
        ids, mask = ids.clamp(max=V - 2), mask.flip(1)
    else:
        kw.update(eos_token_id=2, pad_token_id=0)
    theirs = model.generate(ids, attention_mask=mask, **kw)
    eager = bh.generate(model, ids, mask, return_dict_in_generate=True, **kw)
    ours = bh.generate(model, ids, mask, return_dict_in_generate=True, compile=backend, **kw)
    assert torch.equal(ours.sequences, theirs)
    a = [h.score for hs in ours.hypotheses for h in hs]
    b = [h.score for hs in eager.hypotheses for h in hs]
    # each log-probability within twice a logit's tolerance (log-softmax), logits below 30 in magnitude here
    assert np.allclose(a, b, rtol=0, atol=40 * 2 * tolerance(64, torch.full((1,), 30.0)))


def test_max_autotune_gives_hugging_faces_tokens_and_follows_changed_weights(caplog):
    """``compile="max-autotune"`` (inductor, matrix products autotuned, the weights frozen into the graphs):
    greedy ``beamkit.hf.generate`` returns ``model.generate``'s sequences, scores within float32 rounding of the
    eager bridge's. Then the weights change in place (enough to change the outputs): the step sees it, compiles
    again and returns the changed model's sequences, not the frozen ones."""
    model = _model("gpt2")
    ids, mask = _prompts("cpu")
    kw = dict(num_beams=1, max_new_tokens=12, do_sample=False, eos_token_id=2, pad_token_id=0)
    results = []
    for change in (False, True):
        if change:
            with torch.no_grad():
                model.transformer.h[1].mlp.c_fc.weight.mul_(-3.0)  # in place: the same tensor, a new version
        theirs = model.generate(ids, attention_mask=mask, **kw)
        eager = bh.generate(model, ids, mask, return_dict_in_generate=True, **kw)
        with caplog.at_level(logging.WARNING, logger="beamkit"):
            ours = bh.generate(model, ids, mask, return_dict_in_generate=True, compile="max-autotune", **kw)
        step = hc.kept_steps(model)["max-autotune"].compiled
        assert step.eager_reason is None, step.eager_reason  # inductor compiled it (a C compiler is at hand)
        assert torch.equal(ours.sequences, theirs)
        a = [h.score for hs in ours.hypotheses for h in hs]
        b = [h.score for hs in eager.hypotheses for h in hs]
        assert np.allclose(a, b, rtol=0, atol=12 * 2 * tolerance(64, torch.full((1,), 30.0)))
        results.append((theirs, step.compilations))
    (before, compiled_before), (after, compiled_after) = results
    assert not torch.equal(before, after)  # the change shows in the outputs: stale weights would be caught
    assert compiled_after == compiled_before + 1
    assert sum("weights changed since its step was compiled" in r.getMessage() for r in caplog.records) == 1


def test_weights_stamp_sees_replaced_and_edited_weights():
    """A weight edited in place, or replaced by another tensor, changes the stamp; reading it does not."""
    model = _model("gpt2")
    stamp = compiled_mod.weights_stamp(model.parameters())
    assert compiled_mod.weights_stamp(model.parameters()) == stamp
    with torch.no_grad():
        model.lm_head.weight.add_(0.0)
    edited = compiled_mod.weights_stamp(model.parameters())
    assert edited != stamp
    model.transformer.ln_f.weight = torch.nn.Parameter(model.transformer.ln_f.weight.detach().clone())
    assert compiled_mod.weights_stamp(model.parameters()) != edited


def test_a_second_call_in_the_same_buckets_compiles_nothing():
    """Graphs are kept per model and bucket: 3 then 4 requests of beam 4 (12 and 16 rows: the 16-row bucket),
    and greedy 3 then 4 rows (the 4-row bucket), compile once per bucket; another step function of the same
    model reuses them."""
    model = _model("gpt2")
    ids, mask = _prompts("cpu", 4)
    kw = dict(max_new_tokens=10, eos_token_id=None, pad_token_id=0, compile="eager")
    bh.generate(model, ids[:3], mask[:3], num_beams=4, **kw)
    after_first = hc.compilations(model)["eager"]
    bh.generate(model, ids, mask, num_beams=4, **kw)
    assert hc.compilations(model)["eager"] == after_first == 1
    bh.generate(model, ids[:3], mask[:3], num_beams=1, **kw)
    bh.generate(model, ids, mask, num_beams=1, **kw)
    assert hc.compilations(model)["eager"] == 2


def _engine_run(step, requests, bos, arrivals, beam=3):
    """Decode ``requests`` (prompt ids, mask) in one ``beamkit.Engine`` (beam 3, 12 tokens, no stop token), each
    added at its step of ``arrivals``: their hypotheses, in order."""
    engine = beamkit.Engine(step, beam_size=beam, max_len=12, policy="pool")
    done, rids = {}, {}
    with torch.inference_mode():
        for t in range(max(arrivals) + 60):
            for k, at in enumerate(arrivals):
                if at == t:
                    rids[engine.add(step.init_state(*requests[k]), bos, [], num_return=beam)] = k
            for c in engine.step():
                assert c.error is None, c.error
                done[rids[c.request_id]] = c.hypotheses
            if engine.idle and len(rids) == len(requests):
                break
    return [done[k] for k in range(len(requests))]


@pytest.mark.parametrize("family", ["gpt2", "bart"])
def test_requests_joining_mid_flight_decode_as_alone(family):
    """In ``beamkit.Engine``, requests joining a compiled search (a decoder-only model's rows here overflow the
    buffers' rows, so they join as a dense cache, copied back into buffers at the next step; an
    encoder-decoder's run as a cohort of their own) get the
    tokens and scores (within float32 rounding) each gets decoded alone by the eager step."""
    ids, mask = _prompts("cpu")
    if family == "bart":
        model = _seq2seq(family)
        ids, mask = ids.clamp(max=V - 2), mask.flip(1)
        bos, make = int(model.config.decoder_start_token_id), EncoderDecoderStep
    else:
        model, bos, make = _model(family), 0, DecoderOnlyStep
    requests = [(ids[k : k + 1], mask[k : k + 1]) for k in (0, 2, 4)]
    step = make(model, compile="eager")
    together = _engine_run(step, requests, bos, (0, 2, 5))
    assert max(step.stats.rows_per_call) > 3  # requests ran together
    for k, got in enumerate(together):
        (alone,) = _engine_run(make(model), requests[k : k + 1], bos, (0,))
        assert [h.tokens for h in got] == [h.tokens for h in alone]
        assert np.allclose([h.score for h in got], [h.score for h in alone], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rows_joining_a_compiled_search_are_written_into_its_buffers(family, monkeypatch):
    """Requests joining a compiled search whose buffers have room for their rows (greedy: one row each, the
    first request's buffers hold four) are written into the running buffers, which are made once: no round trip
    through a dense cache. Each gets the tokens, and the score within float32 rounding, that it gets decoded
    alone by the eager step (the oracle: another code path, no buffers)."""
    made = []
    real = hc.StaticLayers.from_dynamic.__func__

    def counted(cls, *args, **kwargs):
        made.append(1)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(hc.StaticLayers, "from_dynamic", classmethod(counted))
    ids, mask = _prompts("cpu")
    model = _model(family)
    requests = [(ids[k : k + 1], mask[k : k + 1]) for k in (0, 2, 4, 1)]
    step = DecoderOnlyStep(model, compile="eager")
    together = _engine_run(step, requests, 0, (0, 2, 5, 6), beam=1)
    assert max(step.stats.rows_per_call) == 4  # every request ran together at the end
    assert len(made) == 1  # the buffers of the first compiled step took every joining row
    for k, got in enumerate(together):
        (alone,) = _engine_run(DecoderOnlyStep(model), requests[k : k + 1], 0, (0,), beam=1)
        assert [h.tokens for h in got] == [h.tokens for h in alone]
        assert np.allclose([h.score for h in got], [h.score for h in alone], rtol=0, atol=1e-5)


def _lockstep(fast, slow, a, b, y, t: int):
    """One step of the compiled step ``fast`` (state ``a``) and the eager dense ``slow`` (state ``b``) on tokens
    ``y``; their logits must agree within float32 rounding. Returns (rows, a, b)."""
    la, a = fast(a, y)
    lb, b = slow(b, y)
    columns = a.cache.columns if isinstance(a.cache, hc.StaticLayers) else 8  # 8: the prompts' forward
    assert la.shape == lb.shape and (la - lb).abs().max() <= tolerance(columns, lb), f"step {t}"
    return int(la.shape[0]), a, b


def test_buffers_narrow_to_the_rows_left_and_grow_again():
    """16 rows, then 3 (requests left: at most a quarter of the buffers' rows), then 9 (beams forked): the
    buffers narrow to the 4-row bucket, so the steps compute 4 rows, then grow to 16 again; each step's logits
    are the eager dense step's within float32 rounding (the oracle, fed the same parents and tokens)."""
    model = _model("gpt2")
    fast, slow = DecoderOnlyStep(model, compile="eager"), DecoderOnlyStep(model, kv="dense")
    ids, mask = _prompts("cpu", n=16)
    rng = np.random.default_rng(1)
    y = torch.zeros(16, dtype=torch.long)
    caps = []
    with torch.inference_mode():
        a, b = fast.init_state(ids, mask), slow.init_state(ids, mask)
        for t in range(12):
            rows, a, b = _lockstep(fast, slow, a, b, y, t)
            parents = np.arange(rows)
            if t == 3:
                parents = np.array([2, 9, 14])  # requests left
            elif t == 7:
                parents = np.sort(rng.integers(0, rows, size=9))  # forks
            a, b = a.beamkit_select(parents), b.beamkit_select(parents)
            caps.append(a.cache.cap if isinstance(a.cache, hc.StaticLayers) else None)
            y = torch.from_numpy(rng.integers(0, V, size=parents.shape[0]))
    assert caps == [None] + [16] * 2 + [4] * 4 + [16] * 5, caps  # None: the prompts' forward (no buffers yet)


def test_narrowed_buffers_take_joining_rows_and_forks_back_within_their_memory(monkeypatch):
    """16 rows narrow to the 4-row bucket (3 left), then 5 requests join (8 rows) and beams fork (14 rows): the
    buffers widen back within the memory they narrowed, so the joining rows are written into them (no round trip
    through a dense cache) and no new buffers are made. Each step's logits are the eager dense step's within
    float32 rounding (the oracle, fed the same parents, joins and tokens)."""
    made, dense = [], []
    real_from, real_to = hc.StaticLayers.from_dynamic.__func__, hc.StaticLayers.to_dynamic
    monkeypatch.setattr(
        hc.StaticLayers, "from_dynamic", classmethod(lambda c, *a, **k: made.append(1) or real_from(c, *a, **k))
    )
    monkeypatch.setattr(hc.StaticLayers, "to_dynamic", lambda self, *a: dense.append(1) or real_to(self, *a))
    model = _model("gpt2")
    fast, slow = DecoderOnlyStep(model, compile="eager"), DecoderOnlyStep(model, kv="dense")
    ids, mask = _prompts("cpu", n=16)
    joining = _prompts("cpu", n=21)
    rng = np.random.default_rng(2)
    y = torch.zeros(16, dtype=torch.long)
    caps, memory = [], set()
    with torch.inference_mode():
        a, b = fast.init_state(ids, mask), slow.init_state(ids, mask)
        for t in range(12):
            rows, a, b = _lockstep(fast, slow, a, b, y, t)
            parents = np.arange(rows)
            if t == 3:
                parents = np.array([1, 7, 12])  # requests left
            elif t == 8:
                parents = np.sort(rng.integers(0, rows, size=14))  # forks
            a, b = a.beamkit_select(parents), b.beamkit_select(parents)
            y = torch.from_numpy(rng.integers(0, V, size=parents.shape[0]))
            if t == 5:  # five requests join (their prompts: 8 columns, the running rows hold 14)
                new_ids, new_mask = joining[0][16:], joining[1][16:]
                a = a.beamkit_concat([fast.init_state(new_ids, new_mask)])
                b = b.beamkit_concat([slow.init_state(new_ids, new_mask)])
                y = torch.cat([y, torch.zeros(5, dtype=torch.long)])
            if isinstance(getattr(a, "cache", None), hc.StaticLayers):
                caps.append(a.cache.cap)
                memory.update(x.data_ptr() for x in (*a.cache.keys, *a.cache.values, *(a.cache.spare or ())))
    assert caps == [16] * 2 + [4] * 2 + [8] * 2 + [16] * 4, caps  # the steps between: a dense prompt, joining
    assert len(made) == 1 and not dense  # one set of buffers, no dense cache
    assert len(memory) == 2 * 2 * LAYERS  # two sets of keys and values per layer, made once


def test_narrowed_buffers_of_exact_rows_widen_to_their_memory_not_past_it():
    """Buffers of exactly 6 rows (not a bucket: ``exact=True``, as Whisper's) narrowed to 4 take 5 or 6 rows back
    within their 6 (the bucket of 5, 8, would pass their memory), never 7; the live row is kept."""
    cache = transformers.cache_utils.DynamicCache()
    layer = transformers.cache_utils.DynamicLayer()
    layer.lazy_initialization(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    layer.keys, layer.values = torch.randn(6, 2, 5, 8), torch.randn(6, 2, 5, 8)
    cache.layers.append(layer)
    static = hc.StaticLayers.from_dynamic(cache, exact=True)
    static.reorder_cache(torch.tensor([3]))  # one row left: narrowed to the 4-row bucket
    assert (static.cap, static.room) == (4, 6)
    assert static.widen(5) and static.cap == 6 and static.room == 6
    assert torch.equal(static.keys[0][0, :, :5], layer.keys[3]) and torch.equal(
        static.values[0][0, :, :5], layer.values[3]
    )
    assert not static.widen(7) and static.cap == 6


def test_a_busy_compiled_search_trims_its_buffers_when_full_instead_of_growing(monkeypatch):
    """Requests arriving every 8 steps for 80 steps, each running 12 (greedy, no stop token), so the engine is
    never idle: without trimming, its rows would span 8 + 80 columns (the 128-column bucket); the columns no live
    row attends to are dropped once the 64-column buffers are full, so they never grow and are made once. Every
    request gets what the eager step gives it alone."""
    made, grown = [], []
    real = hc.StaticLayers.from_dynamic.__func__
    monkeypatch.setattr(
        hc.StaticLayers, "from_dynamic", classmethod(lambda c, *a, **k: made.append(1) or real(c, *a, **k))
    )
    real_resized, real_trim, trims = hc.StaticLayers._resized, hc.StaticLayers.trim, []
    monkeypatch.setattr(hc.StaticLayers, "_resized", lambda self, *a: grown.append(1) or real_resized(self, *a))
    monkeypatch.setattr(hc.StaticLayers, "trim", lambda self, drop: trims.append(drop) or real_trim(self, drop))
    ids, mask = _prompts("cpu", n=10)
    model = _model("gpt2")
    requests = [(ids[k : k + 1], mask[k : k + 1]) for k in range(10)]
    step = DecoderOnlyStep(model, compile="eager")
    together = _engine_run(step, requests, 0, tuple(8 * k for k in range(10)), beam=1)
    assert step.stats.model_calls > 80 and not grown and len(made) == 1
    # trimmed only when full: at step 56 the rows span columns 0..63, of which the oldest live request (arrived
    # at step 48, the one before it has left) attends to its own only, which start at column 48 plus its
    # prompt's 3 masked ones (the left padding of _prompts' 7th row): 51 go; the buffers do not fill again
    assert trims == [51], trims
    for k, got in enumerate(together):
        (alone,) = _engine_run(DecoderOnlyStep(model), requests[k : k + 1], 0, (0,), beam=1)
        assert [h.tokens for h in got] == [h.tokens for h in alone]
        assert np.allclose([h.score for h in got], [h.score for h in alone], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_sampling_compiled_draws_the_eager_samples(family):
    """Sampling (top-k 20) with the same seed: the compiled step's logits are within float32 rounding of the
    eager step's, so the draws (each compares noise with a cumulative sum) come out the same."""
    seq2seq = family == "t5"
    model = _seq2seq(family) if seq2seq else _model(family)
    ids, mask = _prompts("cpu")
    kw = dict(do_sample=True, top_k=20, max_new_tokens=30)
    if seq2seq:
        ids, mask = ids.clamp(max=V - 2), mask.flip(1)
    else:
        kw.update(eos_token_id=2, pad_token_id=0)
    torch.manual_seed(5)
    eager = bh.generate(model, ids, mask, **kw)
    torch.manual_seed(5)
    ours = bh.generate(model, ids, mask, compile="eager", **kw)
    assert torch.equal(ours, eager)


@pytest.mark.parametrize("family", ["llama", "bart"])
def test_a_model_changed_mid_search_runs_its_model_call(family):
    """A global forward hook registered after some compiled steps: the step gives the buffers back as the
    model's own cache and calls the model (the hook runs), with the eager step's logits."""
    if family == "bart":
        model = _seq2seq(family)
        fast, slow = EncoderDecoderStep(model, compile="eager"), EncoderDecoderStep(model)
        static = hc.StaticSeq2Seq
    else:
        model = _model(family)
        fast, slow = DecoderOnlyStep(model, compile="eager"), DecoderOnlyStep(model, kv="dense")
        static = hc.StaticLayers
    ids, mask = _prompts("cpu")
    ids, mask = ids.clamp(max=V - 2), mask if family == "llama" else mask.flip(1)
    y = torch.full((5,), int(getattr(model.config, "decoder_start_token_id", None) or 0))
    seen = []
    handle = None
    try:
        with torch.inference_mode():
            a, b = fast.init_state(ids, mask), slow.init_state(ids, mask)
            for t in range(6):
                if t == 4:
                    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: seen.append(1))
                la, a = fast(a, y)
                lb, b = slow(b, y)
                assert (la - lb).abs().max() <= tolerance(64 + 8, lb)
                assert isinstance(a.cache, static) == (0 < t < 4)
                y = la.argmax(dim=1)
    finally:
        if handle is not None:
            handle.remove()
    assert seen


def test_a_family_without_a_direct_step_runs_eagerly_and_says_why_once(caplog):
    model = _model("opt")
    ids, mask = _prompts("cpu")
    kw = dict(num_beams=2, max_new_tokens=6, eos_token_id=2, pad_token_id=0, do_sample=False)
    with caplog.at_level(logging.WARNING, logger="beamkit"):
        first = bh.generate(model, ids, mask, compile="eager", **kw)
        bh.generate(model, ids, mask, compile="eager", **kw)
    assert torch.equal(first, model.generate(ids, attention_mask=mask, **kw))
    notes = [r.getMessage() for r in caplog.records if "compile= runs eagerly" in r.getMessage()]
    assert len(notes) == 1 and "OPTForCausalLM" in notes[0]
    assert DecoderOnlyStep(model, compile="eager").compiled is None


def test_a_backend_that_fails_falls_back_to_the_eager_static_step(caplog):
    """A backend torch knows that fails to compile: the step runs eagerly, said once. (A name torch does not know
    is refused by name before anything runs: tests/test_compile_backends.py.)"""
    from torch._dynamo import list_backends, register_backend

    if "beamkit-test-fails" not in list_backends(exclude_tags=()):

        @register_backend(name="beamkit-test-fails")
        def _fails(gm, example_inputs):
            raise RuntimeError("this backend cannot compile")

    model = _model("gpt2")
    ids, mask = _prompts("cpu")
    kw = dict(num_beams=3, max_new_tokens=8, eos_token_id=2, pad_token_id=0, do_sample=False)
    with caplog.at_level(logging.WARNING, logger="beamkit"):
        got = bh.generate(model, ids, mask, compile="beamkit-test-fails", **kw)
    assert torch.equal(got, model.generate(ids, attention_mask=mask, **kw))
    notes = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(notes) == 1 and "running it eagerly" in notes[0]
    with pytest.raises(ValueError, match="'no-such-backend' is no torch.compile backend"):
        bh.generate(model, ids, mask, compile="no-such-backend", **kw)


def test_a_slow_first_compilation_is_announced_once_per_bucket(monkeypatch, capsys):
    model = _model("gpt2")
    monkeypatch.setattr(compiled_mod, "SLOW_COMPILE_SECONDS", -1.0)  # every first compilation counts as slow
    ids, mask = _prompts("cpu", 3)
    for _ in range(2):
        bh.generate(model, ids, mask, num_beams=1, max_new_tokens=5, eos_token_id=None, pad_token_id=0,
                    compile="eager")  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("compiled the decode step for 4 rows") == 1 and "4x64" in err


def test_bad_switches_and_combinations_are_refused():
    model = _model("gpt2")
    ids, mask = _prompts("cpu", 2)
    with pytest.raises(TypeError, match="compile must be True, False or a torch.compile backend name"):
        bh.generate(model, ids, mask, max_new_tokens=3, compile=3)
    with pytest.raises(TypeError, match="compile must be"):
        DecoderOnlyStep(model, compile="")
    trie = beamkit.Trie([[5, 6, 2], [7, 2]])
    with pytest.raises(bh.Unsupported, match="compile= with allowed_output="):
        bh.generate(model, ids, mask, max_new_tokens=3, compile="eager", allowed_output="vocab", num_beams=2,
                    prefix_allowed_tokens_fn=trie.prefix_allowed_tokens_fn(8, eos_token_id=2))  # fmt: skip
    with bh.patch(model), pytest.raises(bh.Unsupported, match="compile= runs on beamkit's engine only"):
        model.generate(ids, attention_mask=mask, max_new_tokens=3, num_beams=2, compile="eager")  # the loop's call
    with pytest.raises(bh.Unsupported, match="compile= with diverse or constrained beam search"):
        bh.generate(model, ids, mask, max_new_tokens=3, compile="eager", num_beams=4, num_beam_groups=2,
                    diversity_penalty=0.5)  # fmt: skip


def test_graphs_live_with_their_model_and_not_with_a_copy():
    """The compiled steps are kept beside the model: a deep copy starts without them (its own weights, its own
    graphs: the original's would run the original's layers), and the model is freed with them."""
    model = _model("gpt2")
    ids, mask = _prompts("cpu", 2)
    kw = dict(num_beams=2, max_new_tokens=5, eos_token_id=None, pad_token_id=0, do_sample=False)
    bh.generate(model, ids, mask, compile="eager", **kw)
    assert hc.compilations(model) == {"eager": 1}
    twin = copy.deepcopy(model)
    assert hc.compilations(twin) == {}
    with torch.no_grad():
        twin.lm_head.weight.mul_(-1.0)  # another model now: the original's graphs must not decode it
    assert torch.equal(
        bh.generate(twin, ids, mask, compile="eager", **kw), twin.generate(ids, attention_mask=mask, **kw)
    )
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_parents_are_copied_into_buffers_of_the_live_rows():
    """``copy_parents`` against ``index_select`` (the oracle): buffers of a rows count that is no bucket (a
    Whisper call's exact rows) keep it while the parents fit, both while the filled columns move alone and as
    whole rows; more parents than rows grow both sets to the rows bucket."""
    gen = torch.Generator().manual_seed(5)
    live = [torch.randn(6, 2, 8, 3, generator=gen) for _ in range(2)]
    spare = None
    for t, index in ((3, [5, 5, 0, 1, 2, 2]), (6, [0, 1, 2, 3, 4, 5]), (2, [4, 3])):
        want = [x[:, :, :t].index_select(0, torch.tensor(index)) for x in live]
        live, spare = compiled_mod.copy_parents(live, spare, torch.tensor(index), t)
        assert all(x.shape[0] == 6 for x in (*live, *spare))
        for got, ref in zip(live, want, strict=True):
            assert torch.equal(got[: len(index), :, :t], ref)
    index = torch.tensor([0, 1, 1, 2, 3, 4, 5])
    want = [x[:, :, :2].index_select(0, index) for x in live]
    live, spare = compiled_mod.copy_parents(live, spare, index, 2)
    assert all(x.shape[0] == 8 for x in (*live, *spare))  # the bucket of 7 rows
    assert all(torch.equal(got[:7, :, :2], ref) for got, ref in zip(live, want, strict=True))


def _whisper():
    """The tiny seeded Whisper of ``tests.test_hf_whisper`` (a copy attending with SDPA) and its 3 features."""
    from tests.test_hf_whisper import sdpa_whisper

    return sdpa_whisper()


# Whisper's decoder: 32 wide, feed-forward 64, 2 layers; its steps attend over 64 self columns and 30 frames
WHISPER_E, WHISPER_F, WHISPER_C = 32, 64, 64 + 30


def whisper_tolerance(logits) -> float:
    """The float32 bound of the module doc for the tiny Whisper's logits."""
    return (WHISPER_E + WHISPER_F + WHISPER_C) * 2 * U * (1.0 + float(logits.abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beams", [1, 3, 5])
def test_whisper_compiled_gives_its_own_generates_tokens(beams, backend):
    """Whisper in beamkit's loop with ``compile=``: Whisper's own ``generate``'s sequences; each step's logits
    within the float32 bound of its own, and the processed scores (log-softmax) within twice that; the steps ran
    compiled."""
    model, feats = _whisper()
    kw = dict(num_beams=beams, min_new_tokens=10, max_new_tokens=20, return_dict_in_generate=True)
    kw.update(output_scores=True, output_logits=True, language="en", task="transcribe")
    with torch.no_grad():
        theirs = model.generate(feats, **kw)
        ours = bh.generate(model, feats, compile=backend, **kw)
    compiled = sum(hc.compilations(model).values())
    assert compiled == 1
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(ours.logits) == len(theirs.logits) >= 10
    for a, b, sa, sb in zip(ours.logits, theirs.logits, ours.scores, theirs.scores, strict=True):
        bound = whisper_tolerance(b)
        assert float((a - b).abs().max()) <= bound
        finite = torch.isfinite(sb)
        assert torch.equal(finite, torch.isfinite(sa))
        assert float((sa[finite] - sb[finite]).abs().max()) <= 2 * bound


def test_whisper_compiles_one_graph_per_rows_count():
    """A Whisper call's rows stay fixed (requests x beams), so its buffers hold exactly them: a second call of
    the same shape compiles nothing, another count of rows compiles its own graph."""
    model, feats = _whisper()
    kw = dict(num_beams=2, min_new_tokens=4, max_new_tokens=6, language="en", task="transcribe")
    with torch.no_grad():
        for count, x in ((1, feats), (1, feats), (2, feats[:2]), (2, feats[:2].clone())):
            assert torch.equal(bh.generate(model, x, compile="eager", **kw), model.generate(x, **kw))
            assert hc.compilations(model) == {"eager": count}


def test_whisper_compile_with_per_step_tables_runs_eagerly_and_says_why_once(caplog, monkeypatch):
    """Token timestamps read the cross-attentions of every step, which only the model's forward returns: the
    call runs as without ``compile=`` (outputs identical to Whisper's own), the reason logged once."""
    model, feats = _whisper()
    kw = dict(num_beams=3, return_token_timestamps=True)
    monkeypatch.setattr(hc, "_LOGGED", set())  # once per process: an earlier test's call may have said it
    with caplog.at_level(logging.WARNING, logger="beamkit"), torch.no_grad():
        for _ in range(2):
            want = model.generate(feats, **kw)
            got = bh.generate(model, feats, compile="eager", **kw)
            assert torch.equal(got["sequences"], want["sequences"])
            assert torch.equal(got["token_timestamps"], want["token_timestamps"])
    notes = [r.getMessage() for r in caplog.records if "compile= runs eagerly" in r.getMessage()]
    assert len(notes) == 1 and "attentions or hidden states" in notes[0]
    assert hc.compilations(model) == {}


def test_whisper_changed_mid_call_gives_its_buffers_back_and_calls_the_model():
    """A global forward hook registered by a logits processor at the fourth step: the loop hands the buffers'
    keys/values back to the model's own cache and calls the model from then on (the hook sees the calls), with
    Whisper's own tokens; the compiled steps before ran."""
    model, feats = _whisper()

    class HookAt(transformers.LogitsProcessor):
        def __init__(self) -> None:
            self.calls, self.handle, self.seen = 0, None, []

        def __call__(self, input_ids, scores):
            self.calls += 1
            if self.calls == 4:
                self.handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: self.seen.append(1))
            return scores

    outs = []
    for run in (model.generate, lambda x, **kw: bh.generate(model, x, compile="eager", **kw)):
        hook = HookAt()
        try:
            with torch.no_grad():
                outs.append(
                    run(feats, num_beams=3, min_new_tokens=8, logits_processor=[hook], language="en", task="transcribe")
                )
        finally:
            if hook.handle is not None:
                hook.handle.remove()
        assert hook.seen
    assert torch.equal(outs[0], outs[1])
    assert hc.compilations(model) == {"eager": 1}
