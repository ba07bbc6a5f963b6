"""Exact search against brute-force enumeration of small toy models."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from beamkit import search_batch
from beamkit.variants.exact import exact_search, exact_search_stats, search_errors


def toy(vocab: int, seed: int, sharp: float = 2.0, max_len: int = 8):
    """A model whose next-token logits depend on the length and the last two tokens (a random table)."""
    table = np.random.default_rng(seed).normal(size=(max_len + 1, vocab + 1, vocab + 1, vocab)) * sharp

    def logits_of(hist: np.ndarray) -> np.ndarray:
        # hist: (rows, 1 + t) with column 0 the request id; bos is token `vocab` (padding too)
        t = hist.shape[1] - 1
        last = hist[:, -1] if t >= 1 else np.full(hist.shape[0], vocab)
        prev = hist[:, -2] if t >= 2 else np.full(hist.shape[0], vocab)
        shift = hist[:, 0][:, None] * 0.37  # request-dependent
        return table[t, last, prev] + np.sin(shift * np.arange(vocab))

    # state: (rows, 1 + t): request id then generated tokens; the bos is not stored
    def step_fn(state, y_prev):
        y = np.asarray(y_prev, dtype=np.int64)
        new = state if np.all(y == BOS) and state.shape[1] == 1 else np.concatenate([state, y[:, None]], axis=1)
        return logits_of(new), new

    return step_fn, logits_of


BOS = 99


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def brute_force(logits_of, req: int, vocab: int, eos: int, max_len: int, alpha: float):
    """Every output (finished, or max_len tokens without eos) with its score, by plain recursion."""
    outs = []

    def rec(tokens: list[int], lp: float) -> None:
        hist = np.array([[req] + tokens], dtype=np.int64)
        logp = log_softmax(logits_of(hist)[0])
        for v in range(vocab):
            total = lp + logp[v]
            seq = tokens + [v]
            if v == eos or len(seq) == max_len:
                outs.append((total / len(seq) ** alpha, seq))
            else:
                rec(seq, total)

    rec([], 0.0)
    outs.sort(key=lambda o: -o[0])
    return outs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 0.7, 1.0, 2.0, -0.5])
def test_exact_matches_enumeration(seed: int, alpha: float) -> None:
    vocab, eos, max_len = 4, 3, 5
    step, logits_of = toy(vocab, seed)
    outs = brute_force(logits_of, 0, vocab, eos, max_len, alpha)
    got = exact_search(step, np.zeros((1, 1), dtype=np.int64), BOS, eos, max_len, length_penalty=alpha, n=3)
    assert len(got) == 3
    for h, (score, seq) in zip(got, outs[:3], strict=True):
        assert h.score == pytest.approx(score, abs=1e-9)
        assert h.tokens == seq
        assert h.finished == (seq[-1] == eos)
        assert h.logprob == pytest.approx(sum(h.token_logprobs), abs=1e-12)


def test_exact_prunes_compared_with_enumeration() -> None:
    vocab, eos, max_len = 5, 4, 6
    step, _ = toy(vocab, 7)
    res = exact_search_stats(step, np.zeros((1, 1), dtype=np.int64), BOS, eos, max_len, length_penalty=1.0)
    assert res.rows_full_enumeration == sum(4**t for t in range(max_len))  # 1365 non-eos prefixes
    assert 0 < res.rows_evaluated < res.rows_full_enumeration
    # batched expansion: fewer calls than rows
    assert res.model_calls < res.rows_evaluated


def test_exact_expand_batch_one_same_answer() -> None:
    vocab, eos, max_len = 4, 3, 5
    step, _ = toy(vocab, 3)
    init = np.zeros((1, 1), dtype=np.int64)
    a = exact_search_stats(step, init, BOS, eos, max_len, 1.0, n=2, expand_batch=1)
    b = exact_search_stats(step, init, BOS, eos, max_len, 1.0, n=2, expand_batch=64)
    assert [h.tokens for h in a.hypotheses] == [h.tokens for h in b.hypotheses]
    assert a.model_calls == a.rows_evaluated


def test_search_errors_against_enumeration() -> None:
    vocab, eos, max_len, n_req = 4, 3, 5, 6
    step, logits_of = toy(vocab, 11, sharp=1.0)
    init = np.arange(n_req, dtype=np.int64)[:, None]
    for k in (1, 2):
        rep = search_errors(step, init, BOS, eos, k, max_len, length_penalty=1.0)
        beams = search_batch(step, init, BOS, eos, k, max_len, length_penalty=1.0)
        expected = 0
        for r in range(n_req):
            best = brute_force(logits_of, r, vocab, eos, max_len, 1.0)[0][0]
            assert rep.exact_scores[r] == pytest.approx(best, abs=1e-9)
            expected += int(beams[r][0].score < best - 1e-9)
        assert rep.errors == expected
        assert rep.total == n_req
    # a beam wider than the tree makes no search error
    wide = search_errors(step, init, BOS, eos, vocab**max_len, max_len, length_penalty=1.0)
    assert wide.errors == 0


def test_search_errors_happen_with_greedy() -> None:
    # Over many requests greedy search must make some search errors on a flat toy model (sanity of the oracle).
    vocab, eos, max_len = 4, 3, 4
    step, _ = toy(vocab, 2, sharp=0.6)
    init = np.arange(12, dtype=np.int64)[:, None]
    rep = search_errors(step, init, BOS, eos, 1, max_len, length_penalty=1.0)
    assert rep.errors > 0


def test_exact_bad_input() -> None:
    step, _ = toy(4, 0)
    with pytest.raises(ValueError, match="n must be"):
        exact_search(step, np.zeros((1, 1), dtype=np.int64), BOS, 3, 4, n=0)
    with pytest.raises(ValueError, match="1 row"):
        exact_search(step, np.zeros((2, 1), dtype=np.int64), BOS, 3, 4)
    with pytest.raises(ValueError, match="max_len"):
        exact_search(step, np.zeros((1, 1), dtype=np.int64), BOS, 3, 0)


def test_brute_force_sums_to_one() -> None:
    # the oracle itself: output probabilities of a toy model sum to 1
    vocab, eos, max_len = 3, 2, 4
    _, logits_of = toy(vocab, 5)
    outs = brute_force(logits_of, 0, vocab, eos, max_len, 0.0)
    assert sum(np.exp(s) for s, _ in outs) == pytest.approx(1.0)
    assert len(outs) == len(list(itertools.product(range(2), repeat=max_len))) + sum(2**t for t in range(max_len))


def test_torch_logits_same_as_numpy(device) -> None:
    torch = pytest.importorskip("torch")
    step, _ = toy(4, 1)

    def tstep(state, y_prev):
        logits, new = step(state, np.asarray(y_prev.cpu() if hasattr(y_prev, "cpu") else y_prev))
        return torch.from_numpy(logits).to(device), new  # shape: (rows, V) on the device

    init = np.zeros((1, 1), dtype=np.int64)
    a = exact_search(step, init, BOS, 3, 5, n=2)
    b = exact_search(tstep, init, BOS, 3, 5, n=2)
    assert [h.tokens for h in a] == [h.tokens for h in b]


def test_exact_batches_growing_states() -> None:
    # the state grows with the prefix length: a step_fn call may only batch prefixes of one length
    vocab, eos, max_len = 6, 5, 6
    step, logits_of = toy(vocab, 0, sharp=1.0, max_len=max_len)
    outs = brute_force(logits_of, 0, vocab, eos, max_len, 1.0)
    res = exact_search_stats(step, np.zeros((1, 1), dtype=np.int64), BOS, eos, max_len, 1.0, n=2)
    assert [h.tokens for h in res.hypotheses] == [seq for _, seq in outs[:2]]
    assert res.rows_evaluated < res.rows_full_enumeration
