"""``beamkit serve hf:DIR`` on encoder-decoder folders (tiny T5, BART and Marian built offline from configs with
fixed seeds, saved with a word-level tokenizer), with requests of different input lengths joining a running
engine mid-flight.

The oracle is Hugging Face's own ``model.generate`` on each request alone: its tokens (up to the first stop
token), its ``sequences_scores`` for beam search, and for greedy search the sum of the log-softmax of its
processed scores. BART's and Marian's generation configs force the stop token at the last step (as their
checkpoints do), which the shared engine applies per request. Servers run on a free 127.0.0.1 port: uvicorn in
a thread with a step function that records the joins and sleeps a little each call (so that requests do join
mid-flight), or a ``beamkit serve`` subprocess ended by its own PID.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import httpx  # noqa: E402

from beamkit.adapters import load  # noqa: E402
from tests.test_adapters import WORDS, _sharpen_eos, _tokenizer  # noqa: E402
from tests.test_serve import _up, in_thread, post, serve_command, serving, sse_events, wait_until  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LONG = " ".join(f"w{i}" for i in range(1, 13))
# (prompt, best_of, n, max_tokens, min_tokens, length_penalty, early_stopping): five input lengths; the first
# runs long (min_tokens) so that the others join it mid-flight
CASES = [
    (LONG, 4, 2, 24, 20, 1.0, False),
    ("w30", 3, 3, 8, 0, 1.0, False),
    ("w11 w12", 1, 1, 10, 3, 1.0, False),  # greedy with a minimum length: renormalised as generate does
    ("w7 w7 w40 w2 w9", 5, 2, 6, 0, 0.5, True),
    ("w3 w4 w5 w6", 2, 2, 12, 2, 2.0, "never"),
]


def _build(kind: str, folder: Path) -> None:
    """A tiny seeded T5, BART or Marian and its tokenizer saved in ``folder``; BART and Marian force their stop
    token at the last step."""
    _tokenizer(folder, True)
    torch.manual_seed(0)
    vocab = 4 + len(WORDS)
    if kind == "t5":
        cfg = transformers.T5Config(
            num_layers=1, num_decoder_layers=1, d_model=16, d_ff=32, d_kv=8, num_heads=2, vocab_size=vocab,
            pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, initializer_factor=3.0,
        )  # fmt: skip
        model = transformers.T5ForConditionalGeneration(cfg).eval()
    elif kind == "bart":
        cfg = transformers.BartConfig(
            vocab_size=vocab, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, init_std=0.3,
        )  # fmt: skip
        model = transformers.BartForConditionalGeneration(cfg).eval()
    else:  # Marian: sinusoidal positions, a final logits bias
        cfg = transformers.MarianConfig(
            vocab_size=vocab, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
            pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, init_std=0.3,
        )  # fmt: skip
        model = transformers.MarianMTModel(cfg).eval()
    eos = _sharpen_eos(model, [5, 9, 13, 17, 2])
    if kind != "t5":  # BART and Marian checkpoints force their stop token at the last step
        model.generation_config.forced_eos_token_id = eos
        model.config.forced_eos_token_id = eos
    model.save_pretrained(folder)


@pytest.fixture(scope="module", params=["t5", "bart"])
def encdec(request, tmp_path_factory):
    """(kind, folder, the model loaded back from it, its tokenizer)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    _build(request.param, folder)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    return request.param, folder, model, transformers.AutoTokenizer.from_pretrained(folder)


def _oracle(model: Any, tok: Any, case: tuple[Any, ...]) -> list[dict[str, Any]]:
    """``model.generate`` on the request alone: per returned sequence, its token texts (through the first stop
    token), text, finish reason and score (``sequences_scores``; greedy: its summed log-probabilities)."""
    prompt, beam, n, max_new, min_new, alpha, early = case
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids, num_beams=beam, num_return_sequences=n, max_new_tokens=max_new, min_new_tokens=min_new,
            length_penalty=alpha, early_stopping=early, do_sample=False, return_dict_in_generate=True,
            output_scores=True,
        )  # fmt: skip
        # the size of the logits the scores are computed from (along the returned sequences)
        scale = float(
            model(input_ids=ids.expand(len(out.sequences), -1), decoder_input_ids=out.sequences).logits.abs().max()
        )
    eos = model.generation_config.eos_token_id
    want = []
    for r, seq in enumerate(out.sequences.tolist()):
        tokens = seq[1:]  # after the decoder start token
        finished = eos in tokens
        if finished:
            tokens = tokens[: tokens.index(eos) + 1]
        if beam > 1:
            score = float(out.sequences_scores[r])
        else:  # greedy: the log-softmax of the processed scores of each chosen token
            score = sum(float(s[r].log_softmax(-1)[t]) for s, t in zip(out.scores, tokens, strict=False))
        body = tokens[:-1] if finished else tokens
        want.append(
            {
                "pieces": [tok.decode([t]) for t in tokens],
                "text": tok.decode(body, skip_special_tokens=True),
                "finish_reason": "stop" if finished else "length",
                "score": score,
                "terms": len(tokens),
                "scale": max(1.0, scale, abs(score)),
            }
        )
    return want


def _body(name: str, case: tuple[Any, ...], **extra: Any) -> dict[str, Any]:
    prompt, beam, n, max_new, min_new, alpha, early = case
    return {
        "model": name, "prompt": prompt, "best_of": beam, "n": n, "max_tokens": max_new, "min_tokens": min_new,
        "length_penalty": alpha, "early_stopping": early, "logprobs": 1, **extra,
    }  # fmt: skip


def _check(choices: list[dict[str, Any]], want: list[dict[str, Any]], beam: int, ulps: int = 8) -> None:
    """The server's choices against the oracle: the same tokens, text and finish reason, and the same score.

    Requests share model calls with others (and their encoder inputs are right-padded next to longer ones), so
    the logits are summed in another order and each of the ``terms`` log-softmax terms may be off by a few float32
    ulps of the logits' size (``scale``, measured along the oracle's sequences): allow ``ulps`` (8) per term.
    """
    assert [c["logprobs"]["tokens"] for c in choices] == [w["pieces"] for w in want]
    assert [c["text"] for c in choices] == [w["text"] for w in want]
    assert [c["finish_reason"] for c in choices] == [w["finish_reason"] for w in want]
    for c, w in zip(choices, want, strict=True):
        ulp = float(np.finfo(np.float32).eps) * w["scale"]
        got = c["score"] if beam > 1 else c["logprob"]
        assert got == pytest.approx(w["score"], abs=ulps * w["terms"] * ulp)
        assert c["logprob"] == pytest.approx(sum(c["logprobs"]["token_logprobs"]), abs=1e-9)


class Recorder:
    """The adapter's step function, slowed a little per call, recording how many running parts (cohorts) each
    call had and whether new requests joined running ones."""

    def __init__(self, step: Any, delay: float = 0.01):
        self.step, self.delay = step, delay
        self.joins = 0  # calls where requests that had not run yet joined rows that had
        self.most_cohorts = 0

    def __call__(self, state: Any, y_prev: Any) -> Any:
        from beamkit.hf.steps.join import Cohorts, Prompt

        if isinstance(state, Cohorts):
            running = [p for p in state.parts if not isinstance(p, Prompt)]
            self.joins += bool(running) and len(running) < len(state.parts)
            self.most_cohorts = max(self.most_cohorts, len(running))
        time.sleep(self.delay)
        return self.step(state, y_prev)


# The compiled steps (``compile=``) attend over every column of their buffers (the unfilled ones weigh exact zeros)
# and may reorder sums: a step's logits move by at most (E + F + C) * layers * 2^-24 of their size (these models:
# E 16 wide, F 32 feed-forward, C at most 64 self-attention + 16 source columns, one decoder layer), a
# log-softmax term by twice that, which is (E + F + C) * layers float32 ulps (2^-23) of their size.
COMPILED_ULPS = 8 + (16 + 32 + 64 + 16) * 1


def _served(folder: Path, compile: bool | str = False) -> tuple[Any, Recorder]:
    adapter = load(f"hf:{folder}", compile=compile)
    recorder = Recorder(adapter.step_fn)
    adapter.step_fn = recorder  # type: ignore[method-assign]
    return adapter, recorder


@pytest.mark.parametrize(
    "encdec, compile",
    [("t5", False), ("bart", False), ("marian", False), ("t5", "eager"), ("marian", "eager")],
    indirect=["encdec"],
)
def test_requests_joining_mid_flight_equal_generate_alone(encdec, compile):
    """Requests joining a running engine one by one get what ``model.generate`` gives each alone; so they do with
    the steps compiled (``beamkit serve --compile``; torch.compile's ``eager`` backend: graph capture, guards and
    static shapes without inductor's C++ build), within :data:`COMPILED_ULPS`, and the steps ran compiled."""
    from beamkit.hf.steps import compiled as hc

    kind, folder, model, tok = encdec
    adapter, recorder = _served(folder, compile)
    with serving(adapter) as (url, _):
        # compiled: a first pass compiles the row buckets (the requests that arrive while one compiles would
        # all join at once), the second is checked
        for _ in range(2 if compile else 1):
            recorder.joins = recorder.most_cohorts = 0
            runs = []
            for i, case in enumerate(CASES):
                runs.append(in_thread(post, url, _body(adapter.name, case)))
                if i == 0:  # the long request is running before the others arrive, one by one
                    calls = adapter._step.stats.model_calls + 1
                    wait_until(lambda c=calls: recorder.joins or adapter._step.stats.model_calls > c)
                time.sleep(0.03)
            for t, _ in runs:
                t.join(120)
    assert recorder.joins >= 2 and recorder.most_cohorts >= 2  # requests did join running ones, as cohorts
    reasons = set()
    for case, (_, box) in zip(CASES, runs, strict=True):
        r = box["out"]
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        _check(choices, _oracle(model, tok, case), case[1], COMPILED_ULPS if compile else 8)
        reasons |= {c["finish_reason"] for c in choices}
    assert "stop" in reasons
    assert bool(hc.compilations(adapter.model)) == bool(compile)


def test_a_stream_joining_mid_flight_ends_with_the_generate_n_best(encdec):
    kind, folder, model, tok = encdec
    adapter, recorder = _served(folder)
    case = ("w7 w7 w40 w2 w9", 4, 2, 10, 0, 1.0, False)
    with serving(adapter) as (url, _):
        long_run = in_thread(post, url, _body(adapter.name, CASES[0]))
        wait_until(lambda: adapter._step.stats.model_calls > 1)
        body = _body(adapter.name, case, stream=True)
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            events = sse_events(r.iter_lines())
        long_run[0].join(120)
    assert recorder.joins >= 1
    assert events[-1] == "[DONE]" and events[-2]["beamkit"] == {"final": True}
    progress = events[:-2]
    assert progress and all(e["beamkit"]["replace"] for e in progress)
    _check(events[-2]["choices"], _oracle(model, tok, case), case[1])
    assert long_run[1]["out"].status_code == 200
    _check(long_run[1]["out"].json()["choices"], _oracle(model, tok, CASES[0]), CASES[0][1])


BAD = [
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"prompt": " ".join(["w1"] * 80)}, None),  # longer than BART's 64 positions (T5: fine, so skipped there)
    ({"bogus": 1}, "bogus"),
]


def test_bad_requests_get_4xx_and_the_server_stays_up(encdec):
    kind, folder, model, tok = encdec
    adapter, _ = _served(folder)
    good = CASES[1]
    with serving(adapter) as (url, _):
        running = in_thread(post, url, _body(adapter.name, CASES[0]))
        for change, param in BAD:
            if kind == "t5" and param is None:
                continue
            r = post(url, {**_body(adapter.name, good), **change})
            assert 400 <= r.status_code < 500, r.text
            assert r.json()["error"]["type"] == "invalid_request_error"
            if param is not None:
                assert param in r.json()["error"]["message"]
        assert post(url, b"{not json").status_code == 400
        r = post(url, _body(adapter.name, good))
        running[0].join(120)
    assert r.status_code == 200
    _check(r.json()["choices"], _oracle(model, tok, good), good[1])
    _check(running[1]["out"].json()["choices"], _oracle(model, tok, CASES[0]), CASES[0][1])


def _listening_line(stream: Any) -> str:
    """The server's "listening on URL" line (loading messages may come first); empty if it ends before it."""
    for _ in range(1000):
        line = stream.readline()
        if not line or "listening on" in line:
            return line
    return ""


def test_the_serve_command_serves_an_encoder_decoder_folder(encdec):
    """``beamkit serve --model hf:DIR`` as a subprocess on a free loopback port (ended by its own PID)."""
    kind, folder, model, tok = encdec
    if kind != "bart":
        pytest.skip("one subprocess server is enough (BART: the forced stop token)")
    with serve_command("--model", f"hf:{folder}", "--port", "0", "--threads", "1", HF_HUB_OFFLINE="1") as proc:
        reader, box = in_thread(_listening_line, proc.stderr)
        reader.join(120)
        line = box.get("out", "")
        assert "listening on http://127.0.0.1:" in line, line
        url = line.strip().rsplit(" ", 1)[1]
        assert _up(url)
        name = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        runs = [in_thread(post, url, _body(name, case)) for case in CASES]
        bad = post(url, json.dumps({**_body(name, CASES[1]), "n": 9}).encode())
        for t, _ in runs:
            t.join(120)
        assert bad.status_code == 400
        for case, (_, got) in zip(CASES, runs, strict=True):
            assert got["out"].status_code == 200, got["out"].text
            _check(got["out"].json()["choices"], _oracle(model, tok, case), case[1])
        assert _up(url)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
