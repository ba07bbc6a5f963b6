"""The shared-prompt IR (``export_decoder(..., shared_prompt=True)``, ``generate(..., shared_prompt=True)``): each
request's prompt keys/values held once however many beams read them.

Oracles: Hugging Face's ``model.generate`` on the same float32 weights (tokens equal; scores within
``tests.test_openvino.TOL``, argued there: the two softmax parts merged here add a few float32 roundings per
attention output, of the same ~1e-7 relative size, well inside it), each request decoded alone (requests joining
mid-flight), and the sizes of the keys/values held counted by hand from the model's dimensions.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("openvino")

import beamkit.openvino as bo  # noqa: E402
from beamkit.openvino.shared import grid  # noqa: E402
from tests.test_openvino import NEW, TOL, V, _decode_arriving, _hf, _prompts  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYERS, HEADS, HEAD_DIM = 2, 2, 16


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The tiny GPT-2 of tests/test_openvino.py (same seed and settings) and its IR folder with the shared-prompt
    IR: ``(model, folder)``."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=LAYERS, n_embd=HEADS * HEAD_DIM, n_head=HEADS, vocab_size=V, n_positions=64, bos_token_id=1,
        eos_token_id=2, pad_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.transformer.wte.weight[2] *= 3.0
    model.generation_config.pad_token_id = 0
    return model, bo.export_decoder(model, tmp_path_factory.mktemp("shared") / "ir", shared_prompt=True)


@pytest.mark.parametrize("beams", [1, 4, 8])
def test_tokens_equal_hugging_face_generate(shared, beams):
    model, folder = shared
    ids, mask = _prompts()
    want = _hf(model, ids, mask, beams)
    got = bo.generate(
        folder, ids, mask, shared_prompt=True, num_beams=beams, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    assert torch.equal(got.sequences, want.sequences)
    if beams > 1:
        np.testing.assert_allclose(got.sequences_scores.numpy(), want.sequences_scores.numpy(), atol=TOL, rtol=0)
    rows = got.stats.rows_per_call
    assert rows[0] == ids.shape[0] and min(rows[1:]) < max(rows[1:])  # finished rows left the batch


def test_a_llama_style_model_with_grouped_heads_gives_hugging_faces_tokens(tmp_path):
    from tests.test_hf import _config_model, left_padded_prompts

    model = _config_model("llama").eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped queries
    folder = bo.export_decoder(model, tmp_path / "ir", shared_prompt=True)
    ids, mask = left_padded_prompts(0, 20)
    for beams in (1, 4):
        kw = dict(num_beams=beams, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0)
        with torch.no_grad():
            want = model.generate(ids, attention_mask=mask, do_sample=False, **kw)
        assert torch.equal(bo.generate(folder, ids, mask, shared_prompt=True, **kw), want)


@pytest.mark.parametrize("beams", [3, 8])
def test_requests_joining_mid_flight_decode_as_alone(shared, beams):
    model, folder = shared
    step = bo.OVSharedPromptStep(bo.Model(folder))
    for k, row, got in _decode_arriving(step, beams):
        want = _hf(model, row, torch.ones_like(row), beams)
        assert got.error is None, got.error
        best = got.hypotheses[0]
        assert list(want.sequences[0, row.shape[1] :].tolist())[: len(best.tokens)] == list(best.tokens), k
        assert abs(best.score - float(want.sequences_scores[0])) < TOL


def test_the_prompt_is_held_once_per_request(shared):
    _, folder = shared
    prompt = 20
    beams = 8
    ids = torch.as_tensor(np.random.default_rng(1).integers(4, V, (1, prompt)))
    mask = torch.ones_like(ids)
    step = bo.OVSharedPromptStep(bo.Model(folder))
    logits, state = step(step.init_state(ids, mask), np.zeros(1, dtype=np.int64))
    assert logits.shape == (1, V)
    wide = state.beamkit_select(np.zeros(beams, dtype=np.int64))  # every beam forks from the prompt's row
    for t in range(3):
        _, wide = step(wide, np.full(beams, 5 + t))
    per_position = LAYERS * 2 * HEADS * HEAD_DIM * 4  # bytes of one position's keys and values, float32
    # the prompt once, and each beam's 3 generated positions (not 8 copies of 23 positions)
    assert step.main.state_bytes() == per_position * (prompt + beams * 3)
    assert {a.shape for a in step.main.prompt.values()} == {(1, HEADS, prompt, HEAD_DIM)}
    dense = bo.OVDecoderStep(bo.Model(folder))
    _, rows = dense(dense.init_state(ids, mask), np.zeros(1, dtype=np.int64))
    rows = rows.beamkit_select(np.zeros(beams, dtype=np.int64))
    for t in range(3):
        _, rows = dense(rows, np.full(beams, 5 + t))
    held = sum(int(a.nbytes) for a in dense.main.read().values())
    assert held == per_position * beams * (prompt + 3)  # the usual IR: a copy of the prompt per beam


def test_a_finished_requests_prompt_is_dropped(shared):
    _, folder = shared
    ids, mask = _prompts()
    step = bo.OVSharedPromptStep(bo.Model(folder))
    _, state = step(step.init_state(ids, mask), np.zeros(6, dtype=np.int64))
    assert step.main.prompt_mask.shape[0] == 6
    keep = np.array([0, 0, 3, 5, 5])  # requests 1, 2 and 4 finished
    _, state = step(state.beamkit_select(keep), np.full(5, 7))
    assert step.main.prompt_mask.shape[0] == 3
    assert state.prompt_of.tolist() == [0, 0, 1, 2, 2]
    np.testing.assert_array_equal(step.main.prompt_mask, mask.numpy()[[0, 3, 5]])


def test_grid_places_each_row_on_its_request():
    prompt_of = np.array([0, 0, 0, 1, 2, 2])
    grid_rows, row_slot = grid(prompt_of, 3)
    assert grid_rows.tolist() == [0, 1, 2, 3, 3, 3, 4, 5, 4]  # 3 wide; padding slots repeat a row of the request
    assert row_slot.tolist() == [0, 1, 2, 3, 6, 7]
    assert (prompt_of[grid_rows] == np.repeat(np.arange(3), 3)).all()


def test_bad_input_gets_one_clear_error(shared, tmp_path):
    model, _ = shared
    plain = bo.export_decoder(model, tmp_path / "plain")
    ids, mask = _prompts()
    with pytest.raises(ValueError, match="has no shared-prompt IR.*shared_prompt=True"):
        bo.generate(plain, ids, mask, shared_prompt=True, num_beams=2, max_new_tokens=2)
    with pytest.raises(TypeError, match="shared_prompt must be"):
        bo.generate(plain, ids, mask, shared_prompt="yes")


def test_other_precisions_run(shared):
    _, folder = shared
    ids, mask = _prompts()
    model = bo.Model(folder)
    for precision in ("bf16", "auto"):  # runs; tokens may differ from float32's
        out = bo.generate(
            model, ids, mask, precision=precision, shared_prompt=True, num_beams=4, max_new_tokens=4, eos_token_id=2
        )
        assert out.shape[0] == ids.shape[0]


def test_a_sliding_window_model_is_refused_at_export(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
    )  # fmt: skip
    model = transformers.MistralForCausalLM(cfg).eval()
    with pytest.raises(TypeError, match="no shared-prompt IR: .*no sliding window"):
        bo.export_shared_prompt(model, tmp_path / "ir")


def test_an_older_state_is_refused(shared):
    _, folder = shared
    step = bo.OVSharedPromptStep(bo.Model(folder))
    ids, mask = _prompts()
    _, first = step(step.init_state(ids, mask), np.zeros(6, dtype=np.int64))
    older = first.beamkit_select(np.arange(6))
    step(first, np.full(6, 5))
    with pytest.raises(bo.StaleState, match="one batch"):
        step(older, np.full(6, 5))
