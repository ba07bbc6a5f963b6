"""The engine's candidate order when only each request's first candidates are ranked (wide beams): the same head as
a plain Python sort of the candidates, ties and non-finite keys included; and wide pool beams, where the cut is
taken, against a plain per-beam loop (one stop token, and many stop tokens ranked in, where the cut falls back)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beamkit import BeamSearch, LengthPenalty, SearchOptions
from beamkit.search import kernels, ranking, select
from tests.test_batch import hf_reference
from tests.toy import BOS, ToyModel, log_softmax_ref

KEYS = (0.0, -1.0, -1.5, -2.0, -3.0, math.nan, math.inf, -math.inf)  # few values: many ties


def candidates(seed: int, widths: list[int], m: int, ordered: bool):
    """The engine's layout: rows grouped by request (request ids ascending, with gaps), ``m`` candidates per row
    (distinct tokens), keys from a small set (ties, NaN, +-inf); ``ordered``: each row by key descending, equal
    keys by token ascending."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(3 * len(widths), len(widths), replace=False))
    row_req = np.repeat(ids, widths)  # shape: (rows,)
    rows = row_req.shape[0]
    tok = np.stack([rng.choice(4 * m, m, replace=False) for _ in range(rows)]) if rows else np.zeros((0, m), int)
    key = rng.choice(np.array(KEYS), size=(rows, m), p=[0.2, 0.2, 0.15, 0.15, 0.1, 0.08, 0.04, 0.08])
    if ordered:  # NaN and +-inf sort anywhere: they are dropped; order the finite ones as a selector would
        sort_key = np.where(np.isfinite(key), -key, np.inf)
        order = np.lexsort((tok, sort_key), axis=1)
        key, tok = np.take_along_axis(key, order, axis=1), np.take_along_axis(tok, order, axis=1)
    valid = rng.random((rows, m)) > 0.05
    row = np.repeat(np.arange(rows), m)
    return np.repeat(row_req, m), key.ravel(), row, tok.ravel(), valid.ravel(), ids


def python_head(req, key, row, tok, valid, limit):
    """Each request's first ``limit[r]`` candidates by a plain sort of tuples (request, -key, row, token, index)."""
    items = [
        (int(req[i]), -float(key[i]), int(row[i]), int(tok[i]), i)
        for i in range(req.shape[0])
        if valid[i] and math.isfinite(float(key[i]))
    ]
    items.sort()
    out, rank, seen = [], [], {}
    for r, _, _, _, i in items:
        k = seen.get(r, 0)
        seen[r] = k + 1
        if limit is None or k < limit[r]:
            out.append(i)
            rank.append(k)
    return out, rank


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    widths=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    m=st.integers(1, 8),
    lim=st.lists(st.integers(0, 30), min_size=5, max_size=5),
    ordered=st.booleans(),
    cut_from=st.sampled_from([1, 8, 2048]),
)
def test_the_ranked_head_is_a_plain_sorts_head(seed, widths, m, lim, ordered, cut_from):
    req, key, row, tok, valid, ids = candidates(seed, widths, m, ordered)
    limit = np.zeros(3 * len(widths), np.int64)
    limit[ids] = lim[: len(ids)]
    saved = ranking._CUT_FROM
    ranking._CUT_FROM = cut_from  # small: the partition cut runs on these small requests too
    try:
        order, rank = ranking.rank_candidates(req, key, row, tok, valid, ordered, limit)
        full, full_rank = ranking.rank_candidates(req, key, row, tok, valid, ordered)
    finally:
        ranking._CUT_FROM = saved
    want, want_rank = python_head(req, key, row, tok, valid, limit)
    assert order.tolist() == want
    assert rank.tolist() == want_rank
    assert (full.tolist(), full_rank.tolist()) == python_head(req, key, row, tok, valid, None)


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    widths=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    m=st.integers(1, 8),
    lim=st.lists(st.integers(0, 30), min_size=5, max_size=5),
    ordered=st.booleans(),
    compiled=st.booleans(),
)
def test_the_head_scan_is_a_plain_sorts_head(seed, widths, m, lim, ordered, compiled):
    """The one-pass head of each request (the scan numba compiles, run compiled and as plain Python) against a plain
    sort of tuples: ties, NaN and +-inf keys, invalid candidates, limits of 0 and past a request's size."""
    req, key, row, tok, valid, ids = candidates(seed, widths, m, ordered)
    limit = np.zeros(3 * len(widths), np.int64)
    limit[ids] = lim[: len(ids)]
    scan = kernels.compiled_head() if compiled else kernels.head_scan
    if scan is None:
        pytest.skip("numba is not installed")
    order, rank = np.empty(req.shape[0], np.int64), np.empty(req.shape[0], np.int64)
    n = scan(req, key, row, tok, valid, limit, order, rank)
    want, want_rank = python_head(req, key, row, tok, valid, limit)
    assert order[:n].tolist() == want
    assert rank[:n].tolist() == want_rank


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_large_requests_of_different_widths_keep_the_full_orders_head(seed, ordered):
    """Requests of thousands of candidates (the partition cut at its real size) beside small ones."""
    req, key, row, tok, valid, ids = candidates(seed, [300, 3, 700, 1], 16, ordered)
    limit = np.zeros(12, np.int64)
    limit[ids] = [40, 5, 1000, 2]
    order, rank = ranking.rank_candidates(req, key, row, tok, valid, ordered, limit)
    want, want_rank = python_head(req, key, row, tok, valid, limit)
    assert order.tolist() == want
    assert rank.tolist() == want_rank


def pool_reference(model: ToyModel, k: int, max_len: int, stops: set[int], cap: int):
    """beamkit's pool policy with several stop tokens and early stopping, as a plain per-beam loop: each beam
    offers its 2k best tokens (ties: lower token); all offers ranked (key descending, beam, token); stop tokens
    (or anything at max_len) ranked < k join the pool (``cap`` entries, by log-probability); the first k others
    run on; stop when the pool is full. Returns the prefixes each model call sees, in row order."""
    running = [((), 0.0)]
    pool: list[tuple[float, tuple, bool]] = []
    seen: list[tuple[int, ...]] = [()]
    for t in range(max_len):
        cands = []
        for b, (toks, lp) in enumerate(running):
            logp = log_softmax_ref(model.logits(toks))
            best = sorted(range(model.v), key=lambda v: (-logp[v], v))[: 2 * k]
            cands += [(lp + logp[v], b, v) for v in best]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        last = t + 1 == max_len
        new_running, new_fin = [], []
        for rank, (s, b, v) in enumerate(cands):
            toks = running[b][0] + (v,)
            if v in stops or last:
                if rank < k:
                    new_fin.append((s, toks, v in stops))
            elif len(new_running) < k:
                new_running.append((toks, s))
        pool = sorted(pool + new_fin, key=lambda h: -h[0])[:cap]
        running = new_running
        if last or not running or len(pool) >= cap:
            break
        seen += [toks for toks, _ in running]
    return seen


@pytest.mark.parametrize(("k", "v", "max_len"), [(40, 120, 4), (70, 4096, 3)])
def test_a_wide_pool_beam_matches_the_hugging_face_loop(k, v, max_len):
    """Width 40 over 120 tokens: 3,200 candidates a request from the second step, ranked only to 80; width 70 over
    4,096 tokens: each row keeps only what may be among its request's 140 best (m = 140 > 128)."""
    m = ToyModel(v, seed=k, scale=1.5, eos_bias=3.0)
    want, _ = hf_reference(m, k, max_len, 0.0, False)
    opts = SearchOptions(k, max_len, LengthPenalty(0.0), policy="pool", early_stopping=False)
    got = BeamSearch(opts).search(m.step, m.init(), BOS, 0)
    hyps = got.hypotheses[0]
    assert [tuple(h.tokens) for h in hyps] == [w[1] for w in want]
    np.testing.assert_allclose([h.logprob for h in hyps], [w[2] for w in want], atol=1e-9)


class Boosted(ToyModel):
    """A toy model whose stop tokens 0-9 are each boosted: they fill the first candidates of every row."""

    def logits(self, prefix):
        out = super().logits(prefix)
        out[:10] += 4.0
        return out


@pytest.mark.parametrize("shared_from", [None, 64])
def test_many_stop_tokens_ranked_in_fall_back_to_the_full_ranking(shared_from, monkeypatch):
    """Ten likely stop tokens fill more than half of a request's first 2k candidates: the k beams that run on
    come from further down, past the ranked head, so the engine must rank everything (``shared_from``: rows keep
    only their request's 2k best at this small size, so the engine must select again)."""
    if shared_from is not None:
        monkeypatch.setattr(select, "_MAX_SCAN_M", 8)
        monkeypatch.setattr(select, "_SHARE_FROM", shared_from)
    model = Boosted(100, seed=3, scale=1.0)
    k, max_len, patience = 30, 4, 5.0
    want = pool_reference(model, k, max_len, set(range(10)), round(k * patience))
    opts = SearchOptions(k, max_len, policy="pool", early_stopping=True, patience=patience)
    BeamSearch(opts).search(model.step, model.init(), BOS, list(range(10)))
    assert len(want) > 1 + k  # the beams chosen past the first 2k ran on
    assert model.seen == want


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    widths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    m=st.integers(2, 12),
    float32=st.booleans(),
)
def test_rows_keep_every_candidate_of_their_requests_m_best(seed, widths, m, float32):
    """Rows cut at their request's floor still hold the request's m best candidates by key, ties with the m-th
    included (logits and keys from a few values), against a plain sort of every (row, token) of the table."""
    rng = np.random.default_rng(seed)
    v = 64
    req = np.repeat(np.arange(len(widths)) * 2, widths)  # shape: (rows,)
    x = rng.choice(np.array([0.0, -0.5, -1.0, -2.0, -np.inf]), size=(req.shape[0], v)).astype(
        np.float32 if float32 else np.float64
    )
    x[:, 0] = 0.5  # every row has a finite best
    key = rng.choice(np.array([0.0, -0.5, -1.0]), size=req.shape[0])
    m_row = np.full(req.shape[0], m)
    saved = select._SHARE_FROM, select._MAX_SCAN_M
    select._SHARE_FROM, select._MAX_SCAN_M = 1, 1
    try:
        lse, vals, idx = select.lse_and_top(x, m, shared=(req, key, m_row))
    finally:
        select._SHARE_FROM, select._MAX_SCAN_M = saved
    c_key = (key[:, None] + (vals - lse[:, None])).ravel()
    got, _ = ranking.rank_candidates(
        np.repeat(req, m), c_key, np.repeat(np.arange(req.shape[0]), m), idx.ravel(), limit=np.full(8, m)
    )
    got_items = [(int(np.repeat(np.arange(req.shape[0]), m)[i]), int(idx.ravel()[i])) for i in got]
    items = []
    for r in range(req.shape[0]):
        for t in range(v):
            k = float(key[r]) + (float(x[r, t]) - float(lse[r]))
            if math.isfinite(k):
                items.append((int(req[r]), -k, r, t))
    items.sort()
    want, seen = [], {}
    for q, _, r, t in items:
        seen[q] = seen.get(q, 0) + 1
        if seen[q] <= m:
            want.append((r, t))
    assert got_items == want


@settings(max_examples=200)
@given(
    st.lists(st.integers(-3, 40), max_size=80),
    st.lists(st.integers(-3, 40), max_size=80),
)
def test_member_is_set_membership(ids, of):
    """``member`` against Python's own set membership, on both sides of its size switch (80 x 80 > 4096)."""
    a, b = np.array(ids, dtype=np.int64), np.array(of, dtype=np.int64)
    assert ranking.member(a, b).tolist() == [x in set(of) for x in ids]
