"""``beamkit decode`` on the local back-end: same results as the one-at-a-time commands, bad inputs reported as
errors, shards that survive a killed run and are reused by the rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from beamkit.cli import main

pytest.importorskip("torch")
pytest.importorskip("safetensors")

SRC = str(Path(__file__).resolve().parents[1] / "src")
SOURCES = ["3rd of March 1999", "1999.3.3", "Wed, 3 Mar 1999", "March 3, '99", "03/04/99", "17 September 1931"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def decode(*args: str) -> int:
    return main(["decode", "--quiet", *args])


def translate_alone(capsys, text: str, beam: int, n_best: int) -> list[dict]:
    """``beamkit translate --json`` on one text (its own search): the oracle for one input."""
    capsys.readouterr()
    assert main(["translate", "--json", "--beam", str(beam), "--n-best", str(n_best), text]) == 0
    (payload,) = json.loads(capsys.readouterr().out)
    return [{"text": h["text"], "logprob": h["logprob"], "score": h["score"]} for h in payload["hypotheses"]]


def assert_close(got: list[dict], want: list[dict]) -> None:
    """Same texts; log-probabilities and scores equal up to the float rounding batching changes (~1e-6)."""
    assert [h["text"] for h in got] == [h["text"] for h in want]
    for a, b in zip(got, want, strict=True):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-5)
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)


def test_text_file_equals_translate_one_at_a_time(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert decode("--input", str(src), "--output", str(out), "--beam", "4", "--n-best", "2", "--batch-size", "1") == 0
    got = read_jsonl(out)
    assert [r["id"] for r in got] == list(range(1, len(SOURCES) + 1))
    assert [r["input"] for r in got] == SOURCES
    for rec, text in zip(got, SOURCES, strict=True):
        assert rec["error"] is None
        assert rec["n_best"] == translate_alone(capsys, text, beam=4, n_best=2)  # bit for bit: same search


def test_batches_across_workers_and_shards_match_alone_decoding(tmp_path, capsys):
    sources = SOURCES * 3
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(sources)))
    out = tmp_path / "out.jsonl"
    args = ["--input", str(src), "--output", str(out), "--beam", "3", "--batch-size", "4", "--shard-size", "5"]
    assert decode(*args, "--workers", "2") == 0
    got = read_jsonl(out)
    assert [r["id"] for r in got] == [f"s{i}" for i in range(len(sources))]
    alone = {t: translate_alone(capsys, t, beam=3, n_best=1) for t in SOURCES}
    for rec, text in zip(got, sources, strict=True):
        assert_close(rec["n_best"], alone[text])
    manifest = json.loads((tmp_path / "out.jsonl.parts" / "manifest.json").read_text())
    assert manifest["shards"] == 4 and manifest["done"] == [0, 1, 2, 3]


def test_bad_lines_are_errors_with_their_ids_and_the_rest_decodes(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_bytes(b"1999.3.3\n\n3 M\xc3\xa4rz 1999\nbad \xff byte\n   \nMarch 3, '99\r\n")
    out = tmp_path / "out.jsonl"
    assert decode("--input", str(src), "--output", str(out), "--batch-size", "8") == 0
    got = read_jsonl(out)
    assert [r["id"] for r in got] == [1, 2, 3, 4, 5, 6]
    errors = {r["id"]: r["error"] for r in got if r["error"]}
    assert set(errors) == {2, 3, 4, 5}
    assert "empty input" in errors[2] and "empty input" in errors[5]
    assert "unknown characters" in errors[3]
    assert "not valid UTF-8" in errors[4]
    assert got[3]["input"] == "bad \ufffd byte"
    assert got[5]["input"] == "March 3, '99"  # the CRLF line ending is not part of the input
    for rec in (got[0], got[5]):
        assert_close(rec["n_best"], translate_alone(capsys, rec["input"], beam=5, n_best=1))
    assert all(r["n_best"] == [] for r in got if r["error"])


def test_jsonl_bad_records(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = ['{"id": "a", "text": "1999.3.3"}', "{not json", '{"id": 7}', '["x"]', '{"text": "1999.3.4"}']
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert decode("--input", str(src), "--output", str(out)) == 0
    got = read_jsonl(out)
    assert [r["id"] for r in got] == ["a", 2, 7, 4, 5]
    assert [bool(r["error"]) for r in got] == [False, True, True, True, False]
    assert "not JSON" in got[1]["error"] and "'text'" in got[2]["error"] and "JSON object" in got[3]["error"]
    assert got[4]["n_best"][0]["text"] == "1999-03-04"


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def test_killed_run_resumes_to_the_complete_file(tmp_path):
    from beamkit.tasks.dates import split

    sources = [s for s, _ in split("test", limit=600)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(sources) + "\n")
    out = tmp_path / "out.jsonl"
    parts = tmp_path / "out.jsonl.parts"
    args = ["--input", str(src), "--output", str(out), "--batch-size", "10", "--shard-size", "20"]
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", "import sys, beamkit.cli as c; sys.exit(c.main(sys.argv[1:]))", "decode", "--quiet"]
    proc = subprocess.Popen([*cmd, *args, "--workers", "2"], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(parts.glob("shard-*.jsonl")):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no shard finished in time"
            time.sleep(0.02)
        workers = _children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # mid-run: the driver dies without any cleanup
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()
    for pid in workers:  # the workers notice the dead driver and stop; make sure before going on
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not out.exists()
    kept = {p.name: p.stat().st_mtime_ns for p in parts.glob("shard-*.jsonl")}
    assert 1 <= len(kept) < 30, "the run was not interrupted mid-way"
    for name in kept:  # a visible shard is always complete
        assert len(read_jsonl(parts / name)) == 20

    assert decode(*args) == 0  # resumed by one worker: the batches, hence the results, are the same
    assert {p.name: p.stat().st_mtime_ns for p in parts.glob("shard-*.jsonl") if p.name in kept} == kept
    resumed = out.read_bytes()
    fresh = tmp_path / "fresh.jsonl"
    assert decode("--input", str(src), "--output", str(fresh), "--batch-size", "10", "--shard-size", "20") == 0
    assert resumed == fresh.read_bytes()  # complete, in order, no duplicate
    assert [r["input"] for r in read_jsonl(out)] == sources
    assert not list(tmp_path.glob("**/.*.tmp"))


def test_rerun_reuses_shards_and_a_changed_run_is_refused(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SOURCES) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["--input", str(src), "--output", str(out), "--shard-size", "4"]
    assert decode(*args) == 0
    first = out.read_bytes()
    capsys.readouterr()
    assert decode(*args) == 0
    assert "0 shards decoded, 2 reused" in capsys.readouterr().err
    assert out.read_bytes() == first
    assert decode(*args, "--beam", "2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different run" in err[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n-best", "6"], "--n-best"),
        (["--beam", "0"], "--beam"),
        (["--workers", "0"], "--workers"),
        (["--labels", "abc"], "--labels applies"),
        (["--model", "/nonexistent/ck"], "checkpoint not found"),
        (["--model", "hf:/nonexistent"], "not a Hugging Face model directory"),
        (["--model", "g2p-en", "--max-len", "5"], "--max-len"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, capsys, extra, message):
    from tests.test_adapters import cli_error

    src = tmp_path / "in.txt"
    src.write_text("1999.3.3\n")
    argv = ["decode", "--quiet", "--input", str(src), "--output", str(tmp_path / "o.jsonl"), *extra]
    code, line = cli_error(capsys, main, argv)
    assert code == 2 and message in line


def test_missing_input_and_folder_without_labels(tmp_path, capsys):
    assert decode("--input", str(tmp_path / "none.txt"), "--output", str(tmp_path / "o.jsonl")) == 2
    assert "no such input" in capsys.readouterr().err
    assert decode("--input", str(tmp_path), "--output", str(tmp_path / "o.jsonl")) == 2
    assert "need --labels" in capsys.readouterr().err


LABELS = ["", " ", "a", "b", "c", "d"]


def write_posteriors(folder: Path) -> list[str]:
    """Five (T, 6) matrices of random log-probabilities (two lengths), a corrupt file and a wrong shape."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    names = []
    for i in range(5):
        logits = rng.normal(0, 2.5, size=(12 + 5 * (i % 2), len(LABELS)))
        logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        np.save(folder / f"u{i}.npy", logp.astype(np.float32))
        names.append(f"u{i}")
    (folder / "u5.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(folder / "u6.npy", np.zeros((4, 3), dtype=np.float32))
    return names


def ctc_alone(capsys, path: Path, labels: Path, lm: Path, beam: int, top: int) -> list[dict]:
    """``beamkit ctc decode --json`` on one file: the oracle for one utterance."""
    capsys.readouterr()
    args = ["ctc", "decode", str(path), "--labels", str(labels), "--lm", str(lm), "--json"]
    assert main([*args, "--beam", str(beam), "--top", str(top)]) == 0
    beams = json.loads(capsys.readouterr().out)["beams"]
    return [{"text": b["text"], "logprob": b["logit_score"], "score": b["score"]} for b in beams]


def test_ctc_folder_equals_ctc_decode_one_at_a_time(tmp_path, capsys):
    from beamkit.lm import write_arpa

    names = write_posteriors(tmp_path / "post")
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join("<space>" if lab == " " else lab for lab in LABELS) + "\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("ab cd\nba dc ab\nabc d\ncab\n")
    lm = tmp_path / "lm.arpa"
    write_arpa(str(corpus), str(lm), order=2)
    out = tmp_path / "out.jsonl"
    common = ["--input", str(tmp_path / "post"), "--output", str(out), "--labels", str(labels), "--lm", str(lm)]
    assert decode(*common, "--beam", "8", "--n-best", "2", "--batch-size", "1") == 0
    got = read_jsonl(out)
    assert [r["id"] for r in got] == [*names, "u5", "u6"]
    for rec, name in zip(got[:5], names, strict=True):
        assert rec["error"] is None
        assert rec["n_best"] == ctc_alone(capsys, tmp_path / "post" / f"{name}.npy", labels, lm, beam=8, top=2)
    assert "cannot read u5.npy" in got[5]["error"]
    assert "(T, 6)" in got[6]["error"]
    batched = tmp_path / "batched.jsonl"
    assert decode(*common[:3], str(batched), *common[4:], "--beam", "8", "--n-best", "2", "--workers", "2") == 0
    for one, many in zip(got, read_jsonl(batched), strict=True):
        assert [h["text"] for h in one["n_best"]] == [h["text"] for h in many["n_best"]]
        for a, b in zip(one["n_best"], many["n_best"], strict=True):
            assert a["score"] == pytest.approx(b["score"], abs=1e-6)


def test_g2p_words_equal_decoding_alone(tmp_path):
    from beamkit.adapters.g2p import decode_words
    from beamkit.models.g2p import G2PModel, phonemes

    words = ["beam", "search", "corpus", "Ray", "decoder"]
    src = tmp_path / "words.txt"
    src.write_text("\n".join(words) + "\n")
    out = tmp_path / "out.jsonl"
    assert decode("--model", "g2p-en", "--input", str(src), "--output", str(out), "--beam", "3", "--n-best", "2") == 0
    got = read_jsonl(out)
    assert "lower-case a-z" in got[3]["error"]
    model = G2PModel.load()
    for rec, word in zip(got, words, strict=True):
        if word == "Ray":
            continue
        (alone,) = decode_words(model, [word], beam_size=3)
        want = [" ".join(phonemes(h.tokens)) for h in alone[:2]]
        assert [h["text"] for h in rec["n_best"]] == want
        assert rec["n_best"][0]["logprob"] == pytest.approx(float(alone[0].logprob), abs=1e-5)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A tiny seeded T5 and a word-level tokenizer, saved with ``save_pretrained`` (built offline)."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    import torch

    words = "the a beam search corpus ray worker model decodes every line of text".split()
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        num_layers=1, num_decoder_layers=1, d_model=16, d_ff=32, d_kv=8, num_heads=2, vocab_size=len(vocab),
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, initializer_factor=3.0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    model.generation_config.suppress_tokens = [0, 2]  # no pad or unknown outputs: the texts are words
    folder = tmp_path_factory.mktemp("tiny-t5")
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    # the oracle decodes with the model as saved (the round trip changes float rounding by ~1e-7)
    return folder, transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), fast


def test_hf_directory_equals_generate_one_at_a_time(tmp_path, tiny_hf):
    import torch

    import beamkit.hf

    folder, model, tokenizer = tiny_hf
    texts = ["the beam search", "a corpus of text", "ray worker", "every line the model decodes"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["--model", f"hf:{folder}", "--input", str(src), "--output", str(out), "--beam", "3", "--n-best", "2"]
    assert decode(*args, "--max-len", "6", "--batch-size", "1") == 0
    for rec, text in zip(read_jsonl(out), texts, strict=True):
        enc = tokenizer([text], return_tensors="pt")
        with torch.inference_mode():
            alone = beamkit.hf.generate(
                model, enc["input_ids"], enc["attention_mask"], num_beams=3, num_return_sequences=2, max_new_tokens=6,
                return_dict_in_generate=True,
            )  # fmt: skip
        want = [
            {"text": tokenizer.decode(h.tokens, skip_special_tokens=True), "logprob": h.logprob, "score": h.score}
            for h in alone.hypotheses[0][:2]
        ]
        assert rec["error"] is None
        assert rec["n_best"] == want
        assert all(h["text"] for h in want)


def test_a_failing_batch_is_decoded_one_by_one():
    """A batched search that fails as a whole is retried input by input: only the culprit becomes an error."""
    from beamkit.adapters import TextHypothesis
    from beamkit.corpus import CorpusDecoder, Item

    class Picky:
        def prepare(self, item):
            return item.text

        def decode(self, batch):
            if "boom" in batch:
                raise ValueError("cannot decode boom")
            return [[TextHypothesis(t.upper(), [], -1.0, -0.5, True)] for t in batch]

    decoder = CorpusDecoder.__new__(CorpusDecoder)
    decoder.model = Picky()
    items = [Item(0, "a", "x"), Item(1, "b", "boom"), Item(2, "c", "y", error="bad"), Item(3, "d", "z")]
    records = decoder.decode_items(items)
    assert [r["id"] for r in records] == ["a", "b", "c", "d"]
    assert [r["error"] for r in records] == [None, "cannot decode boom", "bad", None]
    assert records[0]["n_best"] == [{"text": "X", "logprob": -1.0, "score": -0.5}]
    assert records[3]["n_best"][0]["text"] == "Z"
