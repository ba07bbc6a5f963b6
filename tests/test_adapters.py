"""One model-adapter layer: every command and the server decode a Hugging Face folder (decoder-only GPT-2 and
encoder-decoder T5, tiny, seeded, built offline) exactly as ``beamkit.hf.generate`` does, and they all read
``--model`` by one grammar, refusing a bad one with the same error.

The oracle is ``beamkit.hf.generate`` on the model loaded from the saved folder, one prompt at a time (it is
tested identical to transformers' ``generate`` in tests/test_hf.py). Prompts of different lengths are decoded in
separate batches by the commands (no padding), and each batch runs the same float32 computation as ``generate``
on that prompt alone, so texts, token ids, log-probabilities and scores are compared for equality (the server,
where requests share model calls, within float32 rounding).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

from beamkit.cli import main

# one torch thread, as `beamkit decode`'s workers run (--threads 1): the same float reductions everywhere
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cli_error(capsys: Any, run: Any, argv: list[str]) -> tuple[int, str]:
    """``run(argv)`` (the ``beamkit`` main) expected to refuse its arguments: (exit code, the one error line).

    A refusal by an option's type exits through argparse (``SystemExit``); either way standard error is exactly
    one line, an error, nothing goes to standard output and no traceback is shown."""
    try:
        code = run(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if ": error:" in line]
    assert len(errors) == 1 and err.strip() == errors[0] and out == "", err
    return int(code), errors[0]


# ------------------------------------------------------------------------------------------------ the grammar
def test_load_grammar_errors(tmp_path):
    from beamkit.adapters import load, parse

    with pytest.raises(TypeError, match="--model must be a string"):
        load(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be empty"):
        load(" ")
    with pytest.raises(ValueError, match="needs a folder after 'hf:'"):
        load("hf:")
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model directory"):
        parse(f"hf:{tmp_path}")  # a folder, but no config.json
    with pytest.raises(FileNotFoundError, match="checkpoint not found: .*g2p-en nor hf:DIR"):
        load("no-such-model")
    with pytest.raises(FileNotFoundError, match="not a beamkit checkpoint folder"):
        load(str(tmp_path))
    with pytest.raises(ValueError, match="backend"):
        load(None, backend="gpu")


def test_load_grammar_kinds():
    from beamkit.adapters import CheckpointAdapter, load, parse
    from beamkit.models import SHIPPED_DIR

    assert parse(None).kind == "checkpoint" and parse(None).target == SHIPPED_DIR / "dates-seq2seq"
    assert parse("dates-transformer").target == SHIPPED_DIR / "dates-transformer"
    assert parse(str(SHIPPED_DIR / "dates-transformer")).kind == "checkpoint"
    assert parse("g2p-en") == ("g2p", "g2p-en")
    adapter = load(None, backend="numpy")
    assert isinstance(adapter, CheckpointAdapter) and adapter.name == "dates-seq2seq"


BAD_MODELS = [
    ("no/such/model", "checkpoint not found"),
    ("hf:", "needs a folder after 'hf:'"),
    ("hf:/no/such/folder", "not a Hugging Face model directory"),
]


@pytest.mark.parametrize(("spec", "message"), BAD_MODELS)
def test_every_command_refuses_a_bad_model_with_the_same_line(tmp_path, capsys, spec, message):
    src = tmp_path / "in.txt"
    src.write_text("1999.3.3\n")
    commands = {
        "translate": ["translate", "--quiet", "--model", spec, "1999.3.3"],
        "decode": ["decode", "--quiet", "--model", spec, "--input", str(src), "--output", str(tmp_path / "o.jsonl")],
        "explain": ["explain", "1999.3.3", "--model", spec],
        "serve": ["serve", "--port", "0", "--model", spec],
    }
    lines = {}
    for name, argv in commands.items():
        code, line = cli_error(capsys, main, argv)
        assert code == 2 and line.startswith(f"beamkit {name}: error: ") and message in line
        lines[name] = line.split(": error: ", 1)[1]
    assert len(set(lines.values())) == 1, lines  # the same words from every command


# ------------------------------------------------------------------------------------------------ tiny models
WORDS = [f"w{i}" for i in range(44)]


def _tokenizer(folder: Any, encoder_decoder: bool) -> None:
    """A word-level tokenizer saved with ``save_pretrained`` (offline); the encoder's input ends with ``[EOS]``."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, **{w: 4 + i for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if encoder_decoder:
        backend.post_processor = processors.TemplateProcessing(single="$A [EOS]", special_tokens=[("[EOS]", 2)])
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )
    tok.save_pretrained(folder)


def _sharpen_eos(model: Any, prompt: list[int]) -> int:
    """Make the token the model likes most after a few greedy steps the stop token (sharpened so that it fires in
    some contexts), as tests/test_serve_models.py does; returns it."""
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
        if model.config.is_encoder_decoder:
            probs = model(input_ids=ids, decoder_input_ids=out).logits.softmax(-1).mean(dim=(0, 1))
        else:
            probs = model(out).logits.softmax(-1).mean(dim=(0, 1))
        eos = int(probs[4:].argmax()) + 4
        model.get_output_embeddings().weight[eos] *= 2.0
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    return eos


@pytest.fixture(scope="module", params=["gpt2", "t5"])
def hf_folder(request, tmp_path_factory):
    """(kind, folder, the model loaded back from it, its tokenizer): a tiny seeded GPT-2 or T5."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    kind = request.param
    folder = tmp_path_factory.mktemp(f"tiny-{kind}")
    _tokenizer(folder, kind == "t5")
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=4 + len(WORDS), n_positions=64, bos_token_id=1,
            eos_token_id=2, pad_token_id=0, initializer_range=0.1,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(cfg).eval()
    else:
        cfg = transformers.T5Config(
            num_layers=1, num_decoder_layers=1, d_model=16, d_ff=32, d_kv=8, num_heads=2, vocab_size=4 + len(WORDS),
            pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, initializer_factor=3.0,
        )  # fmt: skip
        model = transformers.T5ForConditionalGeneration(cfg).eval()
    _sharpen_eos(model, [5, 9, 13, 17])
    model.save_pretrained(folder)
    auto = transformers.AutoModelForSeq2SeqLM if kind == "t5" else transformers.AutoModelForCausalLM
    loaded = auto.from_pretrained(folder).eval()
    return kind, folder, loaded, transformers.AutoTokenizer.from_pretrained(folder)


PROMPTS = ["w1 w2 w3", "w7 w7 w40 w2 w9", "w30", "w11 w12"]  # four lengths: four batches, each alone
BEAM, N_BEST, MAX_NEW = 3, 2, 6


def _generate(model: Any, tok: Any, prompt: str, beam: int = BEAM, n: int = N_BEST) -> list[dict[str, Any]]:
    """The oracle: ``beamkit.hf.generate`` on ``prompt`` alone, with the paged cache the adapter uses (with no
    cache named, ``generate`` keeps these tiny models' rows in the dense cache, whose float32 sums run in
    another order)."""
    import torch

    import beamkit.hf

    ids = torch.tensor([tok(prompt)["input_ids"]], device=model.device)
    with torch.inference_mode():
        out = beamkit.hf.generate(
            model, ids, num_beams=beam, num_return_sequences=n, max_new_tokens=MAX_NEW, length_penalty=1.0,
            return_dict_in_generate=True, cache_implementation="paged" if beam > 1 else None,
        )  # fmt: skip
    return [
        {
            "text": tok.decode(h.tokens[:-1] if h.finished else h.tokens, skip_special_tokens=True),
            "tokens": list(h.tokens),
            "logprob": float(h.logprob),
            "score": float(h.score),
            "finished": h.finished,
        }
        for h in out.hypotheses[0]
    ]


def test_the_adapter_equals_generate(hf_folder, device):
    from beamkit.adapters import decode_texts, load

    kind, folder, _, tok = hf_folder
    adapter = load(f"hf:{folder}")
    adapter.model.to(device)  # the adapter's prompts go where its model is
    assert adapter.encoder_decoder == (kind == "t5")
    outs = decode_texts(adapter, PROMPTS, beam=BEAM, n_best=N_BEST, max_len=MAX_NEW, length_penalty=1.0)
    finished = set()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        # the same weights in the same memory: a copy of them (another alignment) can round a float32 matrix
        # product differently on some CPUs, and the comparison is exact
        want = _generate(adapter.model, tok, prompt)
        assert [o._asdict() for o in out] == want
        finished |= {o.finished for o in out}
    assert finished == {True, False}  # eos fired in some hypotheses, others ran to the limit
    assert adapter._step.stats.model_calls > 0
    assert adapter._step.stats.rows_per_call == []  # a long-running server keeps no per-call list


def test_a_served_request_resolves_its_settings_once(hf_folder, monkeypatch):
    """A server asks the adapter for a request's options and for its refusal: the generation config is resolved
    once for both (oracle: a count of the resolver's calls), and the options are those of a fresh adapter
    that resolves them anew."""
    from beamkit.adapters import Ask, load
    from beamkit.hf.bridge import settings

    kind, folder, _, _ = hf_folder
    adapter, fresh = load(f"hf:{folder}"), load(f"hf:{folder}")
    calls = []
    real = settings.resolve
    monkeypatch.setattr(settings, "resolve", lambda *a, **k: calls.append(1) or real(*a, **k))
    ask = Ask(beam=3, n_best=2, max_len=5, prompt_len=4)
    options = adapter.request(ask)
    assert adapter.continuous_refusal(ask) is None
    assert len(calls) == 1
    assert adapter.request(ask) == options and len(calls) == 1
    monkeypatch.setattr(settings, "resolve", real)
    assert fresh.request(ask) == options


def test_the_adapters_prompts_go_to_its_models_device(hf_folder):
    """The prompts the adapter batches are on its model's device: a model on the ``meta`` device (no GPU needed)
    gets ``meta`` ids (they were made on the CPU, which a model on cuda refuses)."""
    from beamkit.adapters import load

    kind, folder, model, tok = hf_folder
    adapter = load(f"hf:{folder}")
    adapter.model.to("meta")
    state = adapter.init_state([[5, 9, 13], [6, 10, 14]])
    assert (state.ids.device.type, state.mask.device.type) == ("meta", "meta")


def test_translate_decode_and_explain_equal_generate(hf_folder, tmp_path, capsys):
    from beamkit.trace import Trace

    kind, folder, model, tok = hf_folder
    spec = f"hf:{folder}"
    want = {p: _generate(model, tok, p) for p in PROMPTS}
    argv = ["translate", "--json", "--quiet", "--model", spec, "--beam", str(BEAM), "--n-best", str(N_BEST)]
    assert main([*argv, "--max-len", str(MAX_NEW), *PROMPTS]) == 0
    payload = json.loads(capsys.readouterr().out)
    for item in payload:
        fields = ("text", "logprob", "score", "finished")
        assert item["hypotheses"] == [{k: h[k] for k in fields} for h in want[item["source"]]]

    src = tmp_path / "in.txt"
    src.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["decode", "--quiet", "--model", spec, "--input", str(src), "--output", str(out)]
    assert main([*argv, "--beam", str(BEAM), "--n-best", str(N_BEST), "--max-len", str(MAX_NEW)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for rec, prompt in zip(records, PROMPTS, strict=True):
        assert rec["error"] is None
        assert rec["n_best"] == [{k: h[k] for k in ("text", "logprob", "score")} for h in want[prompt]]

    path = tmp_path / "t.json"
    prompt = PROMPTS[1]
    argv = ["explain", prompt, "--model", spec, "--beam", str(BEAM), "--max-len", str(MAX_NEW), "--format", "json"]
    assert main([*argv, "-o", str(path)]) == 0
    trace = Trace.from_json(path.read_text())
    best = _generate(model, tok, prompt, beam=BEAM, n=1)[0]
    assert trace.tokens(trace.result[0]) == best["tokens"]
    assert trace.greedy == _generate(model, tok, prompt, beam=1, n=1)[0]["tokens"]
    assert trace.policy == "pool" and trace.source == prompt


def test_the_server_equals_generate(hf_folder):
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from beamkit.adapters import load
    from tests.test_serve import in_thread, post, serving

    kind, folder, model, tok = hf_folder
    adapter = load(f"hf:{folder}")
    body = {"model": adapter.name, "best_of": BEAM, "n": N_BEST, "max_tokens": MAX_NEW}
    with serving(adapter) as (url, _):
        runs = [in_thread(post, url, {**body, "prompt": p}) for p in PROMPTS]
        for t, _ in runs:
            t.join(120)
    for prompt, (_, box) in zip(PROMPTS, runs, strict=True):
        r = box["out"]
        assert r.status_code == 200, r.text
        want = _generate(model, tok, prompt)
        got = r.json()["choices"]
        assert [c["text"] for c in got] == [h["text"] for h in want]
        # requests join the running engine mid-flight, so their rows share model calls (and left-padded caches)
        # with other requests: each of the at most MAX_NEW log-softmax terms is then off by a few float32 ulps of
        # the row's logits, whose size is about the term's own; so allow 8 ulps per term of the total's size
        for c, h in zip(got, want, strict=True):
            ulp = float(np.finfo(np.float32).eps) * max(1.0, abs(h["logprob"]))
            assert c["logprob"] == pytest.approx(h["logprob"], abs=8 * MAX_NEW * ulp)
        assert [c["finish_reason"] for c in got] == ["stop" if h["finished"] else "length" for h in want]


def test_the_server_refuses_what_a_shared_engine_cannot_apply(hf_folder):
    from beamkit.adapters import Ask, load

    kind, folder, model, tok = hf_folder
    adapter = load(f"hf:{folder}")
    greedy_min = Ask(1, 1, 6, 1.0, min_len=2)
    if kind == "t5":  # an encoder-decoder engine applies these per request (tests/test_serve_hf_encdec.py) ...
        adapter.model.generation_config.no_repeat_ngram_size = 2
        try:
            assert adapter.continuous_refusal(greedy_min) is None
            adapter.model.generation_config.repetition_penalty = 1.5
            assert adapter.continuous_refusal(Ask(3, 2, 6, 1.0)) is None
            refusal = adapter.continuous_refusal(Ask(1, 1, 6, 1.0))
        finally:
            adapter.model.generation_config.no_repeat_ngram_size = None
            adapter.model.generation_config.repetition_penalty = 1.0
        assert refusal is not None and "repetition_penalty with a beam of one" in refusal  # ... but this
        return
    assert "'min_tokens' with a beam of one" in adapter.continuous_refusal(greedy_min)
    assert adapter.continuous_refusal(Ask(3, 2, 6, 1.0, min_len=2)) is None
    adapter.model.generation_config.no_repeat_ngram_size = 2
    try:
        refusal = adapter.continuous_refusal(Ask(3, 2, 6, 1.0))
    finally:
        adapter.model.generation_config.no_repeat_ngram_size = None
    assert refusal is not None and "generation_config.no_repeat_ngram_size" in refusal


# ------------------------------------------------------------------------------------------------ every kind
def test_every_kind_of_model_decodes_the_same_through_translate_and_the_driver(capsys):
    """A shipped name, a checkpoint folder and g2p-en through ``translate --json``, against each model's own
    offline decoder (``beamkit.adapters.translate`` / ``beamkit.adapters.g2p.decode_words``)."""
    pytest.importorskip("g2p_en")
    from beamkit.adapters import translate
    from beamkit.adapters.g2p import decode_words
    from beamkit.models import SHIPPED_DIR, load_model
    from beamkit.models.g2p import G2PModel, phonemes

    model = load_model("dates-transformer")
    want = translate(model, ["3rd of March 1999"], beam_size=3, num_return=2)[0]
    for spec in ("dates-transformer", str(SHIPPED_DIR / "dates-transformer")):
        assert (
            main(
                ["translate", "--json", "--quiet", "--model", spec, "--beam", "3", "--n-best", "2", "3rd of March 1999"]
            )
            == 0
        )
        got = json.loads(capsys.readouterr().out)[0]["hypotheses"]
        assert [(h["text"], h["logprob"], h["score"]) for h in got] == [(t.text, t.logprob, t.score) for t in want]
    (alone,) = decode_words(G2PModel.load(), ["search"], beam_size=3)
    assert main(["translate", "--json", "--quiet", "--model", "g2p-en", "--beam", "3", "--n-best", "2", "search"]) == 0
    got = json.loads(capsys.readouterr().out)[0]["hypotheses"]
    assert [h["text"] for h in got] == [" ".join(phonemes(h.tokens)) for h in alone[:2]]
    assert [h["logprob"] for h in got] == [float(h.logprob) for h in alone[:2]]
    code, line = cli_error(capsys, main, ["translate", "--model", "g2p-en", "--strict", "search"])
    assert code == 2 and "--strict applies to the dates models" in line
