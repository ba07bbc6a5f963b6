"""Agreement with pyctcdecode (the peer), run in the separate ``.venv-peer`` (pyctcdecode pins numpy<2).

Create it with::

    python -m venv .venv-peer
    .venv-peer/bin/pip install "numpy<2" pyctcdecode==0.5.0 kenlm pytest
    .venv-peer/bin/pip install -e . --no-deps
    .venv-peer/bin/python -m pytest tests/peer -q

Skips cleanly where pyctcdecode (or, for the LM cases, kenlm) is not installed.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

pyctcdecode = pytest.importorskip("pyctcdecode")

from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder  # noqa: E402

from beamkit.lm import build_arpa  # noqa: E402

logging.getLogger("pyctcdecode").setLevel(logging.ERROR)

LABELS = ["", " ", *"abcdefghijklmnopqrstuvwxyz", "'", "-"]
WORDS = "the cat sat on a mat dog ate rat and log with her hat in black back bat at tab".split()


def peaky_utterance(
    rng: np.random.Generator,
    text: str,
    frames: int = 90,
    *,
    blank_p: float = 0.5,
    max_blanks: int = 1,
    shift: bool = False,
    floor: float = 0.01,
    confuse_p: float = 0.2,
    noise_p: float = 0.15,
    noise_max: float = 0.3,
) -> np.ndarray:
    """Log-probabilities peaked on an alignment of ``text`` (1-2 frames per character; before a character, a
    run of 1..``max_blanks`` blanks with probability ``blank_p``, always between repeats; ``shift``: the
    alignment starts at a random frame) over a faint Dirichlet ``floor``, with confusions (a share of the peak
    on another letter) and uncertain frames (extra mass on a random label)."""
    V = len(LABELS)
    path: list[int] = []
    prev = -1
    for ch in text:
        i = LABELS.index(ch)
        if i == prev or rng.random() < blank_p:
            path += [0] * (int(rng.integers(1, max_blanks + 1)) if max_blanks > 1 else 1)
        path += [i] * int(rng.integers(1, 3))
        prev = i
    if shift:
        path = [0] * int(rng.integers(0, frames - len(path) + 1)) + path
    path = (path + [0] * frames)[:frames]
    probs = rng.dirichlet(np.full(V, 0.3), size=frames) * floor
    for t, lab in enumerate(path):
        peak = rng.uniform(0.6, 0.99)
        if lab != 0 and rng.random() < confuse_p:
            other = int(rng.integers(2, 28))
            share = rng.uniform(0.2, 0.6)
            probs[t, other] += peak * share
            peak *= 1 - share
        elif rng.random() < noise_p:
            probs[t, int(rng.integers(0, V))] += rng.uniform(0.01, noise_max)
        probs[t, lab] += peak
    return np.log(probs / probs.sum(axis=1, keepdims=True))


def utterances(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [peaky_utterance(rng, " ".join(rng.choice(WORDS, size=int(rng.integers(2, 6))))) for _ in range(n)]


def assert_same_beams(pc_beams, bk_beams, top: int = 5) -> None:
    assert [b[0] for b in bk_beams[:top]] == [b[0] for b in pc_beams[:top]]
    for p, b in zip(pc_beams[:top], bk_beams[:top], strict=False):
        assert b[3] == pytest.approx(p[3], abs=1e-6)  # logit score
        assert b[4] == pytest.approx(p[4], abs=1e-6)  # combined score


def test_agreement_without_lm() -> None:
    pc = pyctcdecode.build_ctcdecoder(LABELS)
    bk = build_ctcdecoder(LABELS, pyctcdecode_compat=True)
    mats = utterances(0, 25)
    assert bk.decode_batch(None, mats) == [pc.decode(m) for m in mats]
    for m in mats[:10]:
        assert_same_beams(pc.decode_beams(m), bk.decode_beams(m))
    # logits (not log-probabilities) go through the same normalisation
    logits = mats[0] * 0.7 + 3.0
    assert bk.decode(logits) == pc.decode(logits)
    assert bk.decode(mats[1], hotwords=["cat", "hat"]) == pc.decode(mats[1], hotwords=["cat", "hat"])


@pytest.mark.parametrize("backend", ["arpa", "kenlm"])
def test_agreement_with_lm(tmp_path, backend: str) -> None:
    pytest.importorskip("kenlm")  # pyctcdecode needs kenlm for an LM
    rng = np.random.default_rng(1)
    corpus = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 7)))) for _ in range(300)]
    arpa = tmp_path / "lm.arpa"
    arpa.write_text(build_arpa(corpus, order=3))
    unigrams = sorted(set(WORDS))
    pc = pyctcdecode.build_ctcdecoder(LABELS, kenlm_model_path=str(arpa), unigrams=unigrams)
    bk = build_ctcdecoder(
        LABELS, kenlm_model_path=str(arpa), unigrams=unigrams, lm_backend=backend, pyctcdecode_compat=True
    )
    mats = utterances(2, 25)
    assert bk.decode_batch(None, mats) == [pc.decode(m) for m in mats]
    for m in mats[:10]:
        assert_same_beams(pc.decode_beams(m), bk.decode_beams(m))
    pc.reset_params(alpha=0.9, beta=0.5)
    bk.reset_params(alpha=0.9, beta=0.5)
    assert [bk.decode(m, hotwords=["black"]) for m in mats[:8]] == [pc.decode(m, hotwords=["black"]) for m in mats[:8]]
    assert math.isfinite(bk.decode_beams(mats[0])[0][4])


def long_utterance(rng: np.random.Generator, text: str) -> np.ndarray:
    """The benchmark's posteriors: 200 frames, blank runs, a fainter background, fewer confusions."""
    return peaky_utterance(
        rng, text, 200, blank_p=0.6, max_blanks=2, shift=True, floor=0.005, confuse_p=0.15, noise_p=0.1, noise_max=0.2
    )


def test_batched_beam_sets_match_pyctcdecode() -> None:
    # all utterances in one search: every returned beam (not only the best ones) is pyctcdecode's; long
    # utterances keep many beams alive across skipped blank frames (an old bug left equal prefixes unmerged)
    pc = pyctcdecode.build_ctcdecoder(LABELS)
    bk = build_ctcdecoder(LABELS, pyctcdecode_compat=True)
    rng = np.random.default_rng(0)
    mats = [long_utterance(rng, " ".join(rng.choice(WORDS, size=int(rng.integers(4, 9))))) for _ in range(30)]
    for m, beams in zip(mats, bk.decode_beams_batch(None, mats), strict=True):
        expected = pc.decode_beams(m)
        assert sorted(b[0] for b in beams) == sorted(b[0] for b in expected)
        got = {b[0]: b[3] for b in beams}
        for text, _, _, logit, _ in expected:
            assert got[text] == pytest.approx(logit, abs=1e-6)


def test_every_beam_and_float32_inputs_as_the_readme_states() -> None:
    # the README's compatibility statement: with pyctcdecode_compat=True every returned beam's text, rank,
    # logit and combined score match on float64 log-probabilities; float32 inputs match in text with scores
    # within 1e-5 (pyctcdecode normalises in the input's dtype, beamkit in float64)
    pc = pyctcdecode.build_ctcdecoder(LABELS)
    bk = build_ctcdecoder(LABELS, pyctcdecode_compat=True)
    for m in utterances(4, 15):
        expected, got = pc.decode_beams(m), bk.decode_beams(m)
        assert [b[0] for b in got] == [b[0] for b in expected]
        assert [b[3] for b in got] == pytest.approx([b[3] for b in expected], abs=1e-6)
        assert [b[4] for b in got] == pytest.approx([b[4] for b in expected], abs=1e-6)
        x = m.astype(np.float32)
        expected, got = pc.decode_beams(x), bk.decode_beams(x)
        assert got[0][0] == expected[0][0]
        assert got[0][4] == pytest.approx(expected[0][4], abs=1e-5)
