"""Whisper short-form generation through beamkit, against ``WhisperForConditionalGeneration.generate`` itself.

A tiny random Whisper is built from a config with a fixed seed (no download), its generation config filled in
as a multilingual checkpoint's is (language and task tokens, the no-timestamps token, timestamp ids after it,
alignment heads). Whisper's own ``generate`` is the oracle: patched (or through ``beamkit.hf.generate``), the
same call must give identical outputs, with beamkit's decoding loop doing the decoding (recorded as in
``tests/test_hf_loop.py``).
"""

from __future__ import annotations

import copy
import functools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from tests.test_hf_loop import check_served, same  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 160
EOS, START, EN, FR, TRANSCRIBE, TRANSLATE, NO_TIMESTAMPS, PREV = 150, 100, 101, 102, 103, 104, 105, 106
PAD = VOCAB - 1  # ids above NO_TIMESTAMPS are timestamps (Whisper's layout), so the prompt token PREV sits there


def whisper(device=None):
    """(model, input_features [3, 16, 60]): a seeded tiny Whisper whose eos fires for some requests, on ``device``
    (default: the CPU; elsewhere the CPU's model and features, copied there)."""
    if device is None or torch.device(device).type == "cpu":
        return _whisper_cpu()
    return _whisper_on(str(device))


@functools.cache
def _whisper_on(device: str):
    """:func:`whisper` on ``device``."""
    model, feats = _whisper_cpu()
    return copy.deepcopy(model).to(device), feats.to(device)


@functools.cache
def _whisper_cpu():
    """:func:`whisper` on the CPU."""
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=30,
        max_target_positions=48, pad_token_id=PAD, bos_token_id=EOS, eos_token_id=EOS, decoder_start_token_id=START,
        suppress_tokens=None, begin_suppress_tokens=None,
    )  # fmt: skip
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    gc = model.generation_config
    gc.decoder_start_token_id, gc.eos_token_id, gc.pad_token_id = START, EOS, PAD
    gc.is_multilingual = True
    gc.lang_to_id = {"<|en|>": EN, "<|fr|>": FR}
    gc.task_to_id = {"transcribe": TRANSCRIBE, "translate": TRANSLATE}
    gc.no_timestamps_token_id, gc.prev_sot_token_id = NO_TIMESTAMPS, PREV
    gc.max_initial_timestamp_index = 5
    gc.alignment_heads = [[1, 0], [1, 1]]
    gc.max_length = 24
    with torch.no_grad():  # make eos likely enough to end some hypotheses early
        model.proj_out.weight[EOS] *= 4.5
    feats = torch.randn(3, 16, 60, generator=torch.Generator().manual_seed(1))
    return model, feats


CALLS = {
    "beam 5": dict(num_beams=5),
    "language and task": dict(num_beams=5, language="en", task="transcribe"),
    "translate, several returns": dict(num_beams=4, language="fr", task="translate", num_return_sequences=2),
    "timestamps": dict(num_beams=5, return_timestamps=True),
    "prompt": dict(num_beams=5, prompt_ids=torch.tensor([PREV, 20, 21])),
    "token timestamps": dict(num_beams=5, return_token_timestamps=True),
    "scores": dict(num_beams=5, return_dict_in_generate=True, output_scores=True),
    "greedy": dict(num_beams=1),
}


ON_DEVICE = ("beam 5", "timestamps", "scores", "greedy")  # the calls that also run on cuda
CALL_DEVICES = [
    pytest.param(c, d, id=f"{c}-{d}") for c in CALLS for d in (("cpu", "cuda") if c in ON_DEVICE else ("cpu",))
]


@pytest.mark.parametrize("call,device", CALL_DEVICES, indirect=["device"])
def test_patched_whisper_generate_is_served_and_identical(call, device):
    """Short-form beam search (and greedy) with language / task tokens, a prompt, timestamps and token
    timestamps (cross-attentions): patched, identical to Whisper's own ``generate``, decoded by beamkit."""
    model, feats = whisper(device)
    got, calls = check_served(model, feats, **CALLS[call])
    assert calls.loop == 1
    sequences = got if isinstance(got, torch.Tensor) else got["sequences"]
    assert sequences.shape[0] == feats.shape[0] * CALLS[call].get("num_return_sequences", 1)


def test_eos_ends_some_hypotheses_early():
    """The model is not degenerate: within the length limit some returned sequences end in eos, some do not
    (so the finished pool and early stopping are exercised)."""
    model, feats = whisper()
    with torch.no_grad():
        out = model.generate(feats, num_beams=5, num_return_sequences=5, return_dict_in_generate=True)
    ends = (out.sequences == EOS).any(dim=1)
    assert bool(ends.any()) and not bool(ends.all())


def test_beamkit_generate_takes_whisper(device):
    """``beamkit.hf.generate(whisper, input_features, ...)`` returns what ``model.generate`` returns."""
    model, feats = whisper(device=device)
    with torch.no_grad():
        want = model.generate(feats, num_beams=5, language="en", task="transcribe")
        same(want, bh.generate(model, feats, num_beams=5, language="en", task="transcribe"))
        want = model.generate(input_features=feats, num_beams=3, return_timestamps=True)
        same(want, bh.generate(model, input_features=feats, num_beams=3, return_timestamps=True))


def test_long_form_falls_back_nothing_breaks():
    """Long-form audio (more than one 30 s window, here more than ``max_source_positions`` frames) and the
    temperature fallback go through Whisper's own segment loop, whose per-window calls beamkit still decodes;
    outputs stay identical."""
    model, feats = whisper()
    long = torch.randn(1, 16, 150, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(1, 150, dtype=torch.long)
    for kw in (dict(num_beams=2, return_timestamps=True), dict(num_beams=2, temperature=(0.0, 0.4))):
        got, calls = check_served(model, long, attention_mask=mask, **kw)
        assert calls.loop >= 1


def sdpa_whisper(device=None):
    """:func:`whisper`'s model as a copy that attends with SDPA (the shared one is switched to eager attention by
    Whisper's ``generate`` once a call asks for token timestamps), and its features."""
    model, feats = whisper(device)
    model = copy.deepcopy(model)
    model.set_attn_implementation("sdpa")
    return model, feats


def test_direct_steps_give_the_model_calls_logits_bit_for_bit(device):
    """Whisper's decoder run directly (``beamkit.hf.steps.direct``, what the loop runs for each step after the first)
    against the model's own forward, step by step on copies of one cache, through reorders of the rows: the same
    logits (``torch.equal``) and the same self-attention keys/values. transformers' own output-capturing hooks
    (inactive outside a call that asks for attentions or hidden states) do not stop it."""
    from beamkit.hf.steps.direct import direct_step

    model, feats = sdpa_whisper(device)
    dev = feats.device
    with torch.no_grad():
        enc = model.get_encoder()(feats.repeat_interleave(2, dim=0))  # 6 rows: 3 requests x 2 beams
        ids = torch.tensor([[START, EN, TRANSCRIBE, NO_TIMESTAMPS]] * 6, device=dev)
        # asking for hidden states installs transformers' output-capturing hooks on the layers for good
        first = model(encoder_outputs=enc, decoder_input_ids=ids, use_cache=True, output_hidden_states=True)
        assert any(m._forward_hooks for m in model.modules())
        step, why = direct_step(model)
        assert step is not None, why
        cache, tok = first.past_key_values, first.logits[:, -1].argmax(-1, keepdim=True)
        for i, order in enumerate(([1, 1, 2, 3, 5, 4], [0, 1, 3, 3, 4, 4], [0, 0, 2, 3, 4, 5])):
            theirs = copy.deepcopy(cache)
            want = model(encoder_outputs=enc, decoder_input_ids=tok, past_key_values=theirs, use_cache=True).logits
            got = step(tok, None, None, cache)  # shape: (rows, V)
            assert torch.equal(got, want[:, -1]), f"step {i}"
            for ours, ref in zip(cache.self_attention_cache.layers, theirs.self_attention_cache.layers, strict=True):
                assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
            index = torch.tensor(order, device=dev)
            cache.reorder_cache(index)
            tok = got.argmax(-1, keepdim=True)[index]


def _direct_calls(monkeypatch):
    """A list that counts the direct step's calls from now on."""
    from beamkit.hf.steps.direct import DirectStep

    calls, step = [], DirectStep.__call__

    def counted(self, *args, **kwargs):
        calls.append(1)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(DirectStep, "__call__", counted)
    return calls


@pytest.mark.parametrize("call", ["beam 5", "greedy", "scores", "token timestamps"])
def test_the_loop_runs_whispers_steps_directly_unless_tables_are_asked(call, monkeypatch):
    """Through beamkit's loop Whisper's steps run directly, with outputs identical to Whisper's own ``generate``
    (the oracle); a call that asks for per-step attentions (token timestamps read the cross-attentions) gets
    every step from the model's forward, which returns them."""
    model, feats = sdpa_whisper()
    calls = _direct_calls(monkeypatch)
    kw = dict(CALLS[call], min_new_tokens=4)
    with torch.no_grad():
        want = model.generate(feats, **kw)
        assert not calls  # Hugging Face's own generate never runs it
        same(want, bh.generate(model, feats, **kw))
    assert (len(calls) > 0) == (call != "token timestamps"), len(calls)


def test_a_model_changed_between_calls_is_called_again(monkeypatch):
    """A Whisper with a forward hook on one layer (set after an earlier call ran directly) is called through its
    forward again, hook and all: the direct step is made per call, from the model as it is then."""
    model, feats = sdpa_whisper()
    calls = _direct_calls(monkeypatch)
    seen = []
    with torch.no_grad():
        bh.generate(model, feats, num_beams=3, min_new_tokens=3, language="en", task="transcribe")
        assert calls
        calls.clear()
        hook = model.model.decoder.layers[1].fc2.register_forward_hook(lambda *a: seen.append(1))
        try:
            want = model.generate(feats, num_beams=3, min_new_tokens=3, language="en", task="transcribe")
            hooked = len(seen)
            same(want, bh.generate(model, feats, num_beams=3, min_new_tokens=3, language="en", task="transcribe"))
        finally:
            hook.remove()
    assert not calls and len(seen) == 2 * hooked


def test_beams_share_their_cross_keys_only_where_every_row_of_a_request_is_equal():
    """The loop's beam reorder leaves the cross-attention cache as it is only when every beam of a request holds
    the same keys and values (as Hugging Face's expanded encoder output makes them); one differing row in one
    layer makes it reorder the whole cache."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from beamkit.hf.loop.decoding import BeamLoop

    def cache(rows):
        own, cross = DynamicCache(), DynamicCache()
        for i in range(2):
            own.update(torch.randn(6, 2, 3, 4), torch.randn(6, 2, 3, 4), i)
            cross.update(rows.clone(), rows.clone() + 1, i)
        return EncoderDecoderCache(own, cross)

    shared = torch.randn(3, 1, 2, 5, 4).expand(-1, 2, -1, -1, -1).reshape(6, 2, 5, 4)  # 3 requests x 2 beams

    def loop():
        run = BeamLoop.__new__(BeamLoop)
        run.batch, run.k, run.shared_cross = 3, 2, None
        return run

    assert loop().beams_share_cross(cache(shared))
    odd = cache(shared)
    odd.cross_attention_cache.layers[1].values[3, 1, 4, 0] += 1.0  # request 1, beam 1
    assert not loop().beams_share_cross(odd)
    assert not loop().beams_share_cross(DynamicCache())
