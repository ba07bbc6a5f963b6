"""beamkit.hf leaves the caller's model as it was given: its ``__dict__``, its config (``to_dict()`` and
``__dict__``), its generation config and every module's attributes are the same objects with the same values
before and after every public call (greedy, beam search on the dense and the paged cache, sampling, the loop,
``compile=``, the output layer over a dictionary, ``patch``), and a second thread using the model meanwhile never
sees anything changed. Oracle: a snapshot taken before the call (identities of every attribute, values of plain
ones, the weights' values), compared field by field."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from beamkit import Trie  # noqa: E402

V, EOS = 40, 0
PLAIN = (int, float, str, bool, type(None), bytes)


def tiny_model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=64, bos_token_id=EOS, eos_token_id=EOS
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def _value(v):
    """A plain value as it is, a dict by its items (each by identity or value), anything else by identity."""
    if isinstance(v, PLAIN):
        return v
    if isinstance(v, dict):
        return {k: (x if isinstance(x, PLAIN) else ("object", id(x))) for k, x in v.items()}
    return ("object", id(v))


def snapshot(model):
    """Everything a call could have written onto the model."""
    return {
        "modules": {name: {k: _value(v) for k, v in vars(m).items()} for name, m in model.named_modules()},
        "config": (model.config.to_dict(), {k: _value(v) for k, v in vars(model.config).items()}),
        "generation_config": model.generation_config.to_dict(),
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
    }


def same(before, after):
    assert before["modules"] == after["modules"]
    assert before["config"] == after["config"]
    assert before["generation_config"] == after["generation_config"]
    assert before["weights"].keys() == after["weights"].keys()
    assert all(torch.equal(before["weights"][k], after["weights"][k]) for k in before["weights"])


def prompts():
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    return ids, torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])


def dictionary():
    items = [(3, 11, 21, EOS), (3, 12, 22, EOS), (4, 13, 23, EOS), (5, 11, 24, EOS)]
    return Trie(items, vocab_size=V)


KW = dict(max_new_tokens=6, eos_token_id=EOS, pad_token_id=EOS)
CALLS = {
    "greedy": dict(num_beams=1),
    "beam, dense": dict(num_beams=3, cache_implementation="dynamic"),
    "beam, paged": dict(num_beams=3, cache_implementation="paged"),
    "sampling": dict(num_beams=1, do_sample=True, top_k=5),
    "the loop (per-step scores)": dict(num_beams=3, output_scores=True, return_dict_in_generate=True),
    "compile=": dict(num_beams=3, compile="eager"),
    "allowed output": dict(num_beams=3, allowed_output="allowed"),
    "allowed output, vocab": dict(num_beams=3, allowed_output="vocab"),
    "dictionary in the loop": dict(num_beams=3, output_scores=True, return_dict_in_generate=True),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_generate_leaves_the_model_as_it_was(name):
    model, (ids, mask) = tiny_model(), prompts()
    kw = dict(KW, **CALLS[name])
    if "allowed" in name or "dictionary" in name:
        kw["prefix_allowed_tokens_fn"] = dictionary().prefix_allowed_tokens_fn(prompt_len=ids.shape[1])
    before = snapshot(model)
    torch.manual_seed(1)
    bh.generate(model, ids, mask, **kw)
    bh.generate(model, ids, mask, **kw)  # a second call reuses what the first kept (compiled graphs, views)
    same(before, snapshot(model))


def test_patch_writes_generate_only_and_undo_restores_everything():
    """A patch is the one call that changes the model, by design and by name: ``model.generate``; the calls it
    serves change nothing more, and ``undo`` leaves the model as it was."""
    model, (ids, mask) = tiny_model(), prompts()
    before = snapshot(model)
    with bh.patch(model):
        patched = snapshot(model)
        assert set(patched["modules"][""]) - set(before["modules"][""]) == {"generate"}
        for kw in (dict(num_beams=1), dict(num_beams=3), dict(num_beams=1, compile="eager")):
            model.generate(ids, attention_mask=mask, **KW, **kw)
        same(patched, snapshot(model))
    same(before, snapshot(model))


def test_a_second_thread_never_sees_a_change_while_beamkit_decodes():
    """While one thread decodes with the narrowed output layer and the paged cache's attention, another reads
    the model's output layer, config and attributes and runs its forward: always the model's own (the whole
    vocabulary, the logits of a model that was never touched)."""
    model, (ids, mask) = tiny_model(), prompts()
    head, config_dict, top = model.lm_head, dict(vars(model.config)), dict(vars(model))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    fn = dictionary().prefix_allowed_tokens_fn(prompt_len=ids.shape[1])
    done, seen = threading.Event(), []

    def decode():
        try:
            for _ in range(4):
                bh.generate(model, ids, mask, num_beams=3, prefix_allowed_tokens_fn=fn, allowed_output="allowed", **KW)
                bh.generate(model, ids, mask, num_beams=3, cache_implementation="paged", **KW)
        finally:
            done.set()

    worker = threading.Thread(target=decode)
    worker.start()
    while not done.is_set() or not seen:
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask).logits
        untouched = model.lm_head is head and vars(model.config) == config_dict and vars(model) == top
        seen.append(untouched and torch.equal(got, want))
    worker.join()
    assert all(seen), f"{seen.count(False)} of {len(seen)} reads saw a changed model"


@pytest.mark.parametrize(
    ("make", "way"),
    [
        (dict(kv="paged"), "paged"),
        (dict(kv="dense"), "direct"),
        (dict(kv="dense", direct=False), "model"),
        (dict(kv="dense", compile="eager"), "compiled"),
    ],
)
def test_a_decoding_step_decides_its_way_once_and_leaves_its_input_state_as_it_was(make, way):
    """``DecoderOnlyStep.path`` names the way the documented rules give (the prompt: a model call; then the paged
    forward, the direct step, the model's forward, the compiled step), and a step returns a new state record:
    the one it was given keeps its cache, length, buffers and rows (oracle: a snapshot of them)."""
    model, (ids, mask) = tiny_model(), prompts()
    step = bh.DecoderOnlyStep(model, **make)
    state = step.init_state(ids, mask)
    assert step.path(state).kind == "prompt"
    _, state = step(state, None)
    for token in (3, 4):
        assert step.path(state).kind == way, step.path(state)
        before = (state.cache, state.length, state.per_request, dict(state.per_request), state.row_request)
        _, new = step(state, torch.full((2,), token))
        after = (state.cache, state.length, state.per_request, dict(state.per_request), state.row_request)
        assert new is not state and new.length == state.length + 1
        assert before[0] is after[0] and before[1] == after[1] and before[2] is after[2]
        assert before[3].keys() == after[3].keys() and all(before[3][k] is after[3][k] for k in before[3])
        assert before[4] is after[4]
        state = new


def test_a_forward_that_recomputes_its_rotary_frequencies_writes_them_into_the_view_only():
    """A Llama with dynamic rotary scaling recomputes (re-registers) its ``inv_freq`` buffer once the sequence
    passes ``max_position_embeddings``. Decoding on the paged cache runs the forward on a view of the model: the
    recomputed buffer must land in the view's own table, and the caller's rotary module keep its buffer and its
    cached length together (a shared buffer table would leave it with new frequencies and its old length)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
        bos_token_id=EOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    rotary = model.model.rotary_emb
    freq, length = rotary.inv_freq, rotary.max_seq_len_cached
    before = snapshot(model)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.inference_mode():  # 6 prompt + 8 new tokens: past the 8 positions the frequencies were made for
        bh.generate(model, ids, num_beams=2, max_new_tokens=8, min_new_tokens=8, cache_implementation="paged")
    same(before, snapshot(model))
    assert rotary.inv_freq is freq and rotary.max_seq_len_cached == length
