"""``beamkit serve --model ov:DIR``: requests sent concurrently (they join the running engine at different steps)
each get what ``beamkit.hf.generate`` gives them alone on the float32 model the IR was exported from.

Log-probabilities within 1e-5 (``tests.test_serve.same``): OpenVINO's float32 logits of this 2-layer, 32-wide
model differ from torch's by a few float32 roundings (~1e-6 each), summed over at most 10 tokens.
"""

from __future__ import annotations

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
torch = pytest.importorskip("torch")
pytest.importorskip("openvino")

from beamkit.adapters import load as load_adapter  # noqa: E402
from tests.test_serve import same  # noqa: E402
from tests.test_serve_models import _hf_generate_alone, _hf_served, hf_dir  # noqa: E402, F401

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ov_concurrent_requests_match_generate_alone(hf_dir, tmp_path):  # noqa: F811
    import beamkit.openvino as bo

    folder = bo.export_decoder(hf_dir, tmp_path / "ir")  # the folder's tokenizer is copied beside the IR
    want, _ = _hf_generate_alone(hf_dir)
    adapter = load_adapter(f"ov:{folder}")
    assert adapter.owned_by == "openvino"
    got, reasons = _hf_served(adapter)
    for prompt in want:
        same(got[prompt], want[prompt])
    assert reasons == {"stop", "length"}  # eos fired in some hypotheses, others ran to max_tokens


def test_ov_adapter_knows_its_vocabulary_from_the_ir(hf_dir, tmp_path):  # noqa: F811
    import transformers

    import beamkit.openvino as bo
    from beamkit.serve.app import model_vocab

    folder = bo.export_decoder(hf_dir, tmp_path / "ir")
    adapter = load_adapter(f"ov:{folder}")
    want = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).get_output_embeddings().weight.shape[0]
    assert adapter.vocab_size == want
    ran = []
    adapter.step_fn = lambda *a: ran.append(a)  # the server must not need a model step to learn the width
    assert model_vocab(adapter) == want and not ran


def _listening(proc):
    """The base url ``beamkit serve --port 0`` prints it listens on (its first line on stderr)."""
    from tests.test_serve import in_thread

    reader, box = in_thread(proc.stderr.readline)
    reader.join(120)
    line = box.get("out", "")
    assert "listening on http://127.0.0.1:" in line, line
    return "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()


def test_ov_command_serves_dictionary_and_streamed_requests_as_generate_alone(hf_dir, tmp_path):  # noqa: F811
    """``beamkit serve --model ov:DIR --trie items=FILE`` (the command, in a subprocess on a free loopback port):
    a dictionary request, a streamed beam request and a plain one sent at once each get what
    ``beamkit.hf.generate`` gives them alone on the float32 model the IR came from (the dictionary through its
    ``prefix_allowed_tokens_fn``); the dictionary answers hold only its entries; the stream ends with the plain
    answer."""
    import httpx
    import numpy as np
    import transformers

    import beamkit.hf as bh
    import beamkit.openvino as bo
    from beamkit import Trie
    from tests.test_serve import in_thread, post, serve_command, sse_events, texts

    folder = bo.export_decoder(hf_dir, tmp_path / "ir")
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    eos = int(model.generation_config.eos_token_id)
    rng = np.random.default_rng(0)
    codes = [c for c in range(4, 48) if c != eos]
    items = {tuple(int(x) for x in rng.choice(codes, 3)) + (eos,) for _ in range(120)}
    path = tmp_path / "items.txt"
    path.write_text("".join(" ".join(map(str, it)) + "\n" for it in sorted(items)))
    trie = Trie(path)

    def alone(prompt, beams, n, tokens, **more):
        ids = torch.tensor([tok(prompt)["input_ids"]])
        if "trie" in more:
            more = {"prefix_allowed_tokens_fn": more.pop("trie").prefix_allowed_tokens_fn(prompt_len=ids.shape[1])}
        out = bh.generate(
            model, ids, num_beams=beams, num_return_sequences=n, max_new_tokens=tokens, length_penalty=1.0,
            return_dict_in_generate=True, **more,
        )  # fmt: skip
        return [(tok.decode(h.tokens[:-1] if h.finished else h.tokens), h.logprob) for h in out.hypotheses[0]]

    asks = {
        "trie": ({"prompt": "w1 w2 w3", "best_of": 30, "n": 30, "max_tokens": 6, "trie": "items"}, {"trie": trie}),
        "plain": ({"prompt": "w7 w8", "best_of": 3, "n": 1, "max_tokens": 6}, {}),
        "stream": ({"prompt": "w7 w7 w40 w2 w9", "best_of": 4, "n": 2, "max_tokens": 8}, {}),
    }
    want = {k: alone(b["prompt"], b["best_of"], b["n"], b["max_tokens"], **m) for k, (b, m) in asks.items()}
    with serve_command("--model", f"ov:{folder}", "--trie", f"items={path}", "--port", "0") as proc:
        url = _listening(proc)
        name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]

        def stream(body):
            with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
                return sse_events(r.iter_lines())

        runs = {
            k: in_thread(stream, {**b, "model": name}) if k == "stream" else in_thread(post, url, {**b, "model": name})
            for k, (b, _) in asks.items()
        }
        for t, _ in runs.values():
            t.join(180)
    got = {k: box.get("out", box.get("error")) for k, (_, box) in runs.items()}
    for k in ("trie", "plain"):
        assert got[k].status_code == 200, got[k].text
        same(texts(got[k]), want[k])
    assert len(want["trie"]) == 30
    assert {t for t, _ in texts(got["trie"])} <= {tok.decode(list(it[:-1])) for it in items}
    events = got["stream"]
    assert events[-1] == "[DONE]" and len(events) > 2  # progress events, the final answer, the end
    same([(c["text"], c["logprob"]) for c in events[-2]["choices"]], want["stream"])


def test_ov_shared_prompt_ir_serves_concurrent_requests_as_generate_alone(hf_dir, tmp_path):  # noqa: F811
    """The adapter on the folder's shared-prompt IR (each request's prompt held once): requests sent at once (they
    join the running engine at different steps) get what ``beamkit.hf.generate`` gives each alone."""
    import beamkit.openvino as bo
    from beamkit.adapters.openvino import OVAdapter

    folder = bo.export_decoder(hf_dir, tmp_path / "ir", shared_prompt=True)
    want, _ = _hf_generate_alone(hf_dir)
    adapter = OVAdapter(folder, shared_prompt=True)
    assert isinstance(adapter._step, bo.OVSharedPromptStep)
    got, reasons = _hf_served(adapter)
    for prompt in want:
        same(got[prompt], want[prompt])
    assert reasons == {"stop", "length"}
