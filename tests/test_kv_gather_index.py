"""The gather index of the paged Hugging Face cache (``attention="gather"``), kept from step to step.

Oracles, none of them the index code: the index built with plain Python loops from the rows' block tables and
lengths after each step (slot ``block * block_size + offset`` of each position, rows aligned on the right,
padding 0, then one copy per head offset by ``head * n_blocks * block_size``); a Python model of every row's
values (a list per row, forked, joined, trimmed and extended alongside the cache), which the keys the cache
gathers must equal; and ``model.generate`` for a tiny seeded GPT-2 decoded through the gathering step.
"""

from __future__ import annotations

import functools
import os
import types

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
import beamkit.hf.bridge.generation as generation  # noqa: E402
from beamkit.hf.steps.paged import PagedCache, PagedPool  # noqa: E402
from beamkit.kv import GatherIndex  # noqa: E402
from tests.test_hf import setup  # noqa: E402
from tests.test_hf_paged import NEW, _generate  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HEADS = 2


def _expected_index(cache: PagedCache) -> list[int]:
    """The step's gather index, ``[rows, heads, width]`` flattened, from the block tables by loops."""
    kv = cache.pool.kv
    rows = cache.rows
    bs, width = kv.block_size, cache.length + 1
    out = []
    for r in range(len(rows)):
        own = int(rows.length[r])
        base = []
        for c in range(width):
            p = c - (width - own)
            base.append(0 if p < 0 else int(rows.table[r][p // bs]) * bs + p % bs)
        for h in range(kv.heads):
            out.extend(b + h * kv.n_blocks * bs for b in base)
    return out


class Model:
    """A paged cache with one layer of ``HEADS`` heads of width 1 and, beside it, every row's values as lists."""

    def __init__(self, rng: np.random.Generator, block_size: int, blocks: int, first: int = 0):
        self.rng = rng
        self.pool = PagedPool(block_size, blocks, attention="gather")
        self.next = 1.0  # values written so far: each position gets its own
        self.cache, self.values = self.prompt(first)

    def prompt(self, width: int = 0) -> tuple[PagedCache, list[list[float]]]:
        """A new prompt of 1-3 rows, each with 0-3 columns of leading padding (not stored); ``width``: one row
        of that many positions instead."""
        n, lead = 1, np.zeros(1, np.int64)
        if not width:
            n, width = int(self.rng.integers(1, 4)), int(self.rng.integers(4, 10))
            lead = self.rng.integers(0, 4, n)
        keys = torch.zeros(n, HEADS, width, 1, dtype=torch.float64)
        values = []
        for r in range(n):
            row = [self.next + i for i in range(width - int(lead[r]))]
            self.next += len(row)
            keys[r, :, int(lead[r]) :, 0] = torch.tensor(row, dtype=torch.float64)
            values.append(row)
        mask = torch.as_tensor(np.arange(width)[None, :] >= lead[:, None]).long()
        layer = types.SimpleNamespace(keys=keys, values=-keys)
        return self.pool.store_prompt(types.SimpleNamespace(layers=[layer]), mask), values

    def step(self) -> None:
        """One decoding step: each row's new value written, every row's keys gathered and checked."""
        cache = self.cache
        cache.begin_step()
        assert cache._shared.index.tolist() == _expected_index(cache)
        n, width = len(self.values), cache.length + 1
        new = [self.next + r for r in range(n)]
        self.next += n
        x = torch.tensor(new, dtype=torch.float64)[:, None, None, None].expand(n, HEADS, 1, 1)
        keys, values = cache.layers[0].update(x, -x)  # shape: (rows, heads, width, 1)
        cache.end_step()
        for r in range(n):
            self.values[r].append(new[r])
            own = len(self.values[r])
            for h in range(HEADS):
                assert keys[r, h, width - own :, 0].tolist() == self.values[r]
                assert values[r, h, width - own :, 0].tolist() == [-v for v in self.values[r]]

    def fork(self) -> None:
        """Rows by random parents: repeated (copy-on-write of shared partial blocks), dropped, or the identity."""
        n = len(self.values)
        if self.rng.random() < 0.2:
            idx = np.arange(n)
        else:
            idx = np.sort(self.rng.integers(0, n, int(self.rng.integers(1, 7))))
        self.cache.select(idx)
        self.values = [list(self.values[i]) for i in idx]

    def join(self) -> None:
        """Another prompt's rows joined after these, in a width at least both."""
        other, values = self.prompt()
        width = max(self.cache.length, other.length) + int(self.rng.integers(0, 3))
        self.cache = self.cache.concat([other], width)
        self.values += values

    def trim(self) -> None:
        """Leading columns that every row pads dropped (some or all of them)."""
        spare = self.cache.length - max(len(v) for v in self.values)
        self.cache.trim(int(self.rng.integers(0, spare + 1)))


SEEDS = range(40)


@functools.cache
def _drive(seed: int) -> dict[str, int]:
    """30 checked steps, each after 1-3 random forks, joins and trims; returns how often each case came up. Even
    seeds give the index 0-2 spare columns (its buffer grows often), odd ones the default."""
    rng = np.random.default_rng(seed)
    m = Model(rng, block_size=int(rng.integers(1, 5)), blocks=int(rng.integers(1, 8)))
    seen = {"joined": 0, "left": 0, "trimmed": 0}
    spare = GatherIndex.SPARE
    GatherIndex.SPARE = seed % 3 if seed % 2 == 0 else spare
    try:
        _steps(m, rng, seen)
    finally:
        GatherIndex.SPARE = spare
    kv = m.pool.kv
    m.cache.release()
    assert kv.blocks_in_use() == 0 and not kv.refcount.any()
    return {**seen, "copied": kv.copied_blocks, "grown": m.pool.grown}


def _steps(m: Model, rng: np.random.Generator, seen: dict[str, int]) -> None:
    with torch.inference_mode():
        m.step()
        for _ in range(30):
            for op in rng.choice(["fork", "join", "trim"], int(rng.integers(1, 4)), p=[0.6, 0.2, 0.2]):
                rows, length = len(m.values), m.cache.length
                getattr(m, op)()
                seen["joined"] += op == "join"
                seen["left"] += op == "fork" and len(m.values) < rows
                seen["trimmed"] += op == "trim" and m.cache.length < length
            m.step()


@pytest.mark.parametrize("seed", SEEDS)
def test_the_index_equals_one_built_from_the_block_tables_after_forks_joins_leaves_and_trims(seed):
    _drive(seed)


def test_the_random_runs_meet_every_case():
    # copy-on-write, joins, leaves, trims and pool growth all come up in the runs above (or they prove little)
    seen = {k: sum(_drive(seed)[k] for seed in SEEDS) for k in ("copied", "joined", "left", "trimmed", "grown")}
    assert all(v > 10 for v in seen.values()), seen


def test_only_moved_rows_are_built_again():
    # one prompt row of 6 positions in blocks of 4, forked to 3 beams: the first step builds every row; a step
    # after the identity builds none; a fork whose partial last block is shared builds only the copies' last
    # block columns (rows that got a copy), then nothing while the parents are the identity
    m = Model(np.random.default_rng(0), block_size=4, blocks=64, first=6)
    m.cache.select(np.zeros(3, np.int64))
    m.values = [list(m.values[0]) for _ in range(3)]
    gather = m.cache._shared.gather
    with torch.inference_mode():
        m.step()
        built = gather.rebuilt
        assert built == 3
        for _ in range(2):
            m.cache.select(np.arange(3))
            m.step()
        assert gather.rebuilt == built
        m.cache.select(np.array([0, 0, 2]))  # row 1 forks from row 0
        m.values = [list(m.values[i]) for i in (0, 0, 2)]
        copied = m.pool.kv.copied_blocks
        m.step()
        assert m.pool.kv.copied_blocks == copied + 1  # positions 0-8: block 2 holds 1, row 1 copies it
        assert gather.rebuilt == built + 1
        m.cache.select(np.arange(3))
        m.step()
        assert gather.rebuilt == built + 1
        m.cache.release()


# ---------------------------------------------------------------------------------------- end to end
@pytest.fixture
def gathering(monkeypatch):
    """The DecoderOnlyStep objects beamkit.hf.generate makes gather (``attention="gather"``)."""
    made = []

    class Gathering(bh.DecoderOnlyStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, attention="gather", **kwargs)
            made.append(self)

    monkeypatch.setattr(generation, "DecoderOnlyStep", Gathering)
    return made


@functools.cache
def _generated(beams: int):
    model, ids, mask, eos, pad = setup("gpt2")
    return model.generate(
        ids, attention_mask=mask, num_beams=beams, max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
        pad_token_id=pad, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip


@pytest.mark.parametrize("beams", [1, 4])
def test_the_gathering_step_equals_model_generate(beams, gathering):
    model, ids, mask, eos, pad = setup("gpt2")  # 8 prompts with 0-3 columns of left padding
    hf = _generated(beams)
    paged = _generate(model, ids, mask, eos, pad, beams)
    assert [s.kv for s in gathering] == ["paged"] and gathering[0].pool.attention == "gather"
    assert torch.equal(paged.sequences, hf.sequences), (paged.sequences, hf.sequences)
    if beams > 1:  # float32 vs float64 sums of <= 10 log-probabilities, as in test_hf_paged.py
        assert torch.allclose(paged.sequences_scores, hf.sequences_scores, atol=1e-4, rtol=0)
    pool = gathering[0].pool.kv
    assert pool.blocks_in_use() == 0 and not pool.refcount.any()
