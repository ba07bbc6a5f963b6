"""Where a Hugging Face ``generate`` call runs, decided once by :func:`beamkit.hf.bridge.route.route`:
a table of calls and
the route each takes (the engine, beamkit's loop inside Hugging Face's ``generate``, or Hugging Face's own), from
the documented rules; and bad input raises instead of being routed elsewhere."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from beamkit.hf.bridge.generation import Prepared  # noqa: E402
from beamkit.hf.bridge.route import LoopCall, Route, route  # noqa: E402
from tests.test_hf import VOCAB, setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Streamer:
    """A streamer that keeps nothing (only its presence routes the call)."""

    def put(self, value):
        pass

    def end(self):
        pass


# (generate or a patched model.generate, patch's fast, keywords) -> the route kind the rules give
TABLE = [
    ("generate", False, dict(num_beams=2), "engine"),
    ("generate", False, dict(), "engine"),
    ("generate", False, dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5), "engine"),
    ("generate", False, dict(num_beams=2, output_scores=True, return_dict_in_generate=True), "loop"),
    ("generate", False, dict(assistant_model="MODEL"), "huggingface"),
    ("generate", False, dict(penalty_alpha=0.6, top_k=4), "huggingface"),
    ("patched", False, dict(), "engine"),
    ("patched", False, dict(num_beams=2), "loop"),
    ("patched", True, dict(num_beams=2), "engine"),
    ("patched", False, dict(do_sample=True), "loop"),
    ("patched", False, dict(output_scores=True, return_dict_in_generate=True), "loop"),
    ("patched", False, dict(streamer=Streamer()), "huggingface"),
    ("patched", False, dict(penalty_alpha=0.6, top_k=4), "huggingface"),
    ("patched", False, dict(num_beams=2, num_return_sequences=3), "loop"),  # Hugging Face's check raises
]


def _route(model, ids, mask, how, fast, kw):
    kw = {k: (model if v == "MODEL" else v) for k, v in kw.items()}
    if how == "patched":  # Hugging Face's positionals: inputs, generation config
        return route(model, (ids,), {"attention_mask": mask, "max_new_tokens": 3, **kw}, patched=True, fast=fast)
    return route(model, (ids, mask), {"max_new_tokens": 3, **kw})


def test_the_route_table():
    """Every row of the table routes as the rules say, with the call prepared for where it goes; the whole
    table prints as one line per call."""
    model, ids, mask, eos, pad = setup("gpt2")
    lines = []
    for how, fast, kw, want in TABLE:
        got = _route(model, ids, mask, how, fast, kw)
        assert isinstance(got, Route)
        assert got.kind == want, (how, fast, kw, str(got))
        kind = {"engine": Prepared, "loop": LoopCall, "huggingface": type(None)}[want]
        assert isinstance(got.prepared, kind), (how, kw, got.prepared)
        assert got.reason and str(got).startswith(f"{want}: ")
        lines.append(f"{how:9} fast={fast!s:5} {sorted(kw)!s:60} {got}")
    table = "\n".join(lines)
    assert table.count("\n") == len(TABLE) - 1 and "huggingface: streamer=" in table


def test_no_input_ids_routes_to_the_loop():
    """``inputs_embeds`` alone: the bridge takes token ids only, the loop takes the call."""
    model, ids, mask, eos, pad = setup("gpt2")
    embeds = model.get_input_embeddings()(ids).detach()
    got = route(model, (None, None), {"inputs_embeds": embeds, "attention_mask": mask, "max_new_tokens": 3})
    assert (got.kind, got.reason) == ("loop", "no input_ids")
    assert "inputs_embeds" in got.prepared.kwargs and got.prepared.args == ()


def test_the_routes_decode_as_hugging_face(device):
    """A call routed to the engine and one routed to the loop decode what Hugging Face's own generate does
    (greedy: exact on both)."""
    model, ids, mask, eos, pad = setup("gpt2", device)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=4)
        engine = route(model, (ids, mask), {"max_new_tokens": 4})
        loop = route(model, (ids, mask), {"max_new_tokens": 4}, engine=False)
        assert (engine.kind, loop.kind) == ("engine", "loop")
        assert torch.equal(engine.prepared(), want)
        assert torch.equal(loop.prepared(model.generate), want)


def test_bad_input_raises_instead_of_falling_back():
    """beamkit.hf.generate: bad input raises ValueError / TypeError naming it, from the route itself; nothing
    runs Hugging Face's generate (which would take some of these)."""
    model, ids, mask, eos, pad = setup("gpt2")
    calls = []
    original = model.generate

    def counting(*args, **kw):
        calls.append(kw)
        return original(*args, **kw)

    model.generate = counting
    try:
        bad = ids.clone()
        bad[0, -1] = VOCAB + 5
        cases = [
            ((ids, mask), dict(num_beams=2, num_return_sequences=3), ValueError, "num_return_sequences"),
            ((ids, mask), dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
            ((bad, mask), dict(), ValueError, f"token id {VOCAB + 5}, outside the model's vocabulary"),
            ((ids, mask), dict(attention_mask=mask), TypeError, "attention_mask twice"),
            ((ids, mask), dict(not_an_argument=1), TypeError, "not_an_argument"),
        ]
        for args, kw, kind, match in cases:
            kw = {"max_new_tokens": 3, **kw}
            with pytest.raises(kind, match=match):
                route(model, args, kw)
            with pytest.raises(kind, match=match):
                bh.generate(model, *args, **kw)
        assert calls == []
    finally:
        del model.generate


def test_generate_refuses_by_name_what_only_hugging_face_runs():
    """beamkit.hf.generate never runs Hugging Face's own decoding: a call routed there is Unsupported, named."""
    model, ids, mask, eos, pad = setup("gpt2")
    with pytest.raises(bh.Unsupported, match="generation mode 'contrastive_search' is not decoded by beamkit"):
        bh.generate(model, ids, mask, max_new_tokens=3, penalty_alpha=0.6, top_k=4)
