"""A patched ``model.generate`` never breaks a call and serves what users pass, against Hugging Face itself.

Every test runs the same call twice on the same tiny seeded model (``tests/test_hf.py``'s families): unpatched
(Hugging Face's own ``generate``, the oracle) and patched; outputs must be identical to the bit (beamkit's loop
inside Hugging Face's ``generate`` does Hugging Face's float32 arithmetic in its order, so equality is exact, not
approximate). "Served" is checked by recording every call that reaches Hugging Face's own decoding: a call counts
as beamkit's when Hugging Face's ``generate`` only ran with beamkit's decoding method plugged in.
"""

from __future__ import annotations

import copy
import logging
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from beamkit.hf.loop.decoding import decode  # noqa: E402
from beamkit.hf.versions import output_cache, release  # noqa: E402
from tests.test_hf import MODELS, setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def same(a, b, path="output"):
    """Assert two generate outputs are identical: tensors equal to the bit (dtype and shape included), tuples
    and output objects field by field (the returned cache object is not compared)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), (path, type(b))
        assert a.shape == b.shape and a.dtype == b.dtype, (path, a.shape, b.shape, a.dtype, b.dtype)
        assert torch.equal(a, b), path
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):  # ModelOutput objects are dicts of their set fields
        assert type(a) is type(b) and a.keys() == b.keys(), (path, type(a), type(b), a.keys(), b.keys())
        for k in a:
            if k not in ("past_key_values", "cache"):  # the returned cache object (renamed in 5.24)
                same(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, (path, a, b)


class Calls:
    """A patch whose calls into Hugging Face's own generate are recorded: ``own`` counts the calls Hugging Face
    decoded itself, ``loop`` those it handed to beamkit's decoding method."""

    def __init__(self, model):
        self.handle = bh.patch(model)
        self.own = self.loop = 0
        original = self.handle.original

        def counted(*args, **kwargs):
            method = kwargs.get("custom_generate")
            if getattr(method, "func", method) is decode:  # the loop's method (its options bound)
                self.loop += 1
            else:
                self.own += 1
            return original(*args, **kwargs)

        self.handle.original = counted

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.undo()


class Fresh:
    """A keyword value made anew for each run (Hugging Face expands some inputs in place, such as a given
    ``encoder_outputs`` or cache)."""

    def __init__(self, make):
        self.make = make


def both(model, *args, **kw):
    """(Hugging Face's output, the patched output, the call record), each run from the same torch seed."""

    def run():
        torch.manual_seed(11)
        with torch.no_grad():
            return model.generate(*args, **{k: v.make() if isinstance(v, Fresh) else v for k, v in kw.items()})

    want = run()
    with Calls(model) as calls:
        got = run()
    return want, got, calls


def check_served(model, *args, **kw):
    """The patched call equals Hugging Face's and beamkit decoded it (no fall-back)."""
    want, got, calls = both(model, *args, **kw)
    same(want, got)
    assert calls.own == 0 and not calls.handle.fallbacks, calls.handle.fallbacks
    return got, calls


def eager(name, device=None):
    """``setup(name, device)``'s model with eager attention (the one that returns attention weights)."""
    model, ids, mask, eos, pad = setup(name, device)
    model = copy.deepcopy(model)
    model.set_attn_implementation("eager")
    return model, ids, mask, eos, pad


@pytest.mark.parametrize("name", MODELS)
def test_inputs_embeds_without_ids(name, device):
    """``inputs_embeds=`` and no ids (decoder-only: prefill from the embeddings, then tokens; encoder-decoder:
    the encoder's input) -- used to be a TypeError when patched."""
    model, ids, mask, eos, pad = setup(name, device)
    embeds = model.get_input_embeddings()(ids)
    for beams in (1, 3):
        check_served(model, inputs_embeds=embeds, attention_mask=mask, num_beams=beams, max_new_tokens=6)


@pytest.mark.parametrize("name", MODELS)
def test_no_inputs_at_all(name, device):
    """``generate()`` with no inputs starts from the bos token, as Hugging Face does -- used to be a TypeError."""
    model, ids, mask, eos, pad = setup(name, device)
    if model.generation_config.bos_token_id is None:
        model = copy.deepcopy(model)
        model.generation_config.bos_token_id = 3
    for beams in (1, 4):
        check_served(model, num_beams=beams, max_new_tokens=5)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_assisted_decoding_with_a_patched_encoder_decoder_assistant(name, caplog):
    """Assisted decoding: the main model's call goes to Hugging Face (its assistant loop is its own, logged
    once); Hugging Face calls the patched assistant with ``encoder_outputs`` / ``decoder_input_ids``, which
    beamkit serves -- both used to break."""
    model, ids, mask, eos, pad = setup(name)
    assistant = copy.deepcopy(model)
    with torch.no_grad():  # a different but compatible assistant
        for p in assistant.parameters():
            p.mul_(0.9)
    ids, mask = ids[2:3], mask[2:3]  # Hugging Face's assisted decoding takes one request at a time
    kw = dict(attention_mask=mask, max_new_tokens=6, assistant_model=assistant)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    with caplog.at_level(logging.WARNING, logger="beamkit.hf"), Calls(assistant) as helper, Calls(model) as main:
        with torch.no_grad():
            got = model.generate(ids, **kw)
    same(want, got)
    assert main.own == 1 and main.handle.fallbacks == [
        "assistant_model=: Hugging Face's generate does not hand it to a custom decoding method"
    ]
    assert helper.loop >= 1 and helper.own == 0 and not helper.handle.fallbacks
    assert sum("assistant_model" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("beams", [1, 3])
def test_per_step_tables_in_hugging_faces_layout(name, beams, device):
    """``output_scores`` / ``output_logits`` / ``output_attentions`` / ``output_hidden_states`` (and
    ``beam_indices``, ``sequences_scores``): every table identical, rows in Hugging Face's ``[batch * beams]``
    layout, finished requests included."""
    model, ids, mask, eos, pad = eager(name, device)
    kw = dict(attention_mask=mask, num_beams=beams, max_new_tokens=6, return_dict_in_generate=True)
    got, _ = check_served(
        model, ids, output_scores=True, output_logits=True, output_attentions=True, output_hidden_states=True, **kw
    )
    steps = got.sequences.shape[1] - (1 if model.config.is_encoder_decoder else ids.shape[1])
    assert len(got.scores) == steps if beams == 1 else len(got.scores) >= steps  # one table per step run
    assert got.scores[0].shape == (ids.shape[0] * beams, model.config.vocab_size)
    attentions = got.decoder_attentions if model.config.is_encoder_decoder else got.attentions
    assert attentions[0][0] is not None  # eager attention: real weights, not None
    check_served(model, ids, output_scores=True, **kw)  # one table alone


@pytest.mark.parametrize("name", MODELS)
def test_sampling_follows_hugging_faces_random_stream(name, device):
    """``do_sample=True`` (greedy sampling and beam sampling): the same draws as Hugging Face from the same
    ``torch.manual_seed`` -- used to fall back."""
    model, ids, mask, eos, pad = setup(name, device)
    for beams in (1, 3):
        check_served(model, ids, attention_mask=mask, do_sample=True, num_beams=beams, max_new_tokens=6, top_k=20)


@pytest.mark.parametrize("name", MODELS)
def test_without_the_cache(name, device):
    """``use_cache=False``: every step recomputes the whole sequence, identical tokens and scores."""
    model, ids, mask, eos, pad = setup(name, device)
    for beams in (1, 3):
        check_served(
            model, ids, attention_mask=mask, num_beams=beams, max_new_tokens=5, use_cache=False,
            return_dict_in_generate=True, output_scores=True,
        )  # fmt: skip


def test_token_type_ids_and_logits_to_keep():
    """GPT-2 with ``token_type_ids`` (extended for new tokens as Hugging Face does) and ``logits_to_keep``."""
    model, ids, mask, eos, pad = setup("gpt2")
    types = (torch.arange(ids.shape[1]) % 2).expand_as(ids).contiguous()
    check_served(model, ids, attention_mask=mask, token_type_ids=types, num_beams=3, max_new_tokens=5)
    check_served(model, ids, attention_mask=mask, logits_to_keep=1, num_beams=2, max_new_tokens=5)


def test_position_ids():
    """GPT-2 (learned absolute positions) with explicit ``position_ids``, shifted by 3: a different output than
    the default positions, identical to Hugging Face's."""
    model, ids, mask, eos, pad = setup("gpt2")
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + 3
    want, _, _ = both(model, ids, attention_mask=mask, num_beams=3, max_new_tokens=5)
    got, _ = check_served(model, ids, attention_mask=mask, position_ids=positions, num_beams=3, max_new_tokens=5)
    assert not torch.equal(got, want)  # the positions were used


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_decoder_prefix_and_encoder_outputs(name, device):
    """``decoder_input_ids`` / ``decoder_attention_mask`` (a decoder prefix per request) and precomputed
    ``encoder_outputs`` on encoder-decoder models."""
    model, ids, mask, eos, pad = setup(name, device)
    start = model.generation_config.decoder_start_token_id
    prefix = torch.tensor([[start, 5, 9]] * ids.shape[0], device=ids.device)
    check_served(model, ids, attention_mask=mask, decoder_input_ids=prefix, num_beams=3, max_new_tokens=5)
    check_served(
        model, ids, attention_mask=mask, decoder_input_ids=prefix, decoder_attention_mask=torch.ones_like(prefix),
        num_beams=2, max_new_tokens=5,
    )  # fmt: skip

    def encoded():
        with torch.no_grad():
            return model.get_encoder()(input_ids=ids, attention_mask=mask)

    check_served(model, encoder_outputs=Fresh(encoded), attention_mask=mask, num_beams=3, max_new_tokens=5)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_given_cache(name):
    """``past_key_values=`` (``cache=`` from transformers 5.24 on) holding the prompt's first columns already:
    Hugging Face feeds only the rest (greedy: Hugging Face does not expand a given cache for beams)."""
    model, ids, mask, eos, pad = setup(name)
    head = 4

    def cache():
        with torch.no_grad():
            return output_cache(model(ids[:, :head], attention_mask=mask[:, :head], use_cache=True))

    keyword = "cache" if release() >= (5, 24) else "past_key_values"  # generate's keyword for it, per release
    check_served(model, ids, attention_mask=mask, max_new_tokens=5, **{keyword: Fresh(cache)})


def test_hugging_faces_own_errors_stay_its_own():
    """A call Hugging Face rejects raises Hugging Face's own error when patched (same type, same message)."""
    model, ids, mask, eos, pad = setup("gpt2")
    bad = [dict(max_new_tokens=4, num_beams=2, num_return_sequences=3), dict(max_new_tokens=4, not_an_argument=1)]
    for kw in bad:
        with pytest.raises(Exception) as want:
            model.generate(ids, attention_mask=mask, **kw)
        with Calls(model), pytest.raises(type(want.value)) as got:
            model.generate(ids, attention_mask=mask, **kw)
        assert str(got.value) == str(want.value)


def test_streamer_falls_back_once(caplog):
    """A streamer is handed only to Hugging Face's own decoding: that call falls back, logged once, and the
    streamer still sees every token."""
    model, ids, mask, eos, pad = setup("gpt2")

    class Tokens:
        def __init__(self):
            self.seen = []

        def put(self, value):
            self.seen.append(value.tolist())

        def end(self):
            self.seen.append("end")

    want_stream, got_stream = Tokens(), Tokens()
    with torch.no_grad():
        want = model.generate(ids[:1], max_new_tokens=4, streamer=want_stream)
    with caplog.at_level(logging.WARNING, logger="beamkit.hf"), Calls(model) as calls, torch.no_grad():
        for _ in range(2):
            got = model.generate(ids[:1], max_new_tokens=4, streamer=got_stream)
    same(want, got)
    assert got_stream.seen == want_stream.seen * 2 and calls.own == 2
    assert sum("streamer" in r.getMessage() for r in caplog.records) == 1


def test_generate_takes_what_the_bridge_does_not():
    """``beamkit.hf.generate`` itself serves these calls through the loop too (identical to ``model.generate``),
    and refuses by name what the loop is not handed."""
    model, ids, mask, eos, pad = setup("gpt2")
    embeds = model.get_input_embeddings()(ids)
    with torch.no_grad():
        want = model.generate(inputs_embeds=embeds, attention_mask=mask, num_beams=2, max_new_tokens=4)
        same(want, bh.generate(model, inputs_embeds=embeds, attention_mask=mask, num_beams=2, max_new_tokens=4))
    with pytest.raises(bh.Unsupported, match="assistant_model="):
        bh.generate(model, ids, attention_mask=mask, max_new_tokens=4, assistant_model=model)


def near_uniform_t5():
    """A T5 initialised a thousand times smaller than usual: nearly uniform next-token distributions, so
    hypotheses tie within float32 rounding and the order of the running sums' arithmetic decides rankings."""
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64, d_kv=8, num_heads=4, vocab_size=48,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, initializer_factor=1e-3,
    )  # fmt: skip
    ids = torch.randint(3, 48, (8, 7), generator=torch.Generator().manual_seed(1))
    return transformers.T5ForConditionalGeneration(cfg).eval(), ids


def test_near_ties_come_out_as_hugging_faces():
    """Patched beam search on near-ties is identical to Hugging Face's, sequences and scores (it ranks with
    Hugging Face's float32 sums); the engine bridge (``fast=True``), which sums in float64, is not -- the case
    is a real near-tie, not a model where any arithmetic agrees."""
    model, ids = near_uniform_t5()
    kw = dict(num_beams=4, max_new_tokens=8, num_return_sequences=2)
    check_served(model, ids, **kw)
    check_served(model, ids, return_dict_in_generate=True, output_scores=True, **kw)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        with bh.patch(model, fast=True):
            fast = model.generate(ids, **kw)
    assert fast.shape != want.shape or not torch.equal(fast, want)


@pytest.mark.parametrize("beams", [1, 2])
def test_an_eos_outside_the_vocabulary_is_served_as_hugging_face_does(beams):
    """``eos_token_id=-1`` (Hugging Face warns and never stops early): patched, served identically by the loop
    -- the engine refuses such a request, which used to break the patched call."""
    model, ids, mask, eos, pad = setup("llama")
    check_served(model, ids, attention_mask=mask, eos_token_id=-1, pad_token_id=pad, num_beams=beams, max_new_tokens=4)


def test_a_model_without_generate_is_a_type_error():
    """Patching a base model (no language-modelling head, no ``generate``) names the problem."""
    torch.manual_seed(0)
    base = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20))
    with pytest.raises(TypeError, match="GPT2Model has no generate method to patch"):
        bh.patch(base)


@pytest.mark.parametrize("kind", ["diverse", "constrained"])
def test_variants_transformers_moved_to_the_hub_run_on_the_engine(kind):
    """Diverse (``num_beam_groups``) and constrained (``force_words_ids``) beam search, which transformers 5.x
    only loads from the Hub, are served by beamkit's engine when patched: the same output as
    ``beamkit.hf.generate`` (whose variants are tested in ``tests/test_hf.py``), no fall-back."""
    model, ids, mask, eos, pad = setup("gpt2")
    extra = dict(num_beam_groups=2, diversity_penalty=1.0) if kind == "diverse" else dict(force_words_ids=[[7]])
    kw = dict(attention_mask=mask, num_beams=4, max_new_tokens=5, eos_token_id=eos, pad_token_id=pad, **extra)
    want = bh.generate(model, ids, **kw)
    with Calls(model) as calls, torch.no_grad():
        got = model.generate(ids, **kw)
    assert torch.equal(got, want) and calls.own == calls.loop == 0 and not calls.handle.fallbacks


def test_a_mode_the_loop_does_not_decode_never_enters_hugging_faces_generate_twice():
    """Contrastive search (``penalty_alpha`` + ``top_k``, on the Hub in transformers 5.x) is refused before
    Hugging Face's ``generate`` runs with beamkit's loop, so the call runs once, on Hugging Face's own path (which
    expands a given ``encoder_outputs`` in place: a second run would see it expanded); Hugging Face's own error
    offline, the reason logged."""
    model, ids, mask, eos, pad = setup("t5")
    kw = dict(attention_mask=mask, penalty_alpha=0.6, top_k=4, max_new_tokens=3)
    with pytest.raises(Exception) as want:
        model.generate(ids, **kw)
    with Calls(model) as calls, pytest.raises(type(want.value)) as got:
        model.generate(ids, **kw)
    assert str(got.value) == str(want.value)
    assert calls.loop == 0 and calls.own == 1 and "contrastive_search" in calls.handle.fallbacks[0]
