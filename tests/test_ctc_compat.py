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


def _arpa(tmp_path) -> str:
    from beamkit.lm import build_arpa

    path = tmp_path / "lm.arpa"
    path.write_text(build_arpa(["a cat", "a bat", "cat"] * 3, order=2))
    return str(path)


def test_weights_take_any_float_as_pyctcdecode_does(tmp_path, caplog, monkeypatch) -> None:
    # pyctcdecode's property tests give alpha=inf / unk_score_offset=inf, which the drop-in refused
    import logging
    import math

    pytest.importorskip("kenlm")
    from beamkit.ctc.compat import language_model

    monkeypatch.setattr(language_model, "_WARNED", set())
    arpa = _arpa(tmp_path)
    labels = ["", " ", "a", "b", "c", "t"]
    with caplog.at_level(logging.WARNING, logger="beamkit.ctc.compat"):
        dec = pyctcdecode.build_ctcdecoder(labels, arpa, alpha=math.inf, unk_score_offset=math.inf)
        dec.reset_params(alpha=-math.inf, beta=math.nan, unk_score_offset=1e308)
        dec.reset_params(alpha=math.inf)  # alpha warned already: once per weight
    lm = dec._language_model
    assert lm.alpha == math.inf and math.isnan(lm.beta) and lm.unk_score_offset == 1e308
    meaningless = [r.getMessage() for r in caplog.records if "meaningless" in r.getMessage()]
    assert [m.split(" ")[0] for m in meaningless] == ["alpha=inf", "unk_score_offset=inf", "beta=nan"], meaningless
    with pytest.raises(ValueError, match="must be a float"):  # pyctcdecode's own type rule stays
        dec.reset_params(alpha=1)


def test_a_nan_weight_is_refused_at_decode_not_a_hang(tmp_path) -> None:
    import math

    pytest.importorskip("kenlm")
    dec = pyctcdecode.build_ctcdecoder(["", " ", "a", "b", "c", "t"], _arpa(tmp_path))
    lp = np.log(np.full((4, 6), 1 / 6))
    for name in ("alpha", "beta", "unk_score_offset"):
        dec.reset_params(**{name: math.nan})
        with pytest.raises(ValueError, match=f"cannot decode with {name}=nan"):
            dec.decode(lp)
        dec.reset_params(**{name: 0.5})
    assert isinstance(dec.decode(lp), str)


def test_beamkits_own_fusion_keeps_refusing_meaningless_weights(tmp_path) -> None:
    import math

    from beamkit.ctc import LanguageModelFusion
    from beamkit.lm import ArpaLM

    model = ArpaLM.from_file(_arpa(tmp_path))
    for name in ("alpha", "beta"):
        for value in (math.inf, math.nan, 1e308):
            with pytest.raises(ValueError, match=name):
                LanguageModelFusion(model, **{name: value})


def test_importing_the_drop_in_loads_a_cached_compiled_search(monkeypatch) -> None:
    # the first decode loaded the compiled search (about half a second), past a one-second deadline when loaded
    from beamkit.ctc import jit
    from beamkit.ctc.compat import decoder

    if not jit.COMPILED:
        pytest.skip("the search runs uncompiled here")
    monkeypatch.setattr(jit, "is_cold", lambda dispatcher: True)
    assert decoder.load_compiled_search() is False  # a cold cache is left to the first decode (it says so)
    monkeypatch.setattr(jit, "is_cold", lambda dispatcher: False)
    assert decoder.load_compiled_search() is True


def test_the_drop_in_keeps_the_words_its_lm_scored_across_calls(tmp_path) -> None:
    # each call built its fusion afresh: every word asked of KenLM again and the unigram trie rebuilt per call
    pytest.importorskip("kenlm")
    labels = ["", " ", "a", "b", "c", "t"]
    dec = pyctcdecode.build_ctcdecoder(labels, _arpa(tmp_path))
    lp = matrix([2, 1, 4, 2, 5, 0, 1, 3, 2, 5], 6)  # "a cat bat"
    model = dec._language_model._fusion.model
    asked: list[str] = []
    score_many = model.score_many

    def counted(states, words):
        asked.extend(words)
        return score_many(states, words)

    model.score_many = counted
    first = dec.decode_beams(lp)
    n_first = len(asked)
    assert n_first > 0
    assert dec.decode_beams(lp) == first and len(asked) == n_first  # nothing asked again
    # new weights: the scores follow them (as a decoder built with them decodes)
    dec.reset_params(alpha=0.9, beta=-0.5)
    fresh = pyctcdecode.build_ctcdecoder(labels, _arpa(tmp_path), alpha=0.9, beta=-0.5)
    assert [b[0] for b in dec.decode_beams(lp)] == [b[0] for b in fresh.decode_beams(lp)]
    assert [b[4] for b in dec.decode_beams(lp)] == pytest.approx([b[4] for b in fresh.decode_beams(lp)], abs=1e-9)
    # a start state (streaming) still decodes from it
    state = first[0][1]
    assert dec.decode(lp, lm_start_state=state) == fresh.decode(lp, lm_start_state=state)


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes here")
def test_build_ctcdecoder_refuses_a_named_pipe_as_the_lm(tmp_path) -> None:
    # kenlm opened the pipe and waited for a writer for ever
    pytest.importorskip("kenlm")
    import os

    pipe = tmp_path / "lm.arpa"
    os.mkfifo(pipe)
    with pytest.raises(ValueError, match=r"named pipe \(FIFO\), not a regular file: .*lm\.arpa"):
        pyctcdecode.build_ctcdecoder(["", "a", "b", " "], str(pipe))
    with pytest.raises(OSError):  # a missing file stays kenlm's OSError, as pyctcdecode raises it
        pyctcdecode.build_ctcdecoder(["", "a", "b", " "], str(tmp_path / "missing.arpa"))
