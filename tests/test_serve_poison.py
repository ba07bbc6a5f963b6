"""One poisoned request among healthy ones: the healthy ones get exactly their answer alone, the poisoned one fails
alone, saying why. The poison is a dictionary holding a token id past the model's vocabulary (what a dictionary
built for another tokenizer holds), on the dates model and on a tiny GPT-2 folder (``save_pretrained`` in a
temporary folder, fixed seed).

* The engine (the Python API): one :class:`beamkit.Engine` with a :class:`beamkit.constraints.TrieTable`, every
  request added before the first step, so that the poisoned one shares every model call with the others.
* The server: ``beamkit serve --trie`` refuses such a dictionary at start (one line naming the option and the
  file); an app whose model's vocabulary could not be read at start finds out at the first step and fails only
  the requests naming that dictionary (500 naming it), then refuses further ones at once (400, ``param`` trie),
  while healthy requests sent at the same time (joining the running engine) answer as alone.

Oracle: each healthy request decoded alone, by the same engine code with no other request (the Python API), or
sent alone to the same server afterwards. Float tolerance: a request's rows share a float32 matrix product with
other rows when decoded together; each logit may round differently by a few float32 ulps (2**-23 relative), and
a hypothesis' log-probability sums at most 12 of them: 12 steps x 8 ulps x 2**-23 relative bounds the drift
(tokens must be identical).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
torch = pytest.importorskip("torch")

from beamkit import Engine, Trie  # noqa: E402
from beamkit.adapters import Ask  # noqa: E402
from beamkit.adapters import load as load_adapter  # noqa: E402
from beamkit.cli import main  # noqa: E402
from beamkit.constraints import TrieTable  # noqa: E402
from tests.test_serve import in_thread, post, serving  # noqa: E402
from tests.test_serve_models import hf_dir  # noqa: E402, F401 (the fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REL = 12 * 8 * 2.0**-23
MAX_TOKENS = 10


def dates_case() -> tuple[Any, list[tuple[str, int, int, str | None]], Trie, Trie]:
    """The dates model, its healthy requests (prompt, beam, n, dictionary), a good dictionary of ISO dates and a
    poisoned one (the same dates and one entry holding an id past the 14-id vocabulary)."""
    adapter = load_adapter("dates-seq2seq")
    eos = adapter.eos[0]
    days = ["1999-03-03", "1999-03-04", "1999-04-03", "1987-01-12", "2024-05-07", "2001-09-11", "1976-07-04"]
    good = [adapter.tv.encode(d) + [eos] for d in days]
    asks = [("3rd of March 1999", 5, 3, None), ("03/04/99", 4, 4, "good"), ("12-Jan-87", 3, 2, None),
            ("2001.9.11", 5, 5, "good"), ("July 4, '76", 2, 2, None)]  # fmt: skip
    return adapter, asks, Trie(good), Trie([*good, [4, 5, 14 + 3, eos]])


def hf_case(folder: Any) -> tuple[Any, list[tuple[str, int, int, str | None]], Trie, Trie]:
    """The tiny GPT-2 folder, its healthy requests, a good dictionary of 3-token items and a poisoned one."""
    adapter = load_adapter(f"hf:{folder}")
    vocab = int(adapter.model.config.vocab_size)
    eos = adapter.eos[0]
    rng = np.random.default_rng(0)
    codes = [c for c in range(4, 48) if c != eos]
    items = sorted({tuple(int(x) for x in rng.choice(codes, 3)) + (eos,) for _ in range(60)})
    asks = [("w1 w2 w3", 3, 2, None), ("w7 w7 w40 w2 w9", 6, 4, "good"), ("w30", 1, 1, None),
            ("w11 w12", 5, 3, "good"), ("w5 w6", 4, 4, None)]  # fmt: skip
    return adapter, asks, Trie([list(i) for i in items]), Trie([*map(list, items), [5, vocab + 7, eos]])


@pytest.fixture(params=["dates", "hf"])
def case(request):
    if request.param == "dates":
        return dates_case()
    return hf_case(request.getfixturevalue("hf_dir"))


def engine_decode(adapter: Any, tries: dict[str, Trie], asks: list[tuple[str, int, int, str | None]]) -> list[Any]:
    """Every request of ``asks`` added to one engine before its first step (the server's engine: the adapter's
    continuous options, the dictionaries' table after its processors), stepped until idle: each one's Completed,
    and the table."""
    table = TrieTable(tries)
    options = adapter.continuous_options()
    options = replace(options, processors=(*(options.processors or ()), table))
    engine = Engine(adapter.step_fn, on_step_error="fail", **options.given())
    rids = []
    for prompt, beam, n, name in asks:
        with adapter.step_context():
            state = adapter.init_state([adapter.encode(prompt)])
        request = adapter.request(Ask(beam, n, MAX_TOKENS))
        (rid,) = engine.add_batch(state, adapter.bos, adapter.eos, 1, request=request)
        table.assign(rid, name)
        rids.append(rid)
    done = {}
    while not engine.idle:
        with adapter.step_context():
            for c in engine.step():
                done[c.request_id] = c
    return [done[r] for r in rids], table, rids


def same_hypotheses(got: Any, want: Any) -> None:
    assert got.error is None and want.error is None, (got.error, want.error)
    assert [h.tokens for h in got.hypotheses] == [h.tokens for h in want.hypotheses]
    assert [h.logprob for h in got.hypotheses] == pytest.approx([h.logprob for h in want.hypotheses], rel=REL)


def test_the_engine_fails_the_poisoned_request_alone(case):
    adapter, asks, good, bad = case
    tries = {"good": good, "bad": bad}
    poisoned = [*asks[:2], ("1st of May 2020" if "dates" in adapter.name else "w3 w4", 4, 2, "bad"), *asks[2:]]
    together, table, rids = engine_decode(adapter, tries, poisoned)
    for i, ask in enumerate(poisoned):
        if ask[3] == "bad":
            assert together[i].error is not None and not together[i].hypotheses
            assert "holds token id" in table.failure(rids[i]) and "'bad'" in table.failure(rids[i])
            continue
        (alone,), _, _ = engine_decode(adapter, tries, [ask])
        same_hypotheses(together[i], alone)
        assert alone.hypotheses


def test_the_table_refuses_the_dictionary_once_the_vocabulary_is_known(case):
    adapter, asks, good, bad = case
    with pytest.raises(ValueError, match="'bad' holds token id"):
        TrieTable({"good": good, "bad": bad}, vocab_size=_vocab(adapter))
    _, table, _ = engine_decode(adapter, {"good": good, "bad": bad}, asks[:1])  # one step: the vocabulary is learnt
    with pytest.raises(ValueError, match="'bad' holds token id"):
        table.assign(99, "bad")


def _vocab(adapter: Any) -> int:
    """The logits' width, from one model step (independent of the server's own reading of it)."""
    with adapter.step_context():
        state = adapter.init_state([adapter.encode("w1" if adapter.name != "dates-seq2seq" else "1 May 2020")])
        logits = adapter.step_fn(state, np.full(1, adapter.bos))[0]
    return int(logits.shape[1])


# ------------------------------------------------------------------------------------------------ the server
def body(adapter: Any, prompt: str, beam: int, n: int, name: str | None) -> dict[str, Any]:
    out = {"model": adapter.name, "prompt": prompt, "best_of": beam, "n": n, "max_tokens": MAX_TOKENS}
    return out if name is None else {**out, "trie": name}


def choices(r: Any) -> list[tuple[str, float]]:
    assert r.status_code == 200, r.text
    return [(c["text"], c["logprob"]) for c in r.json()["choices"]]


def test_the_server_fails_the_poisoned_request_alone(case, monkeypatch):
    """The model's vocabulary cannot be read at start (as for a model that only its first step reveals): the
    poisoned request joins the running engine beside the healthy ones and fails alone."""
    import beamkit.serve.app as app_module

    adapter, asks, good, bad = case
    monkeypatch.setattr(app_module, "model_vocab", lambda adapter: None, raising=False)
    step = adapter.step_fn

    def slow(state: Any, y_prev: Any) -> Any:  # every step a little slower: the requests overlap
        time.sleep(0.03)
        return step(state, y_prev)

    adapter.step_fn = slow
    poison = ("1st of May 2020" if adapter.name == "dates-seq2seq" else "w3 w4", 4, 2, "bad")
    with serving(adapter, tries={"good": good, "bad": bad}, max_rows=64) as (url, _):
        healthy = [in_thread(post, url, body(adapter, *ask), 120) for ask in asks]
        time.sleep(0.1)  # the healthy ones are decoding: the poisoned one joins them
        poisoned = in_thread(post, url, body(adapter, *poison), 120)
        for t, _ in [*healthy, poisoned]:
            t.join(120)
        r = poisoned[1]["out"]
        # found at a step (500: the server's dictionary failed), or at the request's check when a step has run
        # already (400): either way this request alone, naming the dictionary
        assert r.status_code in (400, 500) and "'bad' holds token id" in r.json()["error"]["message"], r.text
        again = post(url, body(adapter, *poison))  # the vocabulary is known now: the request's fault, at once
        assert again.status_code == 400 and again.json()["error"]["param"] == "trie", again.text
        assert "holds token id" in again.json()["error"]["message"]
        alone = [post(url, body(adapter, *ask), 120) for ask in asks]
    for (t, box), want, ask in zip(healthy, alone, asks, strict=True):
        got = choices(box["out"])
        expected = choices(want)
        assert [t for t, _ in got] == [t for t, _ in expected], ask
        assert [lp for _, lp in got] == pytest.approx([lp for _, lp in expected], rel=REL, abs=1e-9), ask


def test_serve_refuses_to_start_with_a_dictionary_past_the_vocabulary(case, tmp_path, capsys):
    adapter, _, good, bad = case
    spec = "dates-seq2seq" if adapter.name == "dates-seq2seq" else f"hf:{adapter.config.name_or_path}"
    ok, text = tmp_path / "good.txt", tmp_path / "bad.txt"
    ok.write_text("".join(" ".join(map(str, entry)) + "\n" for entry in _entries(good)))
    text.write_text("".join(" ".join(map(str, entry)) + "\n" for entry in _entries(bad)))
    bad.save(tmp_path / "bad.npz")
    for path in (text, tmp_path / "bad.npz"):
        argv = ["serve", "--model", spec, "--host", "127.0.0.1", "--port", "0", "--trie", f"good={ok}"]
        t, box = in_thread(main, [*argv, "--trie", f"d={path}"])
        t.join(60)
        assert not t.is_alive(), "the server started with the dictionary"  # (it then serves on, in its thread)
        code = box["out"]
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert code == 2, line
        assert line.startswith(f"beamkit serve: error: --trie d={path}: ") and "vocabulary" in line, line
    with pytest.raises(ValueError, match="'bad' holds token id"):
        with serving(adapter, tries={"good": good, "bad": bad}):
            pass


def _entries(trie: Trie) -> list[list[int]]:
    """Every entry of ``trie``, by walking it (node ids breadth first, as its docstring lays them out)."""
    out, stack = [], [(0, [])]
    while stack:
        node, path = stack.pop()
        if trie.terminal[node]:
            out.append(path)
        for k, label in enumerate(trie.children(node).tolist()):
            stack.append((int(trie.indptr[node]) + 1 + k, [*path, label]))
    return out
