"""Resuming ``beamkit decode`` never reuses work that no longer matches: a shard that does not verify is decoded
again, and a changed input, checkpoint, LM or option is a different run. The oracle of each case is a clean
decode from scratch into another output file."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from beamkit.cli import main
from beamkit.corpus import DecodeOptions, decode_corpus
from beamkit.models import shipped_models

pytest.importorskip("safetensors")

SOURCES = ["3rd of March 1999", "1999.3.3", "Wed, 3 Mar 1999", "March 3, '99", "03/04/99", "17 September 1931"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def decode(*args: str) -> int:
    return main(["decode", "--quiet", "--workers", "1", *args])


@pytest.fixture
def corpus(tmp_path) -> Path:
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    return src


def fresh(tmp_path: Path, *args: str) -> bytes:
    """The oracle: the same command decoded from scratch into a new output."""
    out = tmp_path / "fresh" / "out.jsonl"
    out.parent.mkdir(exist_ok=True)
    shutil.rmtree(out.parent / "out.jsonl.parts", ignore_errors=True)
    assert decode(*args, "--output", str(out)) == 0
    return out.read_bytes()


def shard(out: Path, n: int) -> Path:
    return out.with_name(out.name + ".parts") / f"shard-{n:05d}.jsonl"


def assert_refused_then_redecoded(tmp_path: Path, out: Path, args: list[str], capsys) -> None:
    """The rerun is refused as a different run (the old output untouched); with the shards deleted it decodes
    what a clean decode gives, which differs from the old output (so reusing the shards would be wrong)."""
    before = out.read_bytes()
    capsys.readouterr()
    assert decode(*args, "--output", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different run" in err[0]
    assert out.read_bytes() == before
    want = fresh(tmp_path, *args)
    assert want != before
    shutil.rmtree(out.with_name(out.name + ".parts"))
    assert decode(*args, "--output", str(out), "--force") == 0  # the record of the old run is gone
    assert out.read_bytes() == want


def test_a_shard_overwritten_with_garbage_is_decoded_again(tmp_path, corpus):
    out = tmp_path / "out.jsonl"
    args = ["--input", str(corpus), "--shard-size", "3"]
    assert decode(*args, "--output", str(out)) == 0
    shard(out, 1).write_bytes(b"garbage\n" * 3)  # as many lines as a complete shard
    assert decode(*args, "--output", str(out)) == 0
    assert out.read_bytes() == fresh(tmp_path, *args)


def test_an_edited_line_inside_a_shard_is_decoded_again(tmp_path, corpus):
    out = tmp_path / "out.jsonl"
    args = ["--input", str(corpus), "--shard-size", "3"]
    assert decode(*args, "--output", str(out)) == 0
    path = shard(out, 0)
    text = path.read_text(encoding="utf-8")
    assert "1999-03-03" in text
    path.write_text(text.replace("1999-03-03", "2000-01-01", 1), encoding="utf-8")
    assert decode(*args, "--output", str(out)) == 0
    assert out.read_bytes() == fresh(tmp_path, *args)


def test_two_swapped_shards_are_decoded_again(tmp_path, corpus):
    out = tmp_path / "out.jsonl"
    args = ["--input", str(corpus), "--shard-size", "3"]
    assert decode(*args, "--output", str(out)) == 0
    a, b = shard(out, 0), shard(out, 1)
    first, second = a.read_bytes(), b.read_bytes()
    a.write_bytes(second)
    b.write_bytes(first)
    assert decode(*args, "--output", str(out)) == 0
    assert out.read_bytes() == fresh(tmp_path, *args)


def test_shards_without_their_manifest_are_not_reused_by_other_options(tmp_path, corpus):
    out = tmp_path / "out.jsonl"
    args = ["--input", str(corpus), "--shard-size", "3"]
    assert decode(*args, "--output", str(out), "--beam", "3", "--n-best", "3") == 0
    (tmp_path / "out.jsonl.parts" / "manifest.json").unlink()
    # without its manifest the output is no longer known to be decode's own: replacing it needs --force
    assert decode(*args, "--output", str(out)) == 2
    assert decode(*args, "--output", str(out), "--force") == 0
    assert out.read_bytes() == fresh(tmp_path, *args)


def test_a_checkpoint_changed_at_the_same_path_is_a_different_run(tmp_path, corpus, capsys):
    shipped = shipped_models()
    ck = tmp_path / "ck"
    shutil.copytree(shipped["dates-seq2seq"], ck)
    out = tmp_path / "out.jsonl"
    args = ["--input", str(corpus), "--model", str(ck)]
    assert decode(*args, "--output", str(out)) == 0
    shutil.rmtree(ck)
    shutil.copytree(shipped["dates-transformer"], ck)
    assert_refused_then_redecoded(tmp_path, out, args, capsys)


LABELS = ["", " ", "a", "b", "c", "d"]


def write_ctc(tmp_path: Path) -> list[str]:
    """Four (T, 6) posteriors, a labels file and a bigram LM; the ``beamkit decode`` arguments that read them."""
    from beamkit.lm import write_arpa

    post = tmp_path / "post"
    post.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        logits = rng.normal(0, 2.5, size=(14, len(LABELS)))
        np.save(post / f"u{i}.npy", (logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)).astype(np.float32))
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join("<space>" if lab == " " else lab for lab in LABELS) + "\n")
    lm = tmp_path / "lm.arpa"
    (tmp_path / "corpus.txt").write_text("ab cd\nba dc ab\nabc d\ncab\n")
    write_arpa(str(tmp_path / "corpus.txt"), str(lm), order=2)
    return ["--input", str(post), "--labels", str(labels), "--lm", str(lm), "--beam", "8", "--alpha", "2"]


def test_an_lm_changed_at_the_same_path_is_a_different_run(tmp_path, capsys):
    from beamkit.lm import write_arpa

    args = write_ctc(tmp_path)
    out = tmp_path / "out.jsonl"
    assert decode(*args, "--output", str(out)) == 0
    (tmp_path / "corpus.txt").write_text("dd dd\nc c c\nda\n")
    write_arpa(str(tmp_path / "corpus.txt"), str(tmp_path / "lm.arpa"), order=2)
    assert_refused_then_redecoded(tmp_path, out, args, capsys)


def test_a_posterior_changed_with_its_size_and_time_kept_is_a_different_run(tmp_path, capsys):
    args = write_ctc(tmp_path)
    out = tmp_path / "out.jsonl"
    assert decode(*args, "--output", str(out)) == 0
    path = tmp_path / "post" / "u1.npy"
    st = path.stat()
    np.save(path, np.load(path)[::-1].copy())  # the frames reversed: same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert_refused_then_redecoded(tmp_path, out, args, capsys)


def test_an_older_manifest_format_is_refused_clearly(tmp_path, corpus, capsys):
    out = tmp_path / "out.jsonl"
    args = ["--input", str(corpus), "--output", str(out)]
    assert decode(*args) == 0
    manifest = tmp_path / "out.jsonl.parts" / "manifest.json"
    body = json.loads(manifest.read_text())
    body["run"]["format"] = "beamkit-corpus/1"
    manifest.write_text(json.dumps(body))
    capsys.readouterr()
    assert decode(*args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "beamkit-corpus/1" in err[0] and "delete" in err[0]


def test_a_run_that_fails_its_checks_writes_nothing(tmp_path, corpus):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    out = tmp_path / "out.jsonl"
    args = ["--input", str(corpus)]
    assert decode(*args, "--output", str(out), "--model", str(empty)) != 0
    assert not (tmp_path / "out.jsonl.parts").exists() and not out.exists()
    assert decode(*args, "--output", str(out)) == 0  # the corrected command runs
    assert out.read_bytes() == fresh(tmp_path, *args)


def test_an_empty_corpus_into_a_new_folder(tmp_path):
    src = tmp_path / "empty.txt"
    src.write_text("")
    out = tmp_path / "new" / "out.jsonl"
    assert decode("--input", str(src), "--output", str(out)) == 0
    assert out.read_bytes() == b""


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_length_penalty_is_refused_up_front(tmp_path, corpus, capsys, value):
    out = tmp_path / "out.jsonl"
    from tests.test_adapters import cli_error

    argv = ["decode", "--quiet", "--input", str(corpus), "--output", str(out), f"--length-penalty={value}"]
    code, line = cli_error(capsys, main, argv)
    assert code == 2 and "--length-penalty" in line
    assert not out.exists() and not (tmp_path / "out.jsonl.parts").exists()


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("length_penalty", math.nan, ValueError),
        ("length_penalty", math.inf, ValueError),
        ("length_penalty", "1", TypeError),
        ("alpha", math.nan, ValueError),
        ("beta", -math.inf, ValueError),
        ("beam", 2.5, TypeError),
        ("beam", True, TypeError),
        ("n_best", "1", TypeError),
        ("max_len", 3.0, TypeError),
        ("threads", 0, ValueError),
        ("lm_backend", "bogus", ValueError),
    ],
)
def test_decode_options_check_names_the_field(field, value, error):
    with pytest.raises(error, match=field):
        DecodeOptions(**{field: value}).check()


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [("batch_size", "3", TypeError), ("workers", 1.0, TypeError), ("shard_size", 0, ValueError)],
)
def test_decode_corpus_checks_its_numbers(tmp_path, corpus, name, value, error):
    out = tmp_path / "out.jsonl"
    with pytest.raises(error, match=name):
        decode_corpus(corpus, out, DecodeOptions(), **{name: value})
    assert not (tmp_path / "out.jsonl.parts").exists()
