"""``OLMo.generate``'s pattern through :mod:`beamkit.compat.olmo`: a Hugging Face causal LM wrapped as OLMo's step
closure (the prompt and the tokens so far in the state dict, ``log_softmax`` of the last position) and decoded
by ``BeamSearch.search``, against the same search through ``beamkit.hf.generate`` (its own adapter of the same
model, with a key/value cache) as the oracle.

The search is OLMo's rule, beamkit's ``compete`` policy on raw log-probabilities, so ``generate`` is asked for
``policy="compete"`` and ``length_penalty=0.0``. The model runs in float64, so the cached forward of ``generate``
and the closure's full forward agree far below any gap between candidates; both then round the last position's
logits to float32, as Hugging Face's generation does.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf  # noqa: E402
from beamkit.compat.olmo import BeamSearch  # noqa: E402

V, EOS, BEAM, STEPS = 40, 2, 4, 7


@pytest.fixture(scope="module")
def model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=64, bos_token_id=1, eos_token_id=EOS,
        pad_token_id=0, initializer_range=0.3,
    )  # fmt: skip
    m = transformers.GPT2LMHeadModel(cfg).eval().double()
    with torch.no_grad():
        m.lm_head.weight[EOS] += 0.8 * m.lm_head.weight[5]  # the end token follows token 5's direction: varied lengths
    return m


def tolerance(logprob: float, length: int) -> float:
    """How far the two log-probabilities of one path may be apart by float32 rounding (u = 2**-24).

    The closure's ``log_softmax`` of float32 logits is within u (2 |lp_i| + ln V + log2 V + 2) of the exact
    term (the shift, the sum of V exponentials, its logarithm); ``generate``'s engine normalises the same float32
    logits in float64 (within u (log2 V + 2)); the compat search returns the float64 sum rounded to float32 (u
    |logprob|). Summed over ``length`` terms, doubled.
    """
    u = 2.0**-24
    per_term = 2 * np.log(V) + 2 * np.log2(V) + 4
    return 2 * u * (3 * abs(logprob) + length * per_term)


def olmo_step(model):
    """OLMo.generate's closure: the state holds each row's tokens so far; the first call reads the prompt."""

    def step(last_predictions, state, timestep):
        ids = state["input_ids"]
        if timestep > 0:
            ids = torch.cat([ids, last_predictions[:, None]], dim=1)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1].float()  # shape: (rows, V), float32 as generate's
        return torch.log_softmax(logits, dim=-1), {"input_ids": ids}

    return step


def test_olmo_style_generate_matches_beamkit_hf_generate(model):
    prompts = torch.tensor([[3, 7, 9, 11], [12, 5, 5, 8], [30, 31, 4, 6]])
    search = BeamSearch(EOS, max_steps=STEPS, beam_size=BEAM)
    predictions, log_probs = search.search(torch.zeros(3, dtype=torch.int64), {"input_ids": prompts}, olmo_step(model))

    out = beamkit.hf.generate(
        model, prompts, num_beams=BEAM, num_return_sequences=BEAM, max_new_tokens=STEPS, do_sample=False,
        policy="compete", length_penalty=0.0, return_dict_in_generate=True,
    )  # fmt: skip
    assert predictions.shape[:2] == (3, BEAM)
    finished = 0
    for b, hyps in enumerate(out.hypotheses):
        assert len(hyps) == BEAM
        for j, h in enumerate(hyps):
            row = predictions[b, j].tolist()
            got = row[: row.index(EOS) + 1] if EOS in row else row
            assert got == h.tokens
            finished += h.finished
            assert abs(float(log_probs[b, j]) - h.logprob) <= tolerance(h.logprob, len(h.tokens))
    assert 0 < finished < 3 * BEAM  # some hypotheses end with the end token, some are cut at max_steps


def test_the_caller_state_is_left_with_the_returned_rows(model):
    prompts = torch.tensor([[3, 7, 9, 11], [12, 5, 5, 8]])
    width = prompts.shape[1] + STEPS

    def step(last_predictions, state, timestep):
        """OLMo's habit: edit the given dict and return it; the tokens sit in a fixed-width buffer (-1 = empty)."""
        buf, n = state["buffer"].clone(), state["length"]
        if timestep > 0:
            buf[torch.arange(buf.shape[0]), n] = last_predictions
            n = n + 1
        with torch.no_grad():
            logits = model(input_ids=buf.clamp(min=0)).logits  # shape: (rows, W, V)
        last = logits[torch.arange(buf.shape[0]), n - 1].float()
        state["buffer"], state["length"] = buf, n
        return torch.log_softmax(last, dim=-1), state

    buffer = torch.full((2, width), -1, dtype=torch.int64)
    buffer[:, : prompts.shape[1]] = prompts
    state = {"buffer": buffer, "length": torch.full((2,), prompts.shape[1])}
    predictions, _ = BeamSearch(EOS, max_steps=STEPS, beam_size=BEAM).search(
        torch.zeros(2, dtype=torch.int64), state, step
    )
    rows = state["buffer"]
    assert rows.shape == (2 * BEAM, width)
    for b in range(2):
        for j in range(BEAM):
            seq = predictions[b, j].tolist()
            toks = seq[: seq.index(EOS) + 1] if EOS in seq else seq
            # the row the last token was chosen from: the prompt and every token but the last
            want = prompts[b].tolist() + toks[:-1]
            assert rows[b * BEAM + j].tolist() == want + [-1] * (width - len(want))
            assert int(state["length"][b * BEAM + j]) == len(want)


def test_rows_that_cannot_be_stacked_are_left_with_a_warning(model):
    prompts = torch.tensor([[3, 7, 9, 11], [12, 5, 5, 8]])
    inner = olmo_step(model)

    def step(last_predictions, state, timestep):
        log_probs, new = inner(last_predictions, state, timestep)
        state["input_ids"] = new["input_ids"]  # grows by one column a step
        return log_probs, state

    state = {"input_ids": prompts}
    with pytest.warns(RuntimeWarning, match="'input_ids' differ in shape"):
        BeamSearch(EOS, max_steps=STEPS, beam_size=BEAM).search(torch.zeros(2, dtype=torch.int64), state, step)
    assert state["input_ids"] is prompts
