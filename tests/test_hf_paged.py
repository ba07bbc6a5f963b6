"""Paged keys/values for Hugging Face decoder-only models (``beamkit.hf.steps.paged``)
on tiny seeded GPT-2 / Llama models.

Oracles, none of them the paged code: ``model.generate`` itself (tokens identical; ``sequences_scores`` within
1e-4, see below); the dense bridge (``cache_implementation="dynamic"``: Hugging Face's ``DynamicCache``, which
never touches the pool), whose logits the gathering paged step (``attention="gather"``) must reproduce bit for
bit on a static batch, since attention gets the same keys/values in the same layout, and the shared-prefix step
(the default) within float32 rounding (its softmax sums the prefix and the tail apart, then merges them); each
request decoded alone, for requests joining a running engine; and block counts worked out by hand.
"""

from __future__ import annotations

import copy
import functools
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit  # noqa: E402
import beamkit.hf as bh  # noqa: E402
import beamkit.hf.bridge.generation as generation  # noqa: E402
from beamkit.hf.bridge.settings import merge_config, resolve  # noqa: E402
from beamkit.hf.steps.join import Prompt  # noqa: E402
from beamkit.hf.steps.paged import PagedCache  # noqa: E402
from beamkit.kv import PagedKVCache  # noqa: E402
from beamkit.search import BeamSearch, make_options  # noqa: E402
from tests.test_hf import VOCAB, engine_generate, setup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PAGED_MODELS = ("gpt2", "llama")
NEW = 10


@pytest.fixture
def steps(monkeypatch):
    """The DecoderOnlyStep objects beamkit.hf.generate makes (to read which cache they used and their pool)."""
    made = []

    class Recorded(bh.DecoderOnlyStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(generation, "DecoderOnlyStep", Recorded)
    return made


def _generate(model, ids, mask, eos, pad, beams, **kw):
    kw.setdefault("cache_implementation", "paged")  # the test models are small enough for the dense default
    return engine_generate(
        model, ids, mask, num_beams=beams, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=pad,
        return_dict_in_generate=True, output_scores=True, **kw,
    )  # fmt: skip


@functools.cache
def _eager(name):
    """The test model with eager attention: the model builds its 2-D-mask masks from the cache's mask sizes."""
    model, ids, mask, eos, pad = setup(name)
    model = copy.deepcopy(model)
    model.set_attn_implementation("eager")
    return model, ids, mask, eos, pad


# ---------------------------------------------------------------------------------------- against the peers
@pytest.mark.parametrize("beams", [1, 4, 8])
@pytest.mark.parametrize("name", PAGED_MODELS)
def test_paged_equals_model_generate_and_the_dense_bridge(name, beams, steps):
    model, ids, mask, eos, pad = setup(name)  # 8 prompts with 0-3 columns of left padding
    hf = model.generate(
        ids, attention_mask=mask, num_beams=beams, max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
        pad_token_id=pad, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    paged = _generate(model, ids, mask, eos, pad, beams)
    dense = _generate(model, ids, mask, eos, pad, beams, cache_implementation="dynamic")
    assert [s.kv for s in steps] == ["paged", "dense"]
    assert torch.equal(paged.sequences, hf.sequences), (paged.sequences, hf.sequences)
    assert torch.equal(paged.sequences, dense.sequences)
    if beams > 1:
        # Hugging Face sums float32 log-probabilities, beamkit float64 ones of the same float32 logits: <= 10
        # terms of magnitude < 10 each rounded at float32's 6e-8 relative, so the sums differ by < 1e-5 before
        # the length normalisation (which only shrinks them); 1e-4 leaves room, as in test_hf.py.
        assert torch.allclose(paged.sequences_scores, hf.sequences_scores, atol=1e-4, rtol=0)
        # the shared-prefix softmax sums in another order: logits within a few float32 ulps, sums as above
        assert torch.allclose(paged.sequences_scores, dense.sequences_scores, atol=1e-4, rtol=0)
    pool = steps[0].pool.kv
    assert pool.blocks_in_use() == 0 and not pool.refcount.any()  # every request finished and gave its blocks back


@pytest.mark.parametrize("name", PAGED_MODELS)
def test_eager_attention_builds_its_masks_from_the_paged_cache(name, steps):
    model, ids, mask, eos, pad = _eager(name)
    hf = model.generate(
        ids, attention_mask=mask, num_beams=4, max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
        pad_token_id=pad, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    paged = _generate(model, ids, mask, eos, pad, 4)
    dense = _generate(model, ids, mask, eos, pad, 4, cache_implementation="dynamic")
    assert [s.kv for s in steps] == ["paged", "dense"] and not steps[0].mask_4d
    assert torch.equal(paged.sequences, hf.sequences) and torch.equal(paged.sequences, dense.sequences)
    assert torch.allclose(paged.sequences_scores, dense.sequences_scores, atol=1e-4, rtol=0)  # as above


def _logits_of(step, ids, mask, parents_per_step, tokens_per_step):
    """Drive ``step`` by hand: the prompt, then for each step gather by the given parents and feed the tokens;
    returns the logits of every call."""
    out = []
    with torch.inference_mode():
        logits, state = step(step.init_state(ids, mask), np.zeros(ids.shape[0], np.int64))
        out.append(logits.clone())
        for parents, tokens in zip(parents_per_step, tokens_per_step, strict=True):
            state = state.beamkit_select(parents)
            logits, state = step(state, tokens)
            out.append(logits.clone())
    return out, state


@pytest.mark.parametrize("attention", ["gather", "shared-prefix"])
@pytest.mark.parametrize("name", PAGED_MODELS)
def test_logits_equal_the_dense_cache(name, attention):
    model, ids, mask, _, _ = setup(name)
    rng = np.random.default_rng(0)
    rows = [8, 24, 24, 17, 17, 30]  # expansion to 3 beams, forks, rows leaving, a full 30 again
    parents = [np.repeat(np.arange(8), 3)]
    for before, after in zip(rows[1:], rows[2:], strict=False):
        parents.append(np.sort(rng.integers(0, before, after)))
    tokens = [rng.integers(3, VOCAB, len(p)) for p in parents]
    step = bh.DecoderOnlyStep(model, block_size=4, attention=attention)
    paged, state = _logits_of(step, ids, mask, parents, tokens)
    dense, _ = _logits_of(bh.DecoderOnlyStep(model, kv="dense"), ids, mask, parents, tokens)
    assert isinstance(state.cache, PagedCache) and step.pool.attention == attention
    assert len(paged) == len(dense) == 1 + len(parents)
    for p, d in zip(paged, dense, strict=True):
        if attention == "gather":  # the same keys/values in the same layout: bit for bit
            assert torch.equal(p, d)
        else:
            # float32 softmax sums taken in two parts and merged: each attention output within a few ulps
            # (relative 1e-6) of the dense one; through 2 layers into logits of magnitude < 10, 1e-4 absolute
            torch.testing.assert_close(p, d, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------- blocks by hand
def test_beams_share_the_prompt_blocks_and_copy_only_shared_partial_tails():
    model, ids, mask, _, _ = setup("gpt2")
    step = bh.DecoderOnlyStep(model, block_size=4)
    one, keep = ids[:1], mask[:1]  # 7 attended positions: one full block, one holding 3
    with torch.inference_mode():
        _, state = step(step.init_state(one, keep), np.zeros(1, np.int64))
        kv = step.pool.kv
        assert kv.blocks_in_use() == 2
        state = state.beamkit_select(np.zeros(4, np.int64))  # 4 beams: tables forked, nothing copied
        assert kv.blocks_in_use() == 2 and kv.copied_blocks == 0
        _, state = step(state, np.array([5, 6, 7, 8]))  # position 8 fills the shared tail: 3 copies, 1 keeps it
        assert kv.blocks_in_use() == 1 + 4 and kv.copied_blocks == 3  # once for all layers, not per layer
        state = state.beamkit_select(np.array([0, 0, 2, 2]))  # beams 1 and 3 dropped: their tails freed
        assert kv.blocks_in_use() == 1 + 2
        _, state = step(state, np.array([5, 6, 7, 8]))  # length 8 -> 9: a fresh block per row, no copy
        assert kv.blocks_in_use() == 1 + 2 + 4 and kv.copied_blocks == 3
        dense_positions = 4 * 9  # what the dense bridge holds: every row every position
        assert kv.blocks_in_use() < dense_positions / 4
        np.testing.assert_array_equal(state.cache.rows.length, [9, 9, 9, 9])
        del state
    assert kv.blocks_in_use() == 0  # a dropped state gives its blocks back at once


def test_leading_padding_is_not_stored():
    model, ids, mask, _, _ = setup("llama")
    step = bh.DecoderOnlyStep(model, block_size=2)
    with torch.inference_mode():
        _, state = step(step.init_state(ids[:4], mask[:4]), np.zeros(4, np.int64))
    # rows 0-3 have 0, 1, 2, 3 padding columns of 7: 7, 6, 5, 4 positions held, in 4 + 3 + 3 + 2 blocks
    np.testing.assert_array_equal(state.cache.rows.length, [7, 6, 5, 4])
    assert step.pool.kv.blocks_in_use() == 12 and state.cache.length == 7


def test_the_pool_grows_instead_of_failing():
    model, ids, mask, eos, _ = setup("gpt2")
    found = {}
    for kv in ("paged", "dense"):
        step = bh.DecoderOnlyStep(model, kv, block_size=2, blocks=1)
        with torch.inference_mode():
            out = BeamSearch(make_options(8, NEW, policy="pool", num_return=3)).search(
                step, step.init_state(ids, mask), 0, [eos], 8
            )
        found[kv] = out.hypotheses, step.pool
    (paged, pool), (dense, _) = found["paged"], found["dense"]
    assert pool.grown >= 3 and pool.kv.n_blocks > 64
    assert [[h.tokens for h in r] for r in paged] == [[h.tokens for h in r] for r in dense]
    # shared-prefix attention: float32 rounding of the merged softmax, summed over <= 10 steps (see above)
    np.testing.assert_allclose(
        [h.score for r in paged for h in r], [h.score for r in dense for h in r], atol=1e-4, rtol=0
    )
    assert pool.kv.blocks_in_use() == 0


def test_generate_sizes_its_pool_once(steps):
    # hand-worked bound, blocks of 16: prompts of 16 and 17 attended positions take 1 and 2 blocks; each of 4
    # beams at most the blocks of its own tail: ceil((0 + 64) / 16) = 4 and ceil((1 + 64) / 16) = 5 (its copy of
    # the partial prompt block and its new positions): 1 + 16 + 2 + 20
    mask = torch.tensor([[0] + [1] * 16, [1] * 17])
    assert generation.pool_blocks(mask, 4, 64) == 39
    model, ids, mask, eos, pad = setup("gpt2")
    for beams in (1, 4, 8):
        _generate(model, ids, mask, None, pad, beams)  # no eos: every beam runs all NEW steps
        pool = steps[-1].pool
        assert steps[-1].kv == "paged" and pool.grown == 0
        assert pool.kv.n_blocks == generation.pool_blocks(mask, beams, NEW)


def test_grow_keeps_contents_and_handles():
    c = PagedKVCache(1, 2, 3, n_blocks=2, block_size=2)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 2, 3, 3, generator=g), torch.randn(1, 2, 3, 3, generator=g)
    h = c.prefill([k], [v])  # 3 positions: both blocks
    assert c.free_blocks() == 0
    c.grow(5)
    assert c.n_blocks == 5 and c.free_blocks() == 3 and c.blocks_in_use() == 2
    h = h.beamkit_select(np.array([0, 0]))
    h = h.append()  # the shared partial tail is copied into a new block
    h.write(0, torch.zeros(2, 2, 1, 3), torch.zeros(2, 2, 1, 3))
    keys, values = h.read(0)
    torch.testing.assert_close(keys[:, :, :3], k.expand(2, -1, -1, -1), rtol=0, atol=0)
    torch.testing.assert_close(values[:, :, :3], v.expand(2, -1, -1, -1), rtol=0, atol=0)
    assert c.blocks_in_use() == 3
    h.release()
    assert c.blocks_in_use() == 0 and sorted(c._free) == list(range(5))
    with pytest.raises(ValueError, match="n_blocks"):
        c.grow(4)


# ---------------------------------------------------------------------------------------- requests joining
def _alone_dense(model, r, eos, pad):
    out = bh.generate(
        model, r["ids"], r["mask"], num_beams=r["beam_size"], num_return_sequences=min(2, r["beam_size"]),
        max_new_tokens=NEW, early_stopping=True, length_penalty=1.0, eos_token_id=eos, pad_token_id=pad,
        return_dict_in_generate=True, cache_implementation="dynamic",
    )  # fmt: skip
    return out.hypotheses[0]


@pytest.mark.parametrize("attention", ["shared-prefix", "gather"])
@pytest.mark.parametrize("name", PAGED_MODELS)
def test_requests_joining_mid_flight_decode_as_alone_and_free_their_blocks(name, attention):
    model, ids, mask, eos, pad = setup(name)
    model = copy.deepcopy(model)
    model.generation_config = transformers.GenerationConfig()  # no processor: the engine runs none
    rng = np.random.default_rng(3)
    reqs = []
    for i in range(ids.shape[0]):
        cut = int(rng.integers(0, int((mask[i] == 0).sum()) + 1))  # prompts of different widths
        reqs.append(dict(ids=ids[i : i + 1, cut:], mask=mask[i : i + 1, cut:], beam_size=[1, 4, 8][i % 3], at=i))
    step = bh.DecoderOnlyStep(model, block_size=4, attention=attention)
    engine = beamkit.Engine(step, beam_size=1, max_len=NEW, policy="pool")
    ids_of, done, in_use = {}, {}, []
    t = 0
    with torch.inference_mode():
        while len(ids_of) < len(reqs) or not engine.idle:
            for k, r in enumerate(reqs):
                if r["at"] == t:
                    n = r["beam_size"]
                    rid = engine.add(
                        step.init_state(r["ids"], r["mask"]), 0, eos, beam_size=n, num_return=min(2, n),
                        early_stopping=True, length_penalty=1.0,
                    )  # fmt: skip
                    ids_of[rid] = k
            for c in engine.step():
                done[c.request_id] = c
            in_use.append((step.pool.kv.blocks_in_use(), len(done)))
            t += 1
            assert t < 100
    assert step.kv == "paged" and step.pool.attention == attention and any(engine.stats.joined_per_call[1:])
    for rid, k in ids_of.items():
        got, want = done[rid], _alone_dense(model, reqs[k], eos, pad)
        assert got.error is None, got.error
        assert [h.tokens for h in got.hypotheses] == [h.tokens for h in want], k
        # the running batch is wider than the request alone (masked padding columns): float32 sums over more
        # (zero-weight) terms can round differently in the last bits; 1e-5 as in test_hf_join.py
        np.testing.assert_allclose([h.score for h in got.hypotheses], [h.score for h in want], atol=1e-5, rtol=0)
    assert any(b < a and n_b > n_a for (a, n_a), (b, n_b) in zip(in_use, in_use[1:], strict=False))  # freed
    assert step.pool.kv.blocks_in_use() == 0 and not step.pool.kv.refcount.any()


def test_a_join_copies_no_keys_or_values_of_the_running_rows():
    model, ids, mask, _, _ = setup("gpt2")
    step = bh.DecoderOnlyStep(model, block_size=2)
    twin = bh.DecoderOnlyStep(model, block_size=2)
    with torch.inference_mode():
        states = []
        for s in (step, twin):  # the same request in two pools: one joined by another request, one alone
            _, st = s(s.init_state(ids[:1], mask[:1]), np.zeros(1, np.int64))
            st = st.beamkit_select(np.zeros(3, np.int64))
            _, st = s(st, np.array([4, 5, 6]))
            states.append(st)
        running, alone = states
        before = running.cache.rows.table.copy()  # shape: (3, 4): 8 positions in full blocks of 2
        written = step.pool.kv.written_positions
        joining = Prompt(ids[3:4, 2:], mask[3:4, 2:], left=True)  # 5 columns, 1 of them padding
        joined = running.beamkit_concat([joining])
        y = np.array([7, 8, 9, 0])
        logits, merged = step(joined, y)
        want, alone = twin(alone, y[:3])
    table = merged.cache.rows.table
    np.testing.assert_array_equal(table[:3, :4], before)  # the running rows' blocks are untouched
    assert step.pool.kv.written_positions - written == 3 + 4  # one new position per running row, the prompt
    assert merged.length == 9 and list(merged.cache.rows.length) == [9, 9, 9, 4]
    assert merged.per_request["mask"].shape[0] == 4
    torch.testing.assert_close(logits[:3], want, atol=1e-5, rtol=0)  # batch of 4 vs 3: float32 matmul rounding


# ---------------------------------------------------------------------------------------- choosing the cache
def test_models_that_cannot_be_paged_stay_dense():
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, sliding_window=4, pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    model = transformers.MistralForCausalLM(cfg).eval()
    assert bh.DecoderOnlyStep(model).kv == "dense" and bh.DecoderOnlyStep(model).pool is None
    _, ids, mask, _, pad = setup("gpt2")
    hf = model.generate(ids, attention_mask=mask, num_beams=3, max_new_tokens=6, do_sample=False, pad_token_id=pad)
    bk = bh.generate(model, ids, mask, num_beams=3, max_new_tokens=6, pad_token_id=pad)
    assert torch.equal(bk, hf)
    assert bh.DecoderOnlyStep(setup("gpt2")[0], kv="dense").kv == "dense"
    with pytest.raises(ValueError, match="kv"):
        bh.DecoderOnlyStep(model, kv="blocks")
    with pytest.raises(ValueError, match="block_size"):
        bh.DecoderOnlyStep(model, block_size=0)


@pytest.mark.parametrize(
    "implementation,kv", [(None, "paged"), ("paged", "paged"), ("dynamic", "dense"), ("static", "dense")]
)
def test_cache_implementation_chooses_the_cache(implementation, kv):
    model = setup("gpt2")[0]
    gc, rest, given = merge_config(None, model.generation_config, {"cache_implementation": implementation})
    assert resolve(model, gc, rest, given, 7).kv == kv


def test_diverse_and_constrained_search_stay_dense(steps):
    model, ids, mask, eos, pad = setup("gpt2")
    bh.generate(model, ids[:2], mask[:2], num_beams=4, num_beam_groups=2, diversity_penalty=0.5, max_new_tokens=4)
    assert steps[-1].kv == "dense"


def test_served_models_use_the_paged_cache(tmp_path):
    pytest.importorskip("tokenizers")
    from beamkit.adapters import load
    from tests.test_adapters import WORDS, _tokenizer

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=4 + len(WORDS), n_positions=32, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    for implementation, kv in ((None, "paged"), ("dynamic", "dense")):
        folder = tmp_path / str(implementation)
        _tokenizer(folder, False)
        model.generation_config.cache_implementation = implementation
        model.save_pretrained(folder)
        step = load(f"hf:{folder}")._step
        assert step.kv == kv
        assert kv == "dense" or step.pool.attention == "shared-prefix"  # the beams' prompt read once
