"""Shared-prefix attention for Hugging Face decoder-only models (the paged step's default) on tiny seeded models.

Oracles, none of them the shared-prefix code: ``model.generate`` itself; beamkit's gathering paged step
(``attention="gather"``: every row's keys/values copied out and attended by the model's own SDPA, bit-identical
to Hugging Face's dense cache, see test_hf_paged.py); each request decoded alone; byte counts worked out by hand.

Tolerances: scores are sums of <= 10 float32 log-probabilities of magnitude < 10; the shared-prefix softmax
sums its prefix and tail apart and merges them, so each attention output is within a few float32 ulps
(relative 6e-8 each) of the one-pass softmax, and the logits after 2 layers within ~1e-5: 1e-4 on the sums, as
test_hf.py allows against Hugging Face's float32 sums. Hypotheses are compared exactly except at a near-tie
(two candidates whose scores differ by less than that tolerance may swap places at the n-best's edge): such
differences are counted and must stay below 5 % of the n-best.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit  # noqa: E402
import beamkit.hf as bh  # noqa: E402
import beamkit.hf.bridge.generation as generation  # noqa: E402
from beamkit.hf.steps.paged import PagedCache  # noqa: E402
from tests.test_hf import VOCAB, setup  # noqa: E402
from tests.test_hf_paged import NEW, _generate  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOL = 1e-4


@pytest.fixture
def attention(monkeypatch):
    """Set how the DecoderOnlyStep objects beamkit.hf.generate makes attend; they are recorded in ``made``."""
    made = []
    chosen = {"attention": "shared-prefix"}

    class Chosen(bh.DecoderOnlyStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, attention=chosen["attention"], **kwargs)
            made.append(self)

    monkeypatch.setattr(generation, "DecoderOnlyStep", Chosen)

    def use(name):
        chosen["attention"] = name
        return made

    return use


def _nbest(seqs, scores, width):
    """Per request, the list of (tokens, score) in output order."""
    seqs, scores = seqs.tolist(), scores.tolist()
    return [
        list(zip(map(tuple, seqs[i : i + width]), scores[i : i + width], strict=True))
        for i in range(0, len(seqs), width)
    ]


def _compare(got, want, tol=TOL):
    """Same hypotheses with scores within ``tol``, except near-ties at the n-best's edge; returns how many differ."""
    differ = 0
    for g, w in zip(got, want, strict=True):
        assert g[0][0] == w[0][0] or abs(g[0][1] - g[1][1]) < tol, "top-1 differs without a near-tie"
        gd, wd = dict(g), dict(w)
        edge = min(min(gd.values()), min(wd.values()))
        for tokens in gd.keys() & wd.keys():
            assert abs(gd[tokens] - wd[tokens]) < tol, tokens
        for tokens, score in [(t, gd[t]) for t in gd.keys() - wd.keys()] + [(t, wd[t]) for t in wd.keys() - gd.keys()]:
            assert score < edge + tol, f"{tokens} ({score}) is not at the n-best's edge ({edge})"
            differ += 1
        np.testing.assert_allclose([s for _, s in g], [s for _, s in w], atol=tol, rtol=0)
    return differ


# ---------------------------------------------------------------------------------------- against the peers
@pytest.mark.parametrize(
    "width,device",
    [(w, d) for w in (1, 2, 16, 128, 512) for d in (("cpu", "cuda") if w in (2, 128) else ("cpu",))],
    indirect=["device"],
)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_wide_beams_equal_the_gathering_path_and_model_generate(name, width, attention, device):
    model, ids, mask, eos, pad = setup(name, device)
    ids, mask = ids[[0, 3]], mask[[0, 3]]  # one unpadded prompt, one with 3 columns of left padding
    kw = dict(num_beams=width, num_return_sequences=width, eos_token_id=eos, pad_token_id=pad)
    hf = model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True,
        output_scores=True, **kw,
    )  # fmt: skip
    made = attention("gather")
    gathered = _generate(model, ids, mask, eos, pad, width, num_return_sequences=width)
    attention("shared-prefix")
    shared = _generate(model, ids, mask, eos, pad, width, num_return_sequences=width)
    assert [s.pool.attention for s in made] == ["gather", "shared-prefix"]
    if width == 1:
        assert torch.equal(shared.sequences, hf.sequences) and torch.equal(shared.sequences, gathered.sequences)
        return
    g = _nbest(shared.sequences, shared.sequences_scores, width)
    differ = _compare(g, _nbest(gathered.sequences, gathered.sequences_scores, width))
    differ += _compare(g, _nbest(hf.sequences, hf.sequences_scores, width))
    assert differ <= 0.05 * 2 * 2 * width
    pool = made[-1].pool.kv
    assert pool.blocks_in_use() == 0 and not pool.refcount.any()  # every beam finished and gave its blocks back


def test_logits_of_wide_forking_beams_equal_the_gathering_path(device):
    # a request of 60 prompt tokens forked to 256 beams, then random forks: every step's logits within 1e-4
    model, _, _, _, _ = setup("llama", device)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, VOCAB, (2, 60), generator=gen).to(device)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    rng = np.random.default_rng(1)
    parents = [np.repeat([0, 1], [256, 3])]
    for before, after in ((259, 259), (259, 200), (200, 300)):
        parents.append(np.sort(rng.integers(0, before, after)))
    tokens = [rng.integers(3, VOCAB, len(p)) for p in parents]
    out = {}
    for how in ("gather", "shared-prefix"):
        step = bh.DecoderOnlyStep(model, block_size=4, attention=how)
        logits = []
        with torch.inference_mode():
            got, state = step(step.init_state(ids, mask), np.zeros(2, np.int64))
            for p, t in zip(parents, tokens, strict=True):
                got, state = step(state.beamkit_select(p), t)
                logits.append(got.clone())
        assert isinstance(state.cache, PagedCache) and step.pool.attention == how
        out[how] = logits
    for a, b in zip(out["gather"], out["shared-prefix"], strict=True):
        torch.testing.assert_close(b, a, atol=TOL, rtol=0)


# ---------------------------------------------------------------------------------------- requests joining
def test_wide_requests_joining_a_running_engine_decode_as_alone(device):
    model, ids, mask, eos, pad = setup("gpt2", device)
    model = copy.deepcopy(model)
    model.generation_config = transformers.GenerationConfig()  # no processor: the engine runs none
    reqs = [(0, 64, 0), (3, 3, 1), (5, 128, 2), (6, 1, 2)]  # (prompt row, width, step it joins at)
    step = bh.DecoderOnlyStep(model, block_size=4)
    engine = beamkit.Engine(step, beam_size=1, max_len=NEW, policy="pool")
    rid_of, done, t = {}, {}, 0
    with torch.inference_mode():
        while len(rid_of) < len(reqs) or not engine.idle:
            for k, (row, width, at) in enumerate(reqs):
                if at == t:
                    state = step.init_state(ids[row : row + 1], mask[row : row + 1])
                    rid_of[engine.add(state, 0, eos, beam_size=width, num_return=width, early_stopping=True)] = k
            for c in engine.step():
                done[c.request_id] = c
            t += 1
    assert step.pool.attention == "shared-prefix" and any(engine.stats.joined_per_call[1:])
    differ = 0
    for rid, k in rid_of.items():
        row, width, _ = reqs[k]
        alone = bh.generate(
            model, ids[row : row + 1], mask[row : row + 1], num_beams=width, num_return_sequences=width,
            max_new_tokens=NEW, early_stopping=True, eos_token_id=eos, pad_token_id=pad, return_dict_in_generate=True,
            cache_implementation="dynamic",
        )  # fmt: skip
        got = [(tuple(h.tokens), h.score) for h in done[rid].hypotheses]
        want = [(tuple(h.tokens), h.score) for h in alone.hypotheses[0]]
        differ += _compare([got], [want])
    assert differ <= 0.05 * sum(w for _, w, _ in reqs)
    assert step.pool.kv.blocks_in_use() == 0


# ---------------------------------------------------------------------------------------- no per-row copies
class _Copies:
    """Counts the bytes of the tensors index_select / gather / take_along_dim make while active."""

    NAMES = ("index_select", "gather", "take_along_dim")

    def __init__(self, monkeypatch):
        self.bytes = 0
        for owner in (torch, torch.Tensor):
            for name in self.NAMES:
                monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))
        self.on = False

    def _wrap(self, fn):
        def counted(*args, **kwargs):
            out = fn(*args, **kwargs)
            if self.on:
                self.bytes += out.numel() * out.element_size()
            return out

        return counted


@pytest.mark.parametrize("how", ["gather", "shared-prefix"])
def test_no_per_row_copy_of_the_shared_prompt(how, monkeypatch):
    # GPT-2 of 2 layers, 2 heads of 16; one request of 60 prompt tokens in blocks of 4 (15 full blocks), 64 beams
    model, _, _, _, _ = setup("gpt2")
    ids = torch.randint(3, VOCAB, (1, 60), generator=torch.Generator().manual_seed(2))
    step = bh.DecoderOnlyStep(model, block_size=4, attention=how)
    copies = _Copies(monkeypatch)
    with torch.inference_mode():
        _, state = step(step.init_state(ids, torch.ones_like(ids)), np.zeros(1, np.int64))
        state = state.beamkit_select(np.zeros(64, np.int64))
        copies.on = True
        step(state, np.arange(64) % VOCAB)  # position 61: each beam's own new block, the prompt's 15 shared
        copies.on = False
    per_position = 2 * 2 * 2 * 16 * 4  # keys and values, 2 layers, 2 heads, 16 floats of 4 bytes
    if how == "gather":  # every beam's 61 positions copied out (the baseline this attention avoids)
        assert copies.bytes >= 64 * 61 * per_position
    else:  # hand-worked: 60 = 15 full blocks shared in place; each beam's tail is its newest position only
        assert copies.bytes == 64 * 1 * per_position


# ---------------------------------------------------------------------------------------- fallback
def test_a_model_whose_layers_bypass_the_registry_is_decoded_gathered(attention):
    model, ids, mask, eos, pad = setup("gpt2")
    model = copy.deepcopy(model)
    for block in model.transformer.h:  # the attention modules read a configuration of their own
        block.attn.config = copy.deepcopy(model.config)
    made = attention("shared-prefix")
    shared = _generate(model, ids, mask, eos, pad, 4)
    hf = model.generate(
        ids, attention_mask=mask, num_beams=4, max_new_tokens=10, do_sample=False, eos_token_id=eos,
        pad_token_id=pad, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    assert made[0].pool.attention == "gather"  # noticed at the first step, which ran again gathered
    assert torch.equal(shared.sequences, hf.sequences)
    assert torch.allclose(shared.sequences_scores, hf.sequences_scores, atol=TOL, rtol=0)
    assert model.config._attn_implementation == "sdpa"  # the model's own setting is back


def test_bad_attention_names_are_refused():
    with pytest.raises(ValueError, match="attention"):
        bh.DecoderOnlyStep(setup("gpt2")[0], attention="flash")
