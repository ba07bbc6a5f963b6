"""The paged KV cache: block sharing and copy-on-write against hand-worked counts and a plain per-row reference,
and the Transformer over pages against its dense cache (the same outputs), alone and through the Engine with
joins, leaves and cancellations. Every test ends with every block free and every reference count zero."""

from __future__ import annotations

import copy
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from beamkit import Engine, search_batch  # noqa: E402
from beamkit.kv import CacheFullError, PagedKVCache  # noqa: E402
from beamkit.models import load_model  # noqa: E402
from beamkit.models.common import encode_sources, pad_batch  # noqa: E402
from beamkit.models.transformer import Transformer  # noqa: E402
from beamkit.models.vocab import SPECIALS, Vocab  # noqa: E402

_CACHES: list[PagedKVCache] = []


@pytest.fixture(autouse=True)
def no_leaks():
    """Leak check: after each test every cache it made has all blocks free and all reference counts zero."""
    _CACHES.clear()
    yield
    gc.collect()
    for c in _CACHES:
        assert c.free_blocks() == c.n_blocks, f"{c.blocks_in_use()} blocks still in use"
        assert not c.refcount.any()
        assert sorted(c._free) == list(range(c.n_blocks))  # each block on the free list once
    _CACHES.clear()


def make_cache(*args, **kwargs) -> PagedKVCache:
    c = PagedKVCache(*args, **kwargs)
    _CACHES.append(c)
    return c


def paged_cache(model, n_blocks: int, block_size: int) -> PagedKVCache:
    c = model.paged_cache(n_blocks, block_size)
    _CACHES.append(c)
    return c


def kv(rows: int, length: int, seed: int, layers: int = 2, heads: int = 2, d: int = 3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, heads, length, d, generator=g) for _ in range(2 * layers)]


# ---------------------------------------------------------------------------------------------- the cache alone
def test_fork_shares_blocks_and_copy_on_write_copies_only_the_shared_partial_block():
    c = make_cache(2, 2, 3, n_blocks=10, block_size=4)
    t = kv(1, 6, 0)
    h = c.prefill(t[:2], t[2:])  # 6 positions: one full block, one holding 2
    assert c.blocks_in_use() == 2
    h = h.beamkit_select(np.array([0, 0, 0]))
    assert c.blocks_in_use() == 2 and c.copied_blocks == 0  # three rows, still two blocks
    assert sorted(c.refcount[c.refcount > 0].tolist()) == [3, 3]
    h = h.append()
    assert c.copied_blocks == 2  # the partial block: the first row keeps it, the two others copy it
    assert c.blocks_in_use() == 4
    assert c.refcount[h.table[0, 0]] == 3  # the full block is still shared by all three rows
    new = kv(3, 1, 1)
    for layer in range(2):
        h.write(layer, new[layer], new[2 + layer])
    for layer in range(2):
        k, v = h.read(layer)
        for row in range(3):
            assert torch.equal(k[row, :, :6], t[layer][0])
            assert torch.equal(v[row, :, :6], t[2 + layer][0])
            assert torch.equal(k[row, :, 6], new[layer][row, :, 0])
    h = h.beamkit_select(np.array([2]))  # two rows leave: their blocks come back
    assert c.blocks_in_use() == 2
    h.release()


def test_full_blocks_are_never_copied():
    c = make_cache(2, 2, 3, n_blocks=10, block_size=4)
    t = kv(1, 8, 0)
    h = c.prefill(t[:2], t[2:]).beamkit_select(np.array([0, 0, 0, 0]))
    h = h.append()
    assert c.copied_blocks == 0 and c.blocks_in_use() == 2 + 4  # each row starts a block of its own
    assert c.peak_bytes() == 6 * c.block_bytes == 6 * 2 * 2 * 2 * 4 * 3 * 4
    del h


def test_selecting_the_identity_walks_no_reference_count(monkeypatch):
    c = make_cache(2, 2, 3, n_blocks=16, block_size=2)
    h = c.prefill(kv(3, 5, 0)[:2], kv(3, 5, 1)[:2])  # 3 rows of 5 positions: 3 blocks each
    h = h.beamkit_select(np.array([0, 0, 2]))
    counts = c.refcount.copy()
    walked = []
    monkeypatch.setattr(c, "_incref", lambda b: walked.append(b))
    monkeypatch.setattr(c, "_decref", lambda b: walked.append(b))
    h = h.beamkit_select(np.arange(3))
    assert walked == [] and np.array_equal(c.refcount, counts)
    monkeypatch.undo()
    h.release()


def test_blocks_needed_counts_fresh_blocks_and_copies_on_write():
    c = make_cache(1, 1, 2, n_blocks=32, block_size=4)
    a = c.prefill(kv(1, 4, 0, layers=1, heads=1, d=2)[:1], kv(1, 4, 1, layers=1, heads=1, d=2)[:1])  # full block
    b = c.prefill(kv(1, 6, 2, layers=1, heads=1, d=2)[:1], kv(1, 6, 3, layers=1, heads=1, d=2)[:1])  # 4 + 2
    rows = a.beamkit_concat([b]).beamkit_select(np.array([0, 0, 1, 1, 1]))
    # hand-worked: rows 0-1 start a block (2 fresh); rows 2-4 write into a partial block only the three hold:
    # the first keeps it, the other two copy it
    assert rows.blocks_needed() == 4
    before = c.free_blocks()
    rows = rows.append()
    assert before - c.free_blocks() == 4 and rows.blocks_needed() == 0  # now 4 + 1 kept; all partial, own
    rows.release()


def test_out_of_blocks_raises_and_changes_nothing():
    c = make_cache(1, 1, 2, n_blocks=3, block_size=2)
    t = kv(1, 2, 0, layers=1, heads=1, d=2)
    h = c.prefill(t[:1], t[1:]).beamkit_select(np.array([0, 0, 0]))  # 1 block, 3 rows each need a fresh one
    before = c.refcount.copy()
    with pytest.raises(CacheFullError, match="out of blocks: 3 needed, 2 free"):
        h.append()
    assert (c.refcount == before).all() and c.free_blocks() == 2
    h = h.beamkit_select(np.array([0, 1])).append()  # still usable
    assert c.blocks_in_use() == 3
    del h


def test_consumed_handles_and_bad_input_are_refused():
    c = make_cache(1, 1, 2, n_blocks=4, block_size=2)
    h = c.rows(2)
    h2 = h.beamkit_select(np.array([1, 0]))
    with pytest.raises(ValueError, match="consumed"):
        h.append()
    with pytest.raises(IndexError, match="out of range"):
        h2.beamkit_select(np.array([2]))
    other = make_cache(1, 1, 2, n_blocks=4, block_size=2)
    with pytest.raises(ValueError, match="different PagedKVCache"):
        h2.beamkit_concat([other.rows(1)])
    with pytest.raises(ValueError, match=r"\[rows, 1, P, 2\]"):
        c.prefill([torch.zeros(1, 2, 3, 2)], [torch.zeros(1, 2, 3, 2)])
    with pytest.raises(ValueError, match=r"^block_size must be >= 1, got 0$"):
        PagedKVCache(1, 1, 2, n_blocks=4, block_size=0)
    with pytest.raises(ValueError, match="pages\\(\\) needs the handle returned by append"):
        c.rows(1).pages()


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_random_forks_appends_joins_equal_a_plain_per_row_reference(block_size):
    """Random selects (repeats, drops), appends, joins and releases; every row's positions read back equal a
    reference kept as one growing array per row, and reference counts equal the table entries naming each block."""
    rng = np.random.default_rng(block_size)
    c = make_cache(1, 2, 3, n_blocks=400, block_size=block_size)
    ref: list[np.ndarray] = []  # per row: (positions, heads, d) keys; values are keys + 1
    h = c.rows(0)
    for step in range(60):
        op = rng.integers(0, 4)
        if op == 0 or len(ref) == 0:  # a request joins with a prefix of random length
            p = int(rng.integers(0, 2 * block_size + 2))
            k = torch.randn(1, 2, p, 3, generator=torch.Generator().manual_seed(step))
            h = h.beamkit_concat([c.prefill([k], [k + 1])])
            ref.append(k[0].transpose(0, 1).numpy())
        elif op == 1:  # fork / drop by parent
            idx = np.sort(rng.integers(0, len(ref), int(rng.integers(0, 2 * len(ref) + 1))))
            h = h.beamkit_select(idx)
            ref = [ref[i] for i in idx]
        else:
            h = h.append()
            new = torch.randn(len(ref), 2, 1, 3, generator=torch.Generator().manual_seed(1000 + step))
            h.write(0, new, new + 1)
            ref = [np.concatenate([r, new[i, :, 0].numpy()[None]]) for i, r in enumerate(ref)]
            k, v = h.read(0)
            for i, r in enumerate(ref):
                got = k[i, :, : r.shape[0]].transpose(0, 1).numpy()
                np.testing.assert_array_equal(got, r)
                np.testing.assert_array_equal(v[i, :, : r.shape[0]].transpose(0, 1).numpy(), r + 1)
        assert (h.length == [r.shape[0] for r in ref]).all()
        named = np.bincount(h.table[h.table >= 0], minlength=c.n_blocks)
        assert (named == c.refcount).all()
        assert c.blocks_in_use() == int((named > 0).sum())
    del h


# ---------------------------------------------------------------------------------------------- the Transformer
SRC = Vocab(SPECIALS + tuple("abcdefghij"))
TGT = Vocab(SPECIALS + tuple("0123456789klmnopq"))


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    torch.manual_seed(0)
    return Transformer(SRC, TGT, d_model=32, heads=4, ff=64, dec_layers=2, max_len=64).eval()


@pytest.fixture(scope="module")
def tiny64(tiny):
    """A float64 copy of the tiny model, for the paged-against-dense comparisons (see :data:`TOL`)."""
    return copy.deepcopy(tiny).double()


# Paged and dense attention compute the same sums in a different order and width: the paged rows read whole
# blocks (masked positions add exact zeros to the softmax and to ``weights @ v``), the dense rows of a joined
# batch are padded on the left. How a CPU's SIMD kernel splits a reduction of another width is its own choice,
# so the two paths agree only to rounding, and float32 rounding (unit roundoff 6e-8) is too coarse to tell a
# reordering from a wrong answer: log-probabilities of -20 differ in the sixth decimal, and a near-tie between
# two candidates can swap. The comparisons therefore run in float64 (unit roundoff u = 1.1e-16). A token's
# log-probability passes through about ten reductions of at most 128 terms (two decoder layers of self- and
# cross-attention and feed-forward, the output layer, the log-softmax) whose terms stay below 1e2 in magnitude;
# the worst-case error of a reordered sum of n terms is n * u * sum|terms|, so one log-probability moves by at
# most about 10 * 128 * 1e2 * 1.1e-16 = 1.4e-11, and a sum over at most 14 tokens by 2e-10. TOL = 1e-9 covers
# that on any CPU, while a wrong block, a missed copy-on-write or a misaligned mask moves log-probabilities of
# these models by 1e-3 or more (six orders of magnitude above TOL).
TOL = 1e-9


def _src(seed: int, n: int = 1, length: int = 7):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, len(SRC), (n, length), generator=g)


def _prefix(seed: int, n: int, length: int):
    if length == 0:
        return None
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randint(3, len(TGT), (n, length), generator=g)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("boundary", [-1, 0, 1])
def test_paged_transformer_equals_dense(tiny64, block_size, boundary):
    """Rows of one length: identical hypotheses, log-probabilities equal to float64 rounding (:data:`TOL`), with
    prefixes just below, at and past a block boundary, decoding across further boundaries."""
    p = max(0, block_size + boundary)
    src, prefix = _src(p, 3), _prefix(p, 3, p)
    c = paged_cache(tiny64, 300, block_size)
    with torch.inference_mode():
        dense = search_batch(tiny64.step, tiny64.init_state(src, None, prefix), 1, None, 4, 2 * block_size + 3)
        paged = search_batch(tiny64.step, tiny64.init_state(src, None, prefix, kv=c), 1, None, 4, 2 * block_size + 3)
    for d, q in zip(dense, paged, strict=True):
        _assert_same_hypotheses(q, d)


def test_engine_reports_kv_bytes_dense_and_paged(tiny):
    """The engine's counters: the dense cache at its last call holds rows x positions (hand-computed); the paged
    one reports the pool's peak, which sharing keeps below it."""
    rows, p, steps, beam = 3, 16, 12, 4
    src, prefix = _src(0, rows), _prefix(0, rows, p)
    per_position = 2 * 2 * 4 * 8 * 4  # keys+values x layers x heads x d_head x float32
    c = paged_cache(tiny, 300, 4)
    with torch.inference_mode():
        dense = Engine(tiny.step, beam_size=beam, max_len=steps)
        dense.add_batch(tiny.init_state(src, None, prefix), 1, None)
        paged = Engine(tiny.step, beam_size=beam, max_len=steps)
        paged.add_batch(tiny.init_state(src, None, prefix, kv=c), 1, None)
        for e in (dense, paged):
            while not e.idle:
                e.step()
    assert dense.stats.kv_peak_bytes == rows * beam * (p + steps) * per_position
    assert paged.stats.kv_peak_bytes == c.peak_bytes()
    assert paged.stats.kv_peak_bytes < 0.6 * dense.stats.kv_peak_bytes
    assert c.copied_blocks > 0


def _run_plan(model, plan, make_state, **engine_opts):
    engine = Engine(model.step, **engine_opts)
    ids, done, cancelled = {}, {}, set()
    with torch.inference_mode():
        for step in range(80):
            for i, p in enumerate(plan):
                if p["arrive"] == step:
                    ids[i] = engine.add(make_state(i), p["bos"], p["eos"], beam_size=p["beam"])
                if p["cancel"] is not None and p["arrive"] + p["cancel"] == step and engine.cancel(ids[i]):
                    cancelled.add(i)
            for d in engine.step():
                done[d.request_id] = d
            if len(ids) == len(plan) and engine.idle:
                break
    assert engine.idle and len(done) == len(plan)
    assert max(engine.stats.joined_per_call) >= 1
    return {i: done[ids[i]] for i in range(len(plan))}, cancelled


def _assert_same_hypotheses(got, ref):
    """Identical tokens in the same order; every token's log-probability, each total and each score within
    :data:`TOL` (float64 models)."""
    assert [h.tokens for h in got] == [h.tokens for h in ref]
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g.token_logprobs, r.token_logprobs, rtol=0, atol=TOL)
    np.testing.assert_allclose([h.logprob for h in got], [h.logprob for h in ref], rtol=0, atol=TOL)
    np.testing.assert_allclose([h.score for h in got], [h.score for h in ref], rtol=0, atol=TOL)


def _assert_same(got, alone):
    """A request decoded through the engine equals the same request decoded alone (:func:`_assert_same_hypotheses`)."""
    assert got.error is None
    _assert_same_hypotheses(got.hypotheses, alone)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_engine_joins_leaves_cancels_over_pages_equal_dense_alone(tiny64, block_size):
    """Requests with prefixes of different lengths join a running paged engine mid-flight, finish at eos at
    different steps or are cancelled; each gets what the dense cache gives it decoded alone."""
    rng = np.random.default_rng(block_size)
    plan = [
        {
            "arrive": int(rng.integers(0, 8)),
            "beam": int(rng.integers(1, 5)),
            "prefix": int(rng.integers(0, 2 * block_size + 2)),
            "bos": int(rng.integers(3, len(TGT))),
            "eos": int(rng.integers(3, len(TGT))),
            "cancel": int(rng.integers(1, 5)) if rng.random() < 0.25 else None,
        }
        for _ in range(7)
    ]
    c = paged_cache(tiny64, 600, block_size)

    def paged_state(i):
        return tiny64.init_state(_src(i), None, _prefix(i, 1, plan[i]["prefix"]), kv=c)

    got, cancelled = _run_plan(tiny64, plan, paged_state, max_len=14, policy="pool")
    assert c.copied_blocks > 0 or block_size == 1
    for i, p in enumerate(plan):
        if i in cancelled:
            assert got[i].error == "cancelled"
            continue
        with torch.inference_mode():
            state = tiny64.init_state(_src(i), None, _prefix(i, 1, p["prefix"]))
            alone = search_batch(tiny64.step, state, p["bos"], p["eos"], p["beam"], 14, policy="pool")[0]
        _assert_same(got[i], alone)


DATES = ["3rd of March 1999", "1/2/03", "Tuesday, 14 September 2021", "march 7 1987", "12.10.1955"]


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_shipped_transformer_joins_over_pages_equal_dense_alone(one_torch_thread, block_size):
    model = load_model("dates-transformer").double()  # float64: see TOL
    tv = model.tgt_vocab
    rng = np.random.default_rng(10 + block_size)
    plan = [
        {
            "arrive": int(rng.integers(0, 6)),
            "beam": int(rng.integers(1, 6)),
            "bos": tv.bos,
            "eos": tv.eos,
            "cancel": int(rng.integers(1, 5)) if rng.random() < 0.25 else None,
        }
        for _ in DATES
    ]
    c = paged_cache(model, 400, block_size)

    def state(i, kv=None):
        src, lengths = pad_batch(encode_sources(model.src_vocab, [DATES[i]]), model.src_vocab.pad)
        return model.init_state(torch.as_tensor(src), torch.as_tensor(lengths), kv=kv)

    got, cancelled = _run_plan(model, plan, lambda i: state(i, c), max_len=12, policy="pool")
    for i, p in enumerate(plan):
        if i in cancelled:
            assert got[i].error == "cancelled"
            continue
        with torch.inference_mode():
            alone = search_batch(model.step, state(i), tv.bos, tv.eos, p["beam"], 12, policy="pool")[0]
        _assert_same(got[i], alone)


def test_cache_full_fails_the_requests_of_the_call_and_frees_their_blocks(tiny):
    c = paged_cache(tiny, 6, 4)
    with torch.inference_mode():
        engine = Engine(tiny.step, beam_size=4, max_len=20)
        rid = engine.add(tiny.init_state(_src(0), None, _prefix(0, 1, 6), kv=c), 1, None)
        done = []
        while not engine.idle:
            done += engine.step()
    assert [d.request_id for d in done] == [rid]
    assert "CacheFullError: PagedKVCache out of blocks" in (done[0].error or "")


def test_paged_and_dense_states_do_not_join(tiny):
    c = paged_cache(tiny, 20, 4)
    with torch.inference_mode():
        engine = Engine(tiny.step, beam_size=2, max_len=5, on_step_error="raise")
        engine.add(tiny.init_state(_src(0), kv=c), 1, None)
        engine.step()
        engine.add(tiny.init_state(_src(1)), 1, None)
        with pytest.raises(ValueError, match="cannot join paged and dense"):
            engine.step()
        del engine
    with pytest.raises(TypeError, match="kv must be a beamkit.kv.PagedKVCache"):
        tiny.init_state(_src(0), kv="paged")
    with pytest.raises(ValueError, match="prefix must be \\[1, P\\]"):
        tiny.init_state(_src(0), prefix=torch.zeros(2, 3, dtype=torch.long))
