"""A dictionary-constrained ``generate`` that cannot go on says what happened and what to pass.

Two ways a :class:`beamkit.Trie`'s ``prefix_allowed_tokens_fn`` leaves a beam with nothing allowed: the dictionary
holds fewer continuations than beams (Hugging Face keeps a beam running after its entry ended), or the callable
was made for another prompt width (it reads the wrong tokens). Oracle: Hugging Face's own ``model.generate``
with the same callable raises on the same call (so raising is right), and following the advice gives
``model.generate``'s own output.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from beamkit import Trie  # noqa: E402

EOS = 2
ENTRIES = [[10, 11, EOS], [12, EOS], [13, 14, 15, EOS], [16, 17, EOS], [18, EOS], [19, 20, EOS]]
IDS = [[5, 6, 7]]
KW = {"max_new_tokens": 6, "pad_token_id": 0}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32, bos_token_id=1, eos_token_id=EOS, pad_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def errors(model, fn, **kw):
    """The error of Hugging Face's own generate, the patched one's and beamkit.hf.generate's for one call."""
    ids = torch.tensor(IDS)
    out = []
    for run in ("theirs", "patched", "ours"):
        with pytest.raises(ValueError) as err:
            if run == "theirs":
                model.generate(ids, prefix_allowed_tokens_fn=fn, **KW, **kw)
            elif run == "patched":
                with bh.patch(model):
                    model.generate(ids, prefix_allowed_tokens_fn=fn, **KW, **kw)
            else:
                bh.generate(model, ids, prefix_allowed_tokens_fn=fn, **KW, **kw)
        out.append(str(err.value))
    return out


def test_fewer_entries_than_beams_says_so_and_what_to_pass(model):
    trie = Trie(ENTRIES[:3])  # 3 entries, 5 beams: a beam ends up past its whole entry
    fn = trie.prefix_allowed_tokens_fn(prompt_len=3)
    theirs, patched = errors_beam(model, fn)
    assert "empty list" in theirs  # Hugging Face raises too
    assert "without a stop token" not in patched
    assert "holds a whole entry" in patched and "num_beams=5" in patched and "eos_token_id=" in patched
    # the advice: the stop token allowed after an entry; then the call runs, as model.generate runs it
    fixed = trie.prefix_allowed_tokens_fn(prompt_len=3, eos_token_id=EOS)
    ids = torch.tensor(IDS)
    want = model.generate(ids, prefix_allowed_tokens_fn=fixed, num_beams=5, **KW)
    with bh.patch(model):
        assert torch.equal(model.generate(ids, prefix_allowed_tokens_fn=fixed, num_beams=5, **KW), want)


def errors_beam(model, fn):
    """Hugging Face's and the patched generate's errors for beam search (beamkit.hf.generate decodes it on the
    engine, where a beam with nothing allowed simply ends: no error there)."""
    ids = torch.tensor(IDS)
    with pytest.raises(ValueError) as theirs:
        model.generate(ids, prefix_allowed_tokens_fn=fn, num_beams=5, **KW)
    with bh.patch(model), pytest.raises(ValueError) as patched:
        model.generate(ids, prefix_allowed_tokens_fn=fn, num_beams=5, **KW)
    return str(theirs.value), str(patched.value)


@pytest.mark.parametrize("prompt_len", [4, 5])
def test_a_callable_for_another_prompt_width_says_which_width_to_pass(model, prompt_len):
    fn = Trie(ENTRIES).prefix_allowed_tokens_fn(prompt_len=prompt_len)
    theirs, patched, ours = errors(model, fn, num_beams=3)
    assert "empty list" in theirs  # Hugging Face raises too
    for message in (patched, ours):
        assert "without a stop token" not in message
        assert f"prompt_len={prompt_len}" in message and "prompt_len=3)" in message, message
    fixed = Trie(ENTRIES).prefix_allowed_tokens_fn(prompt_len=3, eos_token_id=EOS)  # (and a stop token after each)
    ids = torch.tensor(IDS)
    want = model.generate(ids, prefix_allowed_tokens_fn=fixed, num_beams=3, **KW)
    with bh.patch(model):
        assert torch.equal(model.generate(ids, prefix_allowed_tokens_fn=fixed, num_beams=3, **KW), want)
