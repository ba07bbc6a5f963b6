"""The direct decoding step (``beamkit.hf.steps.direct``): a known model family's layers run without the model wrapper.

Oracle: the model's own forward. The direct step calls the same layer functions, in the same order, on the same
inputs and the same cache, so its logits must equal the model call's bit for bit (``torch.equal``; on one
machine the same kernels on the same operands give the same floats): step by step, through left padding, beam
reorders, rows leaving and the cache growing. End to end, ``beamkit.hf.generate`` must give ``model.generate``'s
tokens. Models it does not know, or that it must not bypass (hooks, training mode, another attention function, a
sliding window), run through the model call, with the reason recorded.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from beamkit.hf.steps.direct import direct_step  # noqa: E402
from beamkit.hf.steps.step import DecoderOnlyStep, EncoderDecoderStep  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 300


def _model(family: str, **extra):
    """A tiny seeded model of ``family``: 2 layers, 64 wide, 4 heads (2 key/value heads for the Llama-style)."""
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=128, **extra)
        return transformers.GPT2LMHeadModel(cfg).eval()
    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }
    config_cls, model_cls = classes[family]
    extra.setdefault("sliding_window", None) if family == "mistral" else None
    cfg = config_cls(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=V, max_position_embeddings=128, **extra,
    )  # fmt: skip
    return model_cls(cfg).eval()


FAMILIES = ("gpt2", "llama", "mistral", "qwen2")
SEQ2SEQ = ("marian", "bart", "t5")


def _seq2seq(family: str):
    """A tiny seeded Marian, BART or T5 model: 2+2 layers, 64 wide, 4 heads, feed-forward 96 (pad last for Marian,
    as it has it; T5 with its own relative position bias and output scaling)."""
    torch.manual_seed(0)
    if family == "t5":
        cfg = transformers.T5Config(
            vocab_size=V, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
            decoder_start_token_id=V - 1, pad_token_id=V - 1, eos_token_id=1,
        )  # fmt: skip
        return transformers.T5ForConditionalGeneration(cfg).eval()
    sizes = dict(
        vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=128,
    )  # fmt: skip
    if family == "marian":
        cfg = transformers.MarianConfig(
            decoder_vocab_size=V, pad_token_id=V - 1, eos_token_id=1, decoder_start_token_id=V - 1, **sizes
        )
        return transformers.MarianMTModel(cfg).eval()
    cfg = transformers.BartConfig(scale_embedding=True, forced_eos_token_id=None, **sizes)
    return transformers.BartForConditionalGeneration(cfg).eval()


def _prompts(device):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (5, 8), generator=gen)
    mask = torch.ones_like(ids)
    for i, pad in enumerate((0, 3, 1, 0, 5)):  # left padding of different widths
        mask[i, :pad] = 0
    return ids.to(device), mask.to(device)


@pytest.mark.parametrize("family", FAMILIES)
def test_direct_logits_equal_the_model_call(family, device):
    """Step by step, the direct step's logits are the model call's, bit for bit, as rows fork, leave and the
    cache grows (the same random parents and tokens fed to both)."""
    model = _model(family).to(device)
    fast, slow = DecoderOnlyStep(model, kv="dense"), DecoderOnlyStep(model, kv="dense", direct=False)
    assert fast.direct is not None, fast.direct_reason
    assert slow.direct is None
    ids, mask = _prompts(device)
    rng = np.random.default_rng(0)
    y = torch.zeros(5, dtype=torch.long, device=device)
    with torch.inference_mode():
        a, b = fast.init_state(ids, mask), slow.init_state(ids, mask)
        for t in range(14):
            la, a = fast(a, y)
            lb, b = slow(b, y)
            assert la.shape == lb.shape and torch.equal(la, lb), f"step {t}: max diff {(la - lb).abs().max()}"
            rows = la.shape[0]
            size = rows + 2 if t == 2 else max(1, rows - 1) if t == 9 else rows  # a fork, then rows leaving
            parents = np.sort(rng.integers(0, rows, size=size))
            if t > 0:
                a, b = a.beamkit_select(parents), b.beamkit_select(parents)
            else:
                parents = np.arange(rows)
            y = torch.from_numpy(rng.integers(0, V, size=parents.shape[0])).to(device)
    assert fast.forward_seconds > 0


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_encoder_decoder_logits_equal_the_model_call(family, device):
    """Marian and BART: the direct decoder step's logits are the model call's, bit for bit, with the encoder's
    padding, beams forking and leaving; after the first step the model itself is not called."""
    model = _seq2seq(family).to(device)
    fast, slow = EncoderDecoderStep(model), EncoderDecoderStep(model, direct=False)
    assert fast.direct is not None, fast.direct_reason
    ids, mask = _prompts(device)
    ids = ids.clamp(max=V - 2)  # no pad token inside the source
    mask = mask.flip(1)  # encoder inputs are right-padded
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))  # after the steps are made: they keep direct
    rng = np.random.default_rng(1)
    y = torch.full((5,), int(model.config.decoder_start_token_id), device=device)
    with torch.inference_mode():
        a, b = fast.init_state(ids, mask), slow.init_state(ids, mask)
        for t in range(10):
            la, a = fast(a, y)
            lb, b = slow(b, y)
            assert torch.equal(la, lb), f"step {t}: max diff {(la - lb).abs().max()}"
            rows = la.shape[0]
            parents = np.sort(rng.integers(0, rows, size=rows + 3 if t == 0 else max(1, rows - (t == 6))))
            a, b = a.beamkit_select(parents), b.beamkit_select(parents)
            y = torch.from_numpy(rng.integers(0, V, size=parents.shape[0])).to(device)
    assert len(calls) == 1 + 10  # the direct step's first call, then the model-call step's ten


@pytest.mark.parametrize("family", ("gpt2", "llama", "marian", "bart", "t5"))
@pytest.mark.parametrize("beams", (1, 4))
def test_generate_matches_hugging_face(family, beams):
    """``beamkit.hf.generate`` on the direct step returns ``model.generate``'s sequences, greedy and beam."""
    model = _seq2seq(family) if family in SEQ2SEQ else _model(family)
    ids, mask = _prompts("cpu")
    if family in SEQ2SEQ:
        ids, mask = ids.clamp(max=V - 2), mask.flip(1)
    kw = dict(num_beams=beams, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=7)
    if beams > 1:
        kw.update(num_return_sequences=2, early_stopping=True)
    want = model.generate(ids, attention_mask=mask, **kw)
    got = bh.generate(model, ids, mask, **kw)
    assert torch.equal(got, want)


def _reason(model) -> str:
    made, reason = direct_step(model)
    assert made is None
    return reason


class SteeredBlock(transformers.models.gpt2.modeling_gpt2.GPT2Block):
    """A user's block: the stock block plus a shift (its own forward is what the model runs)."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) + 0.5


def test_models_it_does_not_know_or_must_not_bypass():
    """Each case runs through the model call, and the reason names the problem."""
    torch.manual_seed(0)
    opt = transformers.OPTForCausalLM(
        transformers.OPTConfig(hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2, vocab_size=V)
    ).eval()
    assert "OPTForCausalLM is not a model family" in _reason(opt)
    assert "training mode" in _reason(_model("gpt2").train())
    eager = _model("llama", attn_implementation="eager")
    assert "'eager'" in _reason(eager)
    assert "sliding-window" in _reason(_model("mistral", sliding_window=4))
    hooked = _model("gpt2")
    hooked.transformer.h[1].mlp.register_forward_hook(lambda *a: None)
    assert "transformer.h.1.mlp (GPT2MLP) has forward hooks" in _reason(hooked)
    dropout = _model("gpt2")
    dropout.transformer.h[0].attn.train()  # the model itself in evaluation mode
    assert "transformer.h.0.attn (GPT2Attention) is in training mode" in _reason(dropout)
    steered = _model("gpt2")
    steered.transformer.h[1] = SteeredBlock(steered.config, layer_idx=1).eval()
    assert "transformer.h.1 (SteeredBlock) comes from tests" in _reason(steered)
    replaced = _model("llama")
    layer = replaced.model.layers[0]
    layer.forward = lambda *a, **k: type(layer).forward(layer, *a, **k)  # as accelerate's hooks do
    assert "model.layers.0 (LlamaDecoderLayer) has its forward replaced" in _reason(replaced)
    fewer = _model("llama")
    fewer.config.num_hidden_layers = 1  # the model runs only the first layer
    assert "2 layers against 1 in the config" in _reason(fewer)
    own = _model("llama")
    attn = own.model.layers[1].self_attn
    attn.config = copy.deepcopy(attn.config)
    attn.config._attn_implementation = "eager"  # this layer alone attends eagerly
    assert "model.layers.1.self_attn (LlamaAttention) attends with 'eager'" in _reason(own)
    assert "T5 in float16" in _reason(_seq2seq("t5").half())


def test_a_model_changed_after_the_step_is_made_is_called():
    """Training mode, another attention function or a global hook set after the step was made: the step calls
    the model (its logits follow the change), and ``direct.reason`` says why."""
    model = _model("gpt2")
    ids, mask = _prompts("cpu")
    step = DecoderOnlyStep(model, kv="dense")
    assert step.direct is not None
    y = torch.zeros(5, dtype=torch.long)
    calls = []
    with torch.inference_mode():
        state = step.init_state(ids, mask)
        _, state = step(state, y)
        model.transformer.register_forward_pre_hook(lambda *a: calls.append(1))  # a model call runs it
        _, state = step(state, y)
        assert calls == []  # a hook on one layer after the step was made: not seen (documented)
        handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None)
        try:
            _, state = step(state, y)
        finally:
            handle.remove()
        assert calls == [1] and step.direct.reason == "global module hooks are registered"
        model.config._attn_implementation = "eager"
        try:
            _, state = step(state, y)
        finally:
            model.config._attn_implementation = "sdpa"
        assert calls == [1, 1] and "'eager'" in step.direct.reason


def test_a_hook_still_runs():
    """A forward hook on a layer is called on every decoding step (the step falls back to the model call), and
    the output is still Hugging Face's."""
    model = _model("gpt2")
    ids, mask = _prompts("cpu")
    calls = []
    model.transformer.h[0].attn.register_forward_hook(lambda mod, args, out: calls.append(1))
    kw = dict(num_beams=1, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    got = bh.generate(model, ids, mask, **kw)
    assert len(calls) == 6  # the prompt, then five one-token steps
    calls.clear()
    want = model.generate(ids, attention_mask=mask, **kw)
    assert torch.equal(got, want) and len(calls) == 6


def test_step_switch_and_reason():
    """``direct=False`` turns it off; a model it serves says ``"direct"``."""
    model = _model("qwen2")
    assert DecoderOnlyStep(model).direct_reason == "direct"
    assert DecoderOnlyStep(model, direct=False).direct_reason == "direct=False"
    assert EncoderDecoderStep(_seq2seq("bart"), direct=False).direct is None
