"""beamkit's search over OpenVINO IRs (``beamkit.openvino``) against independent oracles.

The IRs are made here, offline, from a tiny GPT-2 built on a fixed seed (:func:`beamkit.openvino.export_decoder`:
stateful with ``beam_idx``, stateless, and stateful without ``beam_idx``). Oracles: Hugging Face's own
``model.generate`` on the same float32 weights (tokens equal; scores within a float32 tolerance), each request
decoded alone (for requests joining mid-flight), the ``hf:DIR`` route of the same folder (for ``--model ov:DIR``).

Score tolerance: OpenVINO and torch compute the same float32 logits in other summation orders. Each logit is a
sum over ``n_embd`` = 32 products through 2 layers; its rounding error is a few units of float32's 2^-24 relative
to the magnitudes summed (|logit| < 10 here), ~1e-6 per logit, hence per log-probability; a sequence score sums at
most ``NEW`` = 10 of them (and Hugging Face's running sum rounds once per step in float32): below 1e-5 in all.
The tests allow 1e-4 (10x margin); a wrong token or a wrong row's logits moves a score by far more than that.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("openvino")

import beamkit  # noqa: E402
import beamkit.openvino as bo  # noqa: E402
from tests.word_tokenizer import WORDS, save_word_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 4 + len(WORDS)
NEW = 10
ARRIVALS = [0, 0, 2, 3, 3, 6]  # the step at which each prompt joins the running engine
TOL = 1e-4  # see the module docstring


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny GPT-2 (its stop token sharpened so that rows finish at different steps), its Hugging Face folder
    and three IR folders: ``{"model", "hf", "stateful", "stateless", "no_beam_idx"}``."""
    pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("ov")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=64, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # the stop token likelier, so that some rows finish early and others do not
        model.transformer.wte.weight[2] *= 3.0
    model.generation_config.pad_token_id = 0
    tok = save_word_tokenizer(root / "hf")
    model.save_pretrained(root / "hf")
    out = {"model": model, "hf": root / "hf"}
    for name, kw in (("stateful", {}), ("stateless", {"stateful": False}), ("no_beam_idx", {"beam_idx": False})):
        out[name] = bo.export_decoder(model, root / name, tokenizer=tok, **kw)
    return out


def _prompts():
    """Six left-padded prompts of different lengths ``(ids, mask)``."""
    rng = np.random.default_rng(3)
    lengths = [7, 3, 5, 1, 6, 4]
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.as_tensor(rng.integers(4, V, n))
        mask[i, width - n :] = 1
    return ids, mask


def _decode_arriving(step, beams):
    """Each of :func:`_prompts` (its padding removed: widths differ) added to one engine over ``step`` at its step
    of ``ARRIVALS``; returns ``(prompt index, prompt row, completion)`` per request, having checked that some
    requests joined running rows."""
    ids, mask = _prompts()
    engine = beamkit.Engine(step, beam_size=beams, max_len=NEW, policy="pool")
    rows: dict[int, tuple] = {}
    done = {}
    t = 0
    with torch.inference_mode():
        while len(rows) < len(ARRIVALS) or not engine.idle:
            for k, at in enumerate(ARRIVALS):
                if at == t:
                    row = ids[k : k + 1, mask[k].bool()]
                    rows[engine.add(step.init_state(row, torch.ones_like(row)), 0, [2])] = (k, row)
            for c in engine.step():
                done[c.request_id] = c
            t += 1
            assert t < 60
    assert any(n and i for i, n in enumerate(engine.stats.joined_per_call))  # some joined running rows
    return [(k, row, done[rid]) for rid, (k, row) in rows.items()]


def _hf(model, ids, mask, beams):
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=mask, num_beams=beams, max_new_tokens=NEW, do_sample=False, eos_token_id=2,
            pad_token_id=0, return_dict_in_generate=True, output_scores=True,
        )  # fmt: skip


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("kind", ["stateful", "stateless"])
def test_tokens_equal_hugging_face_generate(built, kind, beams):
    ids, mask = _prompts()
    want = _hf(built["model"], ids, mask, beams)
    got = bo.generate(
        built[kind], ids, mask, num_beams=beams, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    assert torch.equal(got.sequences, want.sequences)
    if beams > 1:
        np.testing.assert_allclose(got.sequences_scores.numpy(), want.sequences_scores.numpy(), atol=TOL, rtol=0)
    lengths = {len(h.tokens) for hyps in got.hypotheses for h in hyps}
    assert len(lengths) > 1  # rows finished at different steps
    rows = got.stats.rows_per_call
    assert rows[0] == ids.shape[0] and min(rows[1:]) < max(rows[1:])  # finished rows left the batch


def test_a_loaded_model_decodes_like_its_folder_and_logits_equal(built):
    ids, mask = _prompts()
    loaded = bo.Model(built["stateful"])
    a = bo.generate(loaded, ids, mask, num_beams=3, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0)
    b = bo.generate(str(built["stateful"]), ids, mask, num_beams=3, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0)
    assert torch.equal(a, b)
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        want = built["model"](input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    np.testing.assert_allclose(loaded(ids, mask).numpy(), want.numpy(), atol=1e-5, rtol=0)


def test_greedy_on_a_model_without_beam_idx_and_beams_refused(built):
    ids, mask = _prompts()
    want = _hf(built["model"], ids, mask, 1)
    got = bo.generate(built["no_beam_idx"], ids, mask, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0)
    assert torch.equal(got, want.sequences)  # finished rows stay in the model's state, their logits unused
    with pytest.raises(ValueError, match="without a beam_idx input.*greedily only"):
        bo.generate(built["no_beam_idx"], ids, mask, num_beams=2, max_new_tokens=NEW)


def test_sampling_repeats_with_the_seed_and_penalties_apply(built):
    """Settings OpenVINO GenAI's beam search refuses, on the same engine: the bridge's repetition penalty equals
    Hugging Face's; sampling repeats under ``torch.manual_seed`` and equals the torch bridge's draws."""
    import beamkit.hf

    ids, mask = _prompts()
    with torch.no_grad():
        want = built["model"].generate(
            ids, attention_mask=mask, num_beams=3, max_new_tokens=NEW, repetition_penalty=1.5, eos_token_id=2,
            pad_token_id=0, do_sample=False,
        )  # fmt: skip
    got = bo.generate(
        built["stateful"], ids, mask, num_beams=3, max_new_tokens=NEW, repetition_penalty=1.5, eos_token_id=2,
        pad_token_id=0,
    )  # fmt: skip
    assert torch.equal(got, want)
    kw = dict(do_sample=True, top_k=8, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(5)
    one = bo.generate(built["stateful"], ids, mask, **kw)
    torch.manual_seed(5)
    ref = beamkit.hf.generate(built["model"], ids, mask, **kw)
    assert torch.equal(one, ref)


def test_sampling_several_sequences_gives_each_prompt_that_many_rows(built):
    """``do_sample=True, num_return_sequences=3`` with one beam: three rows per prompt, as ``model.generate``
    returns them (each prompt sampled three times side by side), equal to the torch bridge's draws under the same
    seed, and to the same call on the prompts repeated three times."""
    import beamkit.hf

    ids, mask = _prompts()
    kw = dict(do_sample=True, top_k=8, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(7)
    got = bo.generate(built["stateful"], ids, mask, num_return_sequences=3, **kw)
    assert got.shape[0] == 3 * ids.shape[0]
    torch.manual_seed(7)
    assert torch.equal(got, beamkit.hf.generate(built["model"], ids, mask, num_return_sequences=3, **kw))
    torch.manual_seed(7)
    repeated = bo.generate(built["stateful"], ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), **kw)
    assert torch.equal(got, repeated)


@pytest.mark.parametrize("kind", ["stateful", "stateless", "no_beam_idx"])
def test_requests_joining_mid_flight_decode_as_alone(built, kind):
    model = bo.Model(built[kind])
    step = bo.OVDecoderStep(model)
    beams = 1 if kind == "no_beam_idx" else 3
    for k, row, got in _decode_arriving(step, beams):
        want = _hf(built["model"], row, torch.ones_like(row), beams)
        assert got.error is None, got.error
        best = got.hypotheses[0]
        assert list(want.sequences[0, row.shape[1] :].tolist())[: len(best.tokens)] == list(best.tokens), k
        if beams > 1:
            assert abs(best.score - float(want.sequences_scores[0])) < TOL


def test_a_stateful_model_refuses_an_older_state(built):
    step = bo.OVDecoderStep(bo.Model(built["stateful"]))
    ids, mask = _prompts()
    _, first = step(step.init_state(ids, mask), np.zeros(6, dtype=np.int64))
    older = first.beamkit_select(np.arange(6))
    step(first, np.full(6, 5))
    with pytest.raises(bo.StaleState, match="stateless IR"):
        step(older, np.full(6, 5))


def test_precisions_set_openvino_hints(built):
    import openvino as ov

    model = bo.Model(built["stateful"])
    f32 = model.compiled("f32", 1)
    assert f32.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
    assert f32.get_property("KV_CACHE_PRECISION") == ov.Type.f32
    assert f32.get_property("INFERENCE_NUM_THREADS") == 1
    assert model.compiled("bf16").get_property("KV_CACHE_PRECISION") == ov.Type.bf16
    ids, mask = _prompts()
    for precision in ("bf16", "auto"):  # runs; tokens may differ from float32's
        out = bo.generate(model, ids, mask, precision=precision, num_beams=2, max_new_tokens=4, eos_token_id=2)
        assert out.shape[0] == ids.shape[0]


def test_bad_input_gets_one_clear_error(built, tmp_path):
    ids, mask = _prompts()
    with pytest.raises(ValueError, match="precision must be 'f32', 'bf16' or 'auto', got 'fp8'"):
        bo.generate(built["stateful"], ids, mask, precision="fp8")
    with pytest.raises(ValueError, match="not an OpenVINO IR folder: no openvino_model.xml"):
        bo.Model(built["hf"])
    with pytest.raises(ValueError, match="is not a folder"):
        bo.Model(tmp_path / "missing")
    with pytest.raises(TypeError, match="IR folder or a beamkit.openvino.Model"):
        bo.generate(built["model"], ids, mask)
    with pytest.raises(ValueError, match="threads must be"):
        bo.generate(built["stateful"], ids, mask, threads=0)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("openvino_model.xml", "openvino_model.bin", "config.json"):
        (bare / name).write_bytes((built["stateful"] / name).read_bytes())
    with pytest.raises(ValueError, match="has no tokenizer"):
        bo.Model(bare).tokenizer()
    from beamkit.adapters import load

    with pytest.raises(ValueError, match="has no tokenizer"):
        load(f"ov:{bare}")
    with pytest.raises(FileNotFoundError, match="not an OpenVINO IR folder"):
        load(f"ov:{built['hf']}")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "openvino_model.xml").write_text("<net>")
    (broken / "config.json").write_text((built["stateful"] / "config.json").read_text())
    with pytest.raises(ValueError, match="cannot be read as an OpenVINO IR"):
        bo.Model(broken)


def test_ov_folder_decodes_as_the_hf_folder(built):
    from beamkit.adapters import decode_texts, load

    texts = ["w1 w2 w3", "w7 w7 w40 w2 w9", "w30"]
    ov = load(f"ov:{built['stateful']}")
    hf = load(f"hf:{built['hf']}")
    assert ov.tokenizer("w1 w2")["input_ids"] == hf.tokenizer("w1 w2")["input_ids"]
    for beam in (1, 3):
        a = decode_texts(ov, texts, beam=beam, n_best=1, max_len=6)
        b = decode_texts(hf, texts, beam=beam, n_best=1, max_len=6)
        assert [[h.tokens for h in r] for r in a] == [[h.tokens for h in r] for r in b]
        for ra, rb in zip(a, b, strict=True):
            np.testing.assert_allclose([h.score for h in ra], [h.score for h in rb], atol=TOL, rtol=0)


def test_the_translate_command_takes_ov(built, capsys):
    from beamkit.cli import main

    outs = []
    for spec in (f"ov:{built['stateful']}", f"hf:{built['hf']}"):
        code = main(["translate", "--model", spec, "--beam", "3", "--max-len", "6", "w1 w2 w3", "w30 w4"])
        out = capsys.readouterr().out
        assert code in (0, None)
        outs.append(out)
    assert outs[0] == outs[1] and outs[0].strip()


@pytest.mark.parametrize("beams", [1, 4])
def test_tokens_equal_openvino_genai_on_the_same_ir(built, beams):
    """OpenVINO GenAI's own decoding of the IR (its C++ greedy and beam search, ``LLMPipeline``) gives each
    prompt's best sequence; beamkit's best hypothesis over the same IR is the same tokens. Beam search with
    ``early_stopping=True`` on both sides: with Hugging Face's default (False), GenAI's heuristic stopping rule
    ends some requests at another step than Hugging Face's rule (which beamkit follows, see the tests above)."""
    og = pytest.importorskip("openvino_genai")
    import openvino as ov

    ids, mask = _prompts()
    props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "INFERENCE_NUM_THREADS": 1}
    pipe = og.LLMPipeline(str(built["stateful"]), "CPU", **props)
    config = pipe.get_generation_config()
    config.max_new_tokens, config.num_beams, config.eos_token_id, config.do_sample = NEW, beams, 2, False
    if beams > 1:  # early_stopping=True on both sides (GenAI's EARLY), length_penalty 1
        config.num_beam_groups, config.diversity_penalty, config.num_return_sequences = 1, 0.0, 1
        config.stop_criteria, config.length_penalty = og.StopCriteria.EARLY, 1.0
    inputs = og.TokenizedInputs(ov.Tensor(ids.numpy()), ov.Tensor(mask.numpy()))
    want = [list(row) for row in pipe.generate(inputs, config).tokens]
    got = bo.generate(
        built["stateful"], ids, mask, num_beams=beams, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0,
        early_stopping=True, return_dict_in_generate=True,
    )  # fmt: skip
    assert [list(hyps[0].tokens) for hyps in got.hypotheses] == want


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5, num_return_sequences=2),
        dict(num_beams=4, force_words_ids=[[10]]),
        dict(num_beams=3, no_repeat_ngram_size=2, num_return_sequences=3),
        dict(num_beams=4, patience=2.0),
    ],
    ids=["diverse", "constrained", "no-repeat-n-best", "patience"],
)
def test_search_variants_equal_the_torch_bridge(built, kw):
    """Diverse and constrained beam search, n-best lists, beamkit's own search options: the same tokens as
    ``beamkit.hf.generate`` over the float32 torch model (itself checked against Hugging Face elsewhere)."""
    import beamkit.hf

    ids, mask = _prompts()
    common = dict(max_new_tokens=8, eos_token_id=2, pad_token_id=0)
    got = bo.generate(built["stateful"], ids, mask, **common, **kw)
    want = beamkit.hf.generate(built["model"], ids, mask, **common, **kw)
    assert torch.equal(got, want)


def test_the_decode_command_takes_ov(built, tmp_path):
    import json

    from beamkit.cli import main

    (tmp_path / "in.txt").write_text("w1 w2 w3\nw30 w4\n")
    rows = []
    for spec in (f"ov:{built['stateful']}", f"hf:{built['hf']}"):
        out = tmp_path / f"{spec[:2]}.jsonl"
        argv = ["decode", "--input", str(tmp_path / "in.txt"), "--model", spec, "--beam", "3", "--output", str(out)]
        assert main(argv) in (0, None)
        rows.append([json.loads(line) for line in out.read_text().splitlines()])
    assert [[h["text"] for h in r["n_best"]] for r in rows[0]] == [[h["text"] for h in r["n_best"]] for r in rows[1]]
    for a, b in zip(rows[0], rows[1], strict=True):
        np.testing.assert_allclose([h["logprob"] for h in a["n_best"]], [h["logprob"] for h in b["n_best"]], atol=TOL)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama-style model (rotary positions, grouped key/value heads; tests/test_hf.py's) and its IR."""
    from tests.test_hf import _config_model

    model = _config_model("llama").eval()
    return model, bo.export_decoder(model, tmp_path_factory.mktemp("llama") / "ir")


@pytest.mark.parametrize("beams", [1, 4])
def test_a_llama_style_ir_gives_hugging_faces_tokens(llama, beams):
    from tests.test_hf import left_padded_prompts

    model, folder = llama
    ids, mask = left_padded_prompts(0, 20)
    kw = dict(num_beams=beams, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, do_sample=False, **kw)
    assert torch.equal(bo.generate(folder, ids, mask, **kw), want)
