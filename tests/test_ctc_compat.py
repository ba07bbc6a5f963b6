"""``beamkit.ctc.compat`` in the main environment (no pyctcdecode): hand-worked decodes and loading a saved
decoder from a Hugging Face cache laid out on disk (offline). Agreement with pyctcdecode itself is tested in
``tests/peer/test_compat.py``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import beamkit.ctc.compat as pyctcdecode


def matrix(path: list[int], V: int) -> np.ndarray:
    """Log-probabilities with 0.7 on each frame's label of ``path`` and 0.3 spread over the others."""
    probs = np.full((len(path), V), 0.3 / (V - 1))
    probs[np.arange(len(path)), path] = 0.7
    return np.log(probs)


def test_hand_worked_decodes() -> None:
    # wav2vec2 labels: <pad> is the blank, | the delimiter, <unk> shown as ⁇
    dec = pyctcdecode.build_ctcdecoder(["<pad>", "<unk>", "|", "a", "b"])
    assert dec._alphabet.labels == ["", "⁇", " ", "a", "b"]
    assert dec.decode(matrix([3, 0, 3, 2, 1, 2, 4, 4], 5)) == "aa ⁇ b"
    beams = dec.decode_beams(matrix([3, 3, 0, 2, 4], 5))
    assert [b[0] for b in beams[:2]] == ["a b", "ab"]
    # no blank among the labels: one is appended, so the logits need one more column
    with pytest.raises(ValueError, match="vocabulary is size 3"):
        pyctcdecode.build_ctcdecoder([" ", "a"]).decode(np.zeros((2, 2)))
    assert pyctcdecode.build_ctcdecoder([" ", "a", "b"]).decode(matrix([1, 3, 2, 2], 4)) == "ab"


def test_load_from_hf_hub_offline_cache(tmp_path) -> None:
    pytest.importorskip("huggingface_hub")
    snapshot = tmp_path / "models--someone--decoder" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "alphabet.json").write_text(json.dumps({"labels": ["", " ", "a", "b"], "is_bpe": False}))
    (tmp_path / "models--someone--decoder" / "refs").mkdir()
    (tmp_path / "models--someone--decoder" / "refs" / "main").write_text("0" * 40)
    dec = pyctcdecode.BeamSearchDecoderCTC.load_from_hf_hub(
        "someone/decoder", cache_dir=str(tmp_path), local_files_only=True
    )
    assert dec.decode(matrix([2, 1, 3, 3, 0, 3], 4)) == "a bb"
    assert pyctcdecode.BeamSearchDecoderCTC.load_from_hf_hub(str(snapshot)).decode(matrix([3], 4)) == "b"
