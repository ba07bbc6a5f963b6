"""The command line as a new and a hostile user meet it: dates the model cannot mean, files that could not be
written, one write rule for every command, work bounded before it starts, ids that repeat, numbers argparse
misreads, scores that print as zeros.

Run in-process through ``beamkit.cli.main(argv)``. Oracles: Python's calendar (``datetime.date``), the
command's own JSON figures, the files on disk, and the options as the user typed them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from beamkit.cli import entry as cli

ROOT = Path(__file__).resolve().parents[1]
FAST = ("--beam", "2", "--backend", "numpy", "--quiet")


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """The exit code (a usage error argparse finds exits through SystemExit), standard output and error."""
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, command: str, kind: str = "error") -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"beamkit {command}: {kind}: "), err
    return lines[0]


# --- dates the model cannot mean ---------------------------------------------------------------------------

IMPOSSIBLE = ["33/33/33", "31 February 2001", "2024-13-45", "99999", "29 Feb 2001", "12.31.1999"]


@pytest.mark.parametrize("text", IMPOSSIBLE)
def test_strict_refuses_a_date_that_cannot_be_and_plain_translate_warns(capsys, text):
    code, out, err = run_main(capsys, "translate", "--strict", *FAST, text)
    assert code == 2 and out == ""
    assert repr(text) in one_line(err, "translate")
    code, out, err = run_main(capsys, "translate", *FAST, text)
    assert code == 0 and out.startswith(text)
    assert any(line.startswith(f"beamkit translate: warning: {text!r}") for line in err.splitlines()), err


def _calendar_ok(y: int, m: int, d: int) -> bool:
    try:
        dt.date(y, m, d)
    except ValueError:
        return False
    return True


def test_the_input_check_agrees_with_the_calendar():
    """Every year-first numeric date of 2001 and 2000, months 0-13, days 0-32: refused exactly when Python's
    calendar has no such day."""
    from beamkit.tasks.dates import out_of_range_reason

    for year in (2000, 2001):
        for month in range(14):
            for day in range(33):
                text = f"{year}-{month:02d}-{day:02d}"
                assert (out_of_range_reason(text) is None) == _calendar_ok(year, month, day), text
                spoken = f"{day} {dt.date(2001, month, 1).strftime('%B')} {year}" if 1 <= month <= 12 else None
                if spoken and day >= 1:
                    assert (out_of_range_reason(spoken) is None) == _calendar_ok(year, month, day), spoken


def test_every_input_and_target_of_the_task_passes_the_checks():
    from beamkit.tasks.dates import out_of_range_reason, output_reason, split

    for name in ("valid", "test", "train"):
        for source, target in split(name):
            assert out_of_range_reason(source) is None, source
            assert output_reason(target) is None, target


@pytest.mark.parametrize(
    ("output", "ok"),
    [("1999-03-03", True), ("2033-03-33", False), ("2001-02-31", False), ("2999-09-09", False),
     ("20000-05-01", False), ("1799-12-31", False), ("1800-01-01", True), ("2099-12-31", True), ("2000-05", False)],
)  # fmt: skip
def test_the_output_check_is_a_calendar_date_in_the_supported_years(output, ok):
    from beamkit.tasks.dates import output_reason

    assert (output_reason(output) is None) is ok


def test_an_output_that_is_not_a_date_is_flagged_and_strict_fails_after_printing(capsys):
    # a length penalty of 100 ranks the longest hypothesis first: '20000-05-01', not a date
    argv = ("translate", "--length-penalty", "100", "--beam", "3", "--backend", "numpy", "--quiet")
    code, out, _ = run_main(capsys, *argv, "--json", "1 May 2000", "3rd of March 1999")
    best = [r["hypotheses"][0]["text"] for r in json.loads(out)]
    assert best[0] == "20000-05-01" and best[1] == "1999-03-03"
    code, out, err = run_main(capsys, *argv, "--strict", "1 May 2000", "3rd of March 1999")
    assert code == 1
    assert "1 May 2000" in out and "3rd of March 1999" in out  # the other input's result is not lost
    assert "'20000-05-01'" in one_line(err, "translate")


# --- eval dates: the plot file and a word LM ----------------------------------------------------------------


def test_a_plot_that_cannot_be_written_fails_after_the_table(capsys):
    pytest.importorskip("matplotlib")
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    argv = ("eval", "dates", "--beams", "1", "--limit", "3", "--length-penalty", "1", "--backend", "numpy")
    code, out, err = run_main(capsys, *argv, "--quiet", "--plot", "/dev/full")
    assert code == 1
    assert "| 1 |" in out and "plot written" not in out
    assert "/dev/full" in one_line(err, "eval")


def test_a_word_lm_sharing_no_token_with_the_dates_model_is_refused(capsys, tmp_path):
    arpa = tmp_path / "word.arpa"
    arpa.write_text(
        "\\data\\\nngram 1=5\n\n\\1-grams:\n-1.0\t<s>\t0\n-0.5\t</s>\n-0.6\tthe\t0\n-0.7\tcat\t0\n-0.8\t<unk>\n\n"
        "\\end\\\n",
        encoding="utf-8",
    )
    argv = ("eval", "dates", "--beams", "1", "--limit", "3", "--backend", "numpy", "--quiet")
    code, out, err = run_main(capsys, *argv, "--lm", str(arpa), "--lm-weight", "0.5")
    assert code == 2 and out == ""
    line = one_line(err, "eval")
    assert f"--lm {arpa}" in line and "Traceback" not in err


# --- one write rule ------------------------------------------------------------------------------------------


def _writers(tmp_path: Path) -> dict[str, list[str]]:
    corpus = tmp_path / "words.txt"
    corpus.write_text("the cat sat\nthe dog sat\n", encoding="utf-8")
    mat = tmp_path / "m.npy"
    np.save(mat, np.log(np.full((4, 3), 1 / 3)))
    return {
        "corpus": ["corpus", "dates", "-o"],
        "lm": ["lm", "build", str(corpus), "--order", "2", "--quiet", "-o"],
        "explain": ["explain", "3rd of March 1999", "--beam", "2", "--format", "dot", "-o"],
        "ctc": ["ctc", "explain", str(mat), "--alphabet", "ab_", "--blank", "_", "--format", "dot", "-o"],
    }


@pytest.mark.parametrize("command", ["corpus", "lm", "explain", "ctc"])
def test_every_command_that_writes_refuses_an_existing_file_unless_forced(capsys, tmp_path, command):
    argv = _writers(tmp_path)[command]
    target = tmp_path / "mine.txt"
    target.write_text("my own file\n", encoding="utf-8")
    code, _, err = run_main(capsys, *argv, str(target))
    assert code == 2 and "--force" in one_line(err, argv[0])
    assert target.read_text(encoding="utf-8") == "my own file\n"
    code, _, err = run_main(capsys, *argv, str(target), "--force")
    assert code == 0, err
    assert target.read_text(encoding="utf-8") != "my own file\n"
    fresh = tmp_path / "fresh.txt"
    assert run_main(capsys, *argv, str(fresh))[0] == 0 and fresh.stat().st_size > 0  # a new file needs no --force


def test_the_plot_follows_the_write_rule(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "acc.png"
    target.write_bytes(b"mine")
    argv = ("eval", "dates", "--beams", "1", "--limit", "2", "--length-penalty", "1", "--quiet", "--plot")
    code, _, err = run_main(capsys, *argv, str(target))
    assert code == 2 and "--force" in one_line(err, "eval") and target.read_bytes() == b"mine"


# --- decode: ids, output paths, progress ---------------------------------------------------------------------


def test_decode_a_repeated_id_is_an_error_record_and_the_others_decode(capsys, tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [{"id": 7, "text": "1 May 2000"}, {"id": 7, "text": "2 May 2001"}, {"id": "7", "text": "3 May 2002"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(out), "--quiet")
    assert code == 0, err
    got = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in got] == [7, 7, "7"]
    assert got[0]["error"] is None and got[0]["n_best"][0]["text"] == "2000-05-01"
    assert "repeats the id of line 1" in got[1]["error"] and got[1]["n_best"] == []
    assert got[2]["error"] is None and got[2]["n_best"][0]["text"] == "2002-05-03"  # "7" is not 7


def test_decode_when_the_parts_folder_is_a_file(capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("1 May 2000\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    Path(f"{out}.parts").write_text("mine", encoding="utf-8")
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(out), "--quiet")
    line = one_line(err, "decode")
    assert code == 2 and f"--output {out}" in line and "Errno" not in line and "move it away" in line


def test_decode_under_a_folder_that_cannot_be_written_names_the_output_given(capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("1 May 2000\n", encoding="utf-8")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = str(locked / "out.jsonl")
    elif os.path.isdir("/proc"):
        out = "/proc/out.jsonl"  # no file can be created there, even by root
    else:
        pytest.skip("no folder that cannot be written")
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", out, "--quiet")
    line = one_line(err, "decode")
    assert code == 1 and f"--output {out}:" in line and ".parts" not in line and "Errno" not in line


def test_decode_draws_no_progress_bar_when_stderr_is_not_a_terminal(capsys, tmp_path):
    pytest.importorskip("tqdm")
    src = tmp_path / "in.txt"
    src.write_text("1 May 2000\n2 May 2001\n", encoding="utf-8")
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(tmp_path / "o.jsonl"))
    assert code == 0
    assert [line for line in err.splitlines() if line.strip()][0].startswith("wrote "), err  # the summary alone


def test_decode_corpus_names_a_missing_path_argument(tmp_path):
    from beamkit.corpus import DecodeOptions, decode_corpus

    with pytest.raises(TypeError, match="^input must be a path"):
        decode_corpus(None, tmp_path / "o.jsonl", DecodeOptions())
    with pytest.raises(TypeError, match="^output must be a path"):
        decode_corpus(tmp_path / "in.txt", None, DecodeOptions())


def test_a_constraint_longer_than_max_len_is_refused_before_the_search():
    from beamkit.variants.constrained import constrained_beam_search

    calls = []

    def step(state, y_prev):
        calls.append(1)
        return np.zeros((len(y_prev), 5)), state

    with pytest.raises(ValueError, match=r"constraint 0 is 4 tokens long, more than max_len=3"):
        constrained_beam_search(step, np.zeros((1, 1)), 0, 1, 2, 3, [[2, 3, 4, 2]])
    assert calls == []
    with pytest.raises(ValueError, match=r"constraint 1 of request 0"):
        constrained_beam_search(step, np.zeros((1, 1)), 0, 1, 2, 3, [[[2], [3, 3, 3, 3, 3]]], per_request=True)


# --- work bounded before it starts ---------------------------------------------------------------------------


def test_explain_refuses_a_beam_wider_than_it_draws(capsys):
    from beamkit.explain import MAX_BEAM

    code, out, err = run_main(capsys, "explain", "3rd of March 1999", "--beam", "100000", "-o", os.devnull)
    assert code == 2 and out == "" and f"{MAX_BEAM}" in one_line(err, "explain")


def test_translate_refuses_an_input_longer_than_the_model_takes(capsys):
    code, out, err = run_main(capsys, "translate", *FAST, "1" * 1_000_000)
    line = one_line(err, "translate")
    assert code == 2 and out == "" and "1000000" in line and "at most 256" in line


@pytest.mark.parametrize("lr", ["1e308", "0", "-1e-3", "inf"])
def test_train_refuses_a_learning_rate_out_of_range(capsys, tmp_path, lr):
    code, _, err = run_main(capsys, "train", "dates", "--lr", lr, "--out", str(tmp_path / "ckpt"))
    assert code == 2 and "--lr" in one_line(err, "train")
    assert not (tmp_path / "ckpt").exists()


# --- options and printing ------------------------------------------------------------------------------------


def test_version(capsys):
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # tomllib is Python 3.11 on
    declared = re.search(r'^version = "([^"]+)"', project, re.MULTILINE).group(1)
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"beamkit {declared}"


@pytest.mark.parametrize(("text", "value"), [("-1e-3", -1e-3), ("-2.5E+1", -25.0), ("-.5", -0.5), ("-3", -3.0)])
def test_a_negative_number_in_any_notation_is_a_value(text, value):
    args = cli.build_parser().parse_args(["translate", "--length-penalty", text, "x"])
    assert args.length_penalty == value


def test_a_negative_infinity_is_refused_as_a_number_not_an_option(capsys):
    code, _, err = run_main(capsys, "translate", "--length-penalty", "-inf", "x")
    assert code == 2 and "finite" in one_line(err, "translate") and "expected one argument" not in err


def test_scores_print_with_enough_digits_to_rank(capsys):
    argv = ("translate", "--length-penalty", "100", "--beam", "3", "--backend", "numpy", "--quiet", "1 May 2000")
    code, out, _ = run_main(capsys, *argv, "--json")
    want = [h["score"] for h in json.loads(out)[0]["hypotheses"]]
    assert len(set(want)) == 3 and max(abs(s) for s in want) < 1e-50  # all would print as -0.0000
    code, out, _ = run_main(capsys, *argv)
    printed = [float(m) for m in re.findall(r"score (\S+)", out)]
    assert printed == pytest.approx(want, rel=1e-3, abs=0)
    assert sorted(printed, reverse=True) == printed


def test_explain_shows_the_best_hypothesis_as_text(capsys, tmp_path):
    code, out, _ = run_main(capsys, "translate", "--beam", "5", "--quiet", "--json", "3rd of March 1999")
    best = json.loads(out)[0]["hypotheses"][0]["text"]
    code, out, err = run_main(capsys, "explain", "3rd of March 1999", "-o", str(tmp_path / "t.html"))
    assert code == 0, err
    assert out.rstrip().endswith(f"best: {best!r}"), out


def test_train_stops_with_one_line_when_the_loss_diverges(capsys, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")

    class NanLoss(torch.nn.CrossEntropyLoss):
        def forward(self, logits, gold):  # the loss of a run whose weights overflowed
            return super().forward(logits, gold) * float("nan")

    monkeypatch.setattr(torch.nn, "CrossEntropyLoss", NanLoss)
    out = tmp_path / "ckpt"
    code, stdout, err = run_main(capsys, "train", "dates", "--out", str(out), "--train-size", "64", "--epochs", "1")
    assert code == 1 and stdout == ""
    assert "diverged" in one_line(err, "train") and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())  # no checkpoint of NaN weights


# --- decode's input file: named pipes, UTF-16, byte-order marks ------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_decode_refuses_a_named_pipe_as_input(capsys, tmp_path):
    # the input is read twice (its lines, then its digest for resuming): a pipe blocked the second read for ever
    pipe = tmp_path / "in.txt"
    os.mkfifo(pipe)
    out = tmp_path / "out.jsonl"
    code, _, err = run_main(capsys, "decode", "--input", str(pipe), "--output", str(out), "--quiet")
    assert code == 2 and "named pipe" in one_line(err, "decode") and str(pipe) in err
    assert not out.exists()


def test_decode_refuses_a_utf16_input_in_one_line(capsys, tmp_path):
    # each line became an error record of split UTF-16 bytes, and the command exited 0
    src = tmp_path / "in.txt"
    src.write_text("1 May 2000\n2 May 2001\n", encoding="utf-16")
    out = tmp_path / "out.jsonl"
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(out), "--quiet")
    line = one_line(err, "decode")
    assert code == 2 and str(src) in line and "UTF-16" in line and not out.exists()


@pytest.mark.parametrize("name", ["in.txt", "in.jsonl"])
def test_decode_reads_a_file_with_a_byte_order_mark_as_without(capsys, tmp_path, name):
    # the mark was part of the first input: an unknown character (text) or "Unexpected UTF-8 BOM" (JSONL)
    line = '{"id": 1, "text": "1 May 2000"}' if name.endswith(".jsonl") else "1 May 2000"
    outs = []
    for bom in (b"", b"\xef\xbb\xbf"):
        src = tmp_path / f"{len(bom)}{name}"
        src.write_bytes(bom + f"{line}\n".encode())
        out = tmp_path / f"{len(bom)}out.jsonl"
        code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(out), "--quiet")
        assert code == 0, err
        outs.append([json.loads(r) for r in out.read_text(encoding="utf-8").splitlines()])
    assert outs[1] == outs[0] and outs[0][0]["error"] is None and outs[0][0]["n_best"][0]["text"] == "2000-05-01"


# --- no command prints a number JSON cannot hold -------------------------------------------------------------


def _strict_loads(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("bad", [float("-inf"), float("nan")])
def test_translate_json_refuses_a_score_json_cannot_hold(capsys, monkeypatch, bad):
    from types import SimpleNamespace

    import beamkit.adapters

    def decode_texts(adapter, texts, **kw):
        return [[SimpleNamespace(text="2000-05-01", logprob=-1.0, score=bad, finished=True)] for _ in texts]

    monkeypatch.setattr(beamkit.adapters, "decode_texts", decode_texts)
    code, out, err = run_main(capsys, "translate", *FAST, "--json", "1 May 2000")
    assert code == 2 and out == "" and "not a finite number" in one_line(err, "translate")


def test_decode_writes_a_non_finite_score_as_null_with_an_error(tmp_path):
    from beamkit.corpus.shards import encode_records

    records = [
        {"id": 1, "input": "a", "n_best": [{"text": "x", "logprob": -1.5, "score": -0.5}], "error": None},
        {"id": 2, "input": "b", "n_best": [{"text": "y", "logprob": float("-inf"), "score": float("nan")}],
         "error": None},
    ]  # fmt: skip
    lines = encode_records(records).decode("utf-8").splitlines()
    got = [_strict_loads(line) for line in lines]  # "-Infinity" and "NaN" were written as they are
    assert got[0] == records[0] and lines[0].endswith('"error": null}')
    assert got[1]["n_best"] == [{"text": "y", "logprob": None, "score": None}]
    assert "not a finite number" in got[1]["error"]


@pytest.mark.parametrize(
    "argv",
    [
        ("translate", "--beam", "100000000", "3 May 1999"),
        ("decode", "--input", "in.txt", "--output", "out.jsonl", "--beam", "100001"),
        ("eval", "dates", "--beams", "1,100000000"),
    ],
)
def test_text_commands_refuse_a_beam_beyond_the_documented_maximum(capsys, argv):
    # a beam of 10**8 ran for minutes past 3.5 GB without an answer (ctc decode's --beam had the bound already)
    code, out, err = run_main(capsys, *argv)
    line = one_line(err, argv[0])
    assert code == 2 and out == "" and "100,000" in line and "100000001" not in line
    assert "100000000" in line or "100001" in line  # the value given, named
