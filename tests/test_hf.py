"""beamkit.hf.generate against transformers' own model.generate on tiny random models (offline).

Expected values come from ``model.generate`` (the peer implementation); beamkit must return identical
``sequences`` and ``sequences_scores`` within 1e-4. Models are built from configs with ``torch.manual_seed``; the
eos id is chosen from the model's own next-token distribution so that eos actually fires and the early-stopping
rules are exercised. The full matrix is marked ``slow`` (still run in CI); a diagonal runs by default.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402

VOCAB = 48
MODELS = ("gpt2", "llama", "t5", "bart")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config_model(name: str):
    """A tiny random model of the given family (seeded)."""
    torch.manual_seed(0)
    t = transformers
    if name == "gpt2":
        cfg = t.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=64,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            initializer_range=0.1,
        )
        return t.GPT2LMHeadModel(cfg)
    if name == "llama":
        cfg = t.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            initializer_range=0.1,
        )
        return t.LlamaForCausalLM(cfg)
    if name == "t5":
        cfg = t.T5Config(
            num_layers=2,
            num_decoder_layers=2,
            d_model=32,
            d_ff=64,
            d_kv=8,
            num_heads=4,
            vocab_size=VOCAB,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
        return t.T5ForConditionalGeneration(cfg)
    cfg = t.BartConfig(
        encoder_layers=2,
        decoder_layers=2,
        d_model=32,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
        init_std=0.1,
    )
    return t.BartForConditionalGeneration(cfg)


def left_padded_prompts(pad: int, high: int):
    """(input_ids [8, 7] of ids 3 .. high - 1 drawn with seed 1, attention_mask): row i left-padded by i % 4."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, high, (8, 7), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(8):
        ids[i, : i % 4] = pad
        mask[i, : i % 4] = 0
    return ids, mask


def setup(name: str, device=None):
    """(model, input_ids [8, 7] left-padded, attention_mask, eos, pad) with an eos the model likes, on ``device``
    (default: the CPU): the CPU's model and inputs, copied there."""
    if device is None or torch.device(device).type == "cpu":
        return _setup_cpu(name)
    return _setup_on(name, str(device))


@functools.cache
def _setup_on(name: str, device: str):
    """:func:`setup` on ``device``: the CPU's model (the same weights and eos) and inputs moved there."""
    model, ids, mask, eos, pad = _setup_cpu(name)
    return copy.deepcopy(model).to(device), ids.to(device), mask.to(device), eos, pad


@functools.cache
def _setup_cpu(name: str):
    """:func:`setup` on the CPU."""
    model = _config_model(name).eval()
    pad = int(model.config.pad_token_id)
    ids, mask = left_padded_prompts(pad, VOCAB)
    # eos: the most likely token on average after the first greedy steps (fires often, not always)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            pad_token_id=pad,
            forced_eos_token_id=None,
            return_dict_in_generate=True,
            output_logits=True,
        )
        probs = torch.stack([lg.float().softmax(-1) for lg in out.logits]).mean(dim=(0, 1))
    special = {pad, int(getattr(model.config, "decoder_start_token_id", None) or pad)}
    ranked = [int(t) for t in probs.argsort(descending=True) if int(t) not in special]
    eos = ranked[0]
    with torch.no_grad():  # sharpen the eos logit: large where it was positive, so eos wins in some contexts
        model.get_output_embeddings().weight[eos] *= 2.0
    model.generation_config.eos_token_id = eos
    if name == "bart":
        model.generation_config.forced_eos_token_id = eos
    return model, ids, mask, eos, pad


def engine_generate(model, *args, **kw):
    """beamkit.hf.generate on the engine bridge alone: a call asking for per-step scores is not handed to the
    loop (beamkit.hf.generate does that, since only the loop keeps Hugging Face's tables), so that the bridge's
    sequences_scores are what is compared."""
    from beamkit.hf.bridge.generation import prepare

    inputs, second = (list(args) + [None, None])[:2]
    return prepare(model, inputs, second, kw, exact_only=False)()


def full(model, *args, **kw):
    """The engine bridge asking for the output object with sequences_scores (as the peer calls below do)."""
    return engine_generate(model, *args, return_dict_in_generate=True, output_scores=True, **kw)


def check(name: str, batch: int, device=None, **kw):
    """Run both (on ``device``, default the CPU) and compare sequences exactly, scores within 1e-4; return
    beamkit's output."""
    model, ids, mask, eos, pad = setup(name, device)
    ids, mask = ids[-batch:], mask[-batch:]  # batch 1 is a left-padded row too
    kw.setdefault("max_new_tokens", 10)
    hf = model.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
        return_dict_in_generate=True,
        output_scores=True,
        **kw,
    )
    bk = full(model, ids, mask, eos_token_id=eos, pad_token_id=pad, **kw)
    assert bk.sequences.shape == hf.sequences.shape, (bk.sequences, hf.sequences)
    assert torch.equal(bk.sequences, hf.sequences), (bk.sequences, hf.sequences)
    if kw.get("num_beams", 1) > 1:
        assert torch.allclose(bk.sequences_scores, hf.sequences_scores, atol=1e-4, rtol=0)
    return bk, hf


COMBOS = list(itertools.product(MODELS, (1, 8), (1, 3, 5), (True, False, "never"), (0.0, 1.0, 2.0)))


def _fast(combo) -> bool:
    name, batch, beams, es, lp = combo
    if batch != 8:
        return False
    if beams == 5:
        return True
    return beams == 3 and lp == 1.0 and es is False or beams == 1 and lp == 1.0 and es is False


def _devices(combo) -> tuple[str, ...]:
    """The devices a combination runs on: the fast greedy and beam-3 ones on cpu and cuda, the rest on the CPU."""
    name, batch, beams, es, lp = combo
    return ("cpu", "cuda") if _fast(combo) and beams in (1, 3) else ("cpu",)


PARAMS = [
    pytest.param(d, *c, marks=() if _fast(c) else pytest.mark.slow, id="-".join(map(str, (d, *c))))
    for c in COMBOS
    for d in _devices(c)
]


@pytest.mark.parametrize("device,name,batch,beams,early_stopping,lp", PARAMS, indirect=["device"])
def test_matches_hf(name, batch, beams, early_stopping, lp, device):
    bk, _ = check(
        name,
        batch,
        device,
        num_beams=beams,
        early_stopping=early_stopping,
        length_penalty=lp,
        num_return_sequences=min(2, beams),
    )
    if batch == 8 and beams > 1:
        # eos fired somewhere, so early stopping really was exercised
        assert any(h.finished for hyps in bk.hypotheses for h in hyps)


@pytest.mark.parametrize("name", MODELS)
def test_no_repeat_ngram_and_all_returns(name, device):
    bk, _ = check(
        name,
        8,
        device,
        num_beams=4,
        num_return_sequences=4,
        no_repeat_ngram_size=2,
        early_stopping=False,
        length_penalty=1.0,
        max_new_tokens=12,
    )
    # defining property, independently of HF: no 2-gram repeats inside the generated part
    for hyps in bk.hypotheses:
        for h in hyps:
            grams = list(zip(h.tokens, h.tokens[1:], strict=False))
            assert len(grams) == len(set(grams))


@pytest.mark.parametrize("name", MODELS)
def test_min_new_tokens(name):
    bk, _ = check(name, 8, num_beams=3, min_new_tokens=4, early_stopping=True, length_penalty=1.0)
    assert all(len(h.tokens) >= 5 or not h.finished for hyps in bk.hypotheses for h in hyps)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_ngram_min_and_returns_batch1(name):
    check(
        name,
        1,
        num_beams=5,
        num_return_sequences=3,
        no_repeat_ngram_size=3,
        min_new_tokens=2,
        early_stopping="never",
        length_penalty=2.0,
        max_new_tokens=12,
    )


def test_prompt_runs_once_and_finished_requests_leave():
    model, ids, mask, eos, pad = setup("gpt2")
    calls = []

    def pre(mod, args, kwargs):
        calls.append(tuple((kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape))

    handle = model.transformer.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        out = full(
            model,
            ids,
            mask,
            num_beams=5,
            max_new_tokens=10,
            early_stopping=True,
            length_penalty=1.0,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    finally:
        handle.remove()
    assert calls[0] == (8, 7)  # the prompt: one row per request, not 8 * num_beams
    assert all(c[1] == 1 for c in calls[1:])
    assert calls[1][0] == 40
    rows = out.stats.rows_per_call
    assert rows[0] == 8 and min(rows) < 40  # some request finished and left the batch


def test_encoder_runs_once_per_request():
    model, ids, mask, eos, pad = setup("t5")
    seen = []

    def pre(mod, args, kwargs):
        seen.append(tuple((kwargs["input_ids"] if "input_ids" in kwargs else args[0]).shape))

    handle = model.get_encoder().register_forward_pre_hook(pre, with_kwargs=True)
    try:
        full(model, ids, mask, num_beams=5, max_new_tokens=6, eos_token_id=eos, pad_token_id=pad)
    finally:
        handle.remove()
    assert seen == [(8, 7)]


def test_cross_cache_not_gathered_while_layout_is_stable():
    from beamkit.hf.steps.step import CacheRows

    class Rec:
        def __init__(self):
            self.n = 0

        def reorder_cache(self, idx):
            self.n += 1

    class Pair:
        def __init__(self):
            self.self_attention_cache = Rec()
            self.cross_attention_cache = Rec()

    import numpy as np

    c = CacheRows(Pair(), np.array([0, 1]))
    c.beamkit_select(np.array([0, 0, 1, 1]))  # expansion: layout changes
    c.beamkit_select(np.array([1, 0, 2, 2]))  # same layout [0, 0, 1, 1]
    assert c.cache.self_attention_cache.n == 2 and c.cache.cross_attention_cache.n == 1
    c.beamkit_select(np.array([2, 3]))  # request 0 left
    assert c.cache.cross_attention_cache.n == 2 and list(c.row_request) == [1, 1]


@pytest.mark.parametrize("name", MODELS)
def test_repetition_penalty_and_bad_words(name, device):
    """repetition_penalty and bad_words_ids (one- and two-token words) as keywords: same outputs as HF."""
    model, ids, mask, eos, pad = setup(name, device)
    plain, _ = check(name, 8, device, num_beams=3, max_new_tokens=8)
    used = [t for hyps in plain.hypotheses for t in hyps[0].tokens if t != eos]
    bad = [[used[0]], [used[1], used[2]], [eos]]  # [eos] is ignored, as in Hugging Face
    bk, _ = check(name, 8, device, num_beams=3, max_new_tokens=8, repetition_penalty=1.5, bad_words_ids=bad)
    outs = [h.tokens for hyps in bk.hypotheses for h in hyps]
    assert outs != [h.tokens for hyps in plain.hypotheses for h in hyps]  # the settings changed something
    assert all(used[0] not in toks for toks in outs)
    assert any(h.finished for hyps in bk.hypotheses for h in hyps)


@pytest.mark.parametrize("name", MODELS)
def test_suppress_tokens_and_sequence_bias(name, device):
    """suppress_tokens, begin_suppress_tokens and sequence_bias (one-, two- and three-token sequences, a
    token biased twice) as keywords: same outputs and scores as Hugging Face."""
    model, ids, mask, eos, pad = setup(name, device)
    plain, _ = check(name, 8, device, num_beams=3, max_new_tokens=8)
    used = [t for hyps in plain.hypotheses for t in hyps[0].tokens if t != eos]
    first = plain.hypotheses[0][0].tokens[0]
    bias = {(used[2],): -1.5, (used[3], used[4]): 3.0, (used[5], used[6], used[4]): 2.0, (used[7],): 0.5}
    kw = dict(num_beams=3, max_new_tokens=8, suppress_tokens=[used[0]], begin_suppress_tokens=[first])
    bk, _ = check(name, 8, device, sequence_bias=bias, **kw)
    outs = [h.tokens for hyps in bk.hypotheses for h in hyps]
    assert outs != [h.tokens for hyps in plain.hypotheses for h in hyps]  # the settings changed something
    assert all(used[0] not in toks for toks in outs)
    assert all(toks[0] != first for toks in outs if toks)
    as_list = [[list(k), v] for k, v in bias.items()]  # Hugging Face's list form gives the same
    again = full(model, ids, mask, eos_token_id=eos, pad_token_id=pad, sequence_bias=as_list, **kw)
    assert torch.equal(again.sequences, bk.sequences)
    with pytest.raises(ValueError, match="sequence_bias"):
        full(model, ids, mask, eos_token_id=eos, pad_token_id=pad, sequence_bias={(1,): "x"}, **kw)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_hugging_face_call_arguments_swap_in(name, device):
    """A generate call written for Hugging Face runs unchanged: max_length (prompt or start token counted),
    use_cache / sampling warpers without do_sample change nothing; what the engine bridge does not take runs in
    beamkit's loop; an unknown keyword is refused by name."""
    model, ids, mask, eos, pad = setup(name, device)
    check(name, 8, device, num_beams=3, max_new_tokens=None, max_length=12)
    kw = dict(eos_token_id=eos, pad_token_id=pad, num_beams=3, max_new_tokens=6)
    plain = full(model, ids, mask, **kw)
    swapped = full(model, ids, mask, use_cache=True, temperature=0.5, top_k=5, top_p=0.5, **kw)
    assert torch.equal(plain.sequences, swapped.sequences)
    assert torch.equal(plain.sequences_scores, swapped.sequences_scores)
    assert swapped.scores is None  # per-step tables are not kept
    # not on the engine bridge: beamkit's loop inside Hugging Face's generate, identical
    for extra in (dict(use_cache=False), dict(output_attentions=True, return_dict_in_generate=True)):
        want = model.generate(ids, attention_mask=mask, **extra, **kw)
        got = bh.generate(model, ids, mask, **extra, **kw)
        assert torch.equal(got if isinstance(got, torch.Tensor) else got.sequences, plain.sequences)
        assert type(got) is type(want)
    with pytest.raises(TypeError, match="bogus"):
        bh.generate(model, ids, mask, bogus=1, **kw)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_processes_raw_logits_like_hugging_face(name, device):
    """Hugging Face's greedy search applies processors to raw logits (its beam search to log-probs): with a
    repetition penalty the two orders pick different tokens, and beamkit follows each."""
    check(name, 8, device, num_beams=1, max_new_tokens=8, repetition_penalty=1.6, no_repeat_ngram_size=3)
    check(name, 8, device, num_beams=3, max_new_tokens=8, repetition_penalty=1.6)


@pytest.mark.filterwarnings("ignore::UserWarning")  # Hugging Face's own notes on default and clashing lengths
@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_generation_settings_follow_hugging_face_precedence(name):
    """A sequence listed twice in sequence_bias keeps its last bias; suppress ids past the vocabulary are
    ignored; max_new_tokens (argument or config) wins over max_length; min_new_tokens replaces the config's
    min_length; with no length at all, 20 new tokens; a generation_config passed in is used."""
    model, ids, mask, eos, pad = setup(name)
    plain, _ = check(name, 8, num_beams=3, max_new_tokens=8)
    used = [t for hyps in plain.hypotheses for t in hyps[0].tokens if t != eos]
    check(name, 8, num_beams=3, max_new_tokens=8, sequence_bias=[[[used[0]], 6.0], [[used[0]], 0.0]])
    check(name, 8, num_beams=3, max_new_tokens=8, suppress_tokens=[used[1], VOCAB + 5], begin_suppress_tokens=[used[2]])
    gc = copy.deepcopy(model.generation_config)
    gc.max_new_tokens = 5
    kw = dict(eos_token_id=eos, pad_token_id=pad, num_beams=3, max_length=15, generation_config=gc)
    hf = model.generate(ids, attention_mask=mask, do_sample=False, **kw)
    assert torch.equal(full(model, ids, mask, **kw).sequences, hf)
    gc = copy.deepcopy(model.generation_config)
    gc.min_length = 6
    check(name, 8, num_beams=3, max_new_tokens=8, min_new_tokens=1, generation_config=gc)
    check(name, 2, num_beams=3, max_new_tokens=None)  # Hugging Face's default length


def test_generation_settings_refused_by_name():
    model, ids, mask, eos, pad = setup("gpt2")
    kw = dict(eos_token_id=eos, pad_token_id=pad, num_beams=3, max_new_tokens=4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        full(model, ids, mask, sequence_bias={(VOCAB + 1,): 1.0}, **kw)
    with pytest.raises(ValueError, match="exact_exit"):
        full(model, ids, mask, sequence_bias={(5,): 1.0}, exact_exit=True, length_penalty=0.0, **kw)
    with pytest.raises(ValueError, match="also forced"):
        full(model, ids, mask, suppress_tokens=[7], forced_eos_token_id=7, **kw)
    with pytest.raises(TypeError, match="suppress_tokens"):
        full(model, ids, mask, suppress_tokens="x", **kw)
    with pytest.raises(TypeError, match="num_return_sequences"):
        full(model, ids, mask, num_return=2, **kw)


def test_bad_words_from_the_generation_config():
    """Marian-style generation config: bad_words_ids=[[pad]] is read from the model, not an error."""
    model, ids, mask, eos, pad = setup("bart")
    model.generation_config.bad_words_ids = [[pad], [5]]
    model.generation_config.repetition_penalty = 1.2
    kw = dict(num_beams=4, max_new_tokens=8, eos_token_id=eos, pad_token_id=pad)
    with torch.no_grad():
        hf = model.generate(ids, attention_mask=mask, do_sample=False, **kw)
    bk = full(model, ids, mask, **kw)
    assert torch.equal(bk.sequences, hf)
    assert all(5 not in h.tokens and pad not in h.tokens for hyps in bk.hypotheses for h in hyps)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
@pytest.mark.parametrize("beams", [1, 4])
def test_several_eos_ids(name, beams, device):
    """A list of eos ids (Llama-3 style): any of them finishes, min_new_tokens masks all; same as Hugging Face."""
    model, ids, mask, eos, pad = setup(name, device)
    with torch.no_grad():  # a second stop token: the likeliest other token over the first steps, sharpened
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=4,
            min_new_tokens=4,
            return_dict_in_generate=True,
            output_logits=True,
        )
        probs = torch.stack([lg.float().softmax(-1) for lg in out.logits]).mean(dim=(0, 1))
        special = {eos, pad, int(getattr(model.config, "decoder_start_token_id", None) or pad)}
        second = next(int(t) for t in probs.argsort(descending=True) if int(t) not in special)
        model.get_output_embeddings().weight[second] *= 2.0
    kw = dict(num_beams=beams, max_new_tokens=10, num_return_sequences=min(2, beams), min_new_tokens=2)
    with torch.no_grad():
        hf = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            eos_token_id=[eos, second],
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_scores=True,
            **kw,
        )
    bk = full(model, ids, mask, eos_token_id=[eos, second], pad_token_id=pad, **kw)
    assert torch.equal(bk.sequences, hf.sequences), (bk.sequences, hf.sequences)
    if beams > 1:
        assert torch.allclose(bk.sequences_scores, hf.sequences_scores, atol=1e-4, rtol=0)
    ends = {h.tokens[-1] for hyps in bk.hypotheses for h in hyps if h.finished}
    assert second in ends  # the second id really finished hypotheses
    assert all(len(h.tokens) > 2 for hyps in bk.hypotheses for h in hyps)  # min_new_tokens masked both


def test_bad_inputs():
    model, ids, mask, eos, pad = setup("gpt2")
    with pytest.raises(TypeError, match="input_ids"):
        full(model, ids[0], num_beams=2, max_new_tokens=3)
    with pytest.raises(ValueError, match="num_return_sequences"):
        full(model, ids, mask, num_beams=2, num_return_sequences=3, max_new_tokens=3)
    with pytest.raises(ValueError, match="attention_mask"):
        full(model, ids, mask[:, :3], num_beams=2, max_new_tokens=3)
    with pytest.raises(ValueError, match="early_stopping"):
        full(model, ids, mask, num_beams=2, max_new_tokens=3, early_stopping="sometimes")


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_diverse_groups_start_differently(name, device):
    model, ids, mask, eos, pad = setup(name, device)
    kw = dict(
        num_beams=4,
        max_new_tokens=6,
        num_return_sequences=4,
        eos_token_id=eos,
        pad_token_id=pad,
        min_new_tokens=2,
        length_penalty=1.0,
    )
    plain = full(model, ids, mask, **kw)
    div = full(model, ids, mask, num_beam_groups=4, diversity_penalty=1e4, **kw)
    firsts_plain = [len({h.tokens[0] for h in hyps}) for hyps in plain.hypotheses]
    firsts_div = [len({h.tokens[0] for h in hyps}) for hyps in div.hypotheses]
    # one beam per group and a prohibitive penalty: the 4 groups take 4 different first tokens
    assert firsts_div == [4] * 8
    assert min(firsts_plain) < 4  # plain beam search does share first tokens here, so the check can fail
    assert div.sequences.shape[0] == 8 * 4


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_diverse_groups_take_the_prompt_processors(name, device):
    """Diverse beam search with processors that read each request's prompt (no_repeat_ngram_size, bad words):
    every group gets its request's prompt (it used to fail: a group was a request the processors did not know),
    and every returned sequence obeys them (checked by brute force over the sequences)."""
    model, ids, mask, eos, pad = setup(name, device)
    banned = 9
    kw = dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0, max_new_tokens=6, num_return_sequences=4)
    kw.update(eos_token_id=eos, pad_token_id=pad, no_repeat_ngram_size=2, bad_words_ids=[[banned]])
    out = full(model, ids, mask, **kw)
    for r, hyps in enumerate(out.hypotheses):
        prompt = [int(t) for t, m in zip(ids[r], mask[r], strict=True) if m] if name == "gpt2" else []
        for h in hyps:
            seq = prompt + list(h.tokens)
            pairs = list(zip(seq, seq[1:], strict=False))
            assert len(pairs) == len(set(pairs)) and banned not in h.tokens


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_force_words_appear(name, device):
    model, ids, mask, eos, pad = setup(name, device)
    kw = dict(
        num_beams=4, max_new_tokens=8, num_return_sequences=2, eos_token_id=eos, pad_token_id=pad, length_penalty=1.0
    )
    plain = full(model, ids, mask, **kw)
    used = {t for hyps in plain.hypotheses for h in hyps for t in h.tokens}
    word = [t for t in range(3, VOCAB) if t not in used and t != eos][:2]
    forced = full(model, ids, mask, force_words_ids=[word], **kw)
    for hyps in forced.hypotheses:
        assert hyps, "every request should find a hypothesis with the forced word"
        for h in hyps:
            pairs = list(zip(h.tokens, h.tokens[1:], strict=False))
            assert tuple(word) in pairs


def test_generation_config_defaults_and_unmapped_settings():
    model, ids, mask, eos, pad = setup("gpt2")
    gc = model.generation_config
    names = ("num_beams", "max_new_tokens", "length_penalty", "pad_token_id", "repetition_penalty", "do_sample")
    names += ("typical_p",)
    saved = {n: getattr(gc, n) for n in names}
    try:
        gc.num_beams, gc.max_new_tokens, gc.length_penalty, gc.pad_token_id = 3, 5, 0.5, pad
        hf = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True)
        bk = full(model, ids, mask)  # everything from the generation config, as model.generate does
        assert torch.equal(bk.sequences, hf.sequences)
        assert torch.allclose(bk.sequences_scores, hf.sequences_scores, atol=1e-4, rtol=0)
        gc.repetition_penalty = 1.3  # mapped: read from the config like model.generate does
        penalised = model.generate(ids, attention_mask=mask)
        assert torch.equal(full(model, ids, mask).sequences, penalised)
        assert not torch.equal(penalised, hf.sequences)
        gc.repetition_penalty, gc.do_sample, gc.typical_p = 1.0, True, 0.5
        torch.manual_seed(5)  # not on the engine bridge (typical_p): beamkit's loop, on Hugging Face's stream
        sampled = model.generate(ids, attention_mask=mask)
        torch.manual_seed(5)
        assert torch.equal(bh.generate(model, ids, mask), sampled)
        out = full(model, ids, mask, do_sample=False)  # explicit override, as with model.generate
        assert torch.equal(out.sequences, hf.sequences)
    finally:
        for n, v in saved.items():
            setattr(gc, n, v)
