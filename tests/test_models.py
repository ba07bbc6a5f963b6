"""The torch models as step functions: batched == single, incremental == full, hypotheses == teacher forcing."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from beamkit import Shared, search_batch, select_state  # noqa: E402
from beamkit.adapters import translate  # noqa: E402
from beamkit.models import (  # noqa: E402
    checkpoint,  # noqa: E402
    load_model,
    shipped_models,
)
from beamkit.models.common import encode_sources, pad_batch  # noqa: E402
from beamkit.models.scoring import score  # noqa: E402
from beamkit.models.seq2seq import DecoderState, Seq2Seq  # noqa: E402
from beamkit.models.transformer import Transformer, TransformerState  # noqa: E402
from beamkit.models.vocab import source_vocab, target_vocab  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


SOURCES = ["3rd of March 1999", "03/04/99", "Wed, 3 Mar 1999", "1999.3.3", "x"]


def _untrained(arch: str, seed: int = 0, device: str = "cpu"):
    """An untrained model of ``arch`` (weights drawn on the CPU from ``seed``, then moved to ``device``)."""
    torch.manual_seed(seed)
    sv, tv = source_vocab(), target_vocab()
    if arch == "seq2seq":
        model = Seq2Seq(sv, tv, emb=8, hidden=16, layers=2)
    else:
        model = Transformer(sv, tv, d_model=16, heads=2, ff=32, enc_layers=1, dec_layers=2, max_len=40)
    # larger output weights so the untrained distributions are far from uniform
    with torch.no_grad():
        model.out.weight.mul_(8.0)
    return model.eval().to(device)


def _batch(model, texts):
    src, lengths = pad_batch(encode_sources(model.src_vocab, texts), model.src_vocab.pad)
    device = model.out.weight.device
    return torch.as_tensor(src, device=device), torch.as_tensor(lengths, device=device)


def _run_steps(model, texts, tokens):
    """Feed the same token columns to a batch; return logits per step, each (B, V)."""
    state = model.init_state(*_batch(model, texts))
    out = []
    for col in tokens:
        logits, state = model.step(state, np.asarray(col, dtype=np.int64))
        out.append(logits)
    return out


ARCHS = ["seq2seq", "transformer"]


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_step_equals_single(arch, device):
    model = _untrained(arch, device=device)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, len(model.tgt_vocab), size=(6, len(SOURCES)))
    tokens[0] = model.tgt_vocab.bos
    with torch.inference_mode():
        batched = _run_steps(model, SOURCES, tokens)
        for i, text in enumerate(SOURCES):
            single = _run_steps(model, [text], tokens[:, i : i + 1])
            for t in range(len(tokens)):
                np.testing.assert_allclose(batched[t][i].cpu(), single[t][0].cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_steps_equal_teacher_forced_forward(arch, device):
    model = _untrained(arch, seed=1, device=device)
    tgt_in = torch.as_tensor(np.random.default_rng(1).integers(3, 14, size=(len(SOURCES), 7)), device=device)
    tgt_in[:, 0] = model.tgt_vocab.bos
    with torch.inference_mode():
        full = model(*_batch(model, SOURCES), tgt_in)  # all positions at once (causal mask for the transformer)
        steps = _run_steps(model, SOURCES, tgt_in.T.cpu().numpy())
    for t in range(tgt_in.shape[1]):
        np.testing.assert_allclose(steps[t].cpu(), full[:, t].cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_state_shapes_and_types(arch):
    model = _untrained(arch)
    with torch.inference_mode():
        state = model.init_state(*_batch(model, SOURCES[:3]))
        _, state = model.step(state, np.full(3, model.tgt_vocab.bos))
        _, state = model.step(state, np.full(3, 5))
        gathered = select_state(state, np.array([2, 2, 0, 1]))
    if arch == "seq2seq":
        assert isinstance(gathered, DecoderState) and len(gathered.h) == 2
        assert gathered.h[1].shape == (4, 16) and gathered.feed.shape == (4, 16)
        shared = gathered.memory
    else:
        assert isinstance(gathered, TransformerState)
        assert gathered.self_k[0].shape == (4, 2, 2, 8)  # (rows, heads, t, d_head)
        shared = gathered.cross
    assert gathered.req.tolist() == [2, 2, 0, 1]
    # the per-request data is passed through, not gathered: the very same object
    assert isinstance(shared, Shared) and shared is (state.memory if arch == "seq2seq" else state.cross)
    assert torch.equal(gathered.req, torch.tensor([2, 2, 0, 1]))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_hypothesis_logprob_equals_teacher_forced_score(arch, device):
    model = _untrained(arch, seed=2, device=device)
    with torch.inference_mode():
        state = model.init_state(*_batch(model, SOURCES))
        hyps = search_batch(model.step, state, model.tgt_vocab.bos, model.tgt_vocab.eos, 4, 8, length_penalty=1.0)
    count = 0
    for text, request in zip(SOURCES, hyps, strict=True):
        for h in request:
            assert score(model, text, h.tokens) == pytest.approx(h.logprob, abs=1e-4)
            count += 1
    assert count >= 4 * len(SOURCES) - 2


@pytest.mark.parametrize("name", ["dates-seq2seq", "dates-transformer"])
def test_shipped_model_hypotheses_equal_score_and_translate_the_issue_example(name):
    if name not in shipped_models():
        pytest.skip(f"{name} not shipped")
    model = load_model(name)
    outs = translate(model, ["3rd of March 1999", "March 3, '99", "1999.3.3"], beam_size=5)
    assert outs[0][0].text == "1999-03-03"
    assert outs[2][0].text == "1999-03-03"
    for text, request in zip(["3rd of March 1999", "March 3, '99", "1999.3.3"], outs, strict=True):
        scores = score(model, [text] * len(request), [h.tokens for h in request])
        np.testing.assert_allclose(scores, [h.logprob for h in request], atol=1e-4)
        # best first by score = logprob / len ** 1
        assert [h.score for h in request] == sorted((h.score for h in request), reverse=True)


def test_score_of_a_string_appends_eos():
    model = _untrained("seq2seq", seed=3)
    tv = model.tgt_vocab
    by_string = score(model, "1999.3.3", "1999-03-03")
    by_ids = score(model, "1999.3.3", tv.encode("1999-03-03") + [tv.eos])
    assert by_string == pytest.approx(by_ids)
    # hand check against a manual teacher-forced loop over the step function
    with torch.inference_mode():
        state = model.init_state(*_batch(model, ["1999.3.3"]))
        y, total = tv.bos, 0.0
        for tok in tv.encode("1999-03-03") + [tv.eos]:
            logits, state = model.step(state, np.array([y]))
            total += float(torch.log_softmax(logits.double(), -1)[0, tok])
            y = tok
    assert by_string == pytest.approx(total, abs=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_round_trip(tmp_path, arch, device):
    model = _untrained(arch, seed=4, device=device)  # saved from the device, loaded on the CPU
    folder = checkpoint.save(model, tmp_path / "ck", {"task": "dates", "max_len": 12})
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]
    config = json.loads((folder / "config.json").read_text())
    assert config["arch"] == arch and config["hparams"] == model.config
    assert json.loads((folder / "vocab.json").read_text())["target"] == list(target_vocab().symbols)
    loaded = checkpoint.load_checkpoint(folder)
    assert type(loaded) is type(model) and loaded.meta["task"] == "dates"
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value.cpu()), key
    assert translate(loaded, SOURCES, beam_size=3)[0][0].tokens == translate(model, SOURCES, beam_size=3)[0][0].tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_a_models_inputs_go_to_its_device(arch):
    """The ids a checkpoint adapter (``translate``, the commands, the server) and ``score`` hand a torch model are
    on the model's device: a model on the ``meta`` device (no GPU needed) gets ``meta`` tensors (they were made on
    the CPU, which a model on cuda refuses)."""
    from beamkit.adapters import CheckpointAdapter
    from beamkit.models.common import model_inputs

    model = _untrained(arch).to("meta")
    src, lengths = pad_batch(encode_sources(model.src_vocab, SOURCES[:2]), model.src_vocab.pad)
    assert [x.device.type for x in model_inputs(model, src, lengths)] == ["meta", "meta"]
    if arch == "transformer":  # (the LSTM's packed sequences have no meta kernels)
        assert CheckpointAdapter(model, arch).init_state([[5, 6], [7, 8]]).req.device.type == "meta"


def test_missing_and_corrupt_checkpoints_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        checkpoint.load_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(str(tmp_path / "nope"))
    folder = checkpoint.save(_untrained("seq2seq"), tmp_path / "ck")
    (folder / "model.safetensors").write_bytes(b"\x00garbage, not safetensors")
    with pytest.raises(ValueError, match="corrupt checkpoint file .*model.safetensors"):
        checkpoint.load_checkpoint(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        checkpoint.load_checkpoint(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt checkpoint file .*config.json"):
        checkpoint.load_checkpoint(folder)
    (folder / "config.json").write_text(
        json.dumps({"format": "beamkit-checkpoint", "version": 1, "arch": "rnn", "hparams": {}})
    )
    with pytest.raises(ValueError, match="unknown architecture 'rnn'"):
        checkpoint.load_checkpoint(folder)
    file = tmp_path / "file.bin"
    file.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a folder"):
        checkpoint.load_checkpoint(file)


def test_weights_that_do_not_match_the_config_fail_clearly(tmp_path):
    folder = checkpoint.save(_untrained("seq2seq"), tmp_path / "ck")
    config = json.loads((folder / "config.json").read_text())
    config["hparams"]["hidden"] = 32
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not match"):
        checkpoint.load_checkpoint(folder)


@pytest.mark.parametrize(
    ("arch", "path", "value", "message"),
    [
        ("seq2seq", ("hparams", "hidden"), "64", "hidden must be an integer >= 1, got '64'"),
        ("seq2seq", ("hparams", "emb"), 2.5, "emb must be an integer >= 1, got 2.5"),
        ("seq2seq", ("hparams", "layers"), True, "layers must be an integer >= 1, got True"),
        ("transformer", ("hparams", "heads"), "2", "heads must be an integer >= 1, got '2'"),
        ("transformer", ("hparams", "dropout"), "0.1", "dropout must be a finite number, got '0.1'"),
        ("seq2seq", ("meta", "max_len"), "12", "meta.max_len must be an integer >= 1, got '12'"),
        ("seq2seq", ("meta", "test"), {"1": "0.9"}, "meta.test must map beam widths to numbers"),
    ],
)
def test_config_values_of_the_wrong_type_name_the_key(tmp_path, arch, path, value, message):
    # a string where a number belongs used to surface as "not all arguments converted during string formatting"
    folder = checkpoint.save(_untrained(arch), tmp_path / "ck", meta={"max_len": 12})
    config = json.loads((folder / "config.json").read_text())
    config[path[0]][path[1]] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as info:
        load_model(str(folder))
    assert message in str(info.value)


def test_bad_inputs():
    model = _untrained("transformer")
    with pytest.raises(ValueError, match="empty input"):
        translate(model, [""])
    with pytest.raises(ValueError, match="empty input"):
        translate(model, ["   "])
    with pytest.raises(ValueError, match="unknown characters"):
        translate(model, ["3 März 1999"])
    with pytest.raises(ValueError, match="unknown characters"):
        translate(model, ["3rd of\tMarch"])
    with pytest.raises(TypeError, match="sequence of strings"):
        translate(model, "3rd of March 1999")
    with pytest.raises(TypeError, match="string"):
        translate(model, [19990303])
    with pytest.raises(ValueError, match="max_len"):
        translate(model, ["x" * 41])


def test_search_errors_against_exact_search():
    from beamkit.tasks.evaluate import evaluate_dates, exact_scores

    if "dates-seq2seq" not in shipped_models():
        pytest.skip("dates-seq2seq not shipped")
    model = load_model("dates-seq2seq")
    sources = ["03/03/99", "3rd of March 1999", "11/04/05"]
    optimum = exact_scores(model, sources, length_penalty=1.0)
    for k in (1, 3, 10):
        for best, request in zip(optimum, translate(model, sources, beam_size=k), strict=True):
            assert request[0].score <= best + 1e-5  # nothing beats the exact optimum
    # "03/03/99": greedy commits to the first year digit "1" (19xx + 18xx hold more mass than 20xx) ...
    greedy = translate(model, ["03/03/99"], beam_size=1)[0][0]
    assert greedy.text.startswith("1") and greedy.score < optimum[0] - 1e-3
    # ... while the exact optimum is 20xx, which a beam of 2 already finds
    assert translate(model, ["03/03/99"], beam_size=2)[0][0].text == "2099-03-03"
    result = evaluate_dates(model, [1, 5], limit=30, search_errors=True)
    errors = {k: v["search_errors"] for k, v in result["beams"].items()}
    assert all(isinstance(v, int) and 0 <= v <= 30 for v in errors.values())
    assert errors["1"] >= 1
