"""``beamkit.hf.generate(..., allowed_output=...)``: the output layer computed over a dictionary's allowed ids.

Oracles: every dictionary entry scored by teacher forcing with the model's full forward (no cache, no search),
normalised over the whole vocabulary or over the ids the dictionary allows after each prefix (those sets
computed here from the entry list, not from the trie); ``model.generate`` with the same callable; the bridge
without the option. Tolerances: float32 logits, sums of a handful of log-probabilities over V <= 48 ids:
1e-4 absolute is ~100x the rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf  # noqa: E402
from beamkit import Trie  # noqa: E402
from beamkit.hf import Unsupported  # noqa: E402
from beamkit.hf.retrieval.allowed import AllowedOutputStep, _Columns  # noqa: E402
from beamkit.hf.steps.step import DecoderOnlyStep, output_head  # noqa: E402

V, EOS, P = 48, 0, 7


def tiny_model(**extra):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=32, bos_token_id=EOS, eos_token_id=EOS, **extra
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def entries(n, seed=0):
    """``n`` distinct 3-code IDs from small code books (ids 1-6, 10-15, 20-25: the union stays well below V),
    each ending with the stop token."""
    rng = np.random.default_rng(seed)
    got = set()
    while len(got) < n:
        got.add((int(rng.integers(1, 7)), int(rng.integers(10, 16)), int(rng.integers(20, 26)), EOS))
    return sorted(got)


def brute_force(model, prompt, items, normalise):
    """Every item's log-probability given ``prompt`` ``[P]``, by a full forward per prefix: normalised over the
    vocabulary, or over the next ids some item allows after the prefix."""
    out = {}
    with torch.no_grad():
        for item in items:
            total = 0.0
            for k in range(len(item)):
                ids = torch.tensor([list(prompt) + list(item[:k])], device=model.device)
                logits = model(input_ids=ids).logits[0, -1].double()  # shape: (V,)
                if normalise == "vocab":
                    norm = torch.logsumexp(logits, 0)
                else:
                    nxt = sorted({it[k] for it in items if it[:k] == item[:k]})
                    norm = torch.logsumexp(logits[nxt], 0)
                total += float(logits[item[k]] - norm)
            out[tuple(item)] = total
    return out


def decode(model, prompts, trie, width, **kw):
    fn = trie.prefix_allowed_tokens_fn(prompt_len=prompts.shape[1])
    return beamkit.hf.generate(
        model, prompts, prefix_allowed_tokens_fn=fn, num_beams=width, num_return_sequences=width, max_new_tokens=4,
        eos_token_id=EOS, pad_token_id=EOS, length_penalty=0.0, return_dict_in_generate=True, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("normalise", ["vocab", "allowed"])
def test_width_above_the_dictionary_ranks_every_entry_as_brute_force(normalise, device):
    model, items = tiny_model().to(device), entries(18)
    trie = Trie(items, vocab_size=V)
    prompts = torch.randint(1, V, (2, P), generator=torch.Generator().manual_seed(3)).to(device)
    with pytest.warns(UserWarning):  # the dictionary holds fewer entries than the width
        out = decode(model, prompts, trie, 24, allowed_output=normalise)
    for r in range(2):
        truth = brute_force(model, prompts[r].tolist(), items, normalise)
        ranked = sorted(truth, key=lambda it: -truth[it])
        got = out.hypotheses[r]
        assert [tuple(h.tokens) for h in got] == ranked
        assert np.allclose([h.logprob for h in got], [truth[it] for it in ranked], atol=1e-4)


def test_vocab_normalisation_gives_the_scores_of_the_full_output_layer_and_of_model_generate(device):
    model, items = tiny_model().to(device), entries(60, seed=1)
    trie = Trie(items, vocab_size=V)
    prompts = torch.randint(1, V, (3, P), generator=torch.Generator().manual_seed(4)).to(device)
    full = decode(model, prompts, trie, 8)
    part = decode(model, prompts, trie, 8, allowed_output="vocab")
    assert torch.equal(part.sequences, full.sequences)
    for a, b in zip(part.hypotheses, full.hypotheses, strict=True):
        assert np.allclose([h.logprob for h in a], [h.logprob for h in b], atol=1e-5)
    fn = trie.prefix_allowed_tokens_fn(prompt_len=P)
    theirs = model.generate(
        prompts, prefix_allowed_tokens_fn=fn, num_beams=8, num_return_sequences=8, max_new_tokens=4,
        eos_token_id=EOS, pad_token_id=EOS, length_penalty=0.0, attention_mask=torch.ones_like(prompts),
    )  # fmt: skip
    assert torch.equal(part.sequences, theirs)


def test_allowed_normalisation_differs_from_the_vocabulary_one_and_every_output_is_an_entry():
    model, items = tiny_model(), entries(60, seed=2)
    trie = Trie(items, vocab_size=V)
    prompts = torch.randint(1, V, (2, P), generator=torch.Generator().manual_seed(5))
    part = decode(model, prompts, trie, 8, allowed_output="allowed")
    assert all(row in trie for row in part.sequences[:, P:].tolist())
    full = decode(model, prompts, trie, 8)
    # over a row's allowed ids each step's log-probability is larger: the mass off the dictionary is gone
    pairs = [(a, b) for x, y in zip(part.hypotheses, full.hypotheses, strict=True) for a, b in zip(x, y, strict=True)]
    assert all(a.logprob > b.logprob for a, b in pairs)


def test_the_step_computes_only_the_union_of_the_rows_allowed_ids():
    model, items = tiny_model(), entries(30, seed=3)
    trie = Trie(items, vocab_size=V)
    prompts = torch.randint(1, V, (2, P), generator=torch.Generator().manual_seed(6))
    from beamkit.hf.steps.step import DecoderOnlyStep

    step = AllowedOutputStep(DecoderOnlyStep(model, kv="dense"), model, trie, (EOS,), "allowed")
    state = step.init_state(prompts, torch.ones_like(prompts))
    seen = []
    original = _Columns.forward

    def spy(self, hidden):
        out = original(self, hidden)
        seen.append(out.shape[-1])
        return out

    _Columns.forward = spy
    try:
        with torch.inference_mode():
            logp, state, extras = step(state, np.full(2, EOS))
    finally:
        _Columns.forward = original
    roots = sorted({it[0] for it in items})
    assert seen == [len(roots)] and extras == {"log_softmax": False}
    assert torch.isinf(logp[:, [t for t in range(V) if t not in roots]]).all()
    assert torch.allclose(torch.logsumexp(logp.double(), 1), torch.zeros(2, dtype=torch.float64), atol=1e-6)
    assert isinstance(model.lm_head, torch.nn.Linear)  # the model's own head is back


def test_the_head_is_never_replaced_and_ends_with_its_block_even_when_the_forward_fails():
    """The narrowed output layer runs on a view of the model: ``model.lm_head`` stays the model's own inside the
    block, and after a failure inside it the steps compute the whole vocabulary again (oracle: the model's own
    forward)."""
    model = tiny_model()
    head = model.lm_head
    ids, mask = torch.tensor([[3, 4, 5]]), torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(RuntimeError), output_head(_Columns(head, torch.tensor([1, 2]))):
        step = DecoderOnlyStep(model, kv="dense")
        narrow, _ = step(step.init_state(ids, mask), None)
        assert model.lm_head is head and narrow.shape == (1, 2)
        raise RuntimeError("boom")
    assert model.lm_head is head
    step = DecoderOnlyStep(model, kv="dense")
    full, _ = step(step.init_state(ids, mask), None)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits[:, -1, :]
    # float32 logits of size ~1 over sums of 32 products: the two calls may round in another order (~1e-7 each)
    torch.testing.assert_close(full, want, rtol=0, atol=1e-5)


def test_bad_input():
    model, items = tiny_model(), entries(10)
    trie = Trie(items, vocab_size=V)
    prompts = torch.randint(1, V, (1, P), generator=torch.Generator().manual_seed(7))
    fn = trie.prefix_allowed_tokens_fn(prompt_len=P)
    kw = dict(num_beams=4, max_new_tokens=4, eos_token_id=EOS, pad_token_id=EOS)
    with pytest.raises(ValueError, match="needs prefix_allowed_tokens_fn"):
        beamkit.hf.generate(model, prompts, allowed_output="vocab", **kw)
    with pytest.raises(ValueError, match="allowed_output"):
        beamkit.hf.generate(model, prompts, prefix_allowed_tokens_fn=fn, allowed_output="union", **kw)
    with pytest.raises(Unsupported, match="engine only"):  # per-step score tables come from the loop
        beamkit.hf.generate(
            model, prompts, prefix_allowed_tokens_fn=fn, allowed_output="vocab", output_scores=True,
            return_dict_in_generate=True, **kw,
        )  # fmt: skip
    capped = tiny_model()
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(Unsupported, match="final_logit_softcapping"):
        beamkit.hf.generate(capped, prompts, prefix_allowed_tokens_fn=fn, allowed_output="allowed", **kw)


@pytest.mark.parametrize("normalise", ["vocab", "allowed"])
def test_greedy_decoding_gives_model_generates_ids(normalise, device):
    """One row per request: normalising over the row's allowed ids does not move its best id, so both modes pick
    what ``model.generate`` picks with the same callable."""
    model, items = tiny_model().to(device), entries(60, seed=4)
    trie = Trie(items, vocab_size=V)
    prompts = torch.randint(1, V, (3, P), generator=torch.Generator().manual_seed(8)).to(device)
    fn = trie.prefix_allowed_tokens_fn(prompt_len=P)
    kw = dict(
        num_beams=1, max_new_tokens=4, eos_token_id=EOS, pad_token_id=EOS, attention_mask=torch.ones_like(prompts)
    )
    theirs = model.generate(prompts, prefix_allowed_tokens_fn=fn, **kw)
    mine = beamkit.hf.generate(model, prompts, prefix_allowed_tokens_fn=fn, allowed_output=normalise, **kw)
    assert torch.equal(mine, theirs)
