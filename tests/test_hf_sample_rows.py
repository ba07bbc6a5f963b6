"""``beamkit.hf.generate(do_sample=True, num_return_sequences=n)`` without beams returns the rows ``model.generate``
returns: ``n`` samples per prompt, side by side (rows ``i * n .. i * n + n - 1`` belong to prompt ``i``).

Oracles: Hugging Face's own shape for the same call, and Hugging Face's own meaning of the setting, checked on
Hugging Face first: with a fixed seed, ``num_return_sequences=n`` gives what the prompts repeated ``n`` times
(``repeat_interleave``) give with ``num_return_sequences=1``. beamkit's engine draws from its own noise (not
Hugging Face's random stream), so its rows are compared with its own decoding of the repeated prompts; a patched
``model.generate`` runs Hugging Face's stream and must equal it token for token.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


IDS = [[5, 6, 7], [8, 9, 10]]
KW = {"do_sample": True, "max_new_tokens": 6, "pad_token_id": 0}


def seeded(fn, *args, **kwargs):
    torch.manual_seed(1234)
    return fn(*args, **kwargs)


@pytest.mark.parametrize("n", [2, 8])
def test_sampling_returns_n_rows_per_prompt_as_model_generate(model, n):
    ids = torch.tensor(IDS)
    mask = torch.ones_like(ids)
    theirs = seeded(model.generate, ids, attention_mask=mask, num_return_sequences=n, **KW)
    repeated = ids.repeat_interleave(n, dim=0)
    # Hugging Face's meaning of the setting: the prompts repeated n times, one sample each
    assert torch.equal(theirs, seeded(model.generate, repeated, attention_mask=torch.ones_like(repeated), **KW))
    ours = seeded(bh.generate, model, ids, mask, num_return_sequences=n, **KW)
    assert ours.shape[0] == theirs.shape[0] == 2 * n
    assert torch.equal(ours[:, :3], repeated)  # row i * n + j continues prompt i
    assert torch.equal(ours, seeded(bh.generate, model, repeated, torch.ones_like(repeated), **KW))
    assert torch.equal(ours, seeded(bh.generate, model, ids, mask, num_return_sequences=n, **KW))  # the seed repeats
    for i in range(2):  # n independent samples of one prompt: not n copies of one
        rows = {tuple(r) for r in ours[i * n : (i + 1) * n, 3:].tolist()}
        assert len(rows) > 1
    out = seeded(bh.generate, model, ids, mask, num_return_sequences=n, return_dict_in_generate=True, **KW)
    assert torch.equal(out.sequences, ours) and len(out.hypotheses) == 2 * n
    with bh.patch(model):
        patched = seeded(model.generate, ids, attention_mask=mask, num_return_sequences=n, **KW)
    assert torch.equal(patched, theirs)


def test_greedy_and_beam_sampling_keep_hugging_faces_bounds(model):
    ids = torch.tensor(IDS)
    with pytest.raises(ValueError, match="num_return_sequences"):
        bh.generate(model, ids, num_return_sequences=3, max_new_tokens=2, pad_token_id=0)  # greedy: one row
    with pytest.raises(ValueError, match="num_return_sequences"):
        bh.generate(model, ids, num_beams=2, num_return_sequences=3, **KW)  # beam sampling: at most the beams
