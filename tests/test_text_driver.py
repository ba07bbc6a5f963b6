"""The one batched text driver (``beamkit.adapters.decode_texts``) behind ``beamkit.adapters.translate``,
``beamkit.adapters.g2p.decode_words`` and the g2p fusion task, and its adapter wrapper for shallow fusion.

Oracle: the model's own step function searched by ``beamkit.search_batch`` on the same padded batch (so float
rounding is the same and results must be equal, not close), with ``beamkit.fuse`` built by hand for fusion."""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import NGramLM, fuse, search_batch
from beamkit.adapters import CheckpointAdapter, FusedAdapter, TextHypothesis, decode_texts, translate
from beamkit.models import load_model
from beamkit.models.common import encode_sources, pad_batch
from beamkit.search.options import SharedOptions
from beamkit.tasks import dates

SOURCES = ["3rd of March 1999", "march 3, '99", "03/04/05", "1999.3.3", "Sunday 5 June 2011"]


def _direct(model, texts, beam, max_len=12, lm=None, weight=0.0, **options):
    """Each text's hypotheses from search_batch over the numpy model's step, as (text, tokens, logprob, score,
    finished) tuples: one padded batch, like the driver's."""
    tv = model.tgt_vocab
    src, lengths = pad_batch(encode_sources(model.src_vocab, texts), model.src_vocab.pad)
    state, step = model.init_state(src, lengths), model.step
    if lm is not None:
        step = fuse(model.step, lm, weight)
        state = step.init_state(state, lm.init_state(len(texts)))
    hyps = search_batch(step, state, tv.bos, tv.eos, beam, max_len, **options)
    return [[(tv.decode(h.tokens), list(h.tokens), h.logprob, h.score, h.finished) for h in r] for r in hyps]


@pytest.fixture(scope="module")
def model():
    return load_model("dates-transformer", backend="numpy")


@pytest.fixture(scope="module")
def lm():
    return NGramLM(dates.lm_corpus()[:2000], dates.lm_vocab(), order=3)


def test_translate_is_the_search_of_the_models_step(model):
    got = translate(model, SOURCES, beam_size=4, num_return=3)
    assert all(isinstance(h, TextHypothesis) for r in got for h in r)
    assert [[tuple(h) for h in r] for r in got] == [r[:3] for r in _direct(model, SOURCES, 4)]
    assert {h.finished for r in got for h in r} == {True}


def test_translate_with_an_lm_is_the_search_of_the_fused_step(model, lm):
    got = translate(model, SOURCES, beam_size=3, lm=lm, lm_weight=0.5)
    want = _direct(model, SOURCES, 3, lm=lm, weight=0.5)
    assert [[tuple(h) for h in r] for r in got] == want
    assert got != translate(model, SOURCES, beam_size=3)  # the LM changed the scores


def test_search_options_reach_every_search(model):
    options = {"policy": "pool", "min_len": 11, "early_stopping": True}
    got = translate(model, SOURCES, beam_size=3, **options)
    assert [[tuple(h) for h in r] for r in got] == _direct(model, SOURCES, 3, **options)
    assert all(len(h.tokens) >= 11 for r in got for h in r)  # min_len held: the options were not dropped


def test_batches_keep_the_inputs_order(model):
    whole = translate(model, SOURCES, beam_size=2)
    parts = translate(model, SOURCES, beam_size=2, batch_size=2)  # 2 + 2 + 1 inputs
    assert [[h.tokens for h in r] for r in parts] == [[h.tokens for h in r] for r in whole]
    for a, b in zip(parts, whole, strict=True):  # padding to another length changes float32 rounding only
        np.testing.assert_allclose([h.logprob for h in a], [h.logprob for h in b], rtol=0, atol=1e-5)
    assert [[h.text for h in r] for r in whole] == [[r[0] for r in rs] for rs in _direct(model, SOURCES, 2)]


def test_the_driver_refuses_its_own_settings_as_search_options(model):
    adapter = CheckpointAdapter(model, "dates")
    with pytest.raises(TypeError, match="beam_size as beam="):
        decode_texts(adapter, SOURCES[:1], beam=2, beam_size=3)
    with pytest.raises(TypeError, match="num_return as n_best="):
        decode_texts(adapter, SOURCES[:1], beam=2, num_return=1)

    pooled = CheckpointAdapter(model, "pooled")
    pooled.engine_options = SharedOptions(
        policy="pool"
    )  # a model whose decoder sets the policy (as a Hugging Face one)
    with pytest.raises(TypeError, match=r"policy: set by this model's decoder \(pooled\)"):
        decode_texts(pooled, SOURCES[:1], beam=2, policy="narrow")
    assert decode_texts(pooled, SOURCES[:1], beam=2, policy="pool") == decode_texts(pooled, SOURCES[:1], beam=2)


def test_a_source_longer_than_the_model_takes_names_its_max_len(model):
    with pytest.raises(
        ValueError, match=r"input 2 is 70 tokens long; this model takes at most 64 \(the model's max_len\)"
    ):
        decode_texts(CheckpointAdapter(model, "dates"), ["03/04/05", "x" * 70])


def test_the_fused_adapter_is_the_inner_adapter_but_for_its_scores(model, lm):
    inner = CheckpointAdapter(model, "dates")
    fused = FusedAdapter(inner, lm, 0.5)
    same = ("name", "bos", "eos", "vocab", "default_max_tokens", "max_tokens_limit", "max_prompt_tokens")
    assert [getattr(fused, a) for a in same] == [getattr(inner, a) for a in same]
    assert fused.encode("03/04/05") == inner.encode("03/04/05")
    assert fused.decode([5, 6, inner.tv.eos]) == inner.decode([5, 6, inner.tv.eos])
    ids = [inner.encode(t) for t in SOURCES[:2]]
    logits, _, extras = fused.step_fn(fused.init_state(ids), np.full(2, inner.bos))
    np.testing.assert_array_equal(extras["model_logprobs"] + 0.5 * extras["lm_logprobs"], logits)
    with pytest.raises(TypeError, match="wraps a ModelAdapter"):
        FusedAdapter(model, lm, 0.5)
    with pytest.raises(TypeError, match="init_state"):
        FusedAdapter(inner, model.step, 0.5)


def test_g2p_decode_and_its_fusion_are_the_search_of_the_gru():
    pytest.importorskip("g2p_en")
    from beamkit.adapters.g2p import decode_words
    from beamkit.models.g2p import BOS, EOS, MAX_LEN, PHONEMES, G2PModel, phonemes
    from beamkit.tasks.g2p import decode_fused

    g2p = G2PModel.load()
    words = ["beam", "search", "decoder"]
    want = search_batch(g2p.step, g2p.init_state(words), BOS, EOS, 3, MAX_LEN)
    got = decode_words(g2p, words, beam_size=3)
    assert [[(h.tokens, h.logprob, h.score) for h in r] for r in got] == [
        [(list(h.tokens), h.logprob, h.score) for h in r] for r in want
    ]
    assert [r[0].text for r in got] == [" ".join(phonemes(r[0].tokens)) for r in want]
    lm = NGramLM(["B IY1 M", "S ER1 CH", "D IH0 K OW1 D ER0"] * 3, list(PHONEMES), order=2)
    fused = fuse(g2p.step, lm, 0.3)
    want = search_batch(fused, fused.init_state(g2p.init_state(words), lm.init_state(3)), BOS, EOS, 3, MAX_LEN)
    got = decode_fused(g2p, words, 3, lm, 0.3)
    assert [[(h.tokens, h.logprob) for h in r] for r in got] == [[(list(h.tokens), h.logprob) for h in r] for r in want]
