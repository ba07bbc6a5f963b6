"""How a step of a Hugging Face model runs, decided once per step as a :class:`~beamkit.hf.steps.step.StepPath`
(``EncoderDecoderStep.path`` as ``DecoderOnlyStep.path``): a table of step functions and the way each documented
rule gives (the first call, then the direct step, the model's forward or the compiled step), each step deciding
once per part and leaving the state it was given as it was. Oracles: the rules as the docstrings state them,
a count of the decisions, a snapshot of the input state."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from beamkit.hf.steps.step import StepPath  # noqa: E402
from tests.test_hf_direct import _seq2seq  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# (family, the step function's keywords) -> the way every step after the first runs, by the documented rules
TABLE = [
    ("bart", dict(), "direct"),  # Marian, BART and T5 decoders run their layers directly after the first step
    ("t5", dict(), "direct"),
    ("marian", dict(), "direct"),
    ("bart", dict(direct=False), "model"),  # direct=False: the model's forward over its own cache
    ("t5", dict(direct=False), "model"),
    ("bart", dict(compile="eager"), "compiled"),  # compile=: the compiled static step from the second step on
    ("t5", dict(compile="eager"), "compiled"),
]


def _counted(step):
    """``step.path`` wrapped so that the decisions a step makes are counted (the instance's own attribute)."""
    decided = []
    path = step.path

    def counting(state):
        got = path(state)
        decided.append(got.kind)
        return got

    step.path = counting
    return decided


@pytest.mark.parametrize(("family", "make", "way"), TABLE)
def test_the_encoder_decoder_step_path_table(family, make, way):
    """The first call is ``"prompt"`` (the encoder, then the decoder's first step); every later step runs the way
    of its row, decided once per step, with the cache that way reads; the state a step is given keeps its cache,
    length and buffers (a snapshot of them), and deciding changes nothing."""
    model = _seq2seq(family)
    step = bh.EncoderDecoderStep(model, **make)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    start = int(model.config.decoder_start_token_id)
    with torch.inference_mode():
        state = step.init_state(ids, mask)
        first = step.path(state)
        assert isinstance(first, StepPath) and first.kind == "prompt" and first.cache is None
        decided = _counted(step)
        _, state = step(state, torch.full((2,), start))
        assert decided == ["prompt"]
        for n, token in enumerate((3, 4, 5)):
            before = (state.cache, state.length, state.per_request, dict(state.per_request))
            looked = step.path(state)
            assert looked.kind == way and str(looked).startswith(f"{way}: "), looked
            assert state.cache is before[0], "deciding changed the state's cache"
            decided.clear()
            _, new = step(state, torch.full((2,), token))
            assert decided == [way], (n, decided)
            assert new is not state and new.length == state.length + 1
            assert state.cache is before[0] and state.length == before[1] and state.per_request is before[2]
            assert all(state.per_request[k] is v for k, v in before[3].items())
            state = new


def test_a_decoder_only_step_decides_once_per_part_too():
    """``DecoderOnlyStep``: the prompt call, then one decision per step (the paged forward by default)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=40, n_positions=64)
    step = bh.DecoderOnlyStep(transformers.GPT2LMHeadModel(cfg).eval())
    decided = _counted(step)
    with torch.inference_mode():
        state = step.init_state(torch.tensor([[5, 6, 7], [0, 8, 9]]), torch.tensor([[1, 1, 1], [0, 1, 1]]))
        _, state = step(state, None)
        for token in (3, 4):
            _, state = step(state, torch.full((2,), token))
    assert decided == ["paged", "paged"]  # the prompt call runs before any cache: decided by the state's kind
