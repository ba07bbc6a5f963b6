"""``beamkit serve --trie NAME=FILE``: dictionaries loaded at start, a request naming one gets only its entries.

Servers run in-process on a free 127.0.0.1 port (``serving`` from tests/test_serve.py). Oracles: each request
decoded alone by :func:`beamkit.search_batch` with the same dictionary as a processor, and the dictionary itself
(every output must be one of its entries).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from beamkit import Trie, search_batch  # noqa: E402
from beamkit.cli import main  # noqa: E402
from tests.serve_toy import BOS, EOS, LETTERS, ToyAdapter, toy_alone  # noqa: E402
from tests.test_serve import in_thread, post, serving, sse_events  # noqa: E402

try:  # the tiny GPT-2 folder fixture
    from tests.test_serve_models import hf_dir  # noqa: F401
except pytest.skip.Exception:  # no torch: the Hugging Face test is skipped, the others run

    @pytest.fixture
    def hf_dir():
        pytest.skip("needs torch")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def letter_ids(word: str) -> list[int]:
    """The toy model's ids of a word."""
    return [2 + LETTERS.index(ch) for ch in word]


WORDS = ["".join(p) for p in itertools.product(LETTERS, repeat=4)]  # 4096 four-letter words
SHORT = ["bad", "bead", "cab", "dead", "face", "fade", "head"]


def trie_of(words: list[str]) -> Trie:
    """The dictionary of ``words``, each ending with the toy's stop token."""
    return Trie([letter_ids(w) + [EOS] for w in words])


def alone(prompt: str, trie: Trie, beam: int, n: int, max_tokens: int = 8) -> list[tuple[str, float]]:
    """The oracle: one request decoded alone with the dictionary as a processor."""
    toy = ToyAdapter()
    hyps = search_batch(
        toy.step_fn, toy.init_state([toy.encode(prompt)]), BOS, EOS, beam, max_tokens, length_penalty=1.0,
        num_return=n, processors=[trie.mask()],
    )  # fmt: skip
    return [(toy.decode(h.tokens), h.logprob) for h in hyps[0]]


def texts(body: dict) -> list[tuple[str, float]]:
    return [(c["text"], c["logprob"]) for c in body["choices"]]


def same(got: list[tuple[str, float]], want: list[tuple[str, float]], rel: float = 0.0) -> None:
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-9, rel=rel)


def test_a_request_naming_a_dictionary_gets_only_its_entries_as_alone():
    tries = {"short": trie_of(SHORT), "all": trie_of(WORDS)}
    with serving(ToyAdapter(), tries=tries) as (url, _):
        r = post(url, {"model": "toy", "prompt": "abc", "best_of": 5, "n": 5, "trie": "short", "max_tokens": 8})
        free = post(url, {"model": "toy", "prompt": "abc", "best_of": 5, "n": 5, "max_tokens": 8})
        wide = post(url, {"model": "toy", "prompt": "abc", "best_of": 10, "n": 10, "trie": "short", "max_tokens": 8})
    assert r.status_code == 200, r.text
    got = texts(r.json())
    assert {t for t, _ in got} <= set(SHORT)
    same(got, alone("abc", tries["short"], 5, 5))
    same(texts(free.json()), toy_alone("abc", 5, 5, 8))  # a request naming none is not constrained
    # a dictionary of 7 entries and 10 asked: the 7, each once, and nothing outside it
    assert sorted(t for t, _ in texts(wide.json())) == sorted(SHORT)


def test_an_unknown_dictionary_is_a_400_naming_the_field_and_the_server_stays_up():
    with serving(ToyAdapter(), tries={"short": trie_of(SHORT)}) as (url, _):
        r = post(url, {"model": "toy", "prompt": "abc", "best_of": 3, "trie": "nope"})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "trie" and "'nope'" in err["message"] and "'short'" in err["message"]
        bad_type = post(url, {"model": "toy", "prompt": "abc", "trie": 3})
        assert bad_type.status_code == 400 and bad_type.json()["error"]["param"] == "trie"
        assert post(url, {"model": "toy", "prompt": "abc", "best_of": 3, "trie": "short"}).status_code == 200
    with serving(ToyAdapter()) as (url, _):  # no dictionary loaded at all
        r = post(url, {"model": "toy", "prompt": "abc", "trie": "short"})
        assert r.status_code == 400 and "--trie" in r.json()["error"]["message"]


def test_width_1000_mixed_with_greedy_and_narrow_requests_each_as_alone():
    """One continuous batch: a width-1000 dictionary request, greedy and narrow requests (with and without a
    dictionary) sent at once; each answer equals the request decoded alone."""
    trie = trie_of(WORDS)
    asks = [
        ("abc", 1000, 1000, "all"),
        ("bad", 1, 1, None),
        ("cafe", 1, 1, "all"),
        ("dab", 4, 2, "all"),
        ("ace", 3, 3, None),
    ]
    results: dict[int, httpx.Response] = {}
    with serving(ToyAdapter(), tries={"all": trie}, max_rows=1200, max_request_cost=10**6) as (url, _):

        def send(i: int, prompt: str, beam: int, n: int, name: str | None) -> None:
            body = {"model": "toy", "prompt": prompt, "best_of": beam, "n": n, "max_tokens": 8}
            if name is not None:
                body["trie"] = name
            results[i] = post(url, body, timeout=300)

        threads = [threading.Thread(target=send, args=(i, *a)) for i, a in enumerate(asks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    for i, (prompt, beam, n, name) in enumerate(asks):
        assert results[i].status_code == 200, results[i].text
        got = texts(results[i].json())
        want = alone(prompt, trie, beam, n) if name else toy_alone(prompt, beam, n, 8)
        same(got, want)
        if name:
            assert {t for t, _ in got} <= set(WORDS)
    assert len(results[0].json()["choices"]) == 1000


def test_the_n_best_is_streamed_and_matches_the_plain_answer():
    trie = trie_of(WORDS)
    body = {"model": "toy", "prompt": "face", "best_of": 50, "n": 50, "trie": "all", "max_tokens": 8}
    with serving(ToyAdapter(), tries={"all": trie}) as (url, _):
        plain = post(url, body).json()
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert final["beamkit"]["final"] is True
    same(texts(final), texts(plain))
    progress = events[:-2]
    assert progress and all(e["beamkit"]["replace"] for e in progress)
    assert all(set(e["choices"][0]["text"]) <= set(LETTERS) for e in progress)


def test_width_and_n_above_1000_are_refused_and_the_cost_cap_counts_the_width():
    with serving(ToyAdapter(), tries={"all": trie_of(WORDS)}, max_rows=1200) as (url, _):
        r = post(url, {"model": "toy", "prompt": "abc", "best_of": 1001, "trie": "all"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
        r = post(url, {"model": "toy", "prompt": "abc", "n": 1001, "trie": "all"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        r = post(url, {"model": "toy", "prompt": ["abc"] * 40, "best_of": 1000, "max_tokens": 8, "trie": "all"})
        assert r.status_code == 400 and "1000 beams" in r.json()["error"]["message"]


def test_cli_loads_dictionaries_and_refuses_bad_ones_in_one_line(tmp_path, capsys):
    good = tmp_path / "ids.txt"
    good.write_text("2 3 1\n4 5 1\n")
    np.save(tmp_path / "ids.npy", np.array([[2, 3, 1], [4, 5, 1]]))
    from beamkit.cli.serve import load_tries

    loaded = load_tries([("a", str(good)), ("b", str(tmp_path / "ids.npy"))])
    assert sorted(loaded) == ["a", "b"] and len(loaded["a"]) == len(loaded["b"]) == 2
    bad = tmp_path / "bad.txt"
    bad.write_text("2 x 1\n")
    from tests.test_adapters import cli_error

    for argv, needle in (
        (["serve", "--trie", "nofile"], "expected NAME=FILE"),
        (["serve", "--trie", f"a={tmp_path / 'missing.txt'}"], "no dictionary file"),
        (["serve", "--trie", f"a={bad}"], "token ids separated by spaces"),
        (["serve", "--trie", f"a={good}", "--trie", f"a={good}"], "given twice"),
        (["serve", "--trie", f"a={tmp_path / 'ids.npy'}", "--port", "-1"], "--port"),
    ):
        code, line = cli_error(capsys, main, argv)
        assert code == 2 and line.startswith("beamkit serve: error:") and needle in line, line


def test_a_hugging_face_model_serves_dictionary_requests_as_generate_with_the_callable(tmp_path, hf_dir):  # noqa: F811
    """A tiny GPT-2 served from a folder: a dictionary request (beside a plain one) answers what
    ``beamkit.hf.generate`` gives the same prompt alone with the trie's ``prefix_allowed_tokens_fn``, whose best
    is ``model.generate``'s own best with that callable."""
    torch = pytest.importorskip("torch")
    import transformers

    import beamkit.hf as bh
    from beamkit.adapters import load as load_adapter

    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    eos = int(model.generation_config.eos_token_id)
    rng = np.random.default_rng(0)
    codes = [c for c in range(4, 48) if c != eos]
    items = {tuple(int(x) for x in rng.choice(codes, 3)) + (eos,) for _ in range(120)}
    path = tmp_path / "items.txt"
    path.write_text("".join(" ".join(map(str, it)) + "\n" for it in sorted(items)))
    trie = Trie(path)
    prompt = "w1 w2 w3"
    ids = torch.tensor([tok(prompt)["input_ids"]])
    fn = trie.prefix_allowed_tokens_fn(prompt_len=ids.shape[1])
    kw = dict(num_beams=30, num_return_sequences=30, max_new_tokens=6, length_penalty=1.0)
    out = bh.generate(model, ids, prefix_allowed_tokens_fn=fn, return_dict_in_generate=True, **kw)
    want = [(tok.decode(h.tokens[:-1]), h.logprob) for h in out.hypotheses[0]]
    theirs = model.generate(ids, prefix_allowed_tokens_fn=fn, **kw)
    assert theirs[0, ids.shape[1] :].tolist() == out.hypotheses[0][0].tokens
    adapter = load_adapter(f"hf:{hf_dir}")
    with serving(adapter, tries={"items": trie}) as (url, _):
        body = {"model": adapter.name, "prompt": prompt, "best_of": 30, "n": 30, "max_tokens": 6, "trie": "items"}
        plain = {"model": adapter.name, "prompt": "w7 w8", "best_of": 3, "n": 1, "max_tokens": 6}
        runs = [in_thread(post, url, body), in_thread(post, url, plain)]
        for t, _ in runs:
            t.join(120)
    r = runs[0][1]["out"]
    assert r.status_code == 200 and runs[1][1]["out"].status_code == 200
    # Served, the prompt shares a padded batch with the plain request; float32 matmuls over a different batch
    # shape may round each logit differently (a few float32 ulps, 2**-23 relative each), and a hypothesis' score
    # sums 7 such log-probabilities: 7 steps x 8 ulps x 2**-23 ~ 7e-6 relative bounds it.
    same(texts(r.json()), want, rel=7 * 8 * 2.0**-23)
    assert len(want) == 30
    allowed = {tok.decode(list(it[:-1])) for it in items}
    assert {t for t, _ in texts(r.json())} <= allowed
