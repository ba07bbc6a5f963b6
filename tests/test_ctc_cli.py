"""``beamkit ctc decode`` / ``beamkit lm build`` on bad input: one error line, exit code 2, never a wrong answer.

The oracles are the messages and exit codes the CLI contract asks for, and the Python API's answer on the
same input (one default shared by both)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from beamkit.cli import entry as cli
from beamkit.lm import build_arpa, kenlm_available, write_arpa
from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder

LABELS = ["", " ", "a", "b", "c", "t", "h", "e", "s"]


@pytest.fixture
def run(monkeypatch, capsys):
    """Run the top-level CLI with only the CTC commands; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))

    def _run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            rc = cli.main(list(argv))
        except SystemExit as exc:  # a usage error found by argparse (an option's type)
            rc = int(exc.code or 0)
        out, err = capsys.readouterr()
        return rc, out, err

    return _run


def peaky(text: str, rng: np.random.Generator) -> np.ndarray:
    """Log-probabilities whose best path spells ``text`` (2 frames a character, a blank after each)."""
    path: list[int] = []
    for ch in text:
        path += [LABELS.index(ch)] * 2 + [0]
    lp = np.log(rng.dirichlet(np.full(len(LABELS), 0.5), size=len(path)) * 0.05)
    lp[np.arange(len(path)), path] = math.log(0.9)
    return lp


@pytest.fixture
def files(tmp_path):
    """A labels file (blank as an empty line), a (T, V) .npy and a 3-gram ARPA where pyctcdecode's quirk bites."""
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(["", "<space>", *LABELS[2:]]) + "\n")
    npy = tmp_path / "lp.npy"
    np.save(npy, peaky("the cat", np.random.default_rng(3)))
    arpa = tmp_path / "c.arpa"
    arpa.write_text(build_arpa(("the cat\na cat\nthe cat sat\nthe bat\n" * 3).splitlines(), order=3))
    return tmp_path, labels, npy, arpa


def one_error_line(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def usage_error(err: str, needle: str) -> None:
    """argparse's refusal of an option value: one error line naming the option."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and needle in lines[0], err


def test_cli_and_python_share_one_default(run, files) -> None:
    # the same matrix and LM gave "the cat" from the CLI and "the bat" from build_ctcdecoder (compat on)
    _, labels, npy, arpa = files
    lp = np.load(npy)
    api = build_ctcdecoder(LABELS, kenlm_model_path=str(arpa), alpha=0.5, beta=1.0, lm_backend="arpa").decode_beams(lp)
    rc, out, _ = run("ctc", "decode", str(npy), "--labels", str(labels), "--lm", str(arpa), "--alpha", "0.5",
                     "--beta", "1.0", "--lm-backend", "arpa")  # fmt: skip
    assert rc == 0 and out.strip() == api[0][0] == "the cat"
    rc, out, _ = run("ctc", "decode", str(npy), "--labels", str(labels), "--lm", str(arpa), "--alpha", "0.5",
                     "--beta", "1.0", "--lm-backend", "arpa", "--pyctcdecode-compat")  # fmt: skip
    compat = build_ctcdecoder(
        LABELS, kenlm_model_path=str(arpa), alpha=0.5, beta=1.0, lm_backend="arpa", pyctcdecode_compat=True
    )
    assert rc == 0 and out.strip() == compat.decode_beams(lp)[0][0] == "the bat"


def test_labels_without_a_blank_are_refused(run, files) -> None:
    tmp_path, _, npy, _ = files
    no_blank = tmp_path / "noblank.txt"
    no_blank.write_text("\n".join(["<space>", *LABELS[2:], "_"]) + "\n")  # 9 labels for 9 columns, no blank
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(no_blank))
    assert rc == 2 and out == ""
    one_error_line(err, "no blank", "--blank")
    rc, out, _ = run("ctc", "decode", str(npy), "--labels", str(no_blank), "--blank", "8")  # "_" is column 8
    named = [" ", *LABELS[2:], "_"]  # the CLI reads "<space>" as " "
    assert rc == 0 and out.strip() == build_ctcdecoder(named, blank=8).decode(np.load(npy))
    rc, out, _ = run("ctc", "decode", str(npy), "--alphabet", "_ abcthes", "--blank", "_")
    assert rc == 0 and out.strip() == "the cat"


def test_mistyped_labels_path_is_an_error_not_labels(run, files) -> None:
    tmp_path, _, npy, _ = files
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(tmp_path / "lables.txt"))
    assert rc == 2 and out == ""
    one_error_line(err, "labels file not found", "lables.txt")
    rc, _, err = run("ctc", "decode", str(npy), "--labels", str(tmp_path))
    assert rc == 2
    one_error_line(err, "labels file is a directory")


def test_top_must_be_positive(run, files) -> None:
    _, labels, npy, _ = files
    for top in ("-1", "0"):
        rc, out, err = run("ctc", "decode", str(npy), "--labels", str(labels), "--json", "--top", top)
        assert rc == 2 and out == ""
        usage_error(err, "argument --top: expected >= 1")


@pytest.mark.parametrize("dtype", [bool, np.complex64])
def test_bool_and_complex_npy_are_refused(run, files, dtype) -> None:
    tmp_path, labels, _, _ = files
    bad = tmp_path / "bad.npy"
    np.save(bad, np.ones((4, len(LABELS)), dtype=dtype))
    rc, out, err = run("ctc", "decode", str(bad), "--labels", str(labels))
    assert rc == 2 and out == ""
    one_error_line(err, "real numbers", np.dtype(dtype).name)


@pytest.mark.skipif(not kenlm_available(), reason="the auto backend only differs with kenlm installed")
def test_broken_arpa_with_the_auto_backend_is_one_error_line(files, capfd, monkeypatch) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))
    tmp_path, labels, npy, _ = files
    broken = tmp_path / "broken.arpa"
    broken.write_text("\\data\\\nngram 1=3\n\n\\1-grams:\n-1.0\ta\n-1.0 b c d e f\n\\end\\\n")
    capfd.readouterr()
    rc = cli.main(["ctc", "decode", str(npy), "--labels", str(labels), "--lm", str(broken)])
    out, err = capfd.readouterr()  # file-descriptor level: kenlm writes there directly
    assert rc == 2 and out == ""
    one_error_line(err, "broken.arpa")
    assert "Traceback" not in err and "lm/model.cc" not in err
    with pytest.raises(ValueError, match="broken.arpa"):
        build_ctcdecoder(LABELS, kenlm_model_path=str(broken))


def test_lm_build_high_order_warns_up_front_and_the_file_loads_by_default(run, tmp_path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\na cat sat\n")
    out_path = tmp_path / "o10.arpa"
    rc, out, err = run("lm", "build", str(corpus), "--order", "10", "-o", str(out_path))
    assert rc == 0 and "order 10" in out
    one_error_line(err, "warning", "kenlm reads orders up to 6")
    decoder = build_ctcdecoder(LABELS, kenlm_model_path=str(out_path))  # lm_backend="auto"
    assert decoder.language_model is not None and decoder.language_model.order == 10
    rc, _, err = run("lm", "build", str(corpus), "--order", "0", "-o", str(out_path))
    assert rc == 2
    usage_error(err, "argument --order: expected an integer from 1 to 20, got 0")
    rc, _, err = run("lm", "build", str(corpus), "--order", "1000000000", "-o", str(out_path))
    assert rc == 2  # an order no corpus fills, whose tables were allocated before counting anything
    usage_error(err, "argument --order: expected an integer from 1 to 20")


def test_lm_build_directories_are_clear_errors(run, tmp_path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\n")
    (tmp_path / "d").mkdir()
    rc, _, err = run("lm", "build", str(tmp_path / "d"), "-o", str(tmp_path / "x.arpa"))
    assert rc == 2
    one_error_line(err, "corpus is a directory")
    for target in (str(tmp_path / "d"), str(tmp_path / "e") + "/"):
        rc, _, err = run("lm", "build", str(corpus), "-o", target)
        assert rc == 2
        one_error_line(err, "is a folder, not a file")
    rc, _, err = run("lm", "build", str(corpus), "-o", str(tmp_path / "nowhere" / "x.arpa"))
    assert rc == 2
    one_error_line(err, "output folder", "does not exist")


def test_help_texts_explain_the_options_and_the_labels_format(run) -> None:
    rc, out, _ = run("ctc", "decode", "--help")
    assert rc == 0 and out.startswith("usage: beamkit ctc decode")
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    dec = sub["ctc"]._subparsers._group_actions[0].choices["decode"]  # type: ignore[union-attr]
    text = dec.format_help()
    assert "one label per line" in text and "blank" in text and "<space>" in text
    flat = " ".join(text.split())
    assert "--lm-backend {auto,arpa,kenlm} how to read --lm" in flat
    assert "(default: 100)" in flat and "(default: auto)" in flat
    build = sub["lm"]._subparsers._group_actions[0].choices["build"]  # type: ignore[union-attr]
    bflat = " ".join(build.format_help().split())
    assert "Kneser-Ney" in bflat and "(default: 3)" in bflat and "--quiet" in bflat


class _FakeTTY:
    """A stderr that says it is a terminal and keeps what is written."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_lm_build_shows_progress_on_a_terminal_only(run, tmp_path, monkeypatch) -> None:
    pytest.importorskip("tqdm")
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n" * 2000)
    rc, _, err = run("lm", "build", str(corpus), "-o", str(tmp_path / "a.arpa"))
    assert rc == 0 and err == ""  # not a terminal: no bar
    tty = _FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    assert cli.main(["lm", "build", str(corpus), "-o", str(tmp_path / "b.arpa")]) == 0
    shown = "".join(tty.parts)
    assert "counting n-grams" in shown and "100%" in shown and "B/s" in shown
    tty.parts.clear()
    assert cli.main(["lm", "build", str(corpus), "-o", str(tmp_path / "c.arpa"), "--quiet"]) == 0
    assert "".join(tty.parts) == ""
    assert (tmp_path / "a.arpa").read_text() == (tmp_path / "b.arpa").read_text()
    assert write_arpa(corpus, tmp_path / "d.arpa", progress=False) > 0


@pytest.mark.parametrize(
    ("option", "value"), [("--alpha", "1e308"), ("--beta", "1e308"), ("--alpha", "-1e308"), ("--beta", "1001")]
)
def test_lm_weights_are_bounded(run, files, option, value) -> None:
    # --alpha 1e308 printed a score of -Infinity, --beta 1e308 one of Infinity (neither is JSON)
    _, labels, npy, arpa = files
    weight = f"{option}={value}"  # the = form: a negative value is not read as an option
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(labels), "--lm", str(arpa), weight, "--json")
    assert rc == 2 and out == ""
    usage_error(err, option)
    assert "between -1000 and 1000" in err


def test_lm_weights_at_the_bound_print_json(run, files) -> None:
    _, labels, npy, arpa = files
    rc, out, _ = run("ctc", "decode", str(npy), "--labels", str(labels), "--lm", str(arpa), "--alpha", "1000",
                     "--beta", "-1000", "--json", "--lm-backend", "arpa")  # fmt: skip
    assert rc == 0
    assert math.isfinite(json.loads(out, parse_constant=_refuse_constant)["beams"][0]["score"])


def _refuse_constant(name: str) -> float:
    raise AssertionError(f"{name} is not JSON")


def test_a_non_finite_score_is_an_error_not_json_infinity(run, files, monkeypatch) -> None:
    from types import SimpleNamespace

    from beamkit.ctc import Decoder

    def decode(self, mats):
        return [[SimpleNamespace(text="x", word_frames=[], logit_score=-1.0, score=-math.inf)] for _ in mats]

    monkeypatch.setattr(Decoder, "decode", decode)
    _, labels, npy, _ = files
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(labels), "--json")
    assert rc == 2 and out == ""
    one_error_line(err, "not a finite number")


@pytest.mark.parametrize(
    ("extra", "needle"), [(("--top", "2"), "add --json"), (("--greedy", "--json", "--top", "3"), "drop --top")]
)
def test_top_is_never_ignored(run, files, extra, needle) -> None:
    _, labels, npy, _ = files
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(labels), *extra)
    assert rc == 2 and out == ""
    one_error_line(err, "--top", needle)
    rc, out, _ = run("ctc", "decode", str(npy), "--labels", str(labels), "--json", "--top", "2")
    assert rc == 0 and len(json.loads(out)["beams"]) == 2


def test_beam_width_has_a_documented_maximum(run, files) -> None:
    # --beam 99999999999 allocated 8.7 TiB and died with a traceback
    from beamkit.ctc import CTCOptions
    from beamkit.ctc.options import MAX_BEAM_WIDTH

    _, labels, npy, _ = files
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(labels), "--beam", "99999999999")
    assert rc == 2 and out == ""
    usage_error(err, "--beam")
    assert "100,000" in err
    with pytest.raises(ValueError, match=r"^beam_width must be between 1 and 100000, got 100001$"):
        CTCOptions(beam_width=MAX_BEAM_WIDTH + 1)


def test_labels_file_with_a_byte_order_mark_reads_as_without(run, files) -> None:
    # the mark became part of the first label (the blank "" read as "\ufeff": no blank found)
    tmp_path, labels, npy, _ = files
    marked = tmp_path / "marked.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + labels.read_bytes())
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(marked))
    assert (rc, out.strip(), err) == (0, "the cat", "")


def test_labels_file_that_is_not_text_is_named(run, files) -> None:
    tmp_path, labels, npy, _ = files
    utf16 = tmp_path / "labels16.txt"
    utf16.write_text(labels.read_text(encoding="utf-8"), encoding="utf-16")
    rc, out, err = run("ctc", "decode", str(npy), "--labels", str(utf16))
    assert rc == 2 and out == ""
    one_error_line(err, "labels file", "labels16.txt", "is not UTF-8 text", "UTF-16")


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_labels_named_pipe_is_called_one(run, files) -> None:
    from tests.test_lm_arpa import fifo_at

    tmp_path, _, npy, _ = files
    release = fifo_at(tmp_path / "pipe")
    try:
        rc, out, err = run("ctc", "decode", str(npy), "--labels", str(tmp_path / "pipe"))
    finally:
        release()
    assert rc == 2 and out == ""
    one_error_line(err, "labels file is a named pipe (FIFO), not a regular file", "pipe")


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize("command", ["decode", "explain"])
def test_a_named_pipe_as_the_matrix_file_is_called_one(run, files, command) -> None:
    # it was "no such file" for a path that exists
    from tests.test_lm_arpa import fifo_at

    tmp_path, labels, _, _ = files
    release = fifo_at(tmp_path / "m.npy")
    try:
        rc, out, err = run("ctc", command, str(tmp_path / "m.npy"), "--labels", str(labels))
    finally:
        release()
    assert rc == 2 and out == ""
    one_error_line(err, ".npy file is a named pipe (FIFO), not a regular file", "m.npy")


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_as_an_ocr_image_is_called_one(tmp_path) -> None:
    # it was "image not found" for a path that exists
    from beamkit.ctc.ocr import load_line_image
    from tests.test_lm_arpa import fifo_at

    release = fifo_at(tmp_path / "line.png")
    try:
        with pytest.raises(ValueError, match=r"^image is a named pipe \(FIFO\), not a regular file: .*line\.png"):
            load_line_image(tmp_path / "line.png")
    finally:
        release()
    with pytest.raises(FileNotFoundError, match="image not found"):
        load_line_image(tmp_path / "missing.png")
