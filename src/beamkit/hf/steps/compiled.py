"""A compiled decoding step for Hugging Face models: static shapes, keys/values written in place.

``DecoderOnlyStep(model, compile=True)``, ``EncoderDecoderStep(model, compile=True)`` (or
``beamkit.hf.generate(..., compile=True)``) runs each decoding step after the first through ``torch.compile``
(inductor; a string names another backend) over static shapes, for the model families the direct step knows
(:mod:`beamkit.hf.steps.direct`: GPT-2, Llama, Mistral, Qwen2, and the decoders of Marian, BART and T5; Whisper's in
beamkit's loop, :mod:`beamkit.hf.loop`, over buffers of exactly its rows and audio frames, which stay fixed
through a call):

* Rows are padded to a power of two (at least 4), the key/value columns to a power of two (at least 64), an
  encoder-decoder's source to a power of two (at least 8). The
  keys/values live in preallocated buffers ``[rows bucket, kv heads, columns bucket, d]`` per layer
  (:class:`StaticLayers`); the step writes its column in place (``index_copy_`` at a position tensor) and
  attends over the whole buffer under a boolean mask, so one graph serves every step whose rows and length fall
  in one pair of buckets, across calls of the same model (graphs are kept beside the model in a weak-keyed
  registry, freed with it and not copied with it; inductor also keeps its kernels in its on-disk cache across
  processes).
* The same layer functions as the direct step (the model's own ``forward`` of each part, its rotary helper,
  transformers' SDPA attention function), inside one graph: no Python per module.
* Between steps the surviving rows (parents, may repeat) are copied into a second set of buffers, made at the
  first reorder: the dense cache's gather without its concatenation. Where at most a quarter of the buffers'
  rows survive, both sets narrow to the bucket of those rows (views), and widen back within the same memory
  when rows join or beams fork. Rows of requests joining a decoder-only
  search are written into free rows of the buffers (``beamkit.hf.steps.step.join_in_place``, where they fit), and
  the buffers are trimmed of the columns no row attends to only once full.
* Memory: the buffers hold the rows and columns buckets (up to twice the filled rows and columns), and beam
  search keeps the second set too; buffers narrowed to fewer rows keep their peak's memory (and grow back
  within it); ``kv=`` (the paged cache, whose beams share their prompt's blocks) is not
  used. A model's compiled steps are kept beside it (a weak-keyed registry, the steps running through an alias
  of the model that does not refer to it), so dropping the model frees them with it.

``compile="max-autotune"`` compiles with inductor, its matrix products autotuned and the model's weights frozen
into the graphs (:mod:`beamkit.models.compiled`): with few rows (greedy decoding, a few requests) the step's
matrix products run much faster on a CPU, at the cost of a longer first compilation per bucket and a packed copy
of the linear layers' weights; a model whose weights change is compiled again.

The prompt is one model call (its cache is copied into the buffers at the first decoding step). Where
``torch.compile`` fails (no C compiler, an unsupported Python), the same static step runs eagerly and the reason
is logged once; a first compilation of more than two seconds prints one line on standard error
(:class:`beamkit.models.compiled.CompiledStep`, shared with beamkit's own Transformer). Logits equal the eager
step's within the rounding of the model's dtype: the attention sums run over the padded columns (exact zeros)
and the backend may reorder sums.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer

from beamkit.hf.steps.direct import SEQ2SEQ, DirectStep
from beamkit.hf.steps.views import alias
from beamkit.models.compiled import MIN_ROWS, MIN_SOURCE, CompiledStep, bucket, copy_parents

log = logging.getLogger("beamkit")

MIN_COLUMNS = 64  # the smallest key/value columns bucket

#: each model's static steps by backend, kept beside the model (graphs outlive one ``generate`` call) and freed
#: with it (weak keys); a copy or a pickle of a model is another key, so it compiles its own (a copied step would
#: run the original model's layers)
_STATIC: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_STATIC_LOCK = threading.Lock()
_LOGGED: set[str] = set()  # reasons already logged (each once per process)


def log_once(message: str) -> None:
    """Log ``message`` as a warning on the ``beamkit`` logger, once per process."""
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.warning("%s", message)


class StaticLayers:
    """A decoder-only model's keys/values in preallocated buffers: per layer ``keys`` / ``values`` ``[cap, kv
    heads, columns, d]`` whose first ``rows`` rows and ``length`` columns are filled, and a spare set of the same
    shape, the target of reorders (made at the first one: greedy decoding never needs it). Stands in for the
    model's ``DynamicCache`` inside :class:`~beamkit.hf.steps.step.CacheRows` (``reorder_cache``, ``trim``,
    ``get_seq_length``)."""

    def __init__(self, keys: list[Tensor], values: list[Tensor], rows: int, length: int) -> None:
        self.keys, self.values = keys, values  # per layer, shape: (cap, kv heads, columns, d)
        self.spare: list[Tensor] | None = None  # per layer keys then values, made at the first reorder
        self.rows, self.length = rows, length
        self.narrowed: dict[int, Tensor] = {}  # buffers narrowed to views of their first rows, by address

    @classmethod
    def from_dynamic(cls, cache: Any, columns: int = 0, exact: bool = False) -> StaticLayers:
        """The plain ``DynamicLayer`` layers of ``cache`` (``[rows, kv heads, L, d]`` each) copied into buffers of
        the buckets holding their rows and ``L + 1`` columns (``columns``: that many columns instead; ``exact``:
        as many rows as they have)."""
        layers = cache.layers
        rows, _, length, _ = layers[0].keys.shape
        cap, cols = rows if exact else bucket(rows, MIN_ROWS), columns or bucket(length + 1, MIN_COLUMNS)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for layer in layers:
            for src, out in ((layer.keys, keys), (layer.values, values)):
                buf = src.new_zeros((cap, src.shape[1], cols, src.shape[3]))  # shape: (cap, kv heads, cols, d)
                buf[:rows, :, :length].copy_(src)
                out.append(buf)
        return cls(keys, values, int(rows), int(length))

    @property
    def cap(self) -> int:
        """Rows the buffers hold (the rows bucket)."""
        return int(self.keys[0].shape[0])

    @property
    def columns(self) -> int:
        """Key/value columns the buffers hold (the columns bucket)."""
        return int(self.keys[0].shape[2])

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The filled columns (as ``Cache.get_seq_length``)."""
        return self.length

    def kv_bytes(self) -> int:
        """Bytes of the buffers (both sets)."""
        return sum(int(x.numel()) * x.element_size() for x in (*self.keys, *self.values, *(self.spare or ())))

    def make_room(self, length: int) -> None:
        """Grow the buffers to the columns bucket holding ``length`` columns (the filled ones copied)."""
        if length <= self.columns:
            return
        cols = bucket(length, MIN_COLUMNS)
        grown = [self._resized(x, self.cap, cols) for x in (*self.keys, *self.values)]
        n = len(self.keys)
        self.keys, self.values = grown[:n], grown[n:]
        self.spare = None
        self.narrowed = {}

    def _resized(self, x: Tensor, cap: int, cols: int) -> Tensor:
        """``x``'s filled rows and columns in a zeroed buffer of ``cap`` rows and ``cols`` columns."""
        out = x.new_zeros((cap, x.shape[1], cols, x.shape[3]))
        out[: self.rows, :, : self.length].copy_(x[: self.rows, :, : self.length])
        return out

    @property
    def room(self) -> int:
        """The most rows the buffers can hold without new memory: ``cap``, or more where they were narrowed
        (views of the first rows of larger buffers, which :meth:`widen` takes back)."""
        return min(int(self._wide(x).shape[0]) for x in (*self.keys, *self.values, *(self.spare or ())))

    def _wide(self, x: Tensor) -> Tensor:
        """The buffer ``x`` was narrowed from (``x`` is a view of its first rows), or ``x`` itself."""
        return self.narrowed.get(x.data_ptr(), x)

    def widen(self, rows: int) -> bool:
        """Buffers narrowed to fewer rows widened back, within the memory behind them, to the rows bucket holding
        ``rows`` (views again, nothing copied; the rows past the filled ones hold stale values, as after any
        reorder). True where they now hold ``rows``."""
        if rows <= self.cap:
            return True
        room = self.room
        if rows > room:
            return False
        cap = min(bucket(rows, MIN_ROWS), room)  # buffers of exact rows (not a bucket) hold no more than theirs
        wide = [self._wide(x)[:cap] for x in (*self.keys, *self.values, *(self.spare or ()))]
        n = len(self.keys)  # shape: (cap, kv heads, cols, d) each
        self.keys, self.values = wide[:n], wide[n : 2 * n]
        if self.spare is not None:
            self.spare = wide[2 * n :]
        return True

    def reorder_cache(self, index: Tensor) -> None:
        """Rows ``index`` (parents, may repeat), copied into the spare buffers by
        :func:`~beamkit.models.compiled.copy_parents`; they become the live ones. Where they are at most a
        quarter of the buffers' rows (requests left), both sets narrow to the rows bucket holding them: views
        of their first rows, so later steps compute that many rows, not the peak's (the memory stays the
        peak's until they grow again, which they do within it: :meth:`widen`)."""
        self.widen(int(index.shape[0]))  # narrowed buffers given more rows: widened within their memory
        live, spare = copy_parents([*self.keys, *self.values], self.spare, index, self.length)
        self.rows = int(index.shape[0])
        cap = bucket(self.rows, MIN_ROWS)
        if 4 * self.rows <= int(live[0].shape[0]) and cap < int(live[0].shape[0]):
            for x in (*live, *spare):  # the buffers behind the views, by address (views share their first row's)
                self.narrowed.setdefault(x.data_ptr(), x)
            live, spare = [x[:cap] for x in live], [x[:cap] for x in spare]  # shape: (cap, kv heads, cols, d)
        layers = len(self.keys)
        self.keys, self.values, self.spare = live[:layers], live[layers:], spare
        if self.narrowed:  # forget the buffers no longer in use (new ones were made for more rows)
            used = {x.data_ptr() for x in (*live, *spare)}
            self.narrowed = {at: x for at, x in self.narrowed.items() if at in used}

    def trim(self, drop: int) -> None:
        """Drop the first ``drop`` filled columns (every row masks them): the rest move to the front."""
        t = self.length
        for x in (*self.keys, *self.values):
            x[: self.rows, :, : t - drop] = x[: self.rows, :, drop:t].clone()
        self.length = t - drop

    def to_dynamic(self, cache: Any = None) -> Any:
        """The filled rows and columns as a ``DynamicCache`` of plain layers (copies), or written into the layers
        of ``cache`` (a ``DynamicCache`` of as many layers), which is returned."""
        if cache is None:
            cache = DynamicCache()
            for k, v in zip(self.keys, self.values, strict=True):
                layer = DynamicLayer()
                layer.lazy_initialization(k[:1, :, :1], v[:1, :, :1])
                cache.layers.append(layer)
        for layer, k, v in zip(cache.layers, self.keys, self.values, strict=True):
            layer.keys = k[: self.rows, :, : self.length].clone()  # shape: (rows, kv heads, L, d)
            layer.values = v[: self.rows, :, : self.length].clone()
        return cache


class StaticSeq2Seq:
    """An encoder-decoder model's keys/values in preallocated buffers: the self-attention ones
    (:class:`StaticLayers`, one column per decoder position) and the cross-attention ones (a :class:`StaticLayers`
    whose ``length`` is the source's columns, padded to a bucket of at least 8), reordered as the model's
    ``EncoderDecoderCache`` is (``self_attention_cache`` / ``cross_attention_cache``). ``original`` is that cache,
    emptied here (its keys/values now live in the buffers) and refilled by :meth:`to_dynamic`. ``exact``: the
    buffers hold the rows and source columns the cache has, unpadded (for calls whose rows stay fixed and whose
    source has one length: Whisper's in beamkit's loop, whose graphs are made per rows count)."""

    def __init__(self, original: Any, exact: bool = False) -> None:
        self.original = original
        cross = original.cross_attention_cache
        self.source = int(cross.layers[0].keys.shape[2])  # the source's columns
        self.self_attention_cache = StaticLayers.from_dynamic(original.self_attention_cache, exact=exact)
        columns = self.source if exact else bucket(self.source, MIN_SOURCE)
        self.cross_attention_cache = StaticLayers.from_dynamic(cross, columns, exact=exact)
        self.cross_attention_cache.length = self.cross_attention_cache.columns  # every column is read (masked)
        for layer in (*original.self_attention_cache.layers, *cross.layers):  # copied: the originals are freed
            layer.keys, layer.values = layer.keys.new_zeros(0), layer.values.new_zeros(0)
        self._mask: tuple[Tensor | None, Tensor | None] = (None, None)  # the last source mask and its padded form

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The decoder positions held (as ``Cache.get_seq_length``)."""
        return self.self_attention_cache.length

    def kv_bytes(self) -> int:
        """Bytes of the buffers."""
        return self.self_attention_cache.kv_bytes() + self.cross_attention_cache.kv_bytes()

    def source_mask(self, mask: Tensor | None) -> Tensor | None:
        """The source mask ``[rows, 1, 1, S]`` padded to ``[cap, 1, 1, S bucket]`` (padded rows read column 0),
        made again only when the rows' mask is another tensor (their layout changed). None (every source column
        read) where ``mask`` is None and the buffers hold no padded columns."""
        if mask is None:
            if self.cross_attention_cache.columns != self.source:
                raise ValueError("a source mask is needed where the source columns are padded")
            return None
        if self._mask[0] is mask and self._mask[1] is not None:
            return self._mask[1]
        cross = self.cross_attention_cache
        n = int(mask.shape[0])
        padded = torch.zeros((cross.cap, 1, 1, cross.columns), dtype=torch.bool, device=mask.device)
        padded[:n, :, :, : self.source] = mask
        padded[n:, :, :, 0] = True
        self._mask = (mask, padded)
        return padded

    def to_dynamic(self) -> Any:
        """The model's ``EncoderDecoderCache`` refilled with the live rows (copies)."""
        cross = self.cross_attention_cache
        cross.length = self.source
        self.self_attention_cache.to_dynamic(self.original.self_attention_cache)
        cross.to_dynamic(self.original.cross_attention_cache)
        cross.length = cross.columns
        return self.original


class _Column:
    """One layer's buffers as the direct step's cache layer sees them: ``update`` writes the step's column at
    ``at`` in place and returns the whole buffers."""

    def __init__(self, keys: Tensor, values: Tensor, at: Tensor) -> None:
        self.keys, self.values, self.at = keys, values, at

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.keys.index_copy_(2, self.at, k)  # k: (cap, kv heads, 1, d) into column at
        self.values.index_copy_(2, self.at, v)
        return self.keys, self.values


class _Columns:
    """The layers of :class:`_Column` the direct step reads as ``cache.layers``."""

    def __init__(self, layers: list[_Column]) -> None:
        self.layers = layers


class _Seq2SeqColumns:
    """Self- and cross-attention :class:`_Columns`, read as an ``EncoderDecoderCache``."""

    def __init__(self, self_attention: _Columns, cross_attention: _Columns) -> None:
        self.self_attention_cache, self.cross_attention_cache = self_attention, cross_attention


class _Static:
    """What both compiled static steps share: the direct step they compile, the :class:`CompiledStep`, and the
    position tensors they pass (slices of a kept range, on the device of the step's inputs)."""

    def __init__(self, direct: DirectStep, backend: str) -> None:
        self.direct = direct
        model = direct.model
        self.compiled = CompiledStep(self._step, backend, lambda: (*model.parameters(), *model.buffers()))
        self._at = torch.arange(4 * MIN_COLUMNS, device=direct.model.device)  # positions, sliced

    def _step(self, *args: Any) -> Tensor:
        raise NotImplementedError

    def _position(self, i: int, device: torch.device) -> Tensor:
        """``[i]`` as a one-element int64 tensor on ``device`` (the range made again when the model moved)."""
        if i >= self._at.shape[0] or self._at.device != device:
            self._at = torch.arange(max(2 * i + 2, int(self._at.shape[0])), device=device)
        return self._at[i : i + 1]


class StaticStep(_Static):
    """The compiled static step of one model and backend (see the module doc); ``compiled.compilations`` counts
    the graphs compiled so far. ``__call__(ids [rows, 1], mask [rows, 1, 1, >= L] boolean, pos [rows, 1],
    cache)``: the logits ``[rows, V]`` (float32) of the step that fills column ``L - 1`` (``L = cache.length +
    1``) of every row."""

    def _step(self, ids: Tensor, mask: Tensor, pos: Tensor, at: Tensor, keys: list[Tensor], values: list[Tensor]):
        """The eager static step (what is compiled): the direct step over the buffers."""
        layers = _Columns([_Column(k, v, at) for k, v in zip(keys, values, strict=True)])
        return self.direct(ids, mask, pos, layers)  # shape: (cap, V)

    def __call__(self, ids: Tensor, mask: Tensor, pos: Tensor, cache: StaticLayers) -> Tensor:
        length = cache.length + 1
        cache.make_room(length)
        n, cap, cols = int(ids.shape[0]), cache.cap, cache.columns
        ids_in = ids.new_zeros((cap, 1))  # shape: (cap, 1); padded rows read token 0
        ids_in[:n] = ids
        pos_in = pos.new_zeros((cap, 1))  # shape: (cap, 1)
        pos_in[:n] = pos
        mask_in = torch.zeros((cap, 1, 1, cols), dtype=torch.bool, device=ids.device)  # shape: (cap, 1, 1, cols)
        mask_in[:n, :, :, :length] = mask[..., :length]
        mask_in[n:, :, :, 0] = True  # padded rows attend somewhere (no all-masked row)
        at = self._position(length - 1, ids.device)  # shape: (1,)
        key = (cap, cols, str(ids.device), str(cache.keys[0].dtype))
        logits = self.compiled(key, ids_in, mask_in, pos_in, at, cache.keys, cache.values)
        cache.length = length
        return logits[:n]


class StaticSeq2SeqStep(_Static):
    """The compiled static decoder step of one encoder-decoder model (Marian, BART, T5, Whisper) and backend.
    ``__call__(ids [rows, 1], source mask [rows, 1, 1, S] boolean or None, cache)``: the logits ``[rows, V]``
    (float32) of the step at decoder position ``cache.get_seq_length()``, written into that column."""

    def _step(
        self,
        ids: Tensor,
        source_mask: Tensor | None,
        at: Tensor,
        keys: list[Tensor],
        values: list[Tensor],
        cross_keys: list[Tensor],
        cross_values: list[Tensor],
    ) -> Tensor:
        """The eager static step (what is compiled): the direct decoder step over the buffers, reading the
        self-attention columns up to ``at``."""
        cols = keys[0].shape[2]
        self_mask = (torch.arange(cols, device=ids.device) <= at).view(1, 1, 1, cols)  # shape: (1, 1, 1, cols)
        layers = _Seq2SeqColumns(
            _Columns([_Column(k, v, at) for k, v in zip(keys, values, strict=True)]),
            _Columns([_Column(k, v, at) for k, v in zip(cross_keys, cross_values, strict=True)]),
        )
        return self.direct(ids, source_mask, at, layers, self_mask)  # shape: (cap, V)

    def __call__(self, ids: Tensor, mask: Tensor | None, cache: StaticSeq2Seq) -> Tensor:
        own, cross = cache.self_attention_cache, cache.cross_attention_cache
        past = own.length
        own.make_room(past + 1)
        n, cap = int(ids.shape[0]), own.cap
        ids_in = ids.new_zeros((cap, 1))  # shape: (cap, 1); padded rows read token 0
        ids_in[:n] = ids
        at = self._position(past, ids.device)  # shape: (1,)
        key = (cap, own.columns, cross.columns, str(ids.device), str(own.keys[0].dtype))
        logits = self.compiled(key, ids_in, cache.source_mask(mask), at, own.keys, own.values, cross.keys, cross.values)
        own.length = past + 1
        return logits[:n]


def static_step(model: Any, direct: DirectStep | None, backend: str, why: str) -> Any:
    """The model's compiled static step for ``backend`` (:class:`StaticStep`, or :class:`StaticSeq2SeqStep` for
    an encoder-decoder model; made once per model and backend), or None (logged once with ``why``) when the
    model has no direct step to compile."""
    if direct is None:
        log_once(f"beamkit: compile= runs eagerly for {type(model).__name__}: {why}")
        return None
    with _STATIC_LOCK:
        steps = _STATIC.setdefault(model, {})
        if backend not in steps:
            # the kept step runs the model through an alias (views.alias), so the registry keeps no model alive
            kept = DirectStep(alias(model))
            steps[backend] = StaticSeq2SeqStep(kept, backend) if direct.family in SEQ2SEQ else StaticStep(kept, backend)
        return steps[backend]


def kept_steps(model: Any) -> dict[str, Any]:
    """The compiled static steps kept beside ``model``, by backend (a copy of the registry's entry)."""
    with _STATIC_LOCK:
        return dict(_STATIC.get(model, {}))


def compilations(model: Any) -> dict[str, int]:
    """Graphs compiled so far for ``model``'s static steps, by backend."""
    return {name: step.compiled.compilations for name, step in kept_steps(model).items()}
