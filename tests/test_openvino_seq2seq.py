"""beamkit's search over OpenVINO encoder-decoder IRs (BART, Marian; :func:`beamkit.openvino.export_seq2seq`).

Oracles: Hugging Face's own ``model.generate`` on the same float32 weights (tokens equal; scores within float32
rounding, argued in ``tests/test_openvino.py``'s docstring: 1e-4), each request decoded alone (for requests
joining mid-flight), and the ``hf:DIR`` route of the same folder (``--model ov:DIR``).
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
from tests.test_openvino import TOL, V  # noqa: E402
from tests.word_tokenizer import save_word_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NEW = 10


def _marian():
    """A tiny Marian (pad is the last id and starts the decoder; sinusoidal positions), seeded."""
    torch.manual_seed(0)
    cfg = transformers.MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=V - 1, eos_token_id=2, decoder_start_token_id=V - 1, forced_eos_token_id=None, init_std=0.2,
    )  # fmt: skip
    return transformers.MarianMTModel(cfg).eval()


@pytest.fixture(scope="module", params=["bart", "marian"])
def seq2seq(request, tmp_path_factory):
    """(name, float32 model, its Hugging Face folder with a tokenizer, its IR folder)."""
    pytest.importorskip("tokenizers")
    from tests.test_hf import _config_model

    name = request.param
    model = _config_model("bart").eval() if name == "bart" else _marian()
    root = tmp_path_factory.mktemp(name)
    tok = save_word_tokenizer(root / "hf")
    model.save_pretrained(root / "hf")
    return name, model, root / "hf", bo.export_seq2seq(model, root / "ir", tokenizer=tok)


def _inputs(model):
    """Six encoder inputs of different lengths, right-padded."""
    rng = np.random.default_rng(4)
    lengths = [7, 3, 5, 1, 6, 4]
    pad = int(model.config.pad_token_id)
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.as_tensor(rng.integers(3, V - 1, n))
        mask[i, :n] = 1
    return ids, mask


@pytest.mark.parametrize("beams", [1, 4])
def test_tokens_equal_hugging_face_generate(seq2seq, beams):
    _, model, _, folder = seq2seq
    ids, mask = _inputs(model)
    kw = dict(num_beams=beams, max_new_tokens=NEW, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, do_sample=False, **kw)
    got = bo.generate(folder, ids, mask, **kw)
    assert torch.equal(got.sequences, want.sequences)
    if beams > 1:
        np.testing.assert_allclose(got.sequences_scores.numpy(), want.sequences_scores.numpy(), atol=TOL, rtol=0)
    assert got.stats.rows_per_call[0] == ids.shape[0]  # the encoder and first step run once per request


def _engine_run(step, requests, start, eos):
    """Decode ``requests`` (``(arrival step, encoder input [1, S])``) on one engine, each added at its arrival;
    returns the completions in request order and the engine."""
    engine = beamkit.Engine(step, beam_size=3, max_len=NEW, policy="pool")
    rids, done, t = {}, {}, 0
    with torch.inference_mode():
        while len(rids) < len(requests) or not engine.idle:
            for k, (at, row) in enumerate(requests):
                if at == t:
                    rids[engine.add(step.init_state(row, torch.ones_like(row)), start, eos)] = k
            for c in engine.step():
                done[c.request_id] = c
            t += 1
            assert t < 60
    return [done[rid] for rid in sorted(rids, key=rids.get)], engine


def test_requests_joining_mid_flight_decode_as_alone(seq2seq):
    """Requests join a running engine at different steps (their encoder inputs of different widths); each gets
    what the same engine gives it alone."""
    _, model, _, folder = seq2seq
    ids, mask = _inputs(model)
    m = bo.Model(folder)
    step = bo.make_step(m)
    assert isinstance(step, bo.OVSeq2SeqStep)
    start, eos = int(model.config.decoder_start_token_id), [int(model.config.eos_token_id)]
    rows = [ids[k : k + 1, mask[k].bool()] for k in range(ids.shape[0])]  # without padding: widths differ
    arrivals = [0, 0, 2, 3, 3, 6]
    together, engine = _engine_run(step, list(zip(arrivals, rows, strict=True)), start, eos)
    assert any(n and i for i, n in enumerate(engine.stats.joined_per_call))
    for k, got in enumerate(together):
        (want,), _ = _engine_run(bo.make_step(m), [(0, rows[k])], start, eos)
        assert got.error is None and want.error is None
        assert [h.tokens for h in got.hypotheses] == [h.tokens for h in want.hypotheses], k
        np.testing.assert_allclose([h.score for h in got.hypotheses], [h.score for h in want.hypotheses], atol=TOL)


def test_the_translate_command_takes_an_encoder_decoder_ov_folder(seq2seq, capsys):
    from beamkit.cli import main

    _, _, hf_folder, folder = seq2seq
    outs = []
    for spec in (f"ov:{folder}", f"hf:{hf_folder}"):
        code = main(["translate", "--model", spec, "--beam", "3", "--max-len", "6", "w1 w2 w3", "w30 w4"])
        outs.append(capsys.readouterr().out)
        assert code in (0, None)
    assert outs[0] == outs[1] and outs[0].strip()


def test_a_hugging_face_folder_exports_with_its_own_tokenizer(seq2seq, tmp_path, capsys):
    """``export_seq2seq`` given the Hugging Face folder (no tokenizer passed) loads the model and the folder's
    tokenizer from it; the IR folder reads as the ``hf:DIR`` route of the same folder does."""
    from beamkit.cli import main

    _, _, hf_folder, _ = seq2seq
    folder = bo.export_seq2seq(hf_folder, tmp_path / "ir")
    assert (folder / "tokenizer.json").is_file()
    outs = []
    for spec in (f"ov:{folder}", f"hf:{hf_folder}"):
        code = main(["translate", "--model", spec, "--beam", "3", "--max-len", "6", "w1 w2 w3", "w30 w4"])
        outs.append(capsys.readouterr().out)
        assert code in (0, None)
    assert outs[0] == outs[1] and outs[0].strip()


def test_an_encoder_decoder_folder_missing_an_ir_is_refused(seq2seq, tmp_path):
    _, _, _, folder = seq2seq
    for name in ("openvino_encoder_model.xml", "openvino_encoder_model.bin", "config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    with pytest.raises(ValueError, match="without openvino_decoder_model.xml"):
        bo.Model(tmp_path)
    with pytest.raises(TypeError, match="encoder-decoder models"):
        bo.export_seq2seq(
            transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2)), tmp_path
        )


def test_an_older_state_is_refused_not_read(seq2seq):
    """A state's self-attention keys/values are views of an infer request's outputs: stepping a state whose
    request has run since raises StaleState instead of reading overwritten keys/values."""
    _, model, _, folder = seq2seq
    ids, mask = _inputs(model)
    step = bo.make_step(bo.Model(folder))
    start = np.full(ids.shape[0], int(model.config.decoder_start_token_id))
    _, first = step(step.init_state(ids, mask), start)
    _, second = step(first, np.full(ids.shape[0], 5))
    older = second.beamkit_select(np.arange(ids.shape[0]))
    _, third = step(second, np.full(ids.shape[0], 6))
    step(third, np.full(ids.shape[0], 7))  # runs on the request that made ``older``'s keys/values
    with pytest.raises(bo.StaleState, match="newer one ran"):
        step(older, np.full(ids.shape[0], 7))
