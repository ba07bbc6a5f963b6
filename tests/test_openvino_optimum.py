"""A folder written by optimum-intel itself (``optimum-cli export openvino``) read by ``beamkit.openvino``.

optimum-intel pins its own ``transformers``, so it lives in an environment of its own: its ``optimum-cli`` is
found through ``BEAMKIT_OPTIMUM_CLI``, else ``.venv-ov/bin/optimum-cli`` beside the checkout, else on the
``PATH``; the test is skipped where there is none. The tiny GPT-2 is built here on a fixed seed and exported from
its saved folder (nothing is downloaded). Oracle: Hugging Face's ``model.generate`` on the same float32 weights
(tokens equal; scores within ``tests.test_openvino.TOL``, argued there for this model's size).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("openvino")
pytest.importorskip("tokenizers")

import beamkit.openvino as bo  # noqa: E402
from tests.test_openvino import NEW, TOL, V, _hf, _prompts  # noqa: E402
from tests.word_tokenizer import save_word_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]


def optimum_cli() -> str | None:
    """The ``optimum-cli`` to export with, or None."""
    given = os.environ.get("BEAMKIT_OPTIMUM_CLI")
    if given:
        return given
    beside = ROOT / ".venv-ov" / "bin" / "optimum-cli"
    return str(beside) if beside.is_file() else shutil.which("optimum-cli")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny GPT-2 of tests/test_openvino.py (same seed and settings), its saved folder and the folder
    ``optimum-cli export openvino`` writes from it: ``(model, ir folder)``."""
    cli = optimum_cli()
    if cli is None:
        pytest.skip("no optimum-cli (optimum-intel in an environment of its own, see the OpenVINO guide)")
    root = tmp_path_factory.mktemp("optimum")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=64, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.transformer.wte.weight[2] *= 3.0
    model.generation_config.pad_token_id = 0
    save_word_tokenizer(root / "hf")
    model.save_pretrained(root / "hf")
    argv = [cli, "export", "openvino", "--model", str(root / "hf"), "--task", "text-generation-with-past"]
    argv += ["--weight-format", "fp32", str(root / "ir")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(argv, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return model, root / "ir"


@pytest.mark.parametrize("beams", [1, 4])
def test_an_optimum_intel_folder_decodes_as_hugging_face(exported, beams):
    model, folder = exported
    loaded = bo.Model(folder)
    assert loaded.stateful and loaded.reorders  # optimum-intel's stateful layout with beam_idx
    ids, mask = _prompts()
    want = _hf(model, ids, mask, beams)
    got = bo.generate(
        loaded, ids, mask, num_beams=beams, max_new_tokens=NEW, eos_token_id=2, pad_token_id=0,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    assert torch.equal(got.sequences, want.sequences)
    if beams > 1:
        np.testing.assert_allclose(got.sequences_scores.numpy(), want.sequences_scores.numpy(), atol=TOL, rtol=0)


def test_an_optimum_intel_folder_decodes_as_its_hf_folder_through_the_adapters(exported):
    from beamkit.adapters import decode_texts, load

    _, folder = exported
    texts = ["w1 w2 w3", "w7 w7 w40 w2 w9", "w30"]
    ov = load(f"ov:{folder}")
    hf = load(f"hf:{folder.parent / 'hf'}")
    assert ov.tokenizer("w1 w2")["input_ids"] == hf.tokenizer("w1 w2")["input_ids"]
    assert ov.vocab_size == V  # the logits' width, read from optimum-intel's IR
    for beam in (1, 3):
        a = decode_texts(ov, texts, beam=beam, n_best=1, max_len=6)
        b = decode_texts(hf, texts, beam=beam, n_best=1, max_len=6)
        assert [[h.tokens for h in r] for r in a] == [[h.tokens for h in r] for r in b]
        for ra, rb in zip(a, b, strict=True):
            np.testing.assert_allclose([h.score for h in ra], [h.score for h in rb], atol=TOL, rtol=0)
