"""Shared-prefix attention over a paged cache (``beamkit.kv.attention``).

Oracle: plain softmax attention over every row's keys/values, gathered into per-row tensors by
``PagedRows.read`` (the gathering path, which copies and never splits the softmax) and computed with
``torch.softmax``; grouped queries by repeating each key/value head. Tolerances: float32 softmax over at most
~100 positions summed in two parts and merged, outputs of magnitude <= a few units: each output within a few
float32 ulps of relative error (6e-8 each), so 1e-5 absolute.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import beamkit.kv.attention as attention  # noqa: E402
from beamkit.kv import PagedKVCache  # noqa: E402
from beamkit.kv.attention import plan_prefix, shared_prefix_attention  # noqa: E402


def _reference(rows, query, scale, groups, softcap=None):
    """softmax(q k^T * scale) v over each row's positions, from the gathered per-row copies."""
    k, v = rows.read(0)  # shape: (rows, heads, width, d)
    mask = rows.pages().mask
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    s = (query @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v)[:, :, 0]  # shape: (rows, q_heads, d)


def _random_rows(rng, gen, bs, heads, d, steps, device="cpu"):
    """Requests with random prompts, then ``steps`` of random forks / drops and one appended position each."""
    kv = PagedKVCache(1, heads, d, 2000, bs, device=device)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    parts = []
    for _ in range(int(rng.integers(1, 5))):
        p = int(rng.integers(1, 3 * bs + 2))
        parts.append(kv.prefill([randn(1, heads, p, d)], [randn(1, heads, p, d)]))
    rows = parts[0].beamkit_concat(parts[1:]) if len(parts) > 1 else parts[0]
    for _ in range(steps):
        n = len(rows)
        rows = rows.beamkit_select(np.sort(rng.integers(0, n, int(rng.integers(1, 9)))))
        rows = rows.append()
        rows.write(0, randn(len(rows), heads, 1, d), randn(len(rows), heads, 1, d))
    return kv, rows


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("bs", [1, 2, 4, 16])
def test_equals_plain_attention_after_random_forks_and_joins(bs, groups, device):
    rng = np.random.default_rng(bs * 10 + groups)
    gen = torch.Generator().manual_seed(bs)
    heads, d = 2, 8
    for trial in range(30):
        kv, rows = _random_rows(rng, gen, bs, heads, d, int(rng.integers(1, 12)), device)
        plan = plan_prefix(rows.table, rows.length, bs, device)
        q = torch.randn(len(rows), heads * groups, 1, d, generator=gen).to(device)
        got = shared_prefix_attention(plan, q, kv.k[0], kv.v[0], 0.35)
        torch.testing.assert_close(got, _reference(rows, q, 0.35, groups), atol=1e-5, rtol=0, msg=f"trial {trial}")


def test_softcap_matches_plain_attention(device):
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    kv, rows = _random_rows(rng, gen, 4, 2, 8, 6, device)
    plan = plan_prefix(rows.table, rows.length, 4, device)
    q = 3 * torch.randn(len(rows), 2, 1, 8, generator=gen).to(device)
    got = shared_prefix_attention(plan, q, kv.k[0], kv.v[0], 1.0, softcap=2.0)
    torch.testing.assert_close(got, _reference(rows, q, 1.0, 1, softcap=2.0), atol=1e-5, rtol=0)


def test_a_wide_request_reads_its_prompt_once_in_place():
    gen = torch.Generator().manual_seed(0)
    kv = PagedKVCache(1, 2, 4, 400, 4)
    rows = kv.prefill([torch.randn(1, 2, 10, 4, generator=gen)], [torch.randn(1, 2, 10, 4, generator=gen)])
    rows = rows.beamkit_select(np.zeros(300, np.int64)).append()  # 300 beams of one 10-token prompt
    rows.write(0, torch.randn(300, 2, 1, 4, generator=gen), torch.randn(300, 2, 1, 4, generator=gen))
    plan = plan_prefix(rows.table, rows.length, 4, "cpu")
    # hand-worked: blocks of 4, 11 positions each: 2 full prompt blocks shared by all, a tail of 3 per row
    (bucket,) = plan.buckets
    assert (bucket.groups, bucket.width, bucket.blocks) == (1, 300, 2)
    assert bucket.block_ids is None and bucket.query_rows is None  # the pool's blocks and the rows, in place
    assert plan.shared_positions == 8 and plan.tail == 3 and plan.tail_positions == 300 * 3
    q = torch.randn(300, 2, 1, 4, generator=gen)
    got = shared_prefix_attention(plan, q, kv.k[0], kv.v[0], 0.5)
    torch.testing.assert_close(got, _reference(rows, q, 0.5, 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("few", [0, 4])
def test_groups_of_different_sizes_are_bucketed_and_padded_exactly(few, monkeypatch):
    # requests of 1, 5 and 7 rows and prompts of 5, 9 and 13 positions (blocks of 2), one position appended:
    # shared full blocks 2, 4 and 6 (hand-worked: the block of the newest position is never shared); the last
    # two requests fall in one bucket (rows 4-7, blocks 4-7), padded to 7 rows and 6 blocks: the padding must
    # not leak into any row's result. With up to ``few`` groups a bucket whose groups hold runs of block ids
    # reads each group in place instead (one unpadded product per group).
    monkeypatch.setattr(attention, "_IN_PLACE_GROUPS", few)
    gen = torch.Generator().manual_seed(1)
    kv = PagedKVCache(1, 1, 4, 200, 2)
    parts = [
        kv.prefill([torch.randn(1, 1, p, 4, generator=gen)], [torch.randn(1, 1, p, 4, generator=gen)])
        for p in (5, 9, 13)
    ]
    rows = parts[0].beamkit_concat(parts[1:]).beamkit_select(np.repeat([0, 1, 2], [1, 5, 7])).append()
    rows.write(0, torch.randn(13, 1, 1, 4, generator=gen), torch.randn(13, 1, 1, 4, generator=gen))
    plan = plan_prefix(rows.table, rows.length, 2, "cpu")
    want = [(1, 1, 2), (2, 7, 6)] if few == 0 else [(1, 1, 2), (1, 5, 4), (1, 7, 6)]
    assert sorted((b.groups, b.width, b.blocks) for b in plan.buckets) == want
    assert all(b.block_ids is None for b in plan.buckets) == (few > 0)  # in place
    q = torch.randn(13, 1, 1, 4, generator=gen)
    torch.testing.assert_close(
        shared_prefix_attention(plan, q, kv.k[0], kv.v[0], 0.5), _reference(rows, q, 0.5, 1), atol=1e-5, rtol=0
    )
