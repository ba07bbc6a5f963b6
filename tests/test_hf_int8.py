"""int8 weights for CPU decoding (``beamkit.hf.quantize_int8``) on tiny seeded GPT-2, Llama, T5, BART and Marian
models.

Oracles, none of them the int8 code:

* each int8 layer against a hand computation from the original float32 weights: the int8 weights and scales of
  the scheme (symmetric, per output channel, ``max |W| / 127``), the layer's output against the dequantised
  product computed in float64, and against the float32 layer within the quantisation error bound (below);
* ``model.generate`` of the same int8 model: ``beamkit.hf.generate`` must return the same tokens on the dense
  cache (int8 changes the model, not the decoding), and on the paged cache the same up to near-ties (its
  attention rounds float32 differently, and int8 rounding can magnify that by one int8 step);
* the float32 model: its logits within an argued relative error, top-1 flips only where the float32 margin
  is small (random tiny models have near-ties), and its weights unchanged by the quantisation.

The error bound of one layer, per output element (row ``r``, channel ``c``): with ``x = x^ + e`` (activation,
``|e| <= s_r / 2``, ``s_r = max_k |x_rk| / 127``) and ``W = W^ + d`` (weight, ``|d| <= w_c / 2``,
``w_c = max_k |W_ck| / 127``), ``x^ W^ - x W = -x d - e W + e d``, so
``|y_int8 - y_float| <= sum_k |x_rk| w_c / 2 + sum_k |W_ck| s_r / 2 + K s_r w_c / 4``, plus float32 rounding of
the rescaling (a few ulps of the products' magnitude; 1e-6 relative is four times that).
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
from tests.test_hf import VOCAB, full, left_padded_prompts, setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MODELS = ("gpt2", "llama", "t5", "bart", "marian")
NEW = 10
F32_SLOP = 1e-6  # relative float32 rounding of the rescaling (4 roundings of 2**-24 each, with a margin)


@functools.cache
def model_and_inputs(name: str):
    """(float32 model, input_ids, attention_mask, eos, pad): tests.test_hf's tiny models, or a tiny Marian."""
    if name != "marian":
        return setup(name)
    torch.manual_seed(0)
    pad = VOCAB - 1  # Marian's layout: pad is the last id and starts the decoder
    cfg = transformers.MarianConfig(
        vocab_size=VOCAB,
        decoder_vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=2,
        decoder_start_token_id=pad,
        forced_eos_token_id=None,
        init_std=0.1,
    )
    model = transformers.MarianMTModel(cfg).eval()
    model.generation_config.bad_words_ids = [[pad]]
    ids, mask = left_padded_prompts(pad, pad)
    return model, ids, mask, 2, pad


@functools.cache
def quantised(name: str, lm_head: bool = True):
    """The int8 copy of :func:`model_and_inputs`' model."""
    return bh.quantize_int8(model_and_inputs(name)[0], lm_head=lm_head)


def forward_inputs(model, ids, mask) -> dict:
    """Teacher-forced inputs of one forward over every prompt position (decoder inputs: the prompts shifted)."""
    if not model.config.is_encoder_decoder:
        return dict(input_ids=ids, attention_mask=mask)
    dec = ids[:, :6].clone()
    dec[:, 0] = model.config.decoder_start_token_id
    return dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)


def float_layers(model) -> dict:
    """``name -> (W (out, in), b or None)`` of every linear layer of a float32 model (GPT-2's Conv1D transposed)."""
    from transformers.pytorch_utils import Conv1D

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            out[name] = (mod.weight.detach(), None if mod.bias is None else mod.bias.detach())
        elif isinstance(mod, Conv1D):
            out[name] = (mod.weight.detach().t(), mod.bias.detach())
    return out


def hand_quantise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row, worked in float32 as the scheme states: (q as float, scale per row)."""
    amax = t.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(t / scale[:, None]).clamp(-127, 127), scale


@pytest.mark.parametrize("name", MODELS)
def test_every_layer_is_the_dequantised_product_within_the_quantisation_bound(name):
    model, ids, mask, _, _ = model_and_inputs(name)
    q = quantised(name)
    originals = float_layers(model)
    layers = {n: m for n, m in q.named_modules() if isinstance(m, bh.Int8Linear)}
    assert set(layers) == set(originals)  # every linear layer, the output projection included
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(name: str):
        def hook(mod, args, out) -> None:
            seen.setdefault(name, (args[0], out))

        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in layers.items()]
    try:
        with torch.no_grad():
            q(**forward_inputs(q, ids, mask))
    finally:
        for h in hooks:
            h.remove()
    assert set(seen) == set(layers)
    for n, (x, y) in seen.items():
        w, b = originals[n]
        wq, ws = hand_quantise(w.float())
        assert torch.equal(layers[n].weight, wq.to(torch.int8)), n
        assert torch.equal(layers[n].weight_scale, ws), n
        x2 = x.reshape(-1, w.shape[1]).float()  # shape: (rows, in)
        y2 = y.reshape(-1, w.shape[0]).double()  # shape: (rows, out)
        xq, xs = hand_quantise(x2)
        bias = torch.zeros(w.shape[0], dtype=torch.float64) if b is None else b.double()
        # the dequantised product, float64 (integer sums exact): the layer only rounds its rescaling
        dq = (xq.double() * xs.double()[:, None]) @ (wq.double() * ws.double()[:, None]).T + bias
        size = (xq.double() * xs.double()[:, None]).abs() @ (wq.double() * ws.double()[:, None]).abs().T
        assert ((y2 - dq).abs() <= F32_SLOP * (size + bias.abs()) + 1e-30).all(), n
        # against the float32 layer: the bound of the module docstring
        exact = x2.double() @ w.double().T + bias
        s, c = xs.double()[:, None], ws.double()[None, :]
        bound = (
            x2.double().abs().sum(1, keepdim=True) * c / 2
            + w.double().abs().sum(1)[None, :] * s / 2
            + w.shape[1] * s * c / 4
            + F32_SLOP * (x2.double().abs() @ w.double().abs().T + bias.abs())
        )
        assert ((y2 - exact).abs() <= bound).all(), n


def test_rows_are_quantised_alone_so_a_row_never_depends_on_the_batch():
    torch.manual_seed(3)
    layer = bh.Int8Linear(torch.randn(24, 40), torch.randn(24))
    x = torch.randn(6, 40) * torch.tensor([1e-3, 1.0, 50.0, 0.0, 2.0, 7.0])[:, None]  # rows of very different sizes
    batch = layer(x)  # shape: (6, 24)
    for r in range(6):
        assert torch.equal(batch[r], layer(x[r : r + 1])[0])  # bit for bit: one scale per row
    assert torch.equal(batch[3], layer.bias)  # a zero row: only the bias
    assert layer(x.view(2, 3, 40)).shape == (2, 3, 24)


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("name", MODELS)
def test_beamkit_generate_equals_the_int8_models_own_generate(name, beams):
    """On the dense cache (Hugging Face's own attention) beamkit decodes the int8 copy as its own ``generate``."""
    model, ids, mask, eos, pad = model_and_inputs(name)
    q = quantised(name)
    kw = dict(num_beams=beams, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=pad)
    if not model.config.is_encoder_decoder:
        kw["cache_implementation"] = "dynamic"
    with torch.no_grad():
        theirs = q.generate(
            ids, attention_mask=mask, do_sample=False, return_dict_in_generate=True, output_scores=True, **kw
        )
    assert torch.equal(bh.generate(q, ids, mask, **kw), theirs.sequences)
    engine = full(q, ids, mask, **kw)  # the engine bridge itself, with its sequences_scores
    assert torch.equal(engine.sequences, theirs.sequences)
    if beams > 1:  # as for float32 models: the engine's float64 sums against Hugging Face's float32 ones
        assert torch.allclose(engine.sequences_scores, theirs.sequences_scores, atol=1e-4, rtol=0)


NEAR_TIE = 0.05  # a beam score gap (mean log-probability per token) below which two searches may part ways


@pytest.mark.parametrize(("name", "lm_head"), [("gpt2", True), ("gpt2", False), ("llama", True)])
def test_the_paged_cache_decodes_the_int8_copy_up_to_near_ties(name, lm_head):
    """The paged cache's shared-prefix attention matches Hugging Face's to float32 rounding; int8 rounding can
    turn a one-ulp difference of an activation into one int8 step (``max |x| / 127``), which moves a tiny model's
    logits by well under 0.01 per step: over ten steps a row may differ only where the two best hypotheses'
    scores are within 0.05 of each other. A broken int8 layer on this path (wrong rows, wrong scales) moves the
    scores by far more."""
    _, ids, mask, eos, pad = model_and_inputs(name)
    q = quantised(name, lm_head)
    assert isinstance(q.lm_head, bh.Int8Linear if lm_head else torch.nn.Linear)
    assert bh.DecoderOnlyStep(q).kv == "paged"
    kw = dict(num_beams=4, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=pad)
    with torch.no_grad():
        theirs = q.generate(
            ids, attention_mask=mask, do_sample=False, return_dict_in_generate=True, output_scores=True, **kw
        )
    ours = full(q, ids, mask, **kw)
    assert ours.sequences.shape == theirs.sequences.shape
    assert torch.allclose(ours.sequences_scores, theirs.sequences_scores, atol=NEAR_TIE, rtol=0)
    assert torch.equal(bh.generate(q, ids, mask, **kw), ours.sequences)  # generate takes the engine here


@pytest.mark.parametrize("name", MODELS)
def test_logits_stay_close_to_float32_and_top1_flips_only_at_near_ties(name):
    """The relative rms error of the logits is at most 5 %: one operand rounded to a step of ``max / 127`` has an
    rms error of ``max / (127 sqrt 12)``, about 0.6 % of its rms for rows of 32-64 Gaussian-like values (max about
    2.5 rms), about 0.8 % per layer for its two operands, and at most ~2.5 % after the nine layers one token
    crosses in series here (errors adding in quadrature): 5 % is twice that. Its largest error is then at most
    about 3 rms errors, 0.15 standard deviations of the logits: an argmax can only change where the float32 top-1
    leads the second by less than twice that, so flips are at most the positions with such a near-tie."""
    model, ids, mask, _, _ = model_and_inputs(name)
    q = quantised(name)
    inputs = forward_inputs(model, ids, mask)
    dec = inputs.get("decoder_input_ids")
    keep = mask.bool() if dec is None else torch.ones_like(dec, dtype=torch.bool)  # positions that are not padding
    with torch.no_grad():
        f = model(**inputs).logits[keep]  # shape: (positions, V)
        g = q(**inputs).logits[keep]  # shape: (positions, V)
    assert ((f - g).pow(2).mean().sqrt() / f.std()).item() <= 0.05
    top2 = f.topk(2, dim=-1).values
    near_ties = int(((top2[:, 0] - top2[:, 1]) < 2 * 0.15 * f.std()).sum())
    flips = int((f.argmax(-1) != g.argmax(-1)).sum())
    assert flips <= near_ties


@pytest.mark.parametrize("name", MODELS)
def test_the_original_model_is_left_unchanged(name):
    model, ids, mask, eos, pad = model_and_inputs(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kinds = [type(m) for m in model.modules()]
    kw = dict(num_beams=2, max_new_tokens=4, eos_token_id=eos, pad_token_id=pad, do_sample=False)
    out = bh.generate(model, ids, mask, **kw)
    q = bh.quantize_int8(model)
    bh.generate(q, ids, mask, **kw)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert [type(m) for m in model.modules()] == kinds  # GPT-2's Conv1D still Conv1D, Linear still Linear
    assert torch.equal(bh.generate(model, ids, mask, **kw), out)
    emb = model.get_input_embeddings().weight
    assert q.get_input_embeddings().weight is not emb and torch.equal(q.get_input_embeddings().weight, emb)


def test_bad_models_are_refused_by_name(monkeypatch):
    model = model_and_inputs("gpt2")[0]
    with pytest.raises(TypeError, match="torch.nn.Module"):
        bh.quantize_int8("gpt2")
    with pytest.raises(ValueError, match=r"CPU only: the model is on meta .*model.to\('cpu'\)"):
        bh.quantize_int8(copy.deepcopy(model).to("meta"))
    with pytest.raises(ValueError, match=r"float32 model, this one holds torch.bfloat16 .*model.float\(\)"):
        bh.quantize_int8(copy.deepcopy(model).to(torch.bfloat16))
    with pytest.raises(TypeError, match="lm_head"):
        bh.quantize_int8(model, lm_head="yes")
    with pytest.raises(ValueError, match="no linear layer to quantise"):
        bh.quantize_int8(torch.nn.Embedding(4, 4))
    with pytest.raises(ValueError, match="lm_head=False: Sequential names no linear output layer"):
        bh.quantize_int8(torch.nn.Sequential(torch.nn.Linear(4, 4)), lm_head=False)
    assert isinstance(bh.quantize_int8(torch.nn.Sequential(torch.nn.Linear(4, 4)))[0], bh.Int8Linear)
    with pytest.raises(ValueError, match="already int8"):
        bh.quantize_int8(quantised("gpt2"))


def test_a_torch_without_int8_matmul_is_named(monkeypatch):
    model = model_and_inputs("gpt2")[0]

    def broken(a, b):
        raise RuntimeError("no kernel for int8")

    monkeypatch.setattr(torch, "_int_mm", broken)
    with pytest.raises(RuntimeError, match="int8 matrix multiply on the CPU.*no kernel for int8"):
        bh.quantize_int8(model)
    monkeypatch.delattr(torch, "_int_mm")
    with pytest.raises(RuntimeError, match=r"torch._int_mm.*install torch >= 2.2"):
        bh.quantize_int8(model)


def test_whisper_int8_decodes_as_its_own_generate():
    """Whisper (its encoder's convolutions stay float32; the decoder's and encoder's linear layers and the
    output projection become int8) through ``beamkit.hf.generate`` and its own ``generate``."""
    from tests.test_hf_whisper import whisper

    model, feats = whisper()
    q = bh.quantize_int8(model)
    assert isinstance(q.proj_out, bh.Int8Linear) and isinstance(q.model.encoder.conv1, torch.nn.Conv1d)
    with torch.no_grad():
        want = q.generate(feats, num_beams=5, language="en", task="transcribe")
    assert torch.equal(bh.generate(q, feats, num_beams=5, language="en", task="transcribe"), want)
