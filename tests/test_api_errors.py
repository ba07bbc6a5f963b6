"""Bad input to the Python API: one clear error naming the argument, and one bad request never fails the others.

Each test states the expected outcome by hand (the error type and the words it must name, or the results a
request gets decoded alone), never by calling the code under test for the answer.
"""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import Engine, LengthPenalty, SearchOptions, search_batch
from beamkit.lm import NGramLM
from tests.toy import BOS, ToyModel

EOS = 0


def _drain(engine: Engine) -> dict:
    done = {}
    while not engine.idle:
        done.update((c.request_id, c) for c in engine.step())
    return done


# ------------------------------------------------------------------------------------------- joining the engine
@pytest.mark.parametrize("bad", [np.zeros(1), np.zeros(1, dtype=np.int64), np.array([True])])
def test_a_request_joining_with_a_state_of_another_kind_fails_alone(bad):
    m = ToyModel(4)
    engine = Engine(m.step, beam_size=2, max_len=3)
    a = engine.add(m.init(), BOS, EOS)
    engine.step()  # a is running
    b = engine.add(bad, BOS, EOS)  # a number array where the running rows hold prefixes (an object array)
    done = _drain(engine)
    assert done[b].hypotheses == [] and done[b].error.startswith("cannot join the running state: ")
    assert "object" in done[b].error
    alone = search_batch(m.step, m.init(), BOS, EOS, 2, 3)[0]
    assert done[a].error is None
    assert [(h.tokens, h.logprob) for h in done[a].hypotheses] == [(h.tokens, h.logprob) for h in alone]


def test_a_float_state_joining_int_rows_fails_alone():
    def step(state, y_prev):  # the state is a step counter per row
        logits = np.tile(np.array([0.0, 1.0, 0.5]), (state.shape[0], 1))
        assert state.dtype == np.int64, "the running rows' state changed type"
        return logits, state + 1

    engine = Engine(step, beam_size=2, max_len=2)
    a = engine.add(np.zeros(1, dtype=np.int64), BOS, EOS)
    engine.step()
    b = engine.add(np.zeros(1), BOS, EOS)
    done = _drain(engine)
    assert done[a].error is None and [h.tokens for h in done[a].hypotheses] == [[1, 1], [1, 2]]
    assert "float64" in done[b].error and "int64" in done[b].error


# -------------------------------------------------------------------------------------------- engine messages
def test_best_of_an_unknown_request_raises_like_cancel():
    m = ToyModel(4)
    engine = Engine(m.step, beam_size=2, max_len=3)
    for call in (engine.best, engine.cancel):
        with pytest.raises(ValueError, match="no request 7 was added"):
            call(7)
    r = engine.add(m.init(), BOS, EOS)
    _drain(engine)
    assert engine.best(r) is None  # known and completed: still None


@pytest.mark.parametrize("call", ["best", "cancel"])
def test_request_ids_must_be_integers(call):
    engine = Engine(ToyModel(4).step, beam_size=2, max_len=3)
    with pytest.raises(TypeError, match=r"request_id must be an integer.*'a'"):
        getattr(engine, call)("a")


def test_engine_needs_a_callable_step_fn():
    with pytest.raises(TypeError, match="step_fn must be callable.*None"):
        Engine(None, beam_size=2, max_len=3)


def test_a_processor_that_is_not_callable_is_named_by_position():
    m = ToyModel(4)
    with pytest.raises(TypeError, match=r"processors\[1\] must be callable.*None"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, processors=[lambda s, c: s, None])


def test_a_processor_returning_none_is_one_clear_error():
    m = ToyModel(4)
    with pytest.raises(Exception) as info:
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, processors=[lambda s, c: None])
    assert "processors[0] returned None" in str(info.value)


def test_a_string_selector_is_refused_with_the_accepted_kinds():
    m = ToyModel(4)
    with pytest.raises(TypeError, match=r"selector must be a Selector object.*'topk'"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, selector="topk")


def test_extras_that_are_not_a_dict_are_one_clear_error():
    m = ToyModel(4)

    def step(state, y_prev):
        logits, new = m.step(state, y_prev)
        return logits, new, [1]

    with pytest.raises(Exception) as info:
        search_batch(step, m.init(), BOS, EOS, 2, 3)
    assert "extras" in str(info.value) and "dict" in str(info.value) and "list" in str(info.value)


def test_min_len_above_max_len_is_refused():
    m = ToyModel(4)
    with pytest.raises(ValueError, match=r"min_len=5.*max_len=3"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, min_len=5)
    engine = Engine(m.step, beam_size=2, max_len=3)
    with pytest.raises(ValueError, match=r"min_len=4.*max_len=3"):
        engine.add(m.init(), BOS, EOS, min_len=4)
    assert engine.idle


# ---------------------------------------------------------------------------------------------- length penalty
@pytest.mark.parametrize("alpha", [1e308, -700.0, -1e308, 101.0, float("inf"), float("nan")])
def test_extreme_length_penalties_are_refused_everywhere(alpha):
    m = ToyModel(4)
    with pytest.raises(ValueError, match="length_penalty"):
        search_batch(m.step, m.init(), BOS, EOS, 2, 3, length_penalty=alpha)
    with pytest.raises(ValueError, match="length_penalty"):
        SearchOptions(beam_size=2, max_len=3, length_penalty=alpha)
    engine = Engine(m.step, beam_size=2, max_len=3)
    with pytest.raises(ValueError, match="length_penalty"):
        engine.add(m.init(), BOS, EOS, length_penalty=alpha)
    with pytest.raises(ValueError, match="length_penalty"):
        Engine(m.step, beam_size=2, max_len=3, length_penalty=alpha)


def test_a_length_penalty_too_large_for_max_len_is_refused():
    # alpha 100 at 3 tokens is 3 ** 100 (finite), at 2000 tokens 2000 ** 100 > 1e308
    m = ToyModel(4)
    scores = [h.score for h in search_batch(m.step, m.init(), BOS, EOS, 2, 3, length_penalty=100.0)[0]]
    assert all(np.isfinite(s) and s < 0 for s in scores)
    with pytest.raises(ValueError, match=r"length_penalty.*max_len=2000"):
        SearchOptions(beam_size=2, max_len=2000, length_penalty=-100.0)


def test_the_length_penalty_range_is_documented():
    assert "100" in (LengthPenalty.__doc__ or "")
    assert LengthPenalty(100.0).alpha == 100.0 and LengthPenalty(-100.0).alpha == -100.0


# ------------------------------------------------------------------------------------------------------ NGramLM
VOCAB = ["<s>", "a", "b", "c", "</s>"]


@pytest.fixture(scope="module")
def lm():
    return NGramLM(["a b c", "b c a"], VOCAB, order=2)


@pytest.mark.parametrize("state", [np.array([10**6]), np.array([-5]), np.array([0.5]), "abc", np.array([[1, 2]]), None])
def test_ngram_step_refuses_a_state_it_did_not_make(lm, state):
    with pytest.raises((ValueError, TypeError), match="NGramLM.step: state"):
        lm.step(state, np.array([1]))


def test_ngram_step_accepts_its_own_states(lm):
    state = lm.init_state(2)
    logits, state = lm.step(state, np.array([1, 2]))
    logits2, _ = lm.step(state, np.array([3, 3]))
    assert logits.shape == (2, 5) and np.isfinite(logits2[:, 1:]).all()


def test_ngram_from_a_corpus_of_ints_is_one_clear_error():
    with pytest.raises(TypeError, match=r"corpus.*strings.*\[1, 2, 3\]"):
        NGramLM([[1, 2, 3], [2, 3]], VOCAB, order=2)


# ------------------------------------------------------------------------------------------- Hugging Face bridge
@pytest.fixture(scope="module")
def gpt2():
    """A tiny random GPT-2 with 16 positions (learned absolute position embeddings)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=16, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def _prompt(width: int):
    import torch

    return torch.arange(3, 3 + width).remainder(17).add(3).reshape(1, width)


def test_hf_generate_within_n_positions_runs(gpt2):
    import beamkit.hf as bh

    out = bh.generate(gpt2, _prompt(5), max_new_tokens=12, min_new_tokens=12, num_beams=2)  # 5 + 12 - 1 = 16 fed
    assert out.shape == (1, 17)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        (dict(max_new_tokens=13), r"max_new_tokens=13.*n_positions=16.*at most 12"),
        (dict(max_length=30), r"max_length=30.*n_positions=16.*at most 12"),
    ],
)
def test_hf_generate_past_n_positions_is_a_clear_error(gpt2, kw, named):
    import beamkit.hf as bh

    with pytest.raises(ValueError, match=named):
        bh.generate(gpt2, _prompt(5), num_beams=2, **kw)


def test_hf_generate_with_a_prompt_longer_than_n_positions(gpt2):
    import beamkit.hf as bh

    with pytest.raises(ValueError, match=r"prompt \(20 tokens\).*n_positions=16.*max_new_tokens"):
        bh.generate(gpt2, _prompt(20), max_new_tokens=3, num_beams=2)


@pytest.mark.parametrize("bad", [[5], [], [[5], 7]])
def test_hf_bad_words_ids_must_be_a_list_of_lists_as_in_hugging_face(gpt2, bad):
    import beamkit.hf as bh

    with pytest.raises(ValueError, match=r"bad_words_ids. has to be a (non-empty list|list of lists)"):
        gpt2.generate(_prompt(5), max_new_tokens=3, num_beams=2, bad_words_ids=bad)  # the peer raises too
    with pytest.raises(ValueError, match=r"bad_words_ids.*list of token-id lists"):
        bh.generate(gpt2, _prompt(5), max_new_tokens=3, num_beams=2, bad_words_ids=bad)


def test_hf_min_new_tokens_above_max_new_tokens_is_as_hugging_face(gpt2):
    import beamkit.hf as bh

    kw = dict(max_new_tokens=4, min_new_tokens=9, num_beams=2)
    assert bh.generate(gpt2, _prompt(5), **kw).tolist() == gpt2.generate(_prompt(5), **kw).tolist()


@pytest.mark.parametrize("model", [None, 42])
def test_hf_patch_needs_a_model(model):
    pytest.importorskip("transformers")
    import beamkit.hf as bh

    with pytest.raises(TypeError, match="model must be a transformers model"):
        bh.patch(model)


def test_checks_word_each_failure_by_hand():
    import math

    from beamkit._checks import check_choice, check_float, check_ids, check_number, check_optional_int

    cases = [
        (lambda: check_float("p", 0.0, above=0, most=1), ValueError, "p must be > 0 and <= 1, got 0.0"),
        (lambda: check_float("p", 1.5, above=0, most=1), ValueError, "p must be > 0 and <= 1, got 1.5"),
        (lambda: check_float("t", -1, above=0), ValueError, "t must be > 0, got -1.0"),
        (
            lambda: check_float("a", 200, least=-100, most=100),
            ValueError,
            "a must be a finite number between -100 and 100, got 200.0",
        ),
        (
            lambda: check_float("a", math.inf, least=-100, most=100),
            ValueError,
            "a must be a finite number between -100 and 100, got inf",
        ),
        (lambda: check_float("a", math.nan, above=0), ValueError, "a must be a finite number, got nan"),
        (lambda: check_choice("mode", "x", ("a", "b", "c")), ValueError, "mode must be 'a', 'b' or 'c', got 'x'"),
        (lambda: check_choice("mode", "x", ("a",)), ValueError, "mode must be 'a', got 'x'"),
        (lambda: check_optional_int("n", 0, 1, 3), ValueError, "n must be between 1 and 3, got 0"),
        (lambda: check_optional_int("n", 1.0), TypeError, "n must be an integer, got 1.0"),
        (lambda: check_number("w", "1"), TypeError, "w must be a number, got '1'"),
        (lambda: check_ids("ids", "12"), TypeError, "ids must be a sequence of token ids, got '12'"),
        (lambda: check_ids("ids", [1, -1]), ValueError, "ids: token ids must be >= 0, got [1, -1]"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as info:
            call()
        assert str(info.value) == message
    assert check_float("p", 1, above=0, most=1) == 1.0 and check_float("p", 1e-300, above=0) == 1e-300
    assert check_optional_int("n", None, 1) is None and check_optional_int("n", np.int64(2), 1) == 2
    assert check_number("w", -math.inf) == -math.inf and check_ids("ids", np.array([0, 3])) == (0, 3)
    assert check_choice("flag", 1, (True, False, "never")) == 1  # compared with ==, as `in` does
