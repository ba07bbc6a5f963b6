"""Hotwords at scale: beamkit's pyctcdecode drop-in (``beamkit.ctc.compat``) against pyctcdecode 0.5.0 itself
with long hotword lists, phrases, hotwords that start one another and hotwords spelled outside the alphabet,
with and without a KenLM model (run in ``.venv-peer``, see test_ctc_pyctcdecode.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pyctcdecode = pytest.importorskip("pyctcdecode")

from test_ctc_pyctcdecode import LABELS, WORDS, assert_same_beams, utterances  # noqa: E402

import beamkit.ctc.compat as compat  # noqa: E402
from beamkit.ctc import CTCOptions, Decoder  # noqa: E402
from beamkit.lm import build_arpa  # noqa: E402

logging.getLogger("pyctcdecode").setLevel(logging.ERROR)

LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def hotword_list(seed: int, n: int) -> list[str]:
    """``n`` hotwords: random letter strings (most never heard), some of the utterances' words and their
    prefixes, phrases of two or three words, words that start one another, and entries pyctcdecode strips or
    drops (padding, blanks) or that hold characters outside the labels."""
    rng = np.random.default_rng(seed)
    out = ["ca", "cat", "catalog", "bla", "black back", " rat ", "", "   ", "café", "U.S.A.", "hat-trick", "o'er"]
    while len(out) < n:
        roll = rng.random()
        if roll < 0.1:
            out.append(" ".join(rng.choice(WORDS, size=int(rng.integers(2, 4)))))
        elif roll < 0.2:
            w = str(rng.choice(WORDS))
            out.append(w[: int(rng.integers(1, len(w) + 1))])
        else:
            out.append("".join(rng.choice(LETTERS, size=int(rng.integers(2, 9)))))
    return out[:n]


@pytest.mark.parametrize(("size", "weight", "n"), [(12, 10.0, 12), (300, 4.0, 12), (1500, 2.5, 5)])
def test_long_hotword_lists_decode_as_pyctcdecode_does(size: int, weight: float, n: int) -> None:
    # pyctcdecode matches every hotword against every beam's text each frame: 1,500 take it a few seconds an
    # utterance, hence fewer utterances there
    pc = pyctcdecode.build_ctcdecoder(LABELS)
    bk = compat.build_ctcdecoder(LABELS)
    hot = hotword_list(size, size)
    mats = utterances(40 + size, n)
    want = [pc.decode(m, hotwords=hot, hotword_weight=weight) for m in mats]
    assert [bk.decode(m, hotwords=hot, hotword_weight=weight) for m in mats] == want
    assert want != [pc.decode(m) for m in mats]  # the hotwords change some texts
    for m in mats[:4]:
        knobs = {"hotwords": hot, "hotword_weight": weight}
        assert_same_beams(pc.decode_beams(m, **knobs), bk.decode_beams(m, **knobs))


def test_hotwords_with_a_kenlm_model_decode_as_pyctcdecode_does(tmp_path) -> None:
    pytest.importorskip("kenlm")  # pyctcdecode needs kenlm for an LM
    rng = np.random.default_rng(5)
    corpus = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 7)))) for _ in range(300)]
    arpa = tmp_path / "lm.arpa"
    arpa.write_text(build_arpa(corpus, order=3))
    unigrams = sorted(set(WORDS))
    pc = pyctcdecode.build_ctcdecoder(LABELS, kenlm_model_path=str(arpa), unigrams=unigrams)
    bk = compat.build_ctcdecoder(LABELS, kenlm_model_path=str(arpa), unigrams=unigrams)
    hot = hotword_list(7, 500)
    mats = utterances(8, 12)
    want = [pc.decode(m, hotwords=hot, hotword_weight=6.0) for m in mats]
    assert [bk.decode(m, hotwords=hot, hotword_weight=6.0) for m in mats] == want
    for m in mats[:4]:
        assert_same_beams(pc.decode_beams(m, hotwords=hot), bk.decode_beams(m, hotwords=hot))


def test_the_native_decoder_scores_hotwords_as_the_drop_in_does() -> None:
    # beamkit's own API with the same list in its options gives the drop-in's texts and scores
    hot = hotword_list(3, 200)
    mats = utterances(9, 10)
    bk = compat.build_ctcdecoder(LABELS)
    opts = CTCOptions(pyctcdecode_compat=True, hotwords=tuple(s.strip() for s in hot if s.strip()), hotword_weight=3.0)
    native = Decoder(LABELS, None, opts).decode(mats)
    for m, hyps in zip(mats, native, strict=True):
        beams = bk.decode_beams(m, hotwords=hot, hotword_weight=3.0)
        assert [h.text for h in hyps[:5]] == [b[0] for b in beams[:5]]
        # the drop-in normalises the matrix again (pyctcdecode's way): a float64 rounding per frame may differ
        assert [h.score for h in hyps[:5]] == pytest.approx([b[4] for b in beams[:5]], abs=1e-9)
