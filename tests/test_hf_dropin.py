"""beamkit.hf as a one-line drop-in: return values, ``patch`` and pipelines, against Hugging Face's own generate.

Oracles are ``model.generate`` on the same tiny random models (see ``tests/test_hf.py``), run unpatched.
"""

from __future__ import annotations

import copy
import logging
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import beamkit.hf as bh  # noqa: E402
from tests.test_hf import MODELS, VOCAB, engine_generate, setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _hf(model, *args, **kw):
    with torch.no_grad():
        return model.generate(*args, **kw)


@pytest.mark.parametrize("name", MODELS)
def test_default_return_is_the_sequences_tensor(name, device):
    """``model.generate(`` -> ``beamkit.hf.generate(model, ``: a plain tensor, equal to Hugging Face's, so
    ``tokenizer.batch_decode(...)`` works as before; beam search and greedy, several returns."""
    model, ids, mask, eos, pad = setup(name, device)
    for kw in (dict(num_beams=4, num_return_sequences=2), dict(num_beams=1)):
        kw.update(max_new_tokens=8, eos_token_id=eos, pad_token_id=pad)
        want = _hf(model, ids, attention_mask=mask, **kw)
        got = bh.generate(model, ids, attention_mask=mask, **kw)
        assert type(got) is torch.Tensor and type(want) is torch.Tensor
        assert torch.equal(got, want)
        # keyword inputs, as pipelines call it
        assert torch.equal(bh.generate(model, input_ids=ids, attention_mask=mask, **kw), want)


@pytest.mark.parametrize("name", MODELS)
def test_dict_output_matches_hugging_face_fields(name, device):
    """With return_dict_in_generate: Hugging Face's output class (subclassed), sequences, sequences_scores only
    with output_scores, beam_indices in Hugging Face's layout, plus beamkit's hypotheses."""
    model, ids, mask, eos, pad = setup(name, device)
    kw = dict(num_beams=4, num_return_sequences=3, max_new_tokens=8, eos_token_id=eos, pad_token_id=pad)
    for scores in (False, True):
        want = _hf(model, ids, attention_mask=mask, return_dict_in_generate=True, output_scores=scores, **kw)
        got = engine_generate(model, ids, mask, return_dict_in_generate=True, output_scores=scores, **kw)
        assert isinstance(got, type(want))
        assert torch.equal(got.sequences, want.sequences)
        assert torch.equal(got.beam_indices, want.beam_indices), (got.beam_indices, want.beam_indices)
        assert got.beam_indices.dtype == want.beam_indices.dtype
        if scores:
            assert torch.allclose(got.sequences_scores, want.sequences_scores, atol=1e-4, rtol=0)
        else:
            assert got.sequences_scores is None and want.sequences_scores is None
        assert len(got.hypotheses) == ids.shape[0] and got.stats.model_calls > 0
    greedy = dict(num_beams=1, max_new_tokens=6, eos_token_id=eos, pad_token_id=pad, return_dict_in_generate=True)
    want = _hf(model, ids, attention_mask=mask, **greedy)
    got = bh.generate(model, ids, mask, **greedy)
    assert isinstance(got, type(want)) and torch.equal(got.sequences, want.sequences)


def test_return_dict_from_the_generation_config():
    """The generation config's own return_dict_in_generate / output_scores are honoured, as by model.generate."""
    model, ids, mask, eos, pad = setup("bart")
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.update(return_dict_in_generate=True, output_scores=True, num_beams=3, max_new_tokens=6, eos_token_id=eos)
    gc.pad_token_id = pad
    want = _hf(model, ids, attention_mask=mask, generation_config=gc)
    got = bh.generate(model, ids, mask, generation_config=gc)
    assert torch.equal(got.sequences, want.sequences)
    assert torch.allclose(got.sequences_scores, want.sequences_scores, atol=1e-4, rtol=0)
    positional = bh.generate(model, ids, gc, attention_mask=mask)  # Hugging Face's second positional argument
    assert torch.equal(positional.sequences, want.sequences)


@pytest.mark.parametrize("name", MODELS)
def test_patch_runs_beamkit_and_falls_back_by_name(name, caplog, device):
    """Patched, model.generate gives Hugging Face's outputs through beamkit (sampling and per-step score tables
    too, through beamkit's loop inside Hugging Face's generate); a call beamkit does not decode (here: an
    assistant model) runs the original with one log line per reason; undo restores."""
    model, ids, mask, eos, pad = setup(name, device)
    kw = dict(num_beams=3, max_new_tokens=7, eos_token_id=eos, pad_token_id=pad)
    want = _hf(model, ids, attention_mask=mask, **kw)
    torch.manual_seed(3)
    want_sampled = _hf(model, ids, attention_mask=mask, do_sample=True, **kw)
    want_tables = _hf(model, ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True, **kw)
    one = dict(kw, num_beams=1)
    want_assisted = _hf(model, ids[:1], attention_mask=mask[:1], assistant_model=model, **one)
    with bh.patch(copy.deepcopy(model), fast=True) as fast:  # beam search on the engine bridge
        assert torch.equal(fast.model.generate(ids, attention_mask=mask, **kw), want) and not fast.fallbacks
    seen = []
    with bh.patch(model) as handle:
        original = handle.original
        handle.original = lambda *a, **k: seen.append(k.get("custom_generate")) or original(*a, **k)
        greedy = dict(kw, num_beams=1)
        assert torch.equal(model.generate(ids, attention_mask=mask, **greedy), _hf(model, ids, mask, **greedy))
        assert not seen  # greedy: the engine bridge
        assert torch.equal(model.generate(ids, attention_mask=mask, **kw), want)  # beamkit's loop
        torch.manual_seed(3)
        assert torch.equal(model.generate(ids, attention_mask=mask, do_sample=True, **kw), want_sampled)
        tables = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True, **kw)
        assert torch.equal(tables.sequences, want_tables.sequences)
        assert all(torch.equal(a, b) for a, b in zip(tables.scores, want_tables.scores, strict=True))
        assert len(seen) == 3 and all(
            getattr(getattr(f, "func", f), "__module__", "") == "beamkit.hf.loop.decoding" for f in seen
        )
        with caplog.at_level(logging.WARNING, logger="beamkit.hf"):
            for _ in range(2):
                got = model.generate(ids[:1], attention_mask=mask[:1], assistant_model=model, **one)
        # Hugging Face's own assisted loop, twice; it calls the (patched) assistant, which beamkit serves
        assert torch.equal(got, want_assisted) and seen[3:].count(None) == 2 and len(seen) > 5
        lines = [r.getMessage() for r in caplog.records if r.name == "beamkit.hf"]
        assert len(lines) == 1 and "assistant_model=" in lines[0]
        assert handle.fallbacks == [lines[0].split("beamkit.hf.patch: ")[1].split("; this call")[0]]
    assert "generate" not in vars(model)  # restored: the class method again
    with pytest.raises(ValueError, match="already patched"):
        with bh.patch(model):
            bh.patch(model)


def _tokenizer(eos: int, pad: int):
    """A word-level tokenizer over the tiny vocabulary: token ``i`` is the word ``t{i}``."""
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t3"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=f"t{pad}", eos_token=f"t{eos}", unk_token="t3", padding_side="left"
    )


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_text_generation_pipeline_on_a_patched_model(name):
    """transformers.pipeline("text-generation") on a patched model: unchanged call, identical text, and the
    calls really went through beamkit. (transformers 5.x removed the "translation" pipeline.)"""
    model, ids, mask, eos, pad = setup(name)
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=_tokenizer(eos, pad))
    prompts = ["t5 t9 t13", "t7 t8 t20 t30", "t11"]
    kw = dict(num_beams=3, max_new_tokens=6, do_sample=False, batch_size=2, num_return_sequences=2)
    want = pipe(prompts, **kw)
    ran = []
    with bh.patch(model) as handle:
        original = handle.original
        handle.original = lambda *a, **k: ran.append(k.get("custom_generate")) or original(*a, **k)
        got = pipe(prompts, **kw)
    assert got == want and ran and None not in ran and not handle.fallbacks  # every call in beamkit's loop
    assert len(got) == 3 and len(got[0]) == 2


def test_none_model_is_a_type_error():
    """``generate(None, ...)`` was an AttributeError from deep inside; no inputs start from the bos token, as
    Hugging Face does."""
    model, ids, mask, eos, pad = setup("gpt2")
    with pytest.raises(TypeError, match="model must be a transformers model.*got None"):
        bh.generate(None, ids, mask, num_beams=2, max_new_tokens=3)
    want = _hf(model, None, num_beams=2, max_new_tokens=3)
    assert torch.equal(bh.generate(model, None, num_beams=2, max_new_tokens=3), want)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_ids_outside_the_vocabulary_are_named(name):
    """issue 13: an id >= the vocabulary (or negative) was a raw torch IndexError."""
    model, ids, mask, eos, pad = setup(name)
    for bad in (VOCAB + 7, VOCAB, -1):
        wrong = ids.clone()
        wrong[2, 5] = bad
        with pytest.raises(ValueError, match=f"token id {bad}, outside the model's vocabulary of {VOCAB} ids"):
            bh.generate(model, wrong, mask, num_beams=2, max_new_tokens=3)


def test_short_max_length_names_what_was_given():
    """issue 13: max_length shorter than the prompt talked about max_new_tokens=-1, which nobody gave."""
    model, ids, mask, eos, pad = setup("gpt2")
    with pytest.raises(ValueError, match=r"^max_length=5 leaves no room.*prompt \(7 tokens\)") as err:
        bh.generate(model, ids, mask, num_beams=2, max_length=5)
    assert "max_new_tokens" not in str(err.value).split(";")[0]
    gc = transformers.GenerationConfig(max_length=7, num_beams=2)
    with pytest.raises(ValueError, match=r"^generation_config.max_length=7 leaves no room"):
        bh.generate(model, ids, mask, generation_config=gc)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        bh.generate(model, ids, mask, num_beams=2, max_new_tokens=0)


@pytest.mark.parametrize("kind", ["diverse", "constrained"])
def test_variants_return_their_real_stats(kind, device):
    """The diverse and constrained paths count their model calls and rows (once an empty SearchStats)."""
    model, ids, mask, eos, pad = setup("gpt2", device)
    rows = []
    hook = model.transformer.register_forward_pre_hook(
        lambda mod, args, kwargs: rows.append(int(kwargs.get("input_ids", args[0] if args else None).shape[0])),
        with_kwargs=True,
    )
    extra = dict(num_beam_groups=2, diversity_penalty=1.0) if kind == "diverse" else dict(force_words_ids=[[5, 6]])
    try:
        out = bh.generate(
            model, ids, mask, num_beams=4, max_new_tokens=6, eos_token_id=eos, return_dict_in_generate=True, **extra
        )
    finally:
        hook.remove()
    assert out.stats.model_calls == len(rows) > 1
    assert out.stats.rows_per_call == rows
