"""Paged keys/values for Hugging Face decoder-only models: a ``transformers`` ``Cache`` over beamkit's block pool.

The dense bridge keeps one ``[rows, heads, L, d]`` tensor per layer, copies it whole when beams fork (the gather
by parent) and again when a step appends a position. Here the keys/values live in a
:class:`beamkit.kv.PagedKVCache` owned by the step function (:class:`PagedPool`: one pool for all the requests it
decodes, grown when full, never a reason for a request to fail). Each row is a block table
(:class:`beamkit.kv.PagedRows`): beams forked from one parent share its blocks (the prompt's blocks are shared by
all the beams of a request); a step copies only a partial last block that other rows also hold (copy-on-write,
once per step for all layers); rows of finished requests give their blocks back.

:class:`PagedCache` is what the model sees: a ``Cache`` whose layers answer ``update(key, value, layer_idx)``
by writing the new position into the pool. How the step then attends is the pool's ``attention``:

- ``"shared-prefix"`` (the default): for the step's forward the model's attention implementation is beamkit's
  function, registered in ``transformers``' ``AttentionInterface`` (so GPT-2, Llama, Mistral, Qwen2 and the like
  need no code of ours). It reads the blocks all the beams of a request share (the prompt, and generated blocks
  no beam has left) once per layer, in place, for all those beams' queries, and gathers only each row's own
  tail; the two softmax parts merge exactly (:mod:`beamkit.kv.attention`). A step's plan is built once on the
  host for every layer. A model whose layers do not attend through the registry (or ask for something it does
  not compute, such as attention sinks) is noticed at its first step, which runs again gathered.
- ``"gather"``: ``update`` returns every row's keys and values gathered from the pool, as ``[rows, heads, L,
  d]`` in the layout the dense bridge would hold: rows of different lengths are aligned on the right and the
  columns before a row's first position are left padding (masked by the attention mask, which the step
  function keeps left-padded as before). The gather index of a step is made once and used by every layer, so a
  decoding step sees the same keys and values as with the dense cache and gives the same logits, bit for bit.
  Its ``[rows, L]`` table of slots is kept from step to step (:class:`beamkit.kv.GatherIndex`): a step adds a
  column, forks and joins move its rows, and only what copy-on-write moved is built again from the block
  tables.

A prompt's leading padding is not stored: its columns are padding of the gather (masked either way) and the
shared-prefix attention never reads them.

Only caches made of plain ``DynamicLayer`` layers are paged (GPT-2, Llama and most decoder-only models);
:func:`pages_fit` tells. Everything here needs torch and transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer

from beamkit._checks import check_choice, check_int
from beamkit.hf.internals import register_attention
from beamkit.hf.steps.views import with_attention
from beamkit.kv import GatherIndex, PagedKVCache, PagedRows
from beamkit.kv.attention import PrefixPlan, plan_prefix, shared_prefix_attention

BLOCK_SIZE = 16  # positions per block unless a step function is given another size
ATTENTION = "beamkit_shared_prefix"  # the name of beamkit's attention function in transformers' AttentionInterface
PAGED_ATTENTION = ("shared-prefix", "gather")  # how a paged decoding step attends (PagedPool's attention)


def pages_fit(model: Any) -> bool:
    """Whether the model's own cache would be plain ``DynamicLayer`` layers (full attention in every layer, no
    cross-attention), the only kind :class:`PagedCache` stands in for."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "is_encoder_decoder", False) or getattr(cfg, "add_cross_attention", False):
        return False
    try:
        layers = DynamicCache(config=cfg).layers
    except Exception:  # a config DynamicCache cannot read: the model's own cache decides
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def plain_layers(cache: Any) -> bool:
    """Whether ``cache`` (the cache a model forward returned) is a ``DynamicCache`` of plain ``DynamicLayer``
    layers holding keys/values of one shape."""
    layers = getattr(cache, "layers", None)
    if not isinstance(cache, DynamicCache) or not layers:
        return False
    if not all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers):
        return False
    shape = layers[0].keys.shape
    return all(layer.keys.shape == shape and layer.values.shape == shape for layer in layers)


class PagedPool:
    """The block pool of one step function: every request it decodes keeps its keys/values here.

    ``block_size``: positions per block. ``blocks``: the pool's first size in blocks (0: four times what the
    first prompts need, at least 64). The pool is made at the first prompt (its layers, heads, head size, dtype
    and device come from the model's keys) and grows (by half, contents kept) whenever a step or a prompt
    needs more free blocks than it has.

    ``attention``: how decoding steps attend. ``"shared-prefix"`` (the default): the model's attention layers
    call beamkit's attention function (registered in ``transformers``' ``AttentionInterface``), which reads
    the blocks every beam of a request shares once per layer, in place, and gathers only each row's own tail
    (:mod:`beamkit.kv.attention`); a model whose layers do not attend through the registry is noticed at its
    first step and decoded with ``"gather"`` from then on (``self.attention`` says which is in use).
    ``"gather"``: every row's keys/values are gathered into ``[rows, heads, L, d]`` and the model's own
    attention reads them.
    """

    def __init__(self, block_size: int = BLOCK_SIZE, blocks: int = 0, attention: str = "shared-prefix"):
        self.block_size = check_int("block_size", block_size, 1)
        self.blocks = check_int("blocks", blocks, 0)
        self.attention = check_choice("attention", attention, PAGED_ATTENTION)
        self.kv: PagedKVCache | None = None
        self.grown = 0  # times the pool grew
        self.view: Any = None  # the model as its steps attend through the pool (views.with_attention), made once
        self._heads_offset: tuple[int, torch.Tensor] | None = None  # (n_blocks, first column of each head)

    def reserve(self, blocks: int) -> None:
        """Make sure at least ``blocks`` blocks are free (the pool grows by half, or more, when they are not)."""
        kv = self.kv
        assert kv is not None
        short = blocks - kv.free_blocks()
        if short > 0:
            kv.grow(max(kv.n_blocks + kv.n_blocks // 2, kv.n_blocks + short))
            self.grown += 1

    def heads_offset(self) -> torch.Tensor:
        """``h * n_blocks * block_size`` for every head ``h`` (where head ``h`` starts in a pool viewed
        ``[heads * n_blocks * block_size, d]``), on the pool's device."""
        kv = self.kv
        assert kv is not None
        if self._heads_offset is None or self._heads_offset[0] != kv.n_blocks:  # the pool grew
            offset = torch.arange(kv.heads, device=kv.device) * (kv.n_blocks * kv.block_size)  # shape: (heads,)
            self._heads_offset = (kv.n_blocks, offset)
        return self._heads_offset[1]

    def store_prompt(self, cache: Any, mask: torch.Tensor) -> PagedCache:
        """The rows of a prompt forward's ``DynamicCache`` (``[n, heads, P, d]`` per layer; ``mask`` ``[n, P]``)
        moved into the pool: each row's positions from its first attended column on, in blocks of its own."""
        layers = cache.layers
        first = layers[0].keys  # shape: (n, heads, P, d)
        n, heads, width, d = (int(s) for s in first.shape)
        attended = (mask != 0).to("cpu").numpy()  # shape: (n, P)
        lead = np.where(attended.any(axis=1), attended.argmax(axis=1), 0)  # shape: (n,) leading padding
        bs = self.block_size
        need = int((-(-(width - lead) // bs)).sum())
        if self.kv is None:
            size = self.blocks or max(64, 4 * need)
            self.kv = PagedKVCache(len(layers), heads, d, size, bs, dtype=first.dtype, device=first.device)
        kv = self.kv
        if (kv.layers, kv.heads, kv.d_head, kv.k[0].dtype) != (len(layers), heads, d, first.dtype):
            raise TypeError(
                f"a prompt's keys ({len(layers)} layers of [rows, {heads}, P, {d}] {first.dtype}) do not fit this "
                f"step function's pool ({kv.layers} layers of [rows, {kv.heads}, P, {kv.d_head}] {kv.k[0].dtype})"
            )
        self.reserve(need)
        groups = [np.flatnonzero(lead == u) for u in np.unique(lead)]  # rows with the same leading padding
        handles = []
        for rows in groups:
            u = int(lead[rows[0]])
            index = torch.as_tensor(rows, device=first.device)
            keys = [layer.keys.index_select(0, index)[:, :, u:] for layer in layers]  # each: (g, heads, P - u, d)
            values = [layer.values.index_select(0, index)[:, :, u:] for layer in layers]
            handles.append(kv.prefill(keys, values))
        joined = handles[0].beamkit_concat(handles[1:]) if len(handles) > 1 else handles[0]
        order = np.concatenate(groups)  # row of the joined handle -> prompt row
        if not np.array_equal(order, np.arange(n)):
            joined = joined.beamkit_select(np.argsort(order))
        return PagedCache(self, joined, width)


@dataclass
class _Rows:
    """What a :class:`PagedCache` and its layers share (no reference back to the cache, so that dropping a
    state frees its blocks at once): the rows, the cache width, and the current step's reading plan (the
    shared-prefix plan, or the gather index)."""

    pool: PagedPool
    rows: PagedRows
    length: int  # positions every row spans, its leading padding included (the attention mask's width)
    gather: GatherIndex  # the rows' slots [rows, length], followed from step to step (gather attention only)
    index: torch.Tensor | None = None  # shape: (rows * heads * (length + 1),) slots of the step's gather
    slots: torch.Tensor | None = None  # shape: (rows * heads,) / (rows,) where each row's new position goes
    plan: PrefixPlan | None = None  # the step's shared-prefix plan (None: gather)
    layer: int | None = None  # the layer whose update ran last (shared-prefix: its attention reads that layer)
    calls: int = 0  # shared-prefix attention calls in this step's forward
    refused: bool = False  # the attention function met a setting it does not compute (the step gathers instead)


_STEP: ContextVar[_Rows | None] = ContextVar("beamkit_paged_step", default=None)  # the step being attended


class PagedLayer(CacheLayerMixin):
    """One model layer of a :class:`PagedCache` (``transformers``' cache-layer interface)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, shared: _Rows, layer: int):
        super().__init__()
        self._shared = shared
        self.layer = layer
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the pool exists before the layer."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's new key/value ``[rows, heads, 1, d]`` into each row's last block and return every
        row's keys and values ``[rows, heads, L + 1, d]`` (left padding first, as the dense cache holds them)."""
        s = self._shared
        kv = s.pool.kv
        assert kv is not None
        rows, heads, q, d = key_states.shape
        count = 0 if s.slots is None else int(s.slots.shape[0]) // (1 if s.plan is not None else kv.heads)
        if q != 1 or heads != kv.heads or d != kv.d_head or rows != count:
            if s.slots is None:
                raise RuntimeError("PagedCache.update outside a step: call begin_step() before the model forward")
            raise ValueError(
                f"PagedCache takes one new position per row, [{count}, {kv.heads}, 1, {kv.d_head}], got "
                f"{list(key_states.shape)}"
            )
        assert s.slots is not None
        if s.plan is not None:  # shared-prefix: store the position, the attention function reads the pool
            for pool, x in ((kv.k[self.layer], key_states), (kv.v[self.layer], value_states)):
                new = x[:, :, 0].to(pool.dtype).transpose(0, 1)  # shape: (heads, rows, d)
                pool.view(heads, -1, d).index_copy_(1, s.slots, new)
            s.layer = self.layer
            return key_states, value_states
        if s.index is None:
            raise RuntimeError("PagedCache.update outside a step: call begin_step() before the model forward")
        width = s.length + 1
        out = []
        for pool, x in ((kv.k[self.layer], key_states), (kv.v[self.layer], value_states)):
            flat = pool.view(-1, kv.d_head)  # shape: (heads * n_blocks * block_size, d)
            flat.index_copy_(0, s.slots, x.reshape(rows * heads, d).to(pool.dtype))
            out.append(flat.index_select(0, s.index).view(rows, heads, width, d))  # shape: (rows, heads, L + 1, d)
        return out[0], out[1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(key/value length, offset) of the masks of a step with ``query_length`` new positions."""
        return self._shared.length + query_length, 0

    def get_seq_length(self) -> int:
        """Positions held before the step (the attention mask's width, leading padding included)."""
        return self._shared.length

    def get_max_length(self) -> int:
        """No maximum (-1): the pool grows."""
        return -1

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Rows are gathered for the whole cache at once: :meth:`PagedCache.reorder_cache`."""
        raise TypeError("a PagedCache is reordered as a whole (PagedCache.reorder_cache), not layer by layer")


class PagedCache(Cache):
    """A ``transformers`` ``Cache`` whose keys/values live in a :class:`PagedPool` (see the module docstring).

    ``rows``: the rows' block tables (a :class:`beamkit.kv.PagedRows` this cache owns); ``length``: the width
    every row spans, its leading padding included (each row holds ``rows.length[r] <= length`` positions).
    A decoding step is ``begin_step()``, the model forward, ``end_step()``; :meth:`select` forks or drops rows by
    parent without copying keys/values, :meth:`concat` joins other requests' caches without copying them.
    """

    def __init__(self, pool: PagedPool, rows: PagedRows, length: int):
        kv = pool.kv
        assert kv is not None
        self._shared = _Rows(pool, rows, int(length), GatherIndex(kv.block_size, kv.device))
        super().__init__(layers=[PagedLayer(self._shared, i) for i in range(kv.layers)])

    @property
    def pool(self) -> PagedPool:
        """The pool the rows live in."""
        return self._shared.pool

    @property
    def rows(self) -> PagedRows:
        """The rows' block tables and lengths."""
        return self._shared.rows

    @property
    def length(self) -> int:
        """The width every row spans (the attention mask's width), leading padding included."""
        return self._shared.length

    def begin_step(self) -> None:
        """Room for one new position per row (a fresh block, or a copy of a shared partial last block), and the
        step's reading plan, built once for every layer: the shared-prefix plan, or the gather index."""
        s = self._shared
        kv = s.pool.kv
        assert kv is not None
        s.pool.reserve(s.rows.blocks_needed())  # a fresh block or a copy-on-write, for some rows
        s.rows = s.rows.append()
        if int(s.rows.length.max(initial=0)) > s.length + 1:
            raise RuntimeError("PagedCache rows longer than the cache width")
        s.calls, s.refused, s.layer = 0, False, None
        if s.pool.attention == "shared-prefix":
            rows = s.rows
            s.slots = torch.from_numpy(rows.slots()).to(kv.device)  # shape: (rows,) the same column in every head
            s.plan = plan_prefix(rows.table, rows.length, kv.block_size, kv.device)
            s.index = None
            s.gather.forget()  # not followed while the steps do not gather
        else:
            self._gather_index()

    def _gather_index(self) -> None:
        """The step's gather index (every row's positions, left-padded to the cache width) and the slots of its
        new positions, in the pool viewed ``[heads * n_blocks * block_size, d]``: the last step's slots with one
        column added (:class:`beamkit.kv.GatherIndex`; only rows whose blocks moved are built again)."""
        s = self._shared
        kv = s.pool.kv
        assert kv is not None
        s.plan = None
        base_t = s.gather.step(s.rows, s.length + 1)  # shape: (rows, L + 1) padding reads slot 0 (masked)
        offset = s.pool.heads_offset()  # shape: (heads,)
        s.index = (base_t[:, None, :] + offset[None, :, None]).reshape(-1)  # shape: (rows * heads * (L + 1),)
        s.slots = (base_t[:, -1:] + offset[None, :]).reshape(-1)  # shape: (rows * heads,) the newest position

    def forward(self, model: Any, run: Callable[[Any], Any]) -> Any:
        """``run(m)`` (the step's model forward on ``m``, after :meth:`begin_step`) on a view of ``model`` whose
        attention layers call beamkit's shared-prefix attention (the pool's ``attention``;
        :func:`~beamkit.hf.steps.views.with_attention`: the model itself is not changed), and the output it
        returns. A model whose layers did not all attend through it (attention modules with a configuration of
        their own, a setting it does not compute) runs the step again on itself over the gathered keys/values,
        and its pool gathers from then on."""
        s = self._shared
        kv = s.pool.kv
        assert kv is not None
        if s.plan is None:
            return run(model)
        register_attention(ATTENTION, _attention)
        view = s.pool.view = with_attention(model, ATTENTION, s.pool.view)
        token = _STEP.set(s)
        out = None
        try:
            out = run(view)
        except Exception:
            if s.calls == kv.layers and not s.refused:
                raise  # the model failed after attending here: not the attention's doing
            # a layer attended on its own (over the new position alone) and failed: gathered below
        finally:
            _STEP.reset(token)
        if out is None or s.refused or s.calls != kv.layers:
            s.pool.attention = "gather"
            self._gather_index()
            out = run(model)
        return out

    def end_step(self) -> None:
        """The step's position is held: the width grows by one."""
        s = self._shared
        s.length += 1
        s.index = s.slots = s.plan = None

    def select(self, idx: np.ndarray) -> None:
        """Keep rows ``idx`` (parents; rows may repeat or disappear): block tables forked, no keys/values copied;
        blocks no row holds any more go back to the pool."""
        s = self._shared
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        s.rows = s.rows.beamkit_select(idx)
        s.gather.select(idx)

    def concat(self, others: list[PagedCache], length: int) -> PagedCache:
        """These rows, then the rows of ``others`` (same pool; all consumed), spanning ``length`` columns (at
        least each part's width; the extra columns are leading padding)."""
        for o in others:
            if o.pool is not self.pool:
                raise ValueError("PagedCache parts of different pools cannot join")
        parts = [self, *others]
        width = max(length, *(p.length for p in parts))
        sizes = [len(p.rows) for p in parts]
        gather = GatherIndex.join([p._shared.gather for p in parts], sizes, [p.length for p in parts], width)
        joined = PagedCache(self.pool, self.rows.beamkit_concat([o.rows for o in others]), width)
        joined._shared.gather = gather
        return joined

    def trim(self, columns: int) -> None:
        """Drop ``columns`` leading columns of the width (leading padding of every row: no row holds them)."""
        s = self._shared
        own = s.rows.length  # shape: (rows,)
        if columns < 0 or (own.size and s.length - columns < int(own.max())):
            raise ValueError(f"cannot trim {columns} columns: a row holds positions there")
        s.length -= columns
        s.gather.trim(columns)

    def release(self) -> None:
        """Give the rows' blocks back now (the cache cannot be used afterwards)."""
        self._shared.rows.release()

    # ------------------------------------------------------------------------------------- Cache interface
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions held before the step (the attention mask's width)."""
        return self._shared.length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        """(key/value length, offset) of the masks of a step with ``query_length`` new positions."""
        return self._shared.length + query_length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        """No maximum (-1): the pool grows."""
        return -1

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Gather rows by ``beam_idx`` (:meth:`select`)."""
        self.select(beam_idx.detach().to("cpu").numpy().astype(np.int64))

    def crop(self, tokens_to_remove: int) -> None:
        """Not supported: positions are never taken back."""
        raise TypeError("a PagedCache cannot be cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each row ``repeats`` times (blocks shared)."""
        self.select(np.repeat(np.arange(len(self.rows)), repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``."""
        self.select(indices.detach().to("cpu").numpy().astype(np.int64))

    def reset(self) -> None:
        """Not supported: a PagedCache is not reused for another prompt."""
        raise TypeError("a PagedCache cannot be reset; make a new one")

    def bytes_in_use(self) -> int:
        """Bytes of the pool's blocks held by any row (all requests of the pool, not only these rows)."""
        kv = self._shared.pool.kv
        return 0 if kv is None else kv.bytes_in_use()


def _attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function a model's layers call during a paged shared-prefix step (``transformers``'
    attention-function signature): ``query`` ``[rows, heads, 1, d]`` against the rows' keys/values in the pool
    (``key`` / ``value`` are the new position only, already stored by the cache's update). Returns
    ``([rows, 1, heads, d], None)``. A setting it does not compute (attention sinks, dropout, a sliding window
    shorter than a row) marks the step refused, and :meth:`PagedCache.forward` runs it again gathered."""
    s = _STEP.get()
    if s is None or s.plan is None:
        raise RuntimeError(f"the {ATTENTION!r} attention runs only inside a paged beamkit decoding step")
    layer = s.layer
    window = kwargs.get("sliding_window")
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    too_long = window is not None and int(s.rows.length.max()) > int(window)
    if layer is None or dropout or sinks is not None or too_long or query.shape[2] != 1:
        s.refused = True
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3]), None
    kv = s.pool.kv
    assert kv is not None
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = shared_prefix_attention(s.plan, query, kv.k[layer], kv.v[layer], scale, kwargs.get("softcap"))
    s.layer = None
    s.calls += 1
    return out.unsqueeze(1), None  # shape: (rows, 1, heads, d)
