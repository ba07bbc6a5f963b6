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
