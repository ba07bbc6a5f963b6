"""``beamkit serve`` on real models: the shipped dates models against ``beamkit translate``, and a tiny GPT-2
(built offline with the ``tokenizers`` library and ``save_pretrained``) against ``beamkit.hf.generate``.

Requests are sent concurrently, so they join the running engine at different steps; each must still get what
the offline decoder gives it alone.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
torch = pytest.importorskip("torch")

from beamkit.adapters import load as load_adapter  # noqa: E402
from beamkit.cli import main  # noqa: E402
from tests.test_serve import in_thread, post, same, serving, sse_events, texts  # noqa: E402
from tests.word_tokenizer import VOCAB, save_word_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATES = [
    ("3rd of March 1999", 5, 3, 1.0),
    ("03/04/99", 4, 4, 0.0),
    ("Tuesday, May 7th, 2024", 1, 1, 1.0),
    ("12-Jan-87", 3, 2, 0.6),
    ("2001.9.11", 5, 1, 1.0),
    ("July 4, '76", 2, 2, 1.0),
]


def translate_cli(capsys, model: str, text: str, beam: int, n: int, alpha: float) -> list[tuple[str, float, bool]]:
    """``beamkit translate --json`` for one text: (text, logprob, finished) of its n-best."""
    argv = ["translate", "--json", "--model", model, "--beam", str(beam), "--n-best", str(n)]
    assert main([*argv, "--length-penalty", str(alpha), text]) == 0
    hyps = json.loads(capsys.readouterr().out)[0]["hypotheses"][:n]
    return [(h["text"], h["logprob"], h["finished"]) for h in hyps]


@pytest.mark.parametrize("model", ["dates-seq2seq", "dates-transformer"])
def test_dates_concurrent_requests_match_translate(capsys, model):
    want = {text: translate_cli(capsys, model, text, b, n, a) for text, b, n, a in DATES}
    with serving(load_adapter(model)) as (url, _):
        runs = [
            in_thread(post, url, {"model": model, "prompt": text, "best_of": b, "n": n, "length_penalty": a})
            for text, b, n, a in DATES
        ]
        for t, _ in runs:
            t.join(120)
    for (text, *_), (_, box) in zip(DATES, runs, strict=True):
        r = box["out"]
        assert r.status_code == 200, r.text
        same(texts(r), [(t, lp) for t, lp, _ in want[text]])
        assert [c["finish_reason"] for c in r.json()["choices"]] == ["stop" if f else "length" for *_, f in want[text]]


def test_dates_stream_ends_with_the_translate_n_best(capsys):
    want = translate_cli(capsys, "dates-seq2seq", "12-Jan-87", 5, 3, 1.0)
    body = {"model": "dates-seq2seq", "prompt": "12-Jan-87", "best_of": 5, "n": 3, "stream": True}
    import httpx

    with serving(load_adapter("dates-seq2seq")) as (url, _):
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            events = sse_events(r.iter_lines())
    final = events[-2]
    same([(c["text"], c["logprob"]) for c in final["choices"]], [(t, lp) for t, lp, _ in want])
    progress = [e["choices"][0]["text"] for e in events[:-2]]
    assert progress and all(len(p) <= 10 for p in progress)  # ISO dates: never longer than YYYY-MM-DD


# ------------------------------------------------------------------------------------------------ hf:DIR


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random GPT-2 and a word-level tokenizer saved with ``save_pretrained`` (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    save_word_tokenizer(folder)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=len(VOCAB), n_positions=64, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    # eos: the token the model likes most after a few greedy steps, sharpened so that it fires in some contexts
    ids = torch.tensor([[5, 9, 13, 17]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
        probs = model(out).logits.softmax(-1).mean(dim=(0, 1))
        eos = int(probs[4:].argmax()) + 4
        model.get_output_embeddings().weight[eos] *= 2.0
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    model.save_pretrained(folder)
    return folder


HF_CASES = [
    ("w1 w2 w3", 3, 2, 1.0, False, 0),
    ("w7 w7 w40 w2 w9", 4, 4, 0.5, True, 0),
    ("w30", 1, 1, 1.0, False, 0),
    ("w11 w12", 5, 3, 2.0, "never", 3),
]


def _hf_generate_alone(hf_dir, **more):
    """The oracle: each of :data:`HF_CASES` decoded alone by ``beamkit.hf.generate`` on the eager model: per
    prompt its n-best (text, logprob), and the largest |logit| along any returned hypothesis's path."""
    import transformers

    import beamkit.hf as bh

    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    want, top = {}, 0.0
    for prompt, beam, n, alpha, early, min_new in HF_CASES:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        out = bh.generate(
            model, ids, num_beams=beam, num_return_sequences=n, max_new_tokens=10, length_penalty=alpha,
            early_stopping=early, min_new_tokens=min_new, return_dict_in_generate=True,
        )  # fmt: skip
        hyps = out.hypotheses[0]  # a finished hypothesis ends with eos, which is not text
        want[prompt] = [(tok.decode(h.tokens[:-1] if h.finished else h.tokens), h.logprob) for h in hyps]
        with torch.no_grad():
            paths = [model(torch.cat([ids[0], torch.tensor(h.tokens)])[None]).logits for h in hyps]
        top = max([top, *(float(logits.abs().max()) for logits in paths)])
    return want, top


def _hf_served(adapter):
    """:data:`HF_CASES` sent to ``adapter`` served, concurrently (they join the running engine at different
    steps): per prompt the choices' (text, logprob), and every finish reason seen."""
    with serving(adapter) as (url, _):
        runs = [
            in_thread(
                post,
                url,
                {
                    "model": adapter.name,
                    "prompt": prompt,
                    "best_of": beam,
                    "n": n,
                    "max_tokens": 10,
                    "length_penalty": alpha,
                    "early_stopping": early,
                    "min_tokens": min_new,
                },  # fmt: skip
            )
            for prompt, beam, n, alpha, early, min_new in HF_CASES
        ]
        for t, _ in runs:
            t.join(120)
    got, reasons = {}, set()
    for (prompt, *_), (_, box) in zip(HF_CASES, runs, strict=True):
        r = box["out"]
        assert r.status_code == 200, r.text
        got[prompt] = texts(r)
        reasons |= {c["finish_reason"] for c in r.json()["choices"]}
    return got, reasons


def test_hf_concurrent_requests_match_generate(hf_dir):
    want, _ = _hf_generate_alone(hf_dir)
    got, reasons = _hf_served(load_adapter(f"hf:{hf_dir}"))
    for prompt in want:
        same(got[prompt], want[prompt])
    assert reasons == {"stop", "length"}  # eos fired in some hypotheses, others ran to max_tokens


def test_hf_compiled_steps_serve_what_generate_gives(hf_dir):
    """``beamkit serve --compile`` (the adapter's ``compile=``; torch.compile's ``eager`` backend here: its graph
    capture, guards and static shapes without inductor's C++ build): requests joining mid-flight get the texts
    the eager model gives each alone, and log-probabilities within float32 rounding of them; the steps ran
    compiled.

    Tolerance: the compiled step attends over every column of its buffers (unfilled ones weigh exact zeros) and
    may reorder sums, so a step's logits move by at most (E + F + C) * layers * 2^-24 * (1 + max|logit|)
    (E 32 wide, F 128 feed-forward, C at most 64 columns: the smallest buffer holds every position these
    requests reach; 2 layers); a token's log-softmax moves by at most twice that, a hypothesis's logprob (at most
    10 tokens) by 20 times that."""
    from beamkit.hf.steps import compiled as hc

    want, top = _hf_generate_alone(hf_dir)
    adapter = load_adapter(f"hf:{hf_dir}", compile="eager")
    assert adapter._step.compiled is not None and adapter._step.kv == "dense"
    got, reasons = _hf_served(adapter)
    bound = 20 * (32 + 128 + 64) * 2 * 2.0**-24 * (1.0 + top)
    for prompt in want:
        assert [t for t, _ in got[prompt]] == [t for t, _ in want[prompt]]
        assert [lp for _, lp in got[prompt]] == pytest.approx([lp for _, lp in want[prompt]], abs=bound)
    assert reasons == {"stop", "length"}
    assert sum(hc.compilations(adapter.model).values()) >= 1  # its steps ran through torch.compile


def test_compile_is_refused_for_models_it_does_not_run(capsys, hf_dir):
    """``--compile`` runs ``hf:DIR`` models only: a beamkit checkpoint or g2p-en is a usage error naming it (one
    line, exit 2), not a server that silently runs eagerly; a bad ``compile=`` value is a TypeError."""
    for model in ("dates-seq2seq", "g2p-en"):
        assert main(["serve", "--port", "0", "--compile", "--model", model]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("beamkit serve: error: --compile runs Hugging Face models")
        assert repr(model) in err[0]
    with pytest.raises(ValueError, match="--compile runs Hugging Face models"):
        load_adapter("dates-transformer", compile=True)
    with pytest.raises(TypeError, match="compile must be True, False or a torch.compile backend name"):
        load_adapter(f"hf:{hf_dir}", compile=3)


@pytest.fixture(scope="module")
def pickled_dir(hf_dir, tmp_path_factory):
    """The tiny GPT-2 again, its weights saved as a pickled ``pytorch_model.bin`` (no safetensors; written with
    ``torch.save``, as older ``save_pretrained(safe_serialization=False)`` did)."""
    import shutil

    import transformers

    folder = tmp_path_factory.mktemp("tiny-gpt2-pickled")
    for f in hf_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), use_safetensors=True)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    assert (folder / "pytorch_model.bin").is_file() and not list(folder.glob("*.safetensors"))
    return folder


def test_hf_pickled_weights_are_refused_unless_allowed(capsys, pickled_dir):
    with pytest.raises(ValueError, match="pytorch_model.bin.*--allow-pickle"):
        load_adapter(f"hf:{pickled_dir}")
    assert main(["serve", "--port", "0", "--model", f"hf:{pickled_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("beamkit serve: error:") and "--allow-pickle" in err[0]
    adapter = load_adapter(f"hf:{pickled_dir}", allow_pickle=True)
    assert adapter.encode("w1 w2") == [5, 6]


def test_hf_loading_never_trusts_remote_code_and_prefers_safetensors(hf_dir, monkeypatch):
    import transformers

    seen: list[tuple[str, dict]] = []
    for cls in (transformers.AutoTokenizer, transformers.AutoConfig, transformers.AutoModelForCausalLM):
        real = cls.from_pretrained

        def spy(*args, _real=real, _name=cls.__name__, **kwargs):
            seen.append((_name, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    load_adapter(f"hf:{hf_dir}")
    assert {name for name, _ in seen} == {"AutoTokenizer", "AutoConfig", "AutoModelForCausalLM"}
    assert all(kwargs.get("trust_remote_code") is False for _, kwargs in seen)
    assert [kw.get("use_safetensors") for name, kw in seen if name == "AutoModelForCausalLM"] == [True]


@pytest.mark.parametrize(
    ("flags", "want"), [([], False), (["--compile"], "inductor"), (["--compile", "eager"], "eager")]
)
def test_the_compile_flag_reaches_the_model_loader(monkeypatch, capsys, flags, want):
    """``beamkit serve --compile [BACKEND]``: the loader is asked for inductor by the bare flag, for the named
    backend otherwise, for no compilation without it (a loader that refuses stops the command: exit 2)."""
    import beamkit.adapters

    seen = []

    def loader(spec, **kwargs):
        seen.append((spec, kwargs))
        raise ValueError("refused by the test's loader")

    monkeypatch.setattr(beamkit.adapters, "load", loader)
    assert main(["serve", "--port", "0", "--model", "hf:some-folder", *flags]) == 2
    assert "refused by the test's loader" in capsys.readouterr().err
    assert seen == [("hf:some-folder", {"allow_pickle": False, "compile": want})]
