"""Vocabulary normalisation, the pyctcdecode-shaped decoder, and the ``ctc``/``lm`` subcommands."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from beamkit.cli import ctc as ctc_cli
from beamkit.ctc import Vocabulary, greedy_ctc, normalize_logits
from beamkit.hypothesis import BatchDecodeError
from beamkit.lm import build_arpa
from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder

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


def test_blank_is_named_or_spelled_never_guessed() -> None:
    # today's rule appended a blank column to labels without one, and took "_" as the blank: rapidocr's
    # list (blank first, spelled "blank"; "_" a real character) decoded garbage silently
    rapid = ["blank", "a", "_", "b", " "]
    with pytest.raises(ValueError, match="no blank"):
        Vocabulary.from_labels(rapid)
    with pytest.raises(ValueError, match="no blank"):
        Vocabulary.from_labels([" ", "a"])
    with pytest.raises(ValueError, match="more than one"):
        Vocabulary.from_labels(["", "<pad>", "a"])
    v = Vocabulary.from_labels(rapid, blank=0)
    assert v.blank == 0 and v.size == 5 and v.labels[2] == "_"
    assert Vocabulary.from_labels(rapid, blank="blank").blank == 0
    assert Vocabulary.from_labels(["a", "<blank>", "b"]).blank == 1
    with pytest.raises(ValueError, match="occurs 0 times"):
        Vocabulary.from_labels(rapid, blank="<pad>")
    with pytest.raises(TypeError, match="blank"):
        Vocabulary.from_labels(rapid, blank=1.0)  # type: ignore[arg-type]
    # the decoder decodes "_" as a character once the blank is named; the text is read off by hand
    lp = np.full((5, 5), math.log(0.01))
    for t, lab in enumerate([1, 0, 2, 0, 3]):  # a, blank, _, blank, b
        lp[t, lab] = math.log(0.96)
    assert build_ctcdecoder(rapid, blank=0).decode(lp) == "a_b"
    assert build_ctcdecoder(rapid, blank="blank").decode_batch(None, [lp]) == ["a_b"]
    with pytest.raises(ValueError, match="no blank"):
        build_ctcdecoder(rapid)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_normalize_logits_equals_numpy_log_softmax_to_the_bit(dtype: type) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(0, 4, (60, 31)).astype(dtype)
    x[rng.random(x.shape) < 0.2] = -np.inf  # masked labels
    x[3, :] = -np.inf
    x[3, 7] = 1.5  # one label left
    x[10, 0], x[10, 5] = 20.0, 20.0  # a tie for the maximum
    x[11, 2], x[11, 9] = 0.0, -0.0  # the maximum is 0 and -0 at once
    x[12] = np.log(np.full(31, 1 / 31, dtype=dtype))  # already normalised
    for m in (x, x[:, ::-1], x[::2]):  # contiguous and not
        wide = m.astype(np.float64)  # pyctcdecode's log-softmax in numpy, written out
        shifted = wide - wide.max(axis=1, keepdims=True)
        want = np.maximum(shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)), np.log(1e-15))
        assert normalize_logits(m, "logits").tobytes() == want.tobytes()
        assert normalize_logits(m).tobytes() == want.tobytes()  # detected as logits


def test_normalize_logits_follows_pyctcdecode_rule() -> None:
    probs = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    np.testing.assert_allclose(normalize_logits(probs), np.log(np.clip(probs, 1e-15, 1)))
    logits = np.array([[1.0, 2.0, 3.0]])
    z = np.exp(logits - 3)
    np.testing.assert_allclose(normalize_logits(logits), np.log(z / z.sum()))
    with pytest.raises(ValueError, match="2-D"):
        normalize_logits(np.zeros((2, 2, 2)))


def float32_softmax_rows_off_by(rng: np.random.Generator, T: int, V: int, excess: float) -> np.ndarray:
    """float32 probabilities whose every row sums to ``1 + excess`` (a softmax rounded as models do)."""
    p = rng.dirichlet(np.full(V, 0.05), size=T)
    p[np.arange(T), p.argmax(axis=1)] += excess
    return p.astype(np.float32)


def test_float32_probabilities_off_by_rounding_are_read_as_probabilities() -> None:
    # rows summing to 1.000001 in float32 failed pyctcdecode's isclose(rel_tol=1e-9) and were normalised
    # again as logits (a second softmax flattens them): beam + LM then returned the greedy text
    rng = np.random.default_rng(7)
    p = float32_softmax_rows_off_by(rng, 6, 400, 1e-6)
    want = np.log(np.clip(p.astype(np.float64), 1e-15, 1.0))
    assert np.array_equal(normalize_logits(p), want)
    # cast to float64 after the model's float32 softmax: read as probabilities, with a warning (a guess)
    with pytest.warns(UserWarning, match="read as probabilities"):
        got = normalize_logits(p.astype(np.float64))
    assert np.array_equal(got, want)
    # an exact float64 softmax needs no guess
    exact = rng.dirichlet(np.ones(50), size=4)
    import warnings as warnings_module

    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error")
        assert np.array_equal(normalize_logits(exact), np.log(exact))
    # said explicitly: no detection, no warning
    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error")
        assert np.array_equal(normalize_logits(p.astype(np.float64), "probs"), want)
        flat = normalize_logits(p, "logits")
    assert np.allclose(np.exp(flat).sum(axis=1), 1.0) and not np.array_equal(flat, want)
    with pytest.raises(ValueError, match="input_kind"):
        normalize_logits(p, "softmax")
    with pytest.raises(ValueError, match="input_kind"):
        build_ctcdecoder(LABELS, input_kind="softmax")


def test_float32_probabilities_keep_the_lm_in_beam_search(tmp_path) -> None:
    # the same defect end to end: the LM must still correct a confusable character when the posteriors are
    # float32 probabilities whose rows sum to 1 + 1e-6 (today the second softmax drowns the LM's choice)
    arpa = tmp_path / "lm.arpa"
    arpa.write_text(build_arpa(["the cat", "a cat", "the cat sat", "cat"] * 5 + ["the bat"], order=2))
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    lp = peaky("the cat", labels, np.random.default_rng(2))
    c_frames = np.flatnonzero(np.argmax(lp, axis=1) == labels.index("c"))
    lp[c_frames, labels.index("b")] = math.log(0.5)
    lp[c_frames, labels.index("c")] = math.log(0.45)
    p = np.exp(lp)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(p)), p.argmax(axis=1)] += 1e-6
    p32 = p.astype(np.float32)
    assert abs(float(p32.sum(axis=1, dtype=np.float64).mean()) - 1.0) > 5e-7  # fails isclose(rel_tol=1e-9)
    fused = build_ctcdecoder(labels, kenlm_model_path=str(arpa), alpha=1.0, beta=0.5, lm_backend="arpa")
    assert build_ctcdecoder(labels).decode(p32) == "the bat"
    assert fused.decode(p32) == "the cat"
    assert fused.decode_batch(None, [p32, p32]) == ["the cat", "the cat"]
    # the scores are those of the log-probabilities themselves (a second softmax would flatten them)
    want = fused.decode_beams(np.log(p32.astype(np.float64)))[0]
    got = fused.decode_beams(p32)[0]
    assert got[0] == want[0] and got[3] == pytest.approx(want[3], abs=1e-4)  # want renormalised: 1e-6 a frame
    assert got[4] == pytest.approx(want[4], abs=1e-4)


def test_bool_and_complex_inputs_are_refused() -> None:
    dec = build_ctcdecoder(LABELS)
    for bad in (np.ones((3, len(LABELS)), dtype=bool), np.ones((3, len(LABELS)), dtype=np.complex128)):
        with pytest.raises(TypeError, match="real numbers"):
            dec.decode(bad)
        with pytest.raises(BatchDecodeError, match="utterance 0: .*real numbers"):
            dec.decode_batch(None, [bad])
        with pytest.raises(TypeError, match="real numbers"):
            normalize_logits(bad)
        with pytest.raises(TypeError, match="real numbers"):
            greedy_ctc(bad, LABELS)


def test_batched_decoding_normalises_each_matrix_alone() -> None:
    # logits, log-probabilities and probabilities of different lengths (and an empty one) in one batch give
    # the texts and scores of decoding each alone; bad frames are refused in every decode method
    rng = np.random.default_rng(3)
    logits = [rng.normal(0, 3, (T, len(LABELS))) for T in (5, 23, 0, 11)]
    probs = rng.dirichlet(np.ones(len(LABELS)), size=9)
    logits[1][4, 2] = -np.inf
    mats = [*logits, probs, np.log(rng.dirichlet(np.ones(len(LABELS)), size=7))]
    dec = build_ctcdecoder(LABELS)
    together = dec.decode_beams_batch(None, mats, beam_width=6)
    for m, beams in zip(mats, together, strict=True):
        alone = dec.decode_beams(m, beam_width=6)
        assert [b[0] for b in beams] == [b[0] for b in alone]
        assert [b[3] for b in beams] == pytest.approx([b[2 + 1] for b in alone], abs=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        dec.decode_batch(None, [logits[0], np.where(np.arange(len(LABELS)) == 3, np.nan, logits[3])])
    fine = rng.normal(0, 3, (4, len(LABELS)))
    for bad_row in ([np.inf, -np.inf, 0, 0, 0, 0], [np.inf, 0, 1, 2, 3, 4], [-np.inf] * 6):
        bad = fine.copy()
        bad[1] = bad_row
        for call in (dec.decode, dec.decode_beams, lambda x: dec.decode_batch(None, [fine, x])):
            with pytest.raises(ValueError, match=r"all -inf or holds \+inf"):
                call(bad)
    assert dec.decode(fine) == dec.decode_batch(None, [fine])[0]


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
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 4, (300, len(LABELS)))
    log_probs = np.log(rng.dirichlet(np.full(len(LABELS), 0.3), size=200))
    logits[7, 3] = -np.inf
    logits[9] = [50.0, -80.0, 0.0, 3.0, -400.0, 1.0]
    for x in (logits, log_probs, logits[:1], logits * 100):
        assert np.array_equal(normalize_logits(x), pyctcdecode_log_softmax(x))


def test_text_only_decoding_equals_the_best_beam() -> None:
    # decode/decode_batch skip the word offsets; their texts are the best beams of decode_beams, which keeps
    # them, with and without an LM and hotwords
    rng = np.random.default_rng(6)
    model = build_arpa(["the cat", "a cat", "the cat sat", "cat", "a bat", "the tab"] * 3, order=2)
    from beamkit.lm import ArpaLM

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
    assert decoder.decode(lp) == "cat bat" == greedy_ctc(lp, LABELS)
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


def test_decoder_pickles_after_use_and_the_copy_decodes_the_same(tmp_path) -> None:
    # process pools pickle the decoder: the search's caches (label tables, the LM's scored words, locks)
    # are kept beside the decoder's objects, not on them; a copy decodes as the original did, and after
    # ``reset_params`` neither keeps scores made with the old weights
    import pickle

    arpa = tmp_path / "lm.arpa"
    arpa.write_text(build_arpa(["the cat", "a cat", "the cat sat", "cat"] * 5 + ["the bat"], order=2))
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    lp = peaky("the cat", labels, np.random.default_rng(2))
    decoder = build_ctcdecoder(labels, kenlm_model_path=str(arpa), alpha=1.0, beta=0.5, lm_backend="arpa")
    first = decoder.decode_beams(lp)
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy.decode_beams(lp) == first
    decoder.reset_params(alpha=0.3, beta=2.0)
    fresh = build_ctcdecoder(labels, kenlm_model_path=str(arpa), alpha=0.3, beta=2.0, lm_backend="arpa")
    assert decoder.decode_beams(lp) == fresh.decode_beams(lp) != first
    assert copy.decode_beams(lp) == first


def test_pyctcdecode_end_of_utterance_quirk_is_reproduced_and_optional(tmp_path) -> None:
    # pyctcdecode 0.5.0 returns "the bat" (combined -7.891) on this input: the faint alignment ending in a
    # space makes it score an empty word for "the cat" (checked against pyctcdecode in the peer venv)
    arpa = tmp_path / "c.arpa"
    arpa.write_text(build_arpa(("the cat\na cat\nthe cat sat\nthe bat\n" * 3).splitlines(), order=3))
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    lp = peaky("the cat", labels, np.random.default_rng(3))
    compat = build_ctcdecoder(
        labels, kenlm_model_path=str(arpa), alpha=0.5, beta=1.0, lm_backend="arpa", pyctcdecode_compat=True
    )
    beams = compat.decode_beams(lp)
    assert beams[0][0] == "the bat" and beams[0][4] == pytest.approx(-7.891, abs=2e-3)
    fixed = build_ctcdecoder(labels, kenlm_model_path=str(arpa), alpha=0.5, beta=1.0, lm_backend="arpa")
    assert fixed.decode(lp) == "the cat"  # the default scores the end of the utterance correctly


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
    from beamkit.cli import entry as cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\nb a\n")
    assert cli.main(["lm", "build", str(corpus), "--order", "2", "-o", str(tmp_path / "x.arpa")]) == 0
    assert cli.main(["lm", "build", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "y.arpa")]) == 2
    assert "corpus not found" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_probability_candidates_without_the_dense_log_equal_the_dense_rule(dtype) -> None:
    # probabilities skip the log of every value: their candidates (values at and around exp(token_min_logp),
    # frames with no candidate but their argmax, the blank column) must be the dense rule's, bit for bit
    from beamkit.ctc.posteriors import dense_part, posterior_part

    rng = np.random.default_rng(8)
    T, V, t_min = 40, 300, -5.0
    p = rng.dirichlet(np.full(V, 0.05), size=T)
    edge = math.exp(t_min)
    p[:5, 7] = [edge, np.nextafter(edge, 0), np.nextafter(edge, 1), edge * 0.999, edge * 1.001]
    p[10] = 1.0 / V  # no candidate at all: the argmax (the first column) alone
    p[11, :] = 0.0
    p[11, 3] = 1e-3  # no candidate, one clear argmax
    x = p.astype(dtype)
    for t in (t_min, -2.0, -40.0):
        want = dense_part(normalize_logits(x, "probs"), t, 0)
        got = posterior_part(x, "probs", t, 0)
        for a, b in zip(got, want, strict=True):
            assert a.dtype.kind == b.dtype.kind and np.array_equal(a, b)


def test_blocked_normalisation_gives_each_utterance_its_own_values() -> None:
    # logit matrices are normalised in blocks of several utterances; any block size (one row's worth, a few
    # utterances, all) gives each utterance the parts of normalising it alone, probabilities interleaved
    from beamkit.ctc.posteriors import dense_part, posterior_part, utterance_parts

    rng = np.random.default_rng(9)
    mats = [rng.normal(0, 3, (T, len(LABELS))) for T in (5, 1, 17, 0, 8)]
    mats.insert(2, rng.dirichlet(np.ones(len(LABELS)), size=6))
    want = [
        posterior_part(m, "probs", -5.0, 0) if i == 2 else dense_part(normalize_logits(m, "logits"), -5.0, 0)
        for i, m in enumerate(mats)
    ]
    for cells in (1, 40, 100, 1 << 18):
        got = list(utterance_parts(mats, "auto", -5.0, 0, block_cells=cells))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            for a, b in zip(g, w, strict=True):
                assert np.array_equal(a, b)


def test_decode_batch_threads_give_the_same_texts_and_bad_counts_are_refused() -> None:
    rng = np.random.default_rng(8)
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    mats = [peaky(text, labels, rng) for text in ("the cat", "a bat", "the hat", "sat") * 5]
    decoder = build_ctcdecoder(labels)
    alone = [decoder.decode(m) for m in mats]
    assert decoder.decode_batch(None, mats, threads=1) == alone == decoder.decode_batch(None, mats, threads=3)
    for bad, error in ((0, ValueError), (-1, ValueError), (True, TypeError), (1.5, TypeError)):
        with pytest.raises(error, match="threads must be"):
            decoder.decode_batch(None, mats, threads=bad)


def test_decoding_never_writes_into_the_callers_matrices() -> None:
    # logits are normalised in place in blocks: only copies may be written, for one matrix or many
    rng = np.random.default_rng(9)
    labels = ["", " ", "a", "b", "c", "t", "h", "e", "s"]
    mats = [rng.normal(0, 3, (int(rng.integers(1, 30)), len(labels))) for _ in range(12)]
    kept = [m.copy() for m in mats]
    decoder = build_ctcdecoder(labels)
    decoder.decode_batch(None, mats)
    decoder.decode_batch(None, mats[:1])
    decoder.decode(mats[0])
    decoder.decode_beams_batch(None, mats)
    assert all(np.array_equal(a, b) for a, b in zip(mats, kept, strict=True))


def test_one_utterance_decodes_as_in_a_batch_and_is_checked_the_same() -> None:
    from beamkit.ctc import CTCBatchDecodeError, CTCOptions, Decoder

    rng = np.random.default_rng(9)
    labels = ["", " ", "a", "b", "c"]
    decoder = Decoder(labels, options=CTCOptions(beam_width=8, num_hypotheses=4))
    x, y = (rng.normal(0, 2, (12, 5)) for _ in range(2))
    alone, batch = decoder.decode([x])[0], decoder.decode([y, x], threads=1)[1]
    assert [(h.text, h.score, h.word_frames) for h in alone] == [(h.text, h.score, h.word_frames) for h in batch]
    with pytest.raises(CTCBatchDecodeError, match="vocabulary has 5 labels") as caught:
        decoder.decode([np.zeros((3, 7))])
    assert caught.value.results == [[]]
    with pytest.raises(ValueError, match="threads must be >= 1"):
        decoder.decode([x], threads=0)
