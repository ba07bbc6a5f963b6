"""Vocabulary normalisation, the pyctcdecode-shaped decoder, and the ``ctc``/``lm`` subcommands."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from beamkit.ctc import Vocabulary, build_arpa, build_ctcdecoder, greedy_decode, normalize_logits
from beamkit.ctc import cli as ctc_cli

LABELS = ["", " ", "a", "b", "c", "t"]


def peaky(text: str, labels: list[str], rng: np.random.Generator, frames: int = 2) -> np.ndarray:
    """Log-probabilities whose best path spells ``text`` (blank between characters)."""
    path: list[int] = []
    for ch in text:
        path += [labels.index(ch)] * frames + [labels.index("")]
    lp = np.log(rng.dirichlet(np.full(len(labels), 0.5), size=len(path)) * 0.05)
    lp[np.arange(len(path)), path] = math.log(0.9)
    return lp


def test_vocabulary_normalisation() -> None:
    v = Vocabulary.from_labels(["<pad>", "|", "a", "b"])
    assert v.blank == 0 and v.labels[1] == " " and v.space == 1 and not v.is_bpe
    v = Vocabulary.from_labels(["_", "a"])
    assert v.blank == 0 and v.space == -1
    v = Vocabulary.from_labels([" ", "a"])  # no blank: appended as a new last column
    assert v.blank == 2 and v.size == 3
    v = Vocabulary.from_labels(["a", "##b", "<pad>"])
    assert v.is_bpe and v.labels == ["▁a", "b", ""] and list(v.starts_word) == [True, False, False]
    v = Vocabulary.from_labels(["x", "y", "z"], blank=1)
    assert v.blank == 1 and v.labels[1] == ""
    with pytest.raises(ValueError, match="duplicate"):
        Vocabulary.from_labels(["", "a", "a"])
    with pytest.raises(TypeError):
        Vocabulary.from_labels("abc")
    with pytest.raises(ValueError, match="out of range"):
        Vocabulary.from_labels(["a"], blank=3)


def test_normalize_logits_follows_pyctcdecode_rule() -> None:
    probs = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    np.testing.assert_allclose(normalize_logits(probs), np.log(np.clip(probs, 1e-15, 1)))
    logits = np.array([[1.0, 2.0, 3.0]])
    z = np.exp(logits - 3)
    np.testing.assert_allclose(normalize_logits(logits), np.log(z / z.sum()))
    with pytest.raises(ValueError, match="2-D"):
        normalize_logits(np.zeros((2, 2, 2)))


def test_batch_normalisation_equals_normalize_logits_per_matrix(monkeypatch) -> None:
    # the batched rule (block-wise log-softmax, NaN check on row sums) gives normalize_logits' values bit
    # for bit, for logits and probabilities, over several blocks of rows
    from beamkit.ctc import decoder as decoder_module

    monkeypatch.setattr(decoder_module, "_BLOCK_ROWS", 7)
    rng = np.random.default_rng(3)
    logits = [rng.normal(0, 3, (T, len(LABELS))) for T in (5, 23, 0, 11)]
    probs = rng.dirichlet(np.ones(len(LABELS)), size=9)
    logits[1][4, 2] = -np.inf  # a row with -inf stays finite elsewhere
    mats = [*logits, probs]
    batch, lens = build_ctcdecoder(LABELS)._normalize_batch(mats)
    assert lens.tolist() == [5, 23, 0, 11, 9]
    for m, b, n in zip(mats, batch, lens.tolist(), strict=True):
        if n:
            assert np.array_equal(b[:n], normalize_logits(m))
    with_nan = logits[2:4] + [np.where(np.arange(len(LABELS)) == 3, np.nan, logits[3])]
    with pytest.raises(ValueError, match="NaN"):
        build_ctcdecoder(LABELS)._normalize_batch(with_nan)
    # a frame that normalises to NaN (a +inf, or all -inf) is refused like a NaN, in every decode method
    dec = build_ctcdecoder(LABELS)
    fine = rng.normal(0, 3, (4, len(LABELS)))
    for bad_row in ([np.inf, -np.inf, 0, 0, 0, 0], [np.inf, 0, 1, 2, 3, 4], [-np.inf] * 6):
        bad = fine.copy()
        bad[1] = bad_row
        with pytest.raises(ValueError, match=r"all -inf or holds \+inf"):
            dec._normalize_batch([fine, bad])
        with pytest.raises(ValueError, match=r"all -inf or holds \+inf"):
            dec.decode(bad)
        with pytest.raises(ValueError, match=r"all -inf or holds \+inf"):
            dec.decode_beams(bad)
        with pytest.raises(ValueError, match=r"all -inf or holds \+inf"):
            dec.decode_batch(None, [fine, bad])
    assert dec.decode(fine) == dec.decode_batch(None, [fine])[0]  # the refused calls left nothing behind
    # rows with -inf entries, one dominant label, signed zeros: same values and signs of zero
    odd = np.array(
        [
            [-np.inf, 0, 1, 2, 3, 4],
            [800.0, 0, 0, 0, 0, 0],
            [0.0, -0.0, 0, 0, 0, 0],
            [-0.0, -800.0, -800.0, -800.0, -800.0, -800.0],
        ]
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        (got,), _ = build_ctcdecoder(LABELS)._normalize_batch([odd])
        want = normalize_logits(odd)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def pyctcdecode_log_softmax(x: np.ndarray) -> np.ndarray:
    """pyctcdecode's ``_log_softmax`` over rows (np.amax, then exp, sum, log), clipped as its decoder does."""
    x_max = np.amax(x, axis=1, keepdims=True)
    x_max[~np.isfinite(x_max)] = 0
    tmp = x - x_max
    with np.errstate(divide="ignore"):
        out = tmp - np.log(np.sum(np.exp(tmp), axis=1, keepdims=True))
    return np.clip(out, math.log(1e-15), 0)


def test_normalize_logits_equals_pyctcdecode_rule_bit_for_bit() -> None:
    # an independent copy of pyctcdecode's steps: same values bit for bit on logits, log-probabilities (all
    # values <= 0), rows with -inf and rows that underflow to the clip
    from beamkit.ctc.decoder import _row_max

    rng = np.random.default_rng(4)
    logits = rng.normal(0, 4, (300, len(LABELS)))
    log_probs = np.log(rng.dirichlet(np.full(len(LABELS), 0.3), size=200))
    logits[7, 3] = -np.inf
    logits[9] = [50.0, -80.0, 0.0, 3.0, -400.0, 1.0]
    for x in (logits, log_probs, logits[:1], logits * 100):
        assert np.array_equal(normalize_logits(x), pyctcdecode_log_softmax(x))
        assert np.array_equal(_row_max(x), x.max(axis=1))
    with_nan = logits.copy()
    with_nan[[3, 40], [1, 0]] = np.nan
    assert np.array_equal(_row_max(with_nan), with_nan.max(axis=1), equal_nan=True)
    assert _row_max(np.zeros((0, 4))).shape == (0,)


def test_batch_normalisation_reuses_its_buffer_and_log_probabilities_pass_through_the_rule() -> None:
    # decoding twice reuses the scratch buffer (a longer batch's old contents must not leak into a shorter
    # one); log-probability matrices (never "probabilities") and probabilities mix in one batch
    from beamkit.ctc import decoder as decoder_module
    from beamkit.ctc import prefix_trie, release_cached_memory

    rng = np.random.default_rng(5)
    decoder = build_ctcdecoder(LABELS)
    long = [np.log(rng.dirichlet(np.ones(len(LABELS)), size=T)) for T in (40, 3, 25)]
    short = [rng.normal(0, 2, (T, len(LABELS))) for T in (6, 2)] + [rng.dirichlet(np.ones(len(LABELS)), size=4)]
    for mats in (long, short, long):
        batch, lens = decoder._normalize_batch(mats)
        for m, b, n in zip(mats, batch, lens.tolist(), strict=True):
            assert np.array_equal(b[:n], normalize_logits(m))
        decoder_module._release_batch(batch)
        assert len(prefix_trie._SCRATCH) == 1
    first = decoder.decode_batch(None, long + short)
    assert decoder.decode_batch(None, long + short) == first == [decoder.decode(m) for m in long + short]
    assert release_cached_memory() > 0 and prefix_trie._SCRATCH == []


def test_text_only_decoding_equals_the_best_beam() -> None:
    # decode/decode_batch skip the word offsets; their texts are the best beams of decode_beams, which keeps
    # them, with and without an LM and hotwords
    rng = np.random.default_rng(6)
    model = build_arpa(["the cat", "a cat", "the cat sat", "cat", "a bat", "the tab"] * 3, order=2)
    from beamkit.ctc import ArpaLM

    arpa = ArpaLM.from_lines(model.splitlines())
    for decoder in (build_ctcdecoder(LABELS), build_ctcdecoder(LABELS, arpa)):
        mats = [peaky(t, LABELS, rng) + rng.normal(0, 2.0, (len(t) * 3, len(LABELS))) for t in ("a cat", "tab", "ta")]
        for hotwords in (None, ["bat"]):
            texts = decoder.decode_batch(None, mats, beam_width=8, hotwords=hotwords)
            best = [decoder.decode_beams(m, beam_width=8, prune_history=True, hotwords=hotwords)[0] for m in mats]
            assert texts == [b[0] for b in best] == [decoder.decode(m, 8, hotwords=hotwords) for m in mats]
            assert all(b[2] or not b[0] for b in best)  # decode_beams still gives word frames


def test_decoder_without_lm_reads_the_best_path() -> None:
    rng = np.random.default_rng(0)
    decoder = build_ctcdecoder(LABELS)
    lp = peaky("cat bat", LABELS, rng)
    assert decoder.decode(lp) == "cat bat" == greedy_decode(lp, LABELS)
    beams = decoder.decode_beams(lp, beam_width=10)
    text, lm_state, frames, logit, combined = beams[0]
    assert text == "cat bat" and lm_state is None and logit == pytest.approx(combined)
    assert [w for w, _ in frames] == ["cat", "bat"]
    assert frames[0][1][0] == 0 and frames[1][1][0] == 12
    with pytest.raises(ValueError, match="vocabulary"):
        decoder.decode(np.zeros((3, 4)))


def test_batch_decode_matches_single_decode() -> None:
    rng = np.random.default_rng(1)
    decoder = build_ctcdecoder(LABELS)
    mats = [peaky(t, LABELS, rng) for t in ("a cab", "tab", "bat cat act")]
    noisy = [m + rng.normal(0, 1.5, m.shape) for m in mats]
    assert decoder.decode_batch(None, noisy) == [decoder.decode(m) for m in noisy]
    beams = decoder.decode_beams_batch(None, noisy, beam_width=5)
    for m, b in zip(noisy, beams, strict=False):
        single = decoder.decode_beams(m, beam_width=5)
        assert [x[0] for x in b] == [x[0] for x in single]


def test_lm_corrects_a_confusable_character(tmp_path) -> None:
    rng = np.random.default_rng(2)
    arpa = tmp_path / "lm.arpa"
    arpa.write_text(build_arpa(["the cat", "a cat", "the cat sat", "cat"] * 5 + ["the bat"], order=2))
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    lp = peaky("the cat", labels, rng)
    # make "b" slightly more likely than "c" at the frames of "c"
    c_frames = np.flatnonzero(np.argmax(lp, axis=1) == labels.index("c"))
    lp[c_frames, labels.index("b")] = math.log(0.5)
    lp[c_frames, labels.index("c")] = math.log(0.45)
    plain = build_ctcdecoder(labels)
    fused = build_ctcdecoder(labels, kenlm_model_path=str(arpa), alpha=1.0, beta=0.5, lm_backend="arpa")
    assert plain.decode(lp) == "the bat"
    assert fused.decode(lp) == "the cat"
    fused.reset_params(alpha=0.0, beta=0.0)
    assert fused.decode(lp) == "the bat"
    assert fused.decode(lp, hotwords=["bat"], hotword_weight=5.0) == "the bat"


def test_pyctcdecode_end_of_utterance_quirk_is_reproduced_and_optional(tmp_path) -> None:
    # pyctcdecode 0.5.0 returns "the bat" (combined -7.891) on this input: the faint alignment ending in a
    # space makes it score an empty word for "the cat" (checked against pyctcdecode in the peer venv)
    arpa = tmp_path / "c.arpa"
    arpa.write_text(build_arpa(("the cat\na cat\nthe cat sat\nthe bat\n" * 3).splitlines(), order=3))
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    lp = peaky("the cat", labels, np.random.default_rng(3))
    compat = build_ctcdecoder(labels, kenlm_model_path=str(arpa), alpha=0.5, beta=1.0, lm_backend="arpa")
    beams = compat.decode_beams(lp)
    assert beams[0][0] == "the bat" and beams[0][4] == pytest.approx(-7.891, abs=2e-3)
    fixed = build_ctcdecoder(
        labels, kenlm_model_path=str(arpa), alpha=0.5, beta=1.0, lm_backend="arpa", pyctcdecode_compat=False
    )
    assert fixed.decode(lp) == "the cat"


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="beamkit")
    ctc_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_lm_build_and_ctc_decode(tmp_path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\na cat\nthe cat sat\nthe bat\n" * 3)
    arpa = tmp_path / "lm.arpa"
    assert _run_cli(["lm", "build", str(corpus), "--order", "3", "-o", str(arpa)]) == 0
    assert "\\3-grams:" in arpa.read_text()
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("\n".join(["", "<space>", *labels[2:]]) + "\n")
    rng = np.random.default_rng(3)
    batch = np.stack([peaky("the cat", labels, rng), peaky("a bat", labels, rng)[:21]][:1])
    npy = tmp_path / "lp.npy"
    np.save(npy, batch)
    capsys.readouterr()
    rc = _run_cli(
        [
            "ctc",
            "decode",
            str(npy),
            "--labels",
            str(labels_file),
            "--lm",
            str(arpa),
            "--alpha",
            "0.5",
            "--beta",
            "1.0",
            "--beam",
            "20",
            "--json",
            "--top",
            "2",
        ]
    )
    assert rc == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out[0]["beams"][0]["text"] == "the cat"
    assert _run_cli(["ctc", "decode", str(npy), "--labels", str(labels_file), "--greedy"]) == 0
    assert capsys.readouterr().out.strip() == "the cat"
    with pytest.raises(FileNotFoundError):
        _run_cli(["ctc", "decode", str(tmp_path / "none.npy"), "--labels", "ab"])


def test_cli_registers_through_the_top_level_parser(monkeypatch, tmp_path, capsys) -> None:
    from beamkit import cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.ctc.cli",))
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\nb a\n")
    assert cli.main(["lm", "build", str(corpus), "--order", "2", "-o", str(tmp_path / "x.arpa")]) == 0
    assert cli.main(["lm", "build", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "y.arpa")]) == 2
    assert "corpus not found" in capsys.readouterr().err
