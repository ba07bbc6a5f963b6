"""Step functions over a Hugging Face model's forward pass and its ``Cache``.

The engine calls ``step(state, y_prev) -> (logits [rows, V], state)``. A request starts with one row, so the
prompt (decoder-only) or the encoder input (encoder-decoder) is run once per request, not ``num_beams`` times.
After that, one token per live row goes through the model with the key/value cache, and the state is a single
:class:`CacheRows`: the cache plus the per-row inputs that depend only on the request (attention mask, position
ids). Its ``beamkit_select`` gathers the cache rows by parent; the engine only calls it when the parents are not
the identity, and rows of finished requests are dropped by the same gather. The per-request inputs are gathered
only when the row -> request layout changes, and the step reads the attention mask and position ids of each
step as slices of buffers grown in chunks, so a decoding step builds no mask and computes no position.

A decoder-only model's keys/values are paged by default (:mod:`beamkit.hf.steps.paged`: beams share blocks, a fork
copies no keys/values, finished requests give their blocks back) where its cache is made of plain
``DynamicLayer`` layers; ``DecoderOnlyStep(model, kv="dense")`` keeps Hugging Face's own ``DynamicCache``
(gathered whole by parent), and so does every other model.

Requests may join mid-flight (``beamkit.Engine``): the initial state is a :class:`~beamkit.hf.steps.join.Prompt`,
and a join makes a :class:`~beamkit.hf.steps.join.Cohorts` state; :mod:`beamkit.hf.steps.join` describes the mechanism.

Everything here needs torch; the module is only imported when the Hugging Face bridge is used.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import BaseModelOutput

from beamkit._checks import check_choice
from beamkit.hf.internals import attention_name
from beamkit.hf.steps.compiled import StaticLayers, StaticSeq2Seq, StaticSeq2SeqStep, StaticStep, static_step
from beamkit.hf.steps.direct import DirectStep, direct_step
from beamkit.hf.steps.join import Cohorts, Prompt, rows_of
from beamkit.hf.steps.paged import BLOCK_SIZE, PagedCache, PagedPool, pages_fit, plain_layers
from beamkit.hf.steps.views import with_module
from beamkit.hf.versions import cache_keyword, output_cache
from beamkit.hypothesis import SearchStats
from beamkit.models.compiled import compile_setting
from beamkit.ops.gather import left_pad

_CHUNK = 64  # columns added to the mask / position buffers at a time


class CacheRows:
    """A Hugging Face ``Cache`` that ``beamkit.select_state`` can gather by parent row.

    ``row_request`` ``[rows]`` is the request of each cache row. ``per_request`` holds tensors with one row per
    cache row whose rows depend only on the request (the attention mask, the position ids): they are gathered
    only when the row -> request layout changes (a request's first expansion, a request leaving). For the same
    reason, the cross-attention keys/values of an encoder-decoder cache are gathered only then; while every
    request keeps its beams, only the self-attention cache is gathered. ``length`` counts the positions the cache
    holds (the step functions keep it).

    ``joined``: the rows came from requests that joined mid-flight (:func:`merge_left_padded`); then, whenever
    requests leave, the leading columns that no remaining row attends to are dropped (:meth:`trim`), so a
    long-running engine's cache is as wide as its longest live request, not as the time since it was last idle.
    A batch decoded together from the start is never trimmed (its padding stays as ``generate`` has it).
    """

    def __init__(
        self,
        cache: Any,
        row_request: np.ndarray,
        per_request: dict[str, torch.Tensor] | None = None,
        length: int = 0,
    ):
        self.cache = cache
        self.row_request = row_request  # shape: (rows,) request of each cache row
        self.per_request: dict[str, torch.Tensor] = dict(per_request or {})  # each: (rows, ...)
        self.length = length
        lead = next(iter(self.per_request.values()), None)
        self.device = lead.device if lead is not None else torch.device("cpu")  # where the index goes
        self.shared: dict[str, Any] = {}  # per-batch values, never gathered (EncoderDecoderStep's encoder output)
        self.joined = False  # rows of requests that joined mid-flight: trimmed when requests leave

    def advanced(self) -> CacheRows:
        """A new record of these rows for the next step to fill in (its cache and length): the cache, the
        per-request buffers and the shared values carried over (dicts of its own, the tensors shared); this one
        is left as it is."""
        rows = CacheRows(self.cache, self.row_request, self.per_request, self.length)
        rows.device, rows.shared, rows.joined = self.device, dict(self.shared), self.joined
        return rows

    def beamkit_select(self, idx: np.ndarray) -> CacheRows:
        """Gather the cache rows ``idx`` (parents; rows may repeat or disappear), in place, and return self. A
        :class:`~beamkit.hf.steps.paged.PagedCache` forks its block tables instead (no keys/values copied)."""
        new_request = self.row_request[idx]
        same_layout = new_request.shape == self.row_request.shape and np.array_equal(new_request, self.row_request)
        index = None
        if isinstance(self.cache, PagedCache):
            self.cache.select(idx)
        else:
            index = self._index(idx)
            self_cache = getattr(self.cache, "self_attention_cache", None)
            cross_cache = getattr(self.cache, "cross_attention_cache", None)
            if self_cache is not None and cross_cache is not None:
                _reorder(self_cache, index)
                if not same_layout:
                    _reorder(cross_cache, index)
            else:
                _reorder(self.cache, index)
        if not same_layout:
            index = self._index(idx) if index is None else index
            self.per_request = {k: v.index_select(0, index) for k, v in self.per_request.items()}
        self.row_request = new_request
        if self.joined and not same_layout:
            self.trim()
        return self

    def trim(self) -> int:
        """Drop the leading columns that every row masks (decoder-only caches: keys/values, attention mask,
        position ids) and return how many were dropped. The attended columns, their keys/values and positions
        are unchanged, so attention reads the same values with less padding. Static buffers (the compiled step's,
        which attends over all their columns whatever is trimmed) are trimmed only once full, before they would
        grow."""
        mask = self.per_request.get("mask")
        rows = int(self.row_request.shape[0])
        if mask is None or "pos" not in self.per_request or rows == 0 or self.length == 0:
            return 0
        if isinstance(self.cache, StaticLayers) and self.length < self.cache.columns:
            return 0  # static buffers: every column is read anyway; trimmed only when the next one would not fit
        attended = mask[..., : self.length].reshape(rows, self.length).any(dim=0)  # shape: (L,)
        drop = int(attended.to(torch.int8).argmax()) if bool(attended.any()) else 0
        if drop == 0:
            return 0
        if isinstance(self.cache, (PagedCache, StaticLayers)):
            self.cache.trim(drop)
        else:
            for layer in getattr(self.cache, "layers", ()):
                if type(layer) is not DynamicLayer:
                    return 0  # nothing trimmed: only plain layers are known to hold one column per position
            for layer in self.cache.layers:
                if layer.is_initialized and layer.keys.numel():
                    layer.keys = layer.keys[:, :, drop:]  # shape: (rows, heads, L - drop, d) view
                    layer.values = layer.values[:, :, drop:]
        self.per_request = {k: v[..., drop:] for k, v in self.per_request.items()}  # views
        self.length -= drop
        return drop

    def _index(self, idx: np.ndarray) -> torch.Tensor:
        """``idx`` as an int64 tensor on the cache's device."""
        index = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
        return index if self.device.type == "cpu" else index.to(self.device)

    def beamkit_concat(self, others: list[Any]) -> Cohorts:
        """These rows, then the joining requests' (their :class:`~beamkit.hf.steps.join.Prompt`), as parts that the
        next step runs and merges (see :mod:`beamkit.hf.steps.join`)."""
        return Cohorts([self, *others])


def _reorder(cache: Any, index: torch.Tensor) -> None:
    """``cache.reorder_cache(index)``, with the plain ``DynamicLayer`` loop inlined (no per-layer checks)."""
    layers = getattr(cache, "layers", None)
    if layers is not None and all(type(layer) is DynamicLayer for layer in layers):
        for layer in layers:
            if layer.is_initialized and layer.keys.numel():
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
        return
    if not hasattr(cache, "reorder_cache"):
        raise TypeError(f"{type(cache).__name__} cannot be reordered for beam search (no reorder_cache)")
    cache.reorder_cache(index)


_ACCEPTS: dict[tuple[Any, str], bool] = {}


def accepts(model: Any, name: str) -> bool:
    """Whether ``model.forward`` takes the keyword ``name`` (cached per forward function)."""
    forward = model.forward
    key = (getattr(forward, "__func__", forward), name)
    try:
        return _ACCEPTS[key]
    except (KeyError, TypeError):
        pass
    try:
        found = name in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        found = False
    try:
        _ACCEPTS[key] = found
    except TypeError:  # an unhashable forward
        pass
    return found


def _grow(per_request: dict[str, torch.Tensor], need: int) -> None:
    """Widen the ``mask`` / ``pos`` buffers to at least ``need`` columns (the last axis): mask 1 (True),
    positions counting on. The mask is ``[rows, C]`` or its ready 4-D boolean form ``[rows, 1, 1, C]``."""
    mask, pos = per_request["mask"], per_request["pos"]
    cap = mask.shape[-1]
    if need <= cap:
        return
    extra = max(_CHUNK, need - cap)
    steps = torch.arange(1, extra + 1, dtype=pos.dtype, device=pos.device)
    per_request["mask"] = torch.cat([mask, mask.new_ones((*mask.shape[:-1], extra))], dim=-1)
    per_request["pos"] = torch.cat([pos, pos[:, -1:] + steps], dim=1)


def _last_logits(out: Any) -> torch.Tensor:
    """The logits of the last position of a model output, as float32 ``[rows, V]``."""
    logits = out.logits[:, -1, :]  # shape: (rows, V)
    return logits if logits.dtype == torch.float32 else logits.float()


def _takes_4d_mask(model: Any) -> bool:
    """Whether a decoding step may pass the attention mask ready-made as a boolean ``[rows, 1, 1, L]`` tensor.

    True for models whose forward builds its masks with ``transformers.masking_utils`` (which returns a 4-D
    mask as it is) and attends with SDPA (which reads a boolean mask as "attend here"). For one query token
    that mask is exactly the padding mask, so the model skips building it every step.
    """
    base = getattr(model, "base_model", model)
    module = inspect.getmodule(type(base))
    uses_masking_utils = module is not None and hasattr(module, "create_causal_mask")
    return uses_masking_utils and attention_name(model.config) == "sdpa"


StepKind = Literal["prompt", "compiled", "direct", "paged", "model"]


@dataclass(frozen=True)
class StepPath:
    """How one part of a step runs (:meth:`DecoderOnlyStep.path`, :meth:`EncoderDecoderStep.path`), decided once
    per step and as data like a :class:`beamkit.hf.Route`: ``kind`` (``"prompt"``: the first call; then
    ``"compiled"``, ``"direct"``, ``"paged"`` (decoder-only) or ``"model"``), why (``reason``), and the cache that
    way reads (None for the first call)."""

    kind: StepKind
    reason: str
    cache: Any = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


#: an output layer to run in place of the model's ``lm_head`` in this context (:func:`output_head`)
_HEAD: ContextVar[Any] = ContextVar("beamkit_output_head", default=None)


@contextmanager
def output_head(head: Any) -> Iterator[None]:
    """Inside the block, decoder-only steps in this thread (this context) compute their logits with ``head`` in
    place of the model's ``lm_head`` (a module over the last hidden state): through a view of the model
    (:func:`~beamkit.hf.steps.views.with_module`), or the direct step's own call; never compiled. The model is not
    changed, and other threads using it see nothing."""
    token = _HEAD.set(head)
    try:
        yield
    finally:
        _HEAD.reset(token)


def _headed(model: Any) -> Any:
    """``model``, or a view of it whose ``lm_head`` is this context's :func:`output_head`."""
    head = _HEAD.get()
    return model if head is None else with_module(model, "lm_head", head)


class _ModelStep:
    """What both step functions share: the initial state, running the step in inference mode, and counting the
    calls (``stats``: model calls and rows per call, whichever search drives the step)."""

    forward_seconds: float  # time spent inside the model forward (benchmarks read it)
    stats: SearchStats

    compiled: Any  # the compiled static step in use (None: the eager steps)
    left_pad: bool  # how prompts of different widths join (see Prompt)
    mask_4d: bool  # whether a step passes the attention mask ready-made in 4-D (see _takes_4d_mask)

    def init_state(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Prompt:
        """The engine's initial state: one row per request (``input_ids`` / ``attention_mask`` ``[n, P]``).
        For :class:`beamkit.Engine`, add each request with the state of its own row (``[1, P]``)."""
        return Prompt(input_ids, attention_mask.long(), left=self.left_pad)

    def __call__(self, state: Any, y_prev: Any) -> tuple[torch.Tensor, Any]:
        """One engine step: ``(logits [rows, V], new state)``, under ``torch.inference_mode``."""
        self.stats.model_calls += 1
        self.stats.rows_per_call.append(int(np.shape(y_prev)[0]) if np.ndim(y_prev) else 1)
        if torch.is_inference_mode_enabled():
            return self._step(state, y_prev)
        with torch.inference_mode():
            return self._step(state, y_prev)

    def _fast_steps(self, model: Any, direct: bool, backend: str | None) -> Any:
        """Set ``self.direct`` / ``self.direct_reason`` (the direct step where ``direct``) and return the compiled
        step for ``backend`` (None: not asked for, or the model has no direct step to compile)."""
        self.direct, self.direct_reason = self._direct(model, direct or backend is not None)
        compiled = None if backend is None else static_step(model, self.direct, backend, self.direct_reason)
        if not direct:
            self.direct, self.direct_reason = None, "direct=False"
        return compiled

    def _direct(self, model: Any, wanted: bool) -> tuple[DirectStep | None, str]:
        """The direct step for ``model`` and why (see :mod:`beamkit.hf.steps.direct`): none where not ``wanted`` or
        where the model builds its own attention masks (the direct step passes the ready 4-D one)."""
        if not wanted:
            return None, "direct=False"
        if not self.mask_4d:
            return None, "the model builds its own attention masks"
        return direct_step(model)

    def _step(self, state: Any, y_prev: Any) -> tuple[torch.Tensor, Any]:
        """Run each part of a joined state (:class:`~beamkit.hf.steps.join.Cohorts`) on its rows, then rejoin them."""
        if not isinstance(state, Cohorts):
            return self._part(state, y_prev)
        logits, parts, start = [], [], 0
        for part in state.parts:
            n = rows_of(part)
            got, new = self._part(part, y_prev[start : start + n])
            logits.append(got)  # each: (rows of the part, V)
            parts.append(new)
            start += n
        return torch.cat(logits), self._rejoin(parts)  # shape: (rows, V)

    def _part(self, state: Any, y_prev: Any) -> tuple[torch.Tensor, CacheRows]:
        raise NotImplementedError

    def _rejoin(self, parts: list[CacheRows]) -> Any:
        raise NotImplementedError


class DecoderOnlyStep(_ModelStep):
    """Step function for a decoder-only model (GPT-2, Llama-style), left-padded prompts.

    Initial state: ``{"mask": [rows, P] attention mask, "ids": [rows, P] prompt}``; after the prompt it is a
    :class:`CacheRows` whose ``per_request`` holds ``"mask"`` and ``"pos"`` buffers ``[rows, C]``, C >= the
    sequence length: the attention mask (1 on every generated column; in its ready 4-D boolean form
    ``[rows, 1, 1, C]`` where :func:`_takes_4d_mask` allows) and each column's position id. Position ids
    follow Hugging Face's generate: the cumulative sum of the attention mask minus one (0 on padding), then +1 per
    generated token. A step passes ``mask[..., :L]`` and ``pos[:, L - 1 : L]`` (views, no copy).

    ``kv="paged"`` (the default) keeps the keys/values in a block pool (:mod:`beamkit.hf.steps.paged`; ``self.pool``,
    shared by every request this step function decodes, grown when full) where the model's cache is plain
    ``DynamicLayer`` layers, and falls back to the dense cache for any other model; ``kv="dense"`` always uses
    Hugging Face's ``DynamicCache``. Both give the same logits. ``self.kv`` is the one in use. ``block_size``:
    positions per block; ``blocks``: the pool's first size (0: sized from the first prompts). The cache goes to
    the model under ``self.cache_key``, the keyword its forward takes (:func:`beamkit.hf.versions.cache_keyword`).

    ``direct`` (default True): on the dense cache, decoding steps of a model family :mod:`beamkit.hf.steps.direct`
    knows run its layers directly (the same logits, bit for bit, without the model wrapper's per-call work);
    ``self.direct_reason`` says whether it is used and why not.

    ``compile`` (default False): True (inductor) or a ``torch.compile`` backend name runs the decoding steps of
    those families compiled over static shapes, keys/values in preallocated buffers (:mod:`beamkit.hf.steps.compiled`;
    the cache is then dense, whatever ``kv`` says). ``self.compiled`` is the compiled step in use (None where
    the model has no direct step: then the step runs as without ``compile``, the reason logged once).
    """

    left_pad = True

    def __init__(
        self,
        model: Any,
        kv: str = "paged",
        *,
        block_size: int = BLOCK_SIZE,
        blocks: int = 0,
        attention: str = "shared-prefix",
        direct: bool = True,
        compile: bool | str = False,
    ):
        backend = compile_setting(compile)
        self.model = model
        self.keep_one = accepts(model, "logits_to_keep")
        self.takes_pos = accepts(model, "position_ids")
        self.cache_key = cache_keyword(model)  # "cache" (transformers 5.24 on) or "past_key_values"
        full = pages_fit(model)  # full attention in every layer: plain DynamicLayer caches
        # a sliding-window layer holds fewer columns than the padding mask: the model builds those masks itself
        self.mask_4d = _takes_4d_mask(model) and full
        self.forward_seconds = 0.0  # time spent inside the model forward (benchmarks read it)
        self.stats = SearchStats()
        check_choice("kv", kv, ("paged", "dense"))
        pool = PagedPool(block_size, blocks, attention)  # checks the sizes whichever kv is used
        self.compiled: StaticStep | None = self._fast_steps(model, direct, backend)
        self.kv = "paged" if kv == "paged" and full and self.compiled is None else "dense"
        self.pool: PagedPool | None = pool if self.kv == "paged" else None

    def _rejoin(self, parts: list[CacheRows]) -> CacheRows:
        """One cache for all rows: the parts' caches, masks and positions left-padded to the longest. Rows
        joining a compiled search are written into its running buffers where they fit (as many rows as the
        buffers hold, no longer than the running rows); otherwise the buffers join as a dense cache, copied back
        into buffers at the next compiled step."""
        if isinstance(parts[0].cache, StaticLayers) and fits_in_place(parts):
            return merge_rows(parts, join_in_place(parts), parts[0].length)
        for part in parts:
            if isinstance(part.cache, StaticLayers):
                part.cache = part.cache.to_dynamic()
        return merge_left_padded(parts)

    def path(self, state: Any) -> StepPath:
        """How the next step runs on ``state`` (one part of it), decided once and as data: the prompt's model call,
        the compiled static step, the direct step, the model's forward over the block pool, or over its own cache;
        with the cache that way reads (moved into or out of static buffers where it must). ``state`` is not
        changed."""
        if not isinstance(state, CacheRows):
            return StepPath("prompt", "the requests' prompts: one model call")
        cache = state.cache
        if self.compiled is not None and _HEAD.get() is None and self.compiled.direct.usable():
            static = cache if isinstance(cache, StaticLayers) else self._to_static(cache)
            if static is not None:
                return StepPath("compiled", "compile=: the compiled static step", static)
        if isinstance(cache, StaticLayers):  # the model changed since it was compiled: its own cache again
            cache = cache.to_dynamic()
        if self.direct is not None and self.direct.usable() and plain_layers(cache):
            return StepPath("direct", "a known family's layers, run directly", cache)
        if isinstance(cache, PagedCache):
            return StepPath("paged", "the model's forward over the block pool", cache)
        return StepPath("model", "the model's forward over its own cache", cache)

    def _part(self, state: Any, y_prev: Any) -> tuple[torch.Tensor, CacheRows]:
        if not isinstance(state, CacheRows):
            return self._prompt(state)
        rows = state.advanced()  # the next state: the input's fields are left as they are
        if rows.joined and isinstance(rows.cache, StaticLayers):
            rows.trim()  # the buffers are full: the columns no row attends to go first (CacheRows.trim)
        buf = rows.per_request
        length = rows.length + 1
        if length > buf["mask"].shape[-1]:
            _grow(buf, length)
        ids = torch.as_tensor(y_prev, dtype=torch.long, device=rows.device).view(-1, 1)  # shape: (rows, 1)
        mask = buf["mask"][..., :length]  # shape: (rows, L) or (rows, 1, 1, L) view
        pos = buf["pos"][:, length - 1 : length]  # shape: (rows, 1) view
        path = self.path(rows)
        rows.cache, rows.length = path.cache, length
        if path.kind == "paged":
            path.cache.begin_step()  # shape: one new slot per row, copy-on-write done; the reading plan made
        start = time.perf_counter()
        if path.kind == "compiled":
            assert self.compiled is not None
            logits = self.compiled(ids, mask, pos, rows.cache)  # shape: (rows, V); the buffers written in place
        elif path.kind == "direct":
            assert self.direct is not None
            logits = self.direct(ids, mask, pos, rows.cache, head=_HEAD.get())  # shape: (rows, V); cache extended
        else:
            logits, rows.cache = self._forward(path, ids, mask, pos)
        self.forward_seconds += time.perf_counter() - start
        if path.kind == "paged":
            path.cache.end_step()
        return logits, rows

    def _forward(self, path: StepPath, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> tuple[Any, Any]:
        """A decoding step through the model's forward (``path`` ``"paged"`` or ``"model"``): the logits ``[rows,
        V]`` and the cache after it."""
        kwargs: dict[str, Any] = {"use_cache": True, "return_dict": True, self.cache_key: path.cache}
        if self.takes_pos:
            kwargs["position_ids"] = pos
        if path.kind == "paged":
            out = path.cache.forward(self.model, lambda m: _headed(m)(input_ids=ids, attention_mask=mask, **kwargs))
            return _last_logits(out), path.cache
        out = _headed(self.model)(input_ids=ids, attention_mask=mask, **kwargs)
        return _last_logits(out), output_cache(out)  # shape: (rows, V)

    def _prompt(self, state: Prompt) -> tuple[torch.Tensor, CacheRows]:
        """The requests' prompts through the model: their logits and their first :class:`CacheRows`."""
        kwargs: dict[str, Any] = {"use_cache": True, "return_dict": True}
        ids = state.ids  # shape: (rows, P)
        mask = state.mask  # shape: (rows, P)
        pos = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 0)  # shape: (rows, P)
        length = ids.shape[1]
        if self.keep_one:
            kwargs["logits_to_keep"] = 1
        if self.takes_pos:
            kwargs["position_ids"] = pos
        start = time.perf_counter()
        out = _headed(self.model)(input_ids=ids, attention_mask=mask, **kwargs)
        self.forward_seconds += time.perf_counter() - start
        per_request = {"mask": mask.bool()[:, None, None, :] if self.mask_4d else mask, "pos": pos}
        _grow(per_request, length + _CHUNK)
        rows = ids.shape[0]
        return _last_logits(out), CacheRows(
            self._keep(output_cache(out), mask), np.arange(rows, dtype=np.int64), per_request, length
        )

    def _to_static(self, cache: Any) -> StaticLayers | None:
        """A dense cache of plain layers in static buffers (at the first decoding step); None for any other."""
        return StaticLayers.from_dynamic(cache) if plain_layers(cache) else None

    def _keep(self, cache: Any, mask: torch.Tensor) -> Any:
        """The prompt forward's cache as the state keeps it: moved into the pool (paged), or as it is (dense).
        A model whose cache turns out not to be plain ``DynamicLayer`` layers goes dense, if nothing was paged
        yet."""
        if self.pool is None:
            return cache
        if not plain_layers(cache):
            if self.pool.kv is not None:
                raise TypeError(
                    f"the model returned a {type(cache).__name__} that cannot be paged after paged prompts; "
                    "use DecoderOnlyStep(model, kv='dense')"
                )
            self.kv, self.pool = "dense", None
            return cache
        return self.pool.store_prompt(cache, mask)


class EncoderDecoderStep(_ModelStep):
    """Step function for an encoder-decoder model (T5, BART, Marian).

    The encoder runs once per request on the first call. Its output is not copied per beam: the decoder reads
    it through the cross-attention cache, filled at the first decoder step from one row per request; later
    steps pass a zero-copy broadcast view where the model only needs its shape. Initial state: ``{"mask":
    [rows, S] encoder attention mask, "ids": [rows, S] input}``; after the first call a :class:`CacheRows` whose
    ``per_request["mask"]`` is the encoder mask of each row (``[rows, 1, 1, S]`` boolean, the cross-attention mask
    of one query token, where :func:`_takes_4d_mask` allows) and ``shared`` keeps the encoder output (one row per
    request, never gathered). The cache goes to the model under ``self.cache_key``
    (:func:`beamkit.hf.versions.cache_keyword`). ``direct`` (default True): after the first step, Marian, BART and T5
    decoders run their layers directly (:mod:`beamkit.hf.steps.direct`; ``self.direct_reason`` says whether).
    ``compile`` (default False): True (inductor) or a ``torch.compile`` backend name runs those decoder steps
    compiled over static shapes (:mod:`beamkit.hf.steps.compiled`); ``self.compiled`` is the compiled step in use (None
    where the model has no direct step: then it runs as without ``compile``, the reason logged once).
    """

    left_pad = False

    def __init__(self, model: Any, *, direct: bool = True, compile: bool | str = False):
        backend = compile_setting(compile)
        self.model = model
        self.mask_4d = _takes_4d_mask(model)
        self.cache_key = cache_keyword(model)  # "cache" (transformers 5.24 on) or "past_key_values"
        self.forward_seconds = 0.0
        self.stats = SearchStats()
        self.compiled: StaticSeq2SeqStep | None = self._fast_steps(model, direct, backend)

    def _rejoin(self, parts: list[CacheRows]) -> Any:
        """The parts stay apart (one decoder forward each; see :mod:`beamkit.hf.steps.join`)."""
        return parts[0] if len(parts) == 1 else Cohorts(list(parts))

    def path(self, state: Any) -> StepPath:
        """How the next step runs on ``state`` (one part of it), decided once and as data, as
        :meth:`DecoderOnlyStep.path` does: the first call (the encoder, then the decoder's first step, which fills
        the cross-attention cache), the compiled static step, the direct step, or the model's forward over its own
        cache; with the cache that way reads (moved out of static buffers where it must; moved into them by the
        compiled step that runs, since that empties the model's cache). ``state`` is not changed."""
        if not isinstance(state, CacheRows):
            return StepPath("prompt", "the encoder over the requests' inputs, then the decoder's first step")
        cache = state.cache
        compiled = self.compiled is not None and self.compiled.direct.usable()
        if compiled and (isinstance(cache, StaticSeq2Seq) or _direct_cache(cache)):
            return StepPath("compiled", "compile=: the compiled static step", cache)
        if isinstance(cache, StaticSeq2Seq):  # the model changed since it was compiled: its own cache again
            cache = cache.to_dynamic()
        if self.direct is not None and self.direct.usable() and _direct_cache(cache):
            return StepPath("direct", "a known family's decoder layers, run directly", cache)
        return StepPath("model", "the model's forward over its own cache", cache)

    def _part(self, state: Any, y_prev: Any) -> tuple[torch.Tensor, CacheRows]:
        path = self.path(state)
        if path.kind == "prompt":
            return self._first(state, y_prev)
        rows = state.advanced()  # the next state: the input's fields are left as they are
        rows.cache = path.cache
        mask = rows.per_request["mask"]  # shape: (rows, 1, 1, S) or (rows, S)
        dec = torch.as_tensor(y_prev, dtype=torch.long, device=rows.device).view(-1, 1)  # shape: (rows, 1)
        start = time.perf_counter()
        if path.kind == "compiled":
            assert self.compiled is not None
            if not isinstance(rows.cache, StaticSeq2Seq):  # the first compiled step: the cache into static buffers
                rows.cache = StaticSeq2Seq(rows.cache)
            logits = self.compiled(dec, mask, rows.cache)  # shape: (rows, V); the buffers written in place
        elif path.kind == "direct":
            assert self.direct is not None
            logits = self.direct(dec, mask, None, rows.cache)  # shape: (rows, V); the cache extended
        else:
            logits, rows.cache = self._forward(rows, dec, mask)
        self.forward_seconds += time.perf_counter() - start
        rows.length += 1
        return logits, rows

    def _forward(self, rows: CacheRows, dec: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A decoding step through the model's forward (path ``"model"``): the logits ``[rows, V]`` and the cache
        after it. Cross-attention keys and values come from the cache: the model only needs the encoder output's
        batch shape, given as a zero-copy broadcast view of one request's row."""
        enc_out = rows.shared["enc_out"]
        n = dec.shape[0]
        if enc_out.last_hidden_state.shape[0] != n:
            hidden = rows.shared["enc"][:1].expand(n, -1, -1)  # shape: (rows, S, d) view, no copy
            enc_out = rows.shared["enc_out"] = BaseModelOutput(last_hidden_state=hidden)
        kwargs: dict[str, Any] = {"use_cache": True, "return_dict": True, self.cache_key: rows.cache}
        out = self.model(encoder_outputs=enc_out, attention_mask=mask, decoder_input_ids=dec, **kwargs)
        return _last_logits(out), output_cache(out)  # shape: (rows, V)

    def _first(self, state: Prompt, y_prev: Any) -> tuple[torch.Tensor, CacheRows]:
        """The requests' inputs through the encoder (once per request), then the decoder's first step: its
        logits and the first :class:`CacheRows` (the cross-attention cache filled, the encoder output kept)."""
        start = time.perf_counter()
        mask = state.mask  # shape: (rows, S)
        dec = torch.as_tensor(y_prev, dtype=torch.long, device=mask.device).view(-1, 1)  # shape: (rows, 1)
        rows = dec.shape[0]
        encoder = self.model.get_encoder()
        enc = encoder(input_ids=state.ids, attention_mask=mask, return_dict=True).last_hidden_state
        enc_out = BaseModelOutput(last_hidden_state=enc)  # shape: (rows, S, d), one row per request
        out = self.model(
            encoder_outputs=enc_out, attention_mask=mask, decoder_input_ids=dec, use_cache=True, return_dict=True
        )
        self.forward_seconds += time.perf_counter() - start
        kv = output_cache(out)
        _check_cross_cache(kv)
        # the encoder mask of each row; for one query token the cross-attention mask is it, ready-made in 4-D
        per_request = {"mask": mask.bool()[:, None, None, :] if self.mask_4d else mask}
        cache = CacheRows(kv, np.arange(rows, dtype=np.int64), per_request, 1)
        cache.shared.update(enc=enc, enc_out=enc_out)
        return _last_logits(out), cache  # shape: (rows, V)


def _direct_cache(cache: Any) -> bool:
    """Whether an encoder-decoder cache is one :class:`~beamkit.hf.steps.direct.DirectStep` reads: plain layers on
    both sides, the cross-attention keys/values of every layer filled."""
    self_cache = getattr(cache, "self_attention_cache", None)
    cross = getattr(cache, "cross_attention_cache", None)
    if cross is None or not (plain_layers(self_cache) and plain_layers(cross)):
        return False
    return all(cache.is_updated.get(i) for i in range(len(cross.layers)))


def _check_cross_cache(cache: Any) -> None:
    """Raise unless the model keeps cross-attention keys/values in an ``EncoderDecoderCache``."""
    cross = getattr(cache, "cross_attention_cache", None)
    if cross is None or cross.get_seq_length() == 0:
        raise TypeError(
            "beamkit.hf needs an encoder-decoder model that caches cross-attention keys/values "
            f"(EncoderDecoderCache); got {type(cache).__name__}"
        )


def merge_left_padded(parts: list[CacheRows]) -> CacheRows:
    """Decoder-only parts (rows in order) as one :class:`CacheRows`: the attention-mask buffer and the position
    ids left-padded to the longest cache with masked columns (mask 0 / False, position 0), then stacked by rows;
    dense caches likewise (every layer's keys / values ``[rows, heads, L, d]`` padded with zeros), paged caches
    by joining their block tables (the padding is the gather's, nothing is copied)."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.length for p in parts)
    paged = [isinstance(p.cache, PagedCache) for p in parts]
    if any(paged):
        if not all(paged):
            raise TypeError("paged and dense Hugging Face caches cannot join")
        first = parts[0]
        cache = first.cache.concat([p.cache for p in parts[1:]], width)  # block tables only, no keys/values
    else:
        cache = _merge_dense(parts, width)
    return merge_rows(parts, cache, width)


def merge_rows(parts: list[CacheRows], cache: Any, width: int) -> CacheRows:
    """The parts' rows as one :class:`CacheRows` over ``cache`` (their keys/values, already joined, ``width``
    columns): masks and positions left-padded to ``width`` and stacked, requests renumbered, then trimmed."""
    per_request = {
        name: torch.cat([left_pad(p.per_request[name][..., : p.length], width, -1) for p in parts])
        for name in ("mask", "pos")
    }  # mask: (rows, L) or (rows, 1, 1, L); pos: (rows, L)
    offsets = np.cumsum([0] + [int(p.row_request.max()) + 1 for p in parts[:-1]])
    row_request = np.concatenate([p.row_request + off for p, off in zip(parts, offsets, strict=True)])
    merged = CacheRows(cache, row_request, per_request, width)
    merged.joined = True
    merged.trim()
    _grow(merged.per_request, merged.length + _CHUNK)
    return merged


def fits_in_place(parts: list[CacheRows]) -> bool:
    """Whether the rows of ``parts[1:]`` (dense caches of plain layers, each no longer than the first part) can be
    written into the first part's static buffers after its rows: they hold as many rows (narrowed buffers: the
    memory behind them does), and every joining cache has as many columns as its part counts."""
    static = parts[0].cache
    rows = int(parts[0].row_request.shape[0]) + sum(int(p.row_request.shape[0]) for p in parts[1:])
    if rows > static.room or static.rows != int(parts[0].row_request.shape[0]) or static.length != parts[0].length:
        return False
    for p in parts[1:]:
        layers = getattr(p.cache, "layers", None)
        if p.length > parts[0].length or not layers or len(layers) != len(static.keys):
            return False
        if not all(type(layer) is DynamicLayer and _columns(layer) == p.length for layer in layers):
            return False
    return True


def _columns(layer: DynamicLayer) -> int:
    """The columns a plain layer holds (-1 before its first keys)."""
    return -1 if layer.keys is None else int(layer.keys.shape[2])


def join_in_place(parts: list[CacheRows]) -> StaticLayers:
    """The rows of ``parts[1:]`` written into the first part's static buffers after its rows, each right-aligned
    to its filled columns (left padding, zeroed: masked, as :func:`merge_left_padded` pads); see
    :func:`fits_in_place`. Returns the buffers, now holding every part's rows."""
    static: StaticLayers = parts[0].cache
    width, row = static.length, static.rows
    widened = static.widen(row + sum(int(p.row_request.shape[0]) for p in parts[1:]))  # narrowed: grown back
    assert widened, "join_in_place needs parts that fits_in_place accepts"
    for p in parts[1:]:
        n, pad = int(p.row_request.shape[0]), width - p.length
        for i, layer in enumerate(p.cache.layers):
            for buf, src in ((static.keys[i], layer.keys), (static.values[i], layer.values)):
                buf[row : row + n, :, :pad].zero_()  # shape: (n, kv heads, pad, d)
                buf[row : row + n, :, pad:width].copy_(src)  # shape: (n, kv heads, p.length, d)
        row += n
    static.rows = row
    return static


def _merge_dense(parts: list[CacheRows], width: int) -> Any:
    """The parts' ``DynamicCache`` s as one (the first's, refilled): every layer's keys / values left-padded to
    ``width`` with zeros and stacked by rows."""
    layer_lists = [getattr(p.cache, "layers", None) for p in parts]
    if any(ls is None or not all(type(layer) is DynamicLayer for layer in ls) for ls in layer_lists):
        raise TypeError(
            "beamkit.hf joins requests mid-flight only for a DynamicCache of plain DynamicLayer layers, got "
            f"{sorted({type(layer).__name__ for ls in layer_lists for layer in (ls or [])})}"
        )
    first = parts[0]
    for i, layer in enumerate(first.cache.layers):
        mine = [p.cache.layers[i] for p in parts]
        layer.keys = torch.cat([left_pad(m.keys, width, 2) for m in mine])  # shape: (rows, heads, L, d)
        layer.values = torch.cat([left_pad(m.values, width, 2) for m in mine])
    return first.cache
