"""Lexically constrained beam search against brute force over small toy models."""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import search_batch
from beamkit.variants.constrained import Constrained, constrained_beam_search, meets_constraints

BOS = 99


def table_model(vocab: int, seed: int, max_len: int, sharp: float = 1.5, rare: tuple[int, ...] = ()):
    """Logits from the step, the last two tokens and the request id; ``rare`` tokens get -6."""
    table = np.random.default_rng(seed).normal(size=(max_len + 1, vocab + 1, vocab + 1, vocab)) * sharp
    for t in rare:
        table[..., t] -= 6.0

    def logits_of(req: int, tokens: list[int]) -> np.ndarray:
        t = len(tokens)
        last = tokens[-1] if t >= 1 else vocab
        prev = tokens[-2] if t >= 2 else vocab
        return table[t, last, prev] + 0.7 * np.sin(req * np.arange(vocab) + 1)

    def step(state, y_prev):
        y = np.asarray(y_prev, dtype=np.int64)
        if state[0, 1]:
            hist = np.concatenate([state, y[:, None]], axis=1)
        else:
            hist = np.concatenate([state[:, :1], np.ones_like(state[:, :1])], axis=1)
        return np.stack([logits_of(int(h[0]), h[2:].tolist()) for h in hist]), hist

    return step, logits_of


def init_for(n: int) -> np.ndarray:
    return np.stack([np.arange(n), np.zeros(n, dtype=np.int64)], axis=1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def contains(seq: list[int], phrase: list[int]) -> bool:
    return any(seq[i : i + len(phrase)] == phrase for i in range(len(seq) - len(phrase) + 1))


def satisfied(seq: list[int], constraints) -> bool:
    """Independent check: every constraint (a phrase, or a list of alternative phrases) occurs."""
    for c in constraints:
        alts = [c] if isinstance(c[0], int) else c
        if not any(contains(seq, list(a)) for a in alts):
            return False
    return True


def brute_best(logits_of, req, vocab, eos, max_len, alpha, constraints):
    """Best output meeting the constraints (finished, or unfinished at max_len), by enumeration."""
    best = (-np.inf, None)

    def rec(tokens, lp):
        nonlocal best
        logp = log_softmax(logits_of(req, tokens))
        for v in range(vocab):
            seq, total = tokens + [v], lp + logp[v]
            if v == eos or len(seq) == max_len:
                if satisfied(seq, constraints) and total / len(seq) ** alpha > best[0]:
                    best = (total / len(seq) ** alpha, seq)
            else:
                rec(seq, total)

    rec([], 0.0)
    return best


CASES = [
    [[2, 3]],  # one phrase
    [[1], [2, 2]],  # two constraints
    [[[2, 3], [1, 1]]],  # one disjunctive constraint
    [[[0, 3], [3, 0]], [2]],  # disjunctive and plain
]


@pytest.mark.parametrize("constraints", CASES)
@pytest.mark.parametrize("policy", ["narrow", "pool"])
def test_wide_beam_finds_constrained_optimum(constraints, policy) -> None:
    vocab, eos, max_len, alpha, n_req = 5, 4, 5, 1.0, 4
    step, logits_of = table_model(vocab, 3, max_len, rare=(2, 3))
    # a beam as wide as the number of live prefixes keeps everything: the search is exhaustive
    res = constrained_beam_search(
        step, init_for(n_req), BOS, eos, 4**4, max_len, constraints, policy=policy, length_penalty=alpha
    )
    for r in range(n_req):
        score, seq = brute_best(logits_of, r, vocab, eos, max_len, alpha, constraints)
        assert res[r], f"request {r} found nothing"
        assert res[r][0].tokens == seq
        assert res[r][0].score == pytest.approx(score, abs=1e-9)
        assert all(satisfied(h.tokens, constraints) for h in res[r])


@pytest.mark.parametrize("seed", range(6))
def test_small_beam_keeps_constrained_hypotheses(seed: int) -> None:
    # constraint tokens are rare: plain beam search never produces them, the bank allocation does
    vocab, eos, max_len, alpha, n_req = 6, 5, 6, 1.0, 3
    constraints = [[2, 3], [[4], [1, 1, 1]]]
    step, logits_of = table_model(vocab, seed, max_len, rare=(2, 3, 4))
    plain = search_batch(step, init_for(n_req), BOS, eos, 4, max_len, length_penalty=alpha)
    assert not any(satisfied(h.tokens, constraints) for hyps in plain for h in hyps)
    res = constrained_beam_search(step, init_for(n_req), BOS, eos, 4, max_len, constraints, length_penalty=alpha)
    for r in range(n_req):
        assert res[r] and all(satisfied(h.tokens, constraints) for h in res[r])
        score, _ = brute_best(logits_of, r, vocab, eos, max_len, alpha, constraints)
        assert res[r][0].score <= score + 1e-9  # never better than the optimum


def test_eos_only_after_constraints() -> None:
    vocab, eos, max_len = 5, 4, 6
    step, _ = table_model(vocab, 1, max_len, rare=(2,))
    # the selector on its own (no filtering by the driver): every finished hypothesis met the constraint
    res = search_batch(step, init_for(2), BOS, eos, 3, max_len, selector=Constrained([[2, 2]]))
    n_finished = 0
    for hyps in res:
        for h in hyps:
            if h.finished:
                n_finished += 1
                assert contains(h.tokens[:-1], [2, 2])
    assert n_finished > 0


def test_per_request_constraints_batched_equals_alone() -> None:
    vocab, eos, max_len = 5, 4, 5
    step, _ = table_model(vocab, 5, max_len)
    per = [[[1, 2]], [[3]], [[[0, 0], [2]]]]
    batched = constrained_beam_search(step, init_for(3), BOS, eos, 4, max_len, per, per_request=True)
    for r in range(3):
        one = np.array([[r, 0]], dtype=np.int64)
        alone = constrained_beam_search(step, one, BOS, eos, 4, max_len, per[r])
        assert [h.tokens for h in batched[r]] == [h.tokens for h in alone[0]]
        assert all(satisfied(h.tokens, per[r]) for h in batched[r])


def test_meets_constraints() -> None:
    assert meets_constraints([1, 2, 3], [[2, 3]])
    assert not meets_constraints([1, 3, 2], [[2, 3]])
    assert meets_constraints([5, 1], [[[2, 3], [5]], [1]])
    assert not meets_constraints([], [[1]])


def test_bad_constraints() -> None:
    step, _ = table_model(5, 0, 3)
    with pytest.raises(ValueError, match="empty"):
        constrained_beam_search(step, init_for(1), BOS, 4, 2, 3, [[]])
    with pytest.raises(ValueError, match="contains eos"):
        constrained_beam_search(step, init_for(1), BOS, 4, 2, 3, [[1, 4]])
    with pytest.raises(ValueError, match="vocabulary"):
        constrained_beam_search(step, init_for(1), BOS, 4, 2, 3, [[7]])
    with pytest.raises(TypeError, match="sequence"):
        constrained_beam_search(step, init_for(1), BOS, 4, 2, 3, 5)  # type: ignore[arg-type]


def test_torch_logits_same_as_numpy(device) -> None:
    torch = pytest.importorskip("torch")
    vocab, eos, max_len = 5, 4, 5
    step, _ = table_model(vocab, 8, max_len, rare=(2,))

    def tstep(state, y_prev):
        logits, new = step(state, np.asarray(y_prev.cpu() if hasattr(y_prev, "cpu") else y_prev))
        return torch.from_numpy(logits).to(device), new  # shape: (rows, V) on the device

    a = constrained_beam_search(step, init_for(3), BOS, eos, 4, max_len, [[2, 1]])
    b = constrained_beam_search(tstep, init_for(3), BOS, eos, 4, max_len, [[2, 1]])
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
