"""beamkit.hf against Hugging Face's own ``model.generate`` where the two used to part: the warnings for length
settings that cannot both hold, the per-step ``scores`` of ``output_scores``, and the cache returned for a
continuation (continue-from-cache must give what one longer call gives, as Hugging Face's own test checks).

Oracles are ``model.generate`` on tiny seeded models built from a config (offline).
"""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from tests.test_hf import setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _length_warnings(call):
    """The result of ``call()`` and the texts of the length warnings it gave (UserWarning), in order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
    return out, [str(w.message) for w in caught if "Unfeasible length constraints" in str(w.message)]


@pytest.mark.parametrize("name", ["gpt2", "t5"])
@pytest.mark.parametrize(
    "lengths",
    [  # lengths that count the prompt are given past it: p is the decoder prefix (7 prompt tokens, 1 start token)
        lambda p: dict(min_new_tokens=10, max_new_tokens=5),
        lambda p: dict(min_new_tokens=30),
        lambda p: dict(min_length=p + 5, max_new_tokens=3),
        lambda p: dict(min_length=p + 5, max_length=p + 3),
        lambda p: dict(min_new_tokens=3, max_length=p + 2),
        lambda p: dict(min_new_tokens=3, max_new_tokens=5),  # feasible: no warning from either
    ],
    ids=[
        "min_new>max_new",
        "min_new>default",
        "min_length>max_new",
        "min_length>max_length",
        "min_new>max_length",
        "feasible",
    ],
)
@pytest.mark.parametrize("beams", [1, 3])
def test_unfeasible_lengths_warn_as_hugging_face_does(name, lengths, beams):
    """A minimum length beyond the maximum: Hugging Face warns (its two 'Unfeasible length constraints'
    warnings when min_new_tokens is given) and stops at the maximum; beamkit.hf.generate gives the same warnings,
    word for word, and the same tokens."""
    model, ids, mask, eos, pad = setup(name)
    lengths = lengths(1 if model.config.is_encoder_decoder else ids.shape[1])
    kw = dict(num_beams=beams, eos_token_id=eos, pad_token_id=pad, do_sample=False, **lengths)
    want, hf_said = _length_warnings(lambda: model.generate(ids[:2], attention_mask=mask[:2], **kw))
    got, bk_said = _length_warnings(lambda: bh.generate(model, ids[:2], mask[:2], **kw))
    assert bk_said == hf_said
    assert torch.equal(got, want)
    feasible = lengths == dict(min_new_tokens=3, max_new_tokens=5)  # noqa: C408
    assert bool(hf_said) is not feasible


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "bart"])
@pytest.mark.parametrize("beams", [1, 3])
def test_output_scores_are_hugging_faces_per_step_scores(name, beams, device):
    """``output_scores=True, return_dict_in_generate=True``: the per-step ``scores`` tables Hugging Face returns
    (``[batch * beams, V]`` per step, in its row layout), with its sequences, sequences_scores and beam_indices
    (the engine bridge keeps no such tables and used to return ``scores=None``)."""
    model, ids, mask, eos, pad = setup(name, device)
    kw = dict(num_beams=beams, max_new_tokens=6, eos_token_id=eos, pad_token_id=pad, do_sample=False)
    kw.update(return_dict_in_generate=True, output_scores=True)
    want = model.generate(ids, attention_mask=mask, **kw)
    got = bh.generate(model, ids, mask, **kw)
    assert type(got).__name__ == type(want).__name__
    assert torch.equal(got.sequences, want.sequences)
    assert got.scores is not None and len(got.scores) == len(want.scores)
    for a, b in zip(got.scores, want.scores, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    if beams > 1:
        assert torch.equal(got.sequences_scores, want.sequences_scores)
        assert torch.equal(got.beam_indices, want.beam_indices)


def _continue_from_inputs_embeds(model):
    """Hugging Face's own test_generate_continue_from_inputs_embeds, step by step: 4 new tokens from
    ``inputs_embeds`` in one call; then 3, and 1 more from the prompt's and the 3 tokens' embeddings with the
    returned cache. Returns (the one call's output, the continuation's output, the 3 + 1 tokens)."""
    from beamkit.hf.versions import release

    model.generation_config.pad_token_id = model.generation_config.eos_token_id = -1
    model.generation_config.forced_eos_token_id = None
    model.config.is_decoder = True
    model.generation_config.use_cache = True
    kw = dict(return_dict_in_generate=True, do_sample=False)
    ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    embeds = model.get_input_embeddings()(ids)
    whole = model.generate(inputs_embeds=embeds, max_new_tokens=4, **kw)
    first = model.generate(inputs_embeds=embeds, max_new_tokens=3, **kw)
    name = "cache" if release() >= (5, 24) else "past_key_values"  # the release's own keyword and field
    continued = torch.cat([embeds, model.get_input_embeddings()(first.sequences)], dim=1)
    rest = model.generate(inputs_embeds=continued, max_new_tokens=1, **{name: getattr(first, name)}, **kw)
    return whole, rest, torch.cat([first.sequences, rest.sequences], dim=1), name


def _decoder_model(name):
    """A tiny seeded decoder-only model: tests.test_hf's GPT-2 or Llama, or Whisper's decoder alone
    (``WhisperForCausalLM``, the Whisper class Hugging Face's continuation test runs)."""
    from tests.test_hf import _config_model

    if name != "whisper-decoder":
        return _config_model(name).eval()
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        vocab_size=48, d_model=16, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
        encoder_attention_heads=4, decoder_ffn_dim=16, encoder_ffn_dim=16, max_target_positions=40,
        max_source_positions=30, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    return transformers.WhisperForCausalLM(cfg).eval()


@pytest.mark.parametrize("name", ["gpt2", "llama", "whisper-decoder"])
def test_continuing_from_the_returned_cache_gives_hugging_faces_cache(name):
    """Patched or not, the tokens continued from a returned cache are the one call's, and the cache returned by
    the continuation is Hugging Face's, position for position (layers, keys and values, same length)."""
    import copy

    model = _decoder_model(name)
    with torch.no_grad():
        want_whole, want_rest, want_tokens, field = _continue_from_inputs_embeds(copy.deepcopy(model))
        with bh.patch(copy.deepcopy(model)) as handle:
            whole, rest, tokens, _ = _continue_from_inputs_embeds(handle.model)
    assert torch.equal(want_whole.sequences, want_tokens)  # Hugging Face's own check, unpatched
    assert torch.equal(whole.sequences, tokens) and torch.equal(tokens, want_tokens)
    for got, want in (
        (getattr(whole, field), getattr(want_whole, field)),
        (getattr(rest, field), getattr(want_rest, field)),
    ):
        assert got.get_seq_length() == want.get_seq_length()
        assert len(got.layers) == len(want.layers)
        for a, b in zip(got.layers, want.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    # and the one call's cache equals the continuation's, as Hugging Face's test asserts
    # (float32 defaults: the same positions computed in one forward or position by position round apart)
    for a, b in zip(getattr(whole, field).layers, getattr(rest, field).layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys)
        torch.testing.assert_close(a.values, b.values)
