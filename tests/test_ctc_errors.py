"""Bad input to the CTC decoder, its pyctcdecode-shaped API and the ``ctc``/``lm``/``ocr`` commands: a clear
error naming the problem, never a traceback, a silent wrong answer, a lost result or an overwritten file."""

from __future__ import annotations

import math

import numpy as np
import pytest

import beamkit.ctc.compat as compat
from beamkit.cli import entry as cli
from beamkit.ctc import CTCOptions, prefix_beam_search
from beamkit.hypothesis import BatchDecodeError
from beamkit.lm import build_arpa
from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder

LABELS = ["", " ", "a", "b", "c", "t"]


def peaky(text: str, seed: int = 0) -> np.ndarray:
    """Log-probabilities whose best path spells ``text`` (2 frames a character, a blank after each)."""
    path: list[int] = []
    for ch in text:
        path += [LABELS.index(ch)] * 2 + [0]
    lp = np.log(np.random.default_rng(seed).dirichlet(np.full(len(LABELS), 0.5), size=len(path)) * 0.05)
    lp[np.arange(len(path)), path] = math.log(0.9)
    return lp


@pytest.fixture
def arpa(tmp_path) -> str:
    path = tmp_path / "lm.arpa"
    path.write_text(build_arpa(["the cat", "a cat", "the cat sat", "cat", "a bat"] * 3, order=2))
    return str(path)


@pytest.fixture
def run(monkeypatch, capsys):
    """Run the top-level CLI with only the CTC commands; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))

    def _run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = cli.main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return _run


def test_one_bad_matrix_keeps_the_other_results() -> None:
    dec = build_ctcdecoder(LABELS)
    good, other = peaky("a cat"), peaky("bat", 1)
    bad = good.copy()
    bad[2, 3] = np.nan
    with pytest.raises(BatchDecodeError) as info:
        dec.decode_batch(None, [good, bad, other])
    assert set(info.value.errors) == {1} and "NaN" in info.value.errors[1] and "utterance 1" in str(info.value)
    assert info.value.results == ["a cat", "", "bat"]
    with pytest.raises(BatchDecodeError) as info:
        dec.decode_beams_batch(None, [bad, other, np.zeros((3, 4))])
    assert set(info.value.errors) == {0, 2} and "shape" in info.value.errors[2]
    assert info.value.results[0] == [] and info.value.results[2] == []
    assert info.value.results[1][0][0] == "bat"
    with pytest.raises(BatchDecodeError) as info:
        prefix_beam_search(np.stack([bad, good]), LABELS, CTCOptions(beam_width=4, split_blank=False))
    assert set(info.value.errors) == {0} and info.value.results[1][0].text == "a cat"
    # compat keeps pyctcdecode's return type and raises, naming the utterance
    with pytest.raises(ValueError, match="utterance 1"):
        compat.build_ctcdecoder(LABELS).decode_batch(None, [good, bad])


@pytest.mark.parametrize("logits", [None, "abc", 5, {"a": 1}])
def test_decode_names_logits_that_are_not_a_matrix(logits) -> None:
    # None and "abc" gave "got shape ()", as if they were a 0-D array
    from beamkit.ctc import Decoder

    dec = Decoder(LABELS)
    for call in (dec.decode, dec.greedy, dec.trace):
        with pytest.raises(TypeError, match=rf"^logits must be .* got {type(logits).__name__}$"):
            call(logits)


def test_decode_names_a_ragged_nested_list_and_keeps_the_others() -> None:
    # numpy's "setting an array element with a sequence ... inhomogeneous shape" named neither logits nor the rows
    from beamkit.ctc import Decoder

    dec = Decoder(LABELS)
    ragged = [[0.1] * 6, [0.2] * 5]
    with pytest.raises(BatchDecodeError) as info:
        dec.decode([peaky("a cat"), ragged, None])
    assert "rows differ in length" in info.value.errors[1] and "logits" in info.value.errors[1]
    assert "got NoneType" in info.value.errors[2]
    assert info.value.results[0][0].text == "a cat"
    with pytest.raises(BatchDecodeError, match=r"a list is a batch: give one matrix as an array"):
        dec.decode(peaky("a").tolist())  # one matrix as a list of rows reads as a batch of 1-D rows


@pytest.mark.parametrize(
    "name, value", [("alpha", math.nan), ("alpha", math.inf), ("beta", math.inf), ("beta", -math.inf),
                    ("unk_score_offset", math.nan), ("unk_score_offset", math.inf)]
)  # fmt: skip
def test_meaningless_weights_are_refused(arpa: str, name: str, value: float) -> None:
    dec = build_ctcdecoder(LABELS, arpa, lm_backend="arpa")
    with pytest.raises(ValueError, match=name):
        dec.reset_params(**{name: value})
    with pytest.raises(ValueError, match=name):
        setattr(dec.language_model, name, value)
    with pytest.raises(ValueError, match=name):
        build_ctcdecoder(LABELS, arpa, lm_backend="arpa", **{name: value})
    assert dec.decode(peaky("a cat")) == "a cat"  # the decoder still works with its old weights


def test_unknown_words_are_forbidden_with_minus_infinity(arpa: str) -> None:
    lp = np.concatenate([peaky("a cat"), peaky(" tab", 2)])  # "tab" is not a word of the LM
    dec = build_ctcdecoder(LABELS, arpa, lm_backend="arpa", unk_score_offset=-math.inf)
    words = {"the", "cat", "sat", "a", "bat"}
    beams = dec.decode_beams(lp, beam_width=16)
    assert beams and all(set(text.split()) <= words for text, *_ in beams)
    assert all(math.isfinite(score) for *_, score in beams)
    dec.reset_params(unk_score_offset=-10.0)
    assert dec.decode(lp) == "a cat tab"
    dec.reset_params(unk_score_offset=-math.inf)
    assert set(dec.decode(lp).split()) <= words
    assert math.isfinite(dec.decode_beams(peaky("a cat"))[0][-1])
    dec.reset_params(alpha=0.0)  # a forbidden word stays forbidden with the LM weight at 0 (not 0 * -inf)
    beams = dec.decode_beams(lp, beam_width=16)
    assert all(set(text.split()) <= words and math.isfinite(score) for text, *_, score in beams)
    pdec = compat.build_ctcdecoder(LABELS)
    assert pdec.decode(lp) == "a cat tab"


def test_hotwords_must_be_strings() -> None:
    lp = peaky("a cat")
    for dec in (build_ctcdecoder(LABELS), compat.build_ctcdecoder(LABELS)):
        with pytest.raises(TypeError, match="hotwords"):
            dec.decode(lp, hotwords=[5])


def test_labels_must_be_a_list_of_strings() -> None:
    for build in (build_ctcdecoder, compat.build_ctcdecoder):
        with pytest.raises(TypeError, match="labels must be a list of strings"):
            build(None)


def test_hotword_scorer_answers_trie_node_queries() -> None:
    scorer = compat.HotwordScorer.build_scorer(["tyrion lannister", "hodor", "U.S.A."])
    trie = scorer._char_trie
    assert trie.has_node("hod") > 0 and trie.has_node("hodor") > 0 and trie.has_node("lann") > 0
    assert trie.has_node("U.S") > 0 and not trie.has_node("dor")
    assert trie.has_node("hodor") & 1 and not trie.has_node("hod") & 1  # a whole hotword holds a value
    assert "hodor" in trie and "hod" not in trie and sorted(trie.keys())[0] == "U.S.A."
    assert scorer._match_ptn.findall("we can match tyrion only") == ["tyrion"]
    assert scorer._match_ptn.findall("do not match hodor, or anything") == []


def test_corrupt_arpa_names_the_file_and_line(arpa: str, tmp_path) -> None:
    lines = open(arpa).read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("-"))
    lines[at] = "x" + lines[at][1:]
    bad = tmp_path / "bad.arpa"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"bad\.arpa, line {at + 1}"):
        build_ctcdecoder(LABELS, str(bad), lm_backend="arpa")


def test_blank_index_where_the_labels_already_spell_a_blank(run, tmp_path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(["", "<space>", *LABELS[2:]]) + "\n")
    npy = tmp_path / "lp.npy"
    np.save(npy, peaky("a cat"))
    rc, _, err = run("ctc", "decode", str(npy), "--labels", str(labels), "--blank", "2")
    assert rc == 2 and "duplicate" not in err and "--blank" in err and "label 0" in err, err


def test_text_file_named_npy_is_not_a_numpy_file(run, tmp_path) -> None:
    text = tmp_path / "lp.npy"
    text.write_text("0.1 0.2\n")
    rc, _, err = run("ctc", "decode", str(text), "--alphabet", "ab", "--blank", "0")
    assert rc == 2 and "not a numpy array file" in err and "allow_pickle" not in err, err


def test_ocr_on_a_folder_says_it_is_a_folder(run, tmp_path) -> None:
    rc, _, err = run("ocr", str(tmp_path))
    assert rc == 2 and "is a folder" in err, err


def test_lm_build_refuses_to_write_over_its_corpus(run, tmp_path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat\n")
    rc, _, err = run("lm", "build", str(corpus), "-o", str(corpus))
    assert rc == 2 and "corpus" in err and corpus.read_text() == "the cat\n", err


def test_options_that_cannot_apply_are_usage_errors(run, tmp_path, arpa) -> None:
    npy = tmp_path / "lp.npy"
    np.save(npy, peaky("a cat"))
    base = ("ctc", "decode", str(npy), "--alphabet", "_ abct", "--blank", "0")
    rc, _, err = run(*base, "--greedy", "--lm", arpa)
    assert rc == 2 and "--greedy" in err and "--lm" in err, err
    for opt in ("--alpha", "--beta"):
        rc, _, err = run(*base, opt, "0.7")
        assert rc == 2 and opt in err and "--lm" in err, err
    rc, _, err = run(*base, "--greedy", "--beam", "8")
    assert rc == 2 and "--greedy" in err and "--beam" in err, err
    rc, out, _ = run(*base)
    assert rc == 0 and out.strip() == "a cat"
    for extra in (("--greedy",), ("--beam", "8")):  # each alone still works
        rc, out, _ = run(*base, *extra)
        assert rc == 0 and out.strip() == "a cat"


def test_explain_refuses_a_matrix_above_the_frame_limit(run, tmp_path, monkeypatch) -> None:
    from beamkit.cli import ctc as ctc_cli

    npy = tmp_path / "long.npy"
    np.save(npy, np.zeros((5001, 3), dtype=np.float32))
    monkeypatch.setattr(ctc_cli, "_build_decoder", lambda *a: pytest.fail("the search ran"))
    rc, _, err = run("ctc", "explain", str(npy), "--alphabet", "_ab", "--blank", "0")
    assert rc == 2 and "5001" in err and "5000" in err and "--max-frames" in err, err
