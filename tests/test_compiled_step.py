"""The compiled decode step of beamkit's Transformer (``init_state(..., compile=...)``) against its eager step.

The oracle is the eager step of the same model (a different code path: a cache grown by concatenation, attention
over exactly the filled columns, no padding). Most tests compile with torch.compile's ``eager`` backend
(dynamo's graph capture and guards, the static shapes and the buckets, without inductor's C++ build, which
takes minutes on a loaded 2-core machine); ``BEAMKIT_TEST_INDUCTOR=1`` adds the same comparison under inductor
(``make gpu-check`` sets it).

Tolerance, float32: the compiled step sums attention over all ``max_len`` columns (the unfilled ones
contribute exact zeros) and its backend may reorder sums, so each logit may differ from the eager one by the
rounding of reordered sums. A sum of n float32 terms reordered moves by at most (n - 1) u sum|terms|
(u = 2^-24); along the deepest path of a step a value passes through sums of d_model, ff and max_len terms in
each decoder layer, so logits agree within (d_model + ff + max_len) * layers * u * (1 + max|logit|).
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from beamkit import search_batch  # noqa: E402
from beamkit.models import compiled as compiled_mod  # noqa: E402
from beamkit.models import load_model  # noqa: E402
from beamkit.models.common import encode_sources, pad_batch  # noqa: E402
from beamkit.state import select_state  # noqa: E402

SOURCES = ["3rd of March 1999", "1/2/03", "Tuesday, 14 September 2021", "march 7 1987", "12.10.1955"]
BACKENDS = ["eager"] + (["inductor"] if os.environ.get("BEAMKIT_TEST_INDUCTOR") == "1" else [])
U = 2.0**-24


@pytest.fixture(scope="module")
def model(one_torch_thread):
    return load_model("dates-transformer")


def on(model, device):
    """``model`` on ``device``: the module's own on the CPU, elsewhere the same model loaded afresh and moved
    there once (its compiled steps then shared by the tests, as the module's are; it stays on the CPU)."""
    return model if device.type == "cpu" else _moved(str(device))


@functools.cache
def _moved(device: str):
    """The dates Transformer loaded and moved to ``device`` (once per device)."""
    return load_model("dates-transformer").to(device)


def state(model, texts, compile=False):
    src, lengths = pad_batch(encode_sources(model.src_vocab, texts), model.src_vocab.pad)
    device = model.out.weight.device
    src, lengths = torch.as_tensor(src, device=device), torch.as_tensor(lengths, device=device)
    return model.init_state(src, lengths, compile=compile)


def tolerance(model, logits):
    c = model.config
    return (c["d_model"] + c["ff"] + c["max_len"]) * c["dec_layers"] * U * (1.0 + float(logits.abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_tokens_identical_scores_within_float32(model, backend, device):
    model = on(model, device)
    tv = model.tgt_vocab
    with torch.inference_mode():
        eager = search_batch(model.step, state(model, SOURCES), tv.bos, tv.eos, 4, 20, num_return=4)
        comp = search_batch(model.step, state(model, SOURCES, backend), tv.bos, tv.eos, 4, 20, num_return=4)
    for ours, theirs in zip(comp, eager, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        # a score sums at most 20 log-probabilities, each within twice a logit's tolerance (log-softmax)
        bound = 20 * 2 * tolerance(model, torch.full((1,), 30.0))
        assert np.allclose([h.score for h in ours], [h.score for h in theirs], rtol=0, atol=bound)


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_logits_within_float32_after_a_reorder(model, backend, device):
    # a few steps with a beam-style reorder (parents repeat, rows drop) between them
    model = on(model, device)
    with torch.inference_mode():
        a, b = state(model, SOURCES[:3]), state(model, SOURCES[:3], backend)
        y = np.full(3, model.tgt_vocab.bos)
        for parents in (np.array([0, 0, 1, 2, 2, 2]), np.array([5, 1, 1, 0]), np.array([3, 2, 1, 0, 0])):
            la, a = model.step(a, y)
            lb, b = model.step(b, y)
            assert lb.shape == la.shape
            assert torch.allclose(lb, la, rtol=0, atol=tolerance(model, la))
            a, b = select_state(a, parents), select_state(b, parents)
            y = la.argmax(-1).cpu().numpy()[parents]


def fresh_steps(model, monkeypatch):
    """Give ``model`` no compiled steps for the rest of the test (its earlier ones come back afterwards)."""
    monkeypatch.setitem(model.__dict__, "_compiled_steps", {})


def test_a_second_call_in_the_same_bucket_compiles_nothing(model, monkeypatch):
    fresh_steps(model, monkeypatch)
    step = model.compiled_step("eager")
    with torch.inference_mode():
        _, s = model.step(state(model, SOURCES[:2] * 3, "eager"), np.zeros(6, dtype=np.int64))  # 6 rows: bucket 8
        before = step.compilations
        assert before == 1 and step.seen == {(8, s.cross.value[2].shape[1])}
        _, s = model.step(state(model, SOURCES[:2] * 4, "eager"), np.zeros(8, dtype=np.int64))  # 8 rows: bucket 8
        assert step.compilations == before  # reused: no new graph
        _, s = model.step(state(model, SOURCES[:2] * 5, "eager"), np.zeros(10, dtype=np.int64))  # bucket 16
        assert step.compilations == before + 1


def test_where_compilation_fails_the_step_runs_eagerly_and_says_why_once(model, monkeypatch, caplog):
    fresh_steps(model, monkeypatch)

    def refuse(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", refuse)
    tv = model.tgt_vocab
    with caplog.at_level(logging.WARNING, logger="beamkit"), torch.inference_mode():
        backend = "aot_eager"
        comp = search_batch(model.step, state(model, SOURCES, backend), tv.bos, tv.eos, 3, 20)
        search_batch(model.step, state(model, SOURCES[:1], backend), tv.bos, tv.eos, 3, 20)
        eager = search_batch(model.step, state(model, SOURCES), tv.bos, tv.eos, 3, 20)
    assert [h[0].tokens for h in comp] == [h[0].tokens for h in eager]
    notes = [r.getMessage() for r in caplog.records if "compiled decode step is not available" in r.getMessage()]
    assert len(notes) == 1 and "no compiler here" in notes[0]


def test_a_slow_first_compilation_is_announced_on_stderr_once_per_bucket(model, monkeypatch, capsys):
    fresh_steps(model, monkeypatch)
    monkeypatch.setattr(compiled_mod, "SLOW_COMPILE_SECONDS", -1.0)  # every first compilation counts as slow
    with torch.inference_mode():
        s = state(model, SOURCES[:3], "eager")
        for _ in range(3):
            _, s = model.step(s, np.zeros(3, dtype=np.int64))
    err = capsys.readouterr().err
    assert err.count("compiled the decode step for 4 rows") == 1


def test_bad_switches_are_refused(model):
    with pytest.raises(TypeError, match="compile must be True, False or a torch.compile backend name"):
        state(model, SOURCES[:1], compile=3)
    src, lengths = pad_batch(encode_sources(model.src_vocab, SOURCES[:1]), model.src_vocab.pad)
    with pytest.raises(ValueError, match="cannot use a paged cache"):
        model.init_state(torch.as_tensor(src), kv=model.paged_cache(8), compile=True)
    a, b = state(model, SOURCES[:1], "eager"), state(model, SOURCES[1:2], "eager")
    with pytest.raises(ValueError, match="cannot join a search running the compiled step"):
        a.beamkit_concat([b])


def test_a_consumed_handle_is_refused(model):
    with torch.inference_mode():
        s = state(model, SOURCES[:2], "eager")
        _, s2 = model.step(s, np.zeros(2, dtype=np.int64))
        with pytest.raises(ValueError, match="consumed"):
            model.step(s, np.zeros(2, dtype=np.int64))
        assert s2.static.t == 1 and len(s2.static) == 2


def test_buckets_by_hand():
    assert [compiled_mod.bucket(n, 4) for n in (0, 1, 4, 5, 8, 9, 33)] == [4, 4, 4, 8, 8, 16, 64]
    with pytest.raises(ValueError):
        compiled_mod.bucket(-1, 4)


def test_a_model_is_freed_with_its_compiled_steps():
    """torch keeps every backend it was given for the life of the process; the step's holds the step only
    weakly, so a model that ran compiled steps is freed when its last reference goes."""
    import gc
    import weakref

    model = load_model("dates-transformer")
    tv = model.tgt_vocab
    with torch.inference_mode():
        search_batch(model.step, state(model, SOURCES[:2], "eager"), tv.bos, tv.eos, 2, 6)
    assert model.compiled_step("eager").compilations >= 1
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
