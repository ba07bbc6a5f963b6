"""Diverse beam search against an independent slow reference (narrow, pool and compete policies)."""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import search_batch
from beamkit.variants.diverse import diverse_beam_search

BOS = 99


def table_model(vocab: int, seed: int, max_len: int, sharp: float = 1.5):
    """Logits from the step, the last two tokens and the request id; state = request id, started flag, tokens.

    The last token (eos in these tests) is made less likely so that beams live long enough to interact.
    """
    table = np.random.default_rng(seed).normal(size=(max_len + 1, vocab + 1, vocab + 1, vocab)) * sharp
    table[..., -1] -= 1.5

    def logits_of(req: int, tokens: list[int]) -> np.ndarray:
        t = len(tokens)
        last = tokens[-1] if t >= 1 else vocab
        prev = tokens[-2] if t >= 2 else vocab
        return table[t, last, prev] + 0.5 * np.cos(req * np.arange(vocab))

    def step(state, y_prev):
        y = np.asarray(y_prev, dtype=np.int64)
        if state[0, 1]:  # started: append the previous token
            hist = np.concatenate([state, y[:, None]], axis=1)
        else:
            hist = np.concatenate([state[:, :1], np.ones_like(state[:, :1])], axis=1)
        logits = np.stack([logits_of(int(h[0]), h[2:].tolist()) for h in hist])
        return logits, hist

    return step, logits_of


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def reference(logits_of, req, vocab, eos, groups, per, lam, max_len, alpha, policy):
    """Vijayakumar et al. / HF group beam search, one request, plain Python lists."""
    live = [[([], 0.0)] for _ in range(groups)]
    done = [[] for _ in range(groups)]  # (score, tokens, logprob, finished)
    stopped = [False] * groups
    for t in range(max_len):
        last = t + 1 == max_len
        chosen: list[int] = []
        for g in range(groups):
            if stopped[g] or not live[g]:
                continue
            cands = []
            for b, (toks, lp) in enumerate(live[g]):
                logp = log_softmax(logits_of(req, toks))
                for v in range(vocab):
                    cands.append((lp + logp[v] - lam * chosen.count(v), b, v))
            cands.sort(key=lambda c: (-c[0], c[1], c[2]))
            new_live = []
            if policy == "narrow":
                for s, b, v in cands[: per - len(done[g])]:
                    seq = live[g][b][0] + [v]
                    if v == eos:
                        done[g].append((s / len(seq) ** alpha, seq, s, True))
                    else:
                        new_live.append((seq, s))
                if last:
                    done[g] += [(s / len(seq) ** alpha, seq, s, False) for seq, s in new_live]
            elif policy == "compete":  # finished and new compete by running log-probability for `per` places
                pool = sorted(done[g], key=lambda d: -d[2])
                places = [(d[2], 0, i) for i, d in enumerate(pool)] + [(c[0], 1, j) for j, c in enumerate(cands)]
                places.sort(key=lambda e: (-e[0], e[1], e[2]))  # a finished one wins a tie
                top = places[:per]
                new_done = []
                for _, side, j in top:
                    if side == 0:
                        continue
                    s, b, v = cands[j]
                    seq = live[g][b][0] + [v]
                    if v == eos:
                        new_done.append((s / len(seq) ** alpha, seq, s, True))
                    else:
                        new_live.append((seq, s))
                if last:
                    new_done += [(s / len(seq) ** alpha, seq, s, False) for seq, s in new_live]
                kept = {j for _, side, j in top if side == 0}
                done[g] = [d for i, d in enumerate(pool) if i in kept] + new_done
                chosen += [seq[-1] for seq, _ in new_live]
            else:  # pool: eos in the top `per` ranks finish, the first `per` others run on
                running = []
                for rank, (s, b, v) in enumerate(cands[: 2 * per]):
                    seq = live[g][b][0] + [v]
                    if (v == eos or last) and rank < per:
                        done[g].append((s / len(seq) ** alpha, seq, s, v == eos))
                    if v != eos and len(running) < per:
                        running.append((seq, s))
                # Hugging Face picks the next running beams even at the last step, and they count as the
                # group's current tokens for the later groups' penalty; at max_len they end the search.
                chosen += [seq[-1] for seq, _ in running]
                new_live = [] if last else running
                done[g].sort(key=lambda d: -d[0])
                done[g] = done[g][:per]
                # early_stopping=False heuristic: stop when the best running cannot beat the worst finished
                if len(done[g]) >= per and new_live:
                    best_run = new_live[0][1] / (t + 1) ** alpha
                    if best_run <= done[g][-1][0]:
                        stopped[g] = True
            if policy == "narrow":
                chosen += [seq[-1] for seq, _ in new_live]
            live[g] = new_live
    merged = []
    for g in range(groups):
        merged += sorted(done[g], key=lambda d: -d[0])
    merged.sort(key=lambda d: -d[0])
    return merged


@pytest.mark.parametrize("policy", ["narrow", "pool", "compete"])
@pytest.mark.parametrize(("groups", "per", "lam"), [(2, 1, 0.5), (2, 2, 1.5), (3, 2, 0.8), (4, 1, 3.0)])
def test_matches_slow_reference(policy: str, groups: int, per: int, lam: float) -> None:
    vocab, eos, max_len, alpha, n_req = 5, 4, 6, 1.0, 3
    step, logits_of = table_model(vocab, groups * 10 + per, max_len)
    init = np.stack([np.arange(n_req), np.zeros(n_req, dtype=np.int64)], axis=1)
    got = diverse_beam_search(
        step,
        init,
        BOS,
        eos,
        groups * per,
        max_len,
        groups=groups,
        diversity=lam,
        policy=policy,
        length_penalty=alpha,
    )
    for r in range(n_req):
        ref = reference(logits_of, r, vocab, eos, groups, per, lam, max_len, alpha, policy)
        assert [h.tokens for h in got[r]] == [d[1] for d in ref]
        assert [h.score for h in got[r]] == pytest.approx([d[0] for d in ref], abs=1e-9)
        assert [h.finished for h in got[r]] == [d[3] for d in ref]


def test_one_group_is_beam_search() -> None:
    vocab, eos, max_len = 5, 4, 5
    step, _ = table_model(vocab, 3, max_len)
    init = np.stack([np.arange(3), np.zeros(3, dtype=np.int64)], axis=1)
    a = diverse_beam_search(step, init, BOS, eos, 3, max_len, groups=1, diversity=2.0)
    b = search_batch(step, init, BOS, eos, 3, max_len)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]


def test_groups_differ_with_diversity() -> None:
    vocab, eos, max_len, groups = 6, 5, 5, 3
    step, _ = table_model(vocab, 21, max_len, sharp=2.5)
    init = np.stack([np.arange(4), np.zeros(4, dtype=np.int64)], axis=1)
    same = diverse_beam_search(step, init, BOS, eos, groups, max_len, groups=groups, diversity=0.0)
    diff = diverse_beam_search(step, init, BOS, eos, groups, max_len, groups=groups, diversity=10.0)
    for r in range(4):
        # without the penalty every group decodes the same single beam; with it, each group starts differently
        assert len({tuple(h.tokens) for h in same[r]}) == 1
        assert len({h.tokens[0] for h in diff[r]}) == groups


def test_bad_arguments() -> None:
    step, _ = table_model(4, 0, 3)
    init = np.zeros((1, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="multiple of groups"):
        diverse_beam_search(step, init, BOS, 3, 5, 3, groups=2)
    with pytest.raises(ValueError, match="groups must be"):
        diverse_beam_search(step, init, BOS, 3, 4, 3, groups=0)
    with pytest.raises(ValueError, match="own selector"):
        diverse_beam_search(step, init, BOS, 3, 4, 3, groups=2, selector=None)


def test_torch_logits_same_as_numpy(device) -> None:
    torch = pytest.importorskip("torch")
    vocab, eos, max_len = 5, 4, 5
    step, _ = table_model(vocab, 8, max_len)

    def tstep(state, y_prev):
        logits, new = step(state, np.asarray(y_prev.cpu() if hasattr(y_prev, "cpu") else y_prev))
        return torch.from_numpy(logits).to(device), new  # shape: (rows, V) on the device

    init = np.stack([np.arange(3), np.zeros(3, dtype=np.int64)], axis=1)
    a = diverse_beam_search(step, init, BOS, eos, 4, max_len, groups=2, diversity=1.0)
    b = diverse_beam_search(tstep, init, BOS, eos, 4, max_len, groups=2, diversity=1.0)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
    assert [h.score for x in a for h in x] == pytest.approx([h.score for x in b for h in x], abs=1e-9)
