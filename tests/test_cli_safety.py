"""The command line as a careless or hostile user meets it: nothing overwritten, no option silently ignored,
inputs the dates model cannot mean flagged, messages that name the file, no hang on an absent Ray cluster.

Run in-process through ``beamkit.cli.main(argv)`` except the Ray case, which runs in a bounded subprocess.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from beamkit.cli import entry as cli
from beamkit.models import SHIPPED_DIR

SRC = Path(__file__).resolve().parents[1] / "src"
TINY_TRAIN = ("--train-size", "64", "--epochs", "1", "--quiet")


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"beamkit {command}: error: "), err
    return lines[0]


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# decode: the output must not be the input


def test_decode_refuses_output_that_is_the_input(capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("3rd of March 1999\n", encoding="utf-8")
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(src), "--quiet")
    assert code == 2
    assert "--output" in one_error(err, "decode")
    assert src.read_text(encoding="utf-8") == "3rd of March 1999\n"


def test_decode_refuses_output_linked_to_the_input(capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("3rd of March 1999\n", encoding="utf-8")
    (tmp_path / "hard.txt").hardlink_to(src)
    (tmp_path / "soft.txt").symlink_to(src)
    for other in ("hard.txt", "soft.txt"):
        code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(tmp_path / other), "--quiet")
        assert code == 2, other
        one_error(err, "decode")
    assert src.read_text(encoding="utf-8") == "3rd of March 1999\n"


def test_decode_refuses_an_existing_file_that_is_not_its_output_unless_forced(capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("3rd of March 1999\n", encoding="utf-8")
    out = tmp_path / "notes.jsonl"
    out.write_text("my notes\n", encoding="utf-8")
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(out), "--quiet")
    assert code == 2
    assert "--force" in one_error(err, "decode")
    assert out.read_text(encoding="utf-8") == "my notes\n"
    assert not (tmp_path / "notes.jsonl.parts").exists()
    code, _, _ = run_main(capsys, "decode", "--input", str(src), "--output", str(out), "--quiet", "--force")
    assert code == 0
    assert "1999-03-03" in out.read_text(encoding="utf-8")


def test_decode_rerun_onto_its_own_output_still_resumes(capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("3rd of March 1999\n4 July 1976\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ("decode", "--input", str(src), "--output", str(out), "--quiet", "--shard-size", "1")
    assert run_main(capsys, *argv)[0] == 0
    first = out.read_bytes()
    code, _, err = run_main(capsys, *argv)
    assert code == 0
    assert "0 shards decoded, 2 reused" in err
    assert out.read_bytes() == first


def test_decode_refuses_a_folder_as_output_before_decoding(capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("3rd of March 1999\n", encoding="utf-8")
    folder = tmp_path / "results"
    folder.mkdir()
    code, _, err = run_main(capsys, "decode", "--input", str(src), "--output", str(folder), "--quiet")
    assert code == 2
    assert "folder" in one_error(err, "decode")
    assert not (tmp_path / "results.parts").exists()


# train: never into the package, never over something that is not asked to be replaced


@pytest.mark.parametrize("name", ["dates-seq2seq", ""])
def test_train_refuses_the_shipped_folder_before_training(capsys, name):
    target = SHIPPED_DIR / name if name else SHIPPED_DIR
    before = digest(SHIPPED_DIR / "dates-seq2seq")
    code, _, err = run_main(capsys, "train", "dates", "--out", str(target), "--force", *TINY_TRAIN)
    assert code == 2
    assert "saved" not in err
    one_error(err, "train")
    assert digest(SHIPPED_DIR / "dates-seq2seq") == before


def test_train_refuses_an_existing_file_before_training(capsys, tmp_path, monkeypatch):
    import beamkit.tasks.train as train_module

    def no_training(*args, **kwargs):
        raise AssertionError("trained before checking --out")

    monkeypatch.setattr(train_module, "train_dates", no_training)
    out = tmp_path / "model.bin"
    out.write_text("keep me", encoding="utf-8")
    code, _, err = run_main(capsys, "train", "dates", "--out", str(out), *TINY_TRAIN)
    assert code == 2
    assert str(out) in one_error(err, "train")
    assert out.read_text(encoding="utf-8") == "keep me"


def test_train_refuses_a_non_empty_folder_unless_forced(capsys, tmp_path, monkeypatch):
    import beamkit.tasks.train as train_module

    calls = []
    real = train_module.train_dates
    monkeypatch.setattr(train_module, "train_dates", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = tmp_path / "work"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me", encoding="utf-8")
    code, _, err = run_main(capsys, "train", "dates", "--out", str(out), *TINY_TRAIN)
    assert code == 2
    assert "--force" in one_error(err, "train")
    assert not calls
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    pytest.importorskip("torch")
    code, out_text, _ = run_main(capsys, "train", "dates", "--out", str(out), "--force", *TINY_TRAIN)
    assert code == 0, out_text
    assert (out / "config.json").is_file() and (out / "thesis.tex").is_file()


def test_train_into_an_empty_or_new_folder_needs_no_force(tmp_path):
    from beamkit.tasks.train import check_out

    (tmp_path / "empty").mkdir()
    check_out(tmp_path / "empty")
    check_out(tmp_path / "new" / "folder")


# options that cannot apply are usage errors


def test_eval_g2p_refuses_words_with_split(capsys):
    code, _, err = run_main(capsys, "eval", "g2p", "--words", "5", "--split", "test")
    assert code == 2
    line = one_error(err, "eval")
    assert "--words" in line and "--split" in line


def test_explain_hf_refuses_policy(capsys, tmp_path):
    code, _, err = run_main(capsys, "explain", "hi", "--model", f"hf:{tmp_path}", "--policy", "pool")
    assert code == 2
    assert "--policy" in one_error(err, "explain")


# the dates model's range


@pytest.mark.parametrize(
    "text",
    ["3rd of March 1999", "July 4, 1800", "31/12/2099", "Mon, 3 Mar 99", "march 3rd", "3-Mar-99", "2024.1.5", "12"],
)
def test_out_of_range_reason_accepts_dates_the_model_knows(text):
    from beamkit.tasks.dates import out_of_range_reason

    assert out_of_range_reason(text) is None


@pytest.mark.parametrize(
    ("text", "word"),
    [("hello world", "date-like"), ("", "date-like"), ("July 4, 1776", "1776"), ("2100-01-01", "2100"),
     ("march 1799", "1799")],
)  # fmt: skip
def test_out_of_range_reason_names_the_problem(text, word):
    from beamkit.tasks.dates import out_of_range_reason

    reason = out_of_range_reason(text)
    assert reason is not None and word in reason
    if word.isdigit():
        assert "1800" in reason and "2099" in reason


def test_translate_help_states_the_range(capsys):
    with pytest.raises(SystemExit):
        cli.main(["translate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "1800" in out and "2099" in out and "--strict" in out


def test_models_guide_states_the_range():
    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "models.md").read_text(encoding="utf-8")
    assert "1800" in text and "2099" in text and "--strict" in text


def test_translate_warns_on_input_it_cannot_mean(capsys):
    code, out, err = run_main(capsys, "translate", "hello world", "July 4, 1776", "3rd of March 1999", "--quiet")
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 2, err
    assert "'hello world'" in warnings[0] and "'July 4, 1776'" in warnings[1]
    assert "1999-03-03" in out


def test_translate_strict_refuses_input_it_cannot_mean(capsys):
    code, out, err = run_main(capsys, "translate", "3rd of March 1999", "July 4, 1776", "--strict", "--quiet")
    assert code == 2
    assert "'July 4, 1776'" in one_error(err, "translate")
    assert out == ""


# messages that name the file


def test_translate_stdin_not_utf8_names_standard_input(capsys, monkeypatch):
    raw = io.BytesIO(b"3rd of March 1999\n\xff\xfe March\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape"))
    code, _, err = run_main(capsys, "translate", "-", "--quiet")
    assert code == 2
    line = one_error(err, "translate")
    assert "standard input" in line and "line 2" in line and "UTF-8" in line


def test_corpus_utf8_error_names_the_file(tmp_path):
    from beamkit.corpus.inputs import read_inputs

    src = tmp_path / "in.txt"
    src.write_bytes(b"3rd of March 1999\n\xff\n")
    items = read_inputs(src)
    assert items[0].error is None
    assert items[1].error is not None and "in.txt" in items[1].error and "line 2" in items[1].error


def test_a_folder_where_a_file_belongs_says_folder(capsys, tmp_path):
    folder = tmp_path / "lm"
    folder.mkdir()
    code, _, err = run_main(capsys, "eval", "dates", "--lm", str(folder), "--lm-weight", "0.1", "--limit", "1")
    assert code == 1
    line = one_error(err, "eval")
    assert "folder" in line and str(folder) in line and "Errno" not in line


# Ray: no hang on an address nothing answers at


def test_decode_ray_address_without_a_cluster_fails_fast(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    src = tmp_path / "in.txt"
    src.write_text("3rd of March 1999\n", encoding="utf-8")
    address = f"127.0.0.1:{port}"
    argv = ["decode", "--input", str(src), "--output", str(tmp_path / "out.jsonl"), "--quiet", "--ray", address]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    code = "import sys; from beamkit.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"beamkit decode --ray {address} hung with no cluster there")
    assert proc.returncode == 1, err
    assert address in one_error(err, "decode")


def test_check_reachable_names_the_address_and_leaves_other_forms_to_ray():
    from beamkit.corpus.ray_backend import check_reachable

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(RuntimeError, match=address):
            check_reachable(address, timeout=2)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout=2)
    check_reachable("auto")
    check_reachable("local")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--beam", "0"], "argument --beam: expected an integer from 1 to 100,000, got 0"),
        (["--max-len", "0"], "argument --max-len: expected >= 1"),
        (["--length-penalty", "1e308"], "length_penalty alpha must be a finite number between -100 and 100"),
    ],
)
def test_translate_checks_its_options_before_warning_about_inputs(args, message, capsys):
    from beamkit.cli import main
    from tests.test_adapters import cli_error

    code, line = cli_error(capsys, main, ["translate", *args, "hello world"])
    assert code == 2 and message in line
