"""``beamkit explain``: the traced search of a dates model or a Hugging Face folder, drawn or dumped.

Oracles: ``beamkit translate`` (the untraced search) for the n-best and the greedy output; transformers' own
``model.generate`` for the Hugging Face greedy path; the trace's own JSON for the drawings' node counts.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from beamkit.cli import main
from beamkit.trace import Trace

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "3rd of March 1999"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def dates_json(tmp_path_factory) -> Trace:
    path = tmp_path_factory.mktemp("explain") / "t.json"
    assert main(["explain", TEXT, "--beam", "3", "--format", "json", "-o", str(path)]) == 0
    return Trace.from_json(path.read_text())


def test_dates_trace_matches_translate(dates_json, capsys):
    trace = dates_json
    code, out, _ = _run(capsys, "translate", TEXT, "--beam", "3", "--json")
    assert code == 0
    want = [h["text"] for h in json.loads(out)[0]["hypotheses"]]
    texts = ["".join(trace.text(t) for t in trace.tokens(i) if t not in trace.eos) for i in trace.result]
    assert texts == want
    code, out, _ = _run(capsys, "translate", TEXT, "--beam", "1", "--json")
    greedy = json.loads(out)[0]["hypotheses"][0]["text"]
    assert "".join(trace.text(t) for t in trace.greedy if t not in trace.eos) == greedy
    assert trace.source == TEXT and trace.beam_size == 3 and trace.vocab is not None


@pytest.mark.parametrize("fmt", ["html", "svg", "dot"])
def test_dates_drawings(dates_json, fmt, tmp_path, capsys):
    path = tmp_path / f"t.{fmt}"
    code, out, _ = _run(capsys, "explain", TEXT, "--beam", "3", "--format", fmt, "-o", str(path))
    assert code == 0 and "wrote" in out
    text = path.read_text()
    n = len(dates_json.nodes)
    if fmt == "svg":
        root = ET.fromstring(text)
        groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if "node" in g.get("class", "").split()]
        assert len(groups) == n
    elif fmt == "dot":
        assert text.startswith("digraph") and text.count("->") == n - 1
    else:
        assert text.count('<g class="node ') == n and "<script>" in text and "src=" not in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["explain", " "], "empty input"),
        (["explain", TEXT, "--beam", "0"], "--beam"),
        (["explain", TEXT, "--model", "no-such-model"], "checkpoint not found"),
        (["explain", TEXT, "--model", "hf:/no/such/folder"], "not a Hugging Face model directory"),
    ],
)
def test_bad_input_is_one_error_line(argv, message, capsys):
    from tests.test_adapters import cli_error

    code, line = cli_error(capsys, main, argv)
    assert code == 2 and line.startswith("beamkit explain: error:") and message in line


def _tiny_hf(folder) -> None:
    """A tiny random GPT-2 and a word-level tokenizer, saved the Hugging Face way (offline)."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<pad>", "<s>", "</s>", "<unk>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tok.save_pretrained(folder)
    torch.manual_seed(3)
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=len(words), n_positions=32, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, initializer_range=0.5,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(folder)


@pytest.mark.slow
def test_hugging_face_folder(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    _tiny_hf(tmp_path / "hf")
    capsys.readouterr()  # what saving the folder printed
    out = tmp_path / "t.json"
    code, _, err = _run(
        capsys, "explain", "the cat sat", "--model", f"hf:{tmp_path / 'hf'}", "--beam", "3", "--max-len", "6",
        "--format", "json", "-o", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert "Loading weights" not in err and "%|" not in err  # transformers' own bar is kept off standard error
    trace = Trace.from_json(out.read_text())
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = tok(["the cat sat"], return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        greedy = model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=6, pad_token_id=0)
    want = greedy[0, ids.shape[1] :].tolist()
    if 2 in want:
        want = want[: want.index(2) + 1]
    assert trace.greedy == want
    with torch.inference_mode():
        beams = model.generate(
            ids, do_sample=False, num_beams=3, max_new_tokens=6, pad_token_id=0, num_return_sequences=1
        )
    best = beams[0, ids.shape[1] :].tolist()
    assert trace.tokens(trace.result[0]) == best[: len(trace.tokens(trace.result[0]))]
    assert trace.policy == "pool" and trace.vocab is not None and trace.vocab[5] == "cat"
