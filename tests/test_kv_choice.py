"""The dense / paged cache choice of beamkit.hf.generate: the rule (hand-worked KV sizes at the threshold), and
both choices decoding exactly what Hugging Face's ``model.generate`` decodes (the oracle) on tiny seeded models."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from beamkit.hf.bridge import generation  # noqa: E402
from beamkit.hf.bridge.settings import merge_config, resolve  # noqa: E402
from tests.test_hf import setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def settings_for(model, prompt_len: int, **kw):
    gc, rest, given = merge_config(None, model.generation_config, kw)
    return resolve(model, gc, rest, given, prompt_len)


def test_kv_row_bytes_by_hand():
    """The test GPT-2 (2 layers, 32 wide, 2 heads, float32): 2 (keys, values) x 2 layers x 32 x 4 bytes = 512
    bytes a position; Llama's (2 layers, 2 key/value heads of 8, float32): 2 x 2 x 16 x 4 = 256 bytes."""
    assert generation.kv_row_bytes(setup("gpt2")[0], 10) == 5120
    assert generation.kv_row_bytes(setup("llama")[0], 10) == 2560


def test_the_rule(monkeypatch):
    """Greedy: dense; a beam below the threshold: dense, at it: paged; a named cache wins over the size rule;
    diverse beam search stays dense."""
    model, ids, mask, _, _ = setup("gpt2")  # 7 prompt columns
    per_position = generation.kv_row_bytes(model, 1)
    choose = generation.choose_cache
    assert choose(model, settings_for(model, 7, num_beams=1), mask).kind == "dense"
    beam = settings_for(model, 7, num_beams=3, max_new_tokens=5)  # 12 positions a row
    monkeypatch.setattr(generation, "DENSE_BELOW_BYTES", 12 * per_position + 1)
    assert choose(model, beam, mask).kind == "dense"
    monkeypatch.setattr(generation, "DENSE_BELOW_BYTES", 12 * per_position)
    assert choose(model, beam, mask).kind == "paged"
    named = settings_for(model, 7, num_beams=3, max_new_tokens=5, cache_implementation="dynamic")
    assert choose(model, named, mask).kind == "dense"
    monkeypatch.setattr(generation, "DENSE_BELOW_BYTES", 1 << 40)
    paged = settings_for(model, 7, num_beams=1, cache_implementation="paged")
    assert choose(model, paged, mask).kind == "paged"
    groups = dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5)
    diverse = settings_for(model, 7, **groups, cache_implementation="paged")
    assert choose(model, diverse, mask).kind == "dense"


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("beams", [1, 4])
def test_both_choices_decode_what_model_generate_decodes(name, beams, kinds, monkeypatch, device):
    """With no cache named, the threshold decides: below it (these tiny models) the dense cache, above it (the
    threshold lowered to 0) the paged one for a beam; both give Hugging Face's sequences exactly, its scores
    within 1e-4 (float32 against float64 sums, as in test_hf.py), and each other's scores within the same 1e-4:
    the paged cache's shared-prefix attention sums the same float32 products in another order, so a score of
    8 steps moves by a few float32 roundings of each log-probability (about 8 x 2**-23 x |logp|), not more."""
    model, ids, mask, eos, pad = setup(name, device)
    kw = dict(num_beams=beams, max_new_tokens=8, eos_token_id=eos, pad_token_id=pad, do_sample=False)
    kw |= dict(return_dict_in_generate=True, output_scores=True)
    want = model.generate(ids, attention_mask=mask, **kw)
    small = generation.prepare(model, ids, mask, kw, exact_only=False)()
    monkeypatch.setattr(generation, "DENSE_BELOW_BYTES", 0)
    large = generation.prepare(model, ids, mask, kw, exact_only=False)()
    assert kinds == ["dense", "dense" if beams == 1 else "paged"]
    for out in (small, large):
        assert torch.equal(out.sequences, want.sequences)
        if beams > 1:
            assert torch.allclose(out.sequences_scores, want.sequences_scores, atol=1e-4, rtol=0)
    got = [[h.score for h in r] for r in large.hypotheses]
    assert got == [pytest.approx([h.score for h in r], abs=1e-4) for r in small.hypotheses]
    assert [[h.tokens for h in r] for r in small.hypotheses] == [[h.tokens for h in r] for r in large.hypotheses]
