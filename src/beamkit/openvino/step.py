"""The engine's step function over an OpenVINO decoder-only IR (:class:`beamkit.openvino.Model`).

The engine calls ``step(state, y_prev) -> (logits [rows, V], state)``. A request starts with one row (its prompt
runs once, whatever the beam count); after that one token per live row runs with the key/value cache. The state
is an :class:`OVRows`: the attention mask and next position of each row of the cache (host arrays, a few ints
per row), and ``phys``, the cache row each live row reads.

``beamkit.select_state`` gathers rows by parent; :meth:`OVRows.beamkit_select` only composes ``phys`` with the
parents (no keys/values move). The next step passes ``phys`` as the model's ``beam_idx`` input: in a stateful
IR the keys/values are the model's own state and ``beam_idx`` gathers them inside the model, so beams forking
and requests leaving cost no copy through Python. A stateless IR gets its past keys/values as inputs: the
step gathers them on the host (``numpy.take``) where the parents are not the identity, and keeps the model's
outputs. A stateful IR without ``beam_idx`` cannot reorder its rows: it runs every row it holds (finished ones
too, their logits unused), so it decodes greedily (rows leave, none forks).

A stateful model holds one batch's keys/values, so one state is live at a time: stepping an older state (a
search that keeps several, such as ``keep_state``) raises :class:`StaleState`; stateless IRs have no such limit.

Requests join mid-flight (``beamkit.Engine``) as in :mod:`beamkit.hf.steps.join`: the joining prompts run on a second
infer request, then the keys/values of both are left-padded to the longer length and joined (a copy, once per
join, not per step), and the leading columns no row attends to are dropped.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from beamkit.hf.steps.join import Cohorts, Prompt, rows_of
from beamkit.hypothesis import SearchStats
from beamkit.ops.gather import left_pad

_CHUNK = 64  # columns added to the mask buffer at a time


class Counted:
    """What every OpenVINO step function counts: ``stats`` (model calls, rows per call) and ``forward_seconds``
    (the time inside OpenVINO's inference)."""

    def __init__(self) -> None:
        """Nothing counted yet."""
        self.stats = SearchStats()
        self.forward_seconds = 0.0

    def counted(self, y_prev: Any) -> np.ndarray:
        """A step's tokens as a flat int64 array (one per row), the call counted in ``stats``."""
        y = np.asarray(y_prev, dtype=np.int64).reshape(-1)  # shape: (rows,)
        self.stats.model_calls += 1
        self.stats.rows_per_call.append(int(y.shape[0]))
        return y


def next_mask(state: Any, rows: int) -> tuple[int, np.ndarray, bool]:
    """The next step's length, the state's mask (grown by a chunk when full) and whether the step's ``rows`` are
    the cache's rows in order (no reorder). ``state`` has ``length``, ``mask`` and ``phys``."""
    length = state.length + 1
    mask = state.mask  # shape: (cache rows, C)
    if length > mask.shape[1]:
        mask = np.concatenate([mask, np.ones((mask.shape[0], _CHUNK), dtype=mask.dtype)], axis=1)
    identity = rows == int(mask.shape[0]) and bool((state.phys == np.arange(rows)).all())
    return length, mask, identity


def input_dtypes(compiled: Any) -> dict[str, Any]:
    """The numpy type of each input of a compiled model, by every name of the input."""
    out = {}
    for port in compiled.inputs:
        dtype = port.get_element_type().to_dtype()
        for name in port.get_names():
            out[name] = dtype
    return out


def infer(request: Any, inputs: dict[str, np.ndarray], dtypes: dict[str, Any]) -> None:
    """Run ``request`` on ``inputs`` (arrays by input name, each bound to the request without a copy where it is
    contiguous, writable and of the input's type ``dtypes[name]``, else converted first); the outputs stay the
    request's tensors (read them as views). Cheaper per call than ``InferRequest.infer(inputs)``, whose Python
    side dispatches every input and gathers the outputs into a dictionary."""
    from openvino import Tensor

    for name, array in inputs.items():
        dtype = dtypes[name]
        if array.dtype != dtype or not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, dtype=dtype, order="C")
        request.set_tensor(name, Tensor(array, shared_memory=True))
    request.infer(share_outputs=True)


class StaleState(RuntimeError):
    """A decoding state of a stateful OpenVINO model that is no longer the model's (a newer one ran since)."""


class _Backend:
    """One infer request of a compiled IR and the keys/values it runs with."""

    def __init__(self, compiled: Any, model: Any):
        self.request = compiled.create_infer_request()
        self.dtypes = input_dtypes(compiled)
        self.stateful = bool(model.stateful)
        self.reorders = bool(model.reorders) or not self.stateful
        self.takes_positions = bool(model.takes_positions)
        self.past = list(model.layers)  # stateless: the past key/value input names, layer by layer
        self.present = [n.replace("past_key_values", "present", 1) for n in self.past]
        self.empty = {}  # stateless: zero-length past per input, by name
        for name in self.past:
            shape = model.ir.input(name).get_partial_shape()
            dims = [0 if i in (0, 2) else shape[i].get_length() for i in range(len(shape))]
            self.empty[name] = np.zeros(dims, dtype=model.ir.input(name).get_element_type().to_dtype())
        self.epoch = 0  # runs so far: an OVRows of a stateful model is live while its epoch is this one
        self._order: np.ndarray | None = None  # the beam_idx bound at the last run
        self._identity: np.ndarray | None = None  # the identity beam_idx of the last row count asked

    def run(self, inputs: dict[str, np.ndarray], kv: dict[str, np.ndarray] | None) -> tuple[np.ndarray, Any]:
        """Run ``inputs`` (with ``kv``, a stateless model's past keys/values); the logits of each row's last
        position ``[rows, V]`` (a view of the output) and the new keys/values (stateless; None stateful)."""
        if not self.stateful:
            inputs = dict(inputs)
            inputs.pop("beam_idx", None)
            if kv is None:  # an empty cache for each row
                rows = len(inputs["input_ids"])
                kv = {n: np.zeros((rows, *e.shape[1:]), dtype=e.dtype) for n, e in self.empty.items()}
            inputs.update(kv)
        order = inputs.get("beam_idx")
        if order is not None and order is self._order:  # the same identity order as bound already
            inputs = {k: v for k, v in inputs.items() if k != "beam_idx"}
        infer(self.request, inputs, self.dtypes)
        self._order = order
        self.epoch += 1
        logits = self.request.get_tensor("logits").data  # shape: (rows, T, V)
        new = None
        if not self.stateful:  # the outputs' memory is the request's: copied before the next run
            new = {p: self.request.get_tensor(o).data.copy() for p, o in zip(self.past, self.present, strict=True)}
        return logits[:, -1, :], new

    def identity(self, rows: int) -> np.ndarray:
        """``beam_idx`` of ``rows`` rows in order (int32), one array per row count: bound once while it repeats."""
        if self._identity is None or self._identity.shape[0] != rows:
            self._identity = np.arange(rows, dtype=np.int32)
        return self._identity

    def read(self) -> dict[str, np.ndarray]:
        """A stateful model's keys/values by state name (``[rows, heads, L, d]`` each)."""
        return {s.name: s.state.data for s in self.request.query_state()}

    def write(self, arrays: dict[str, np.ndarray]) -> None:
        """Set a stateful model's keys/values (by state name)."""
        import openvino as ov

        for s in self.request.query_state():
            s.state = ov.Tensor(np.ascontiguousarray(arrays[s.name]))


class OVRows:
    """The rows of a decoding batch: ``phys`` ``[rows]`` (the cache row each row reads), per cache row the
    attention mask ``mask`` ``[cache rows, C]`` (C >= ``length``, ones past the prompt) and the next position
    ``pos`` ``[cache rows]``, ``row_request`` ``[rows]``, ``length`` the positions the cache holds; ``kv`` a
    stateless model's keys/values (by input name, ``[cache rows, heads, length, d]``), None for a stateful one."""

    def __init__(
        self,
        backend: _Backend,
        phys: np.ndarray,
        mask: np.ndarray,
        pos: np.ndarray,
        row_request: np.ndarray,
        length: int,
        kv: dict[str, np.ndarray] | None,
    ):
        self.backend = backend
        self.phys = phys  # shape: (rows,) int64
        self.mask = mask  # shape: (cache rows, C) int64
        self.pos = pos  # shape: (cache rows,) int64
        self.row_request = row_request  # shape: (rows,)
        self.length = length
        self.kv = kv
        self.epoch = backend.epoch

    def beamkit_select(self, idx: np.ndarray) -> OVRows:
        """The rows ``idx`` (parents; rows may repeat or disappear): ``phys`` composed, nothing else moved."""
        idx = np.asarray(idx, dtype=np.int64)
        out = OVRows(self.backend, self.phys[idx], self.mask, self.pos, self.row_request[idx], self.length, self.kv)
        out.epoch = self.epoch
        return out

    def beamkit_concat(self, others: list[Any]) -> Cohorts:
        """These rows, then the joining requests' prompts, as parts the next step runs and joins."""
        return Cohorts([self, *others])


class OVDecoderStep(Counted):
    """Step function of the engine over a :class:`~beamkit.openvino.Model` compiled at ``precision`` with
    ``threads`` (see the module docstring). ``stats`` counts model calls and rows per call; ``forward_seconds``
    the time inside OpenVINO's inference."""

    def __init__(self, model: Any, precision: str = "f32", threads: int | None = None):
        self.model = model
        self.compiled = model.compiled(precision, threads)
        self.main = _Backend(self.compiled, model)
        self.spares: list[_Backend] = []
        super().__init__()  # stats, forward_seconds

    def init_state(self, input_ids: Any, attention_mask: Any) -> Prompt:
        """The engine's initial state: one row per request (left-padded ``input_ids`` / ``attention_mask``
        ``[n, P]`` torch tensors). For :class:`beamkit.Engine`, add each request with its own row (``[1, P]``)."""
        return Prompt(input_ids, attention_mask.long(), left=True)

    def __call__(self, state: Any, y_prev: Any) -> tuple[Any, Any]:
        """One engine step: ``(logits [rows, V] float32 torch tensor, new state)``."""
        import torch

        y = self.counted(y_prev)
        if not isinstance(state, Cohorts):
            logits, new = self._part(state, y, self.main)
            return torch.from_numpy(logits), new
        outs, parts, start = [], [], 0
        for k, part in enumerate(state.parts):
            n = rows_of(part)
            backend = self.main if k == 0 else self._spare(k - 1)
            got, new = self._part(part, y[start : start + n], backend)
            outs.append(got)  # each: (rows of the part, V)
            parts.append(new)
            start += n
        return torch.from_numpy(np.concatenate(outs)), self._merge(parts)  # shape: (rows, V)

    def _spare(self, k: int) -> _Backend:
        while len(self.spares) <= k:
            self.spares.append(_Backend(self.compiled, self.model))
        return self.spares[k]

    def _part(self, state: Any, y: np.ndarray, backend: _Backend) -> tuple[np.ndarray, OVRows]:
        if isinstance(state, Prompt):
            return self._prefill(state, backend)
        if not isinstance(state, OVRows):
            raise TypeError(f"beamkit.openvino steps take their own states, got {type(state).__name__}")
        if state.backend.stateful and state.epoch != state.backend.epoch:
            raise StaleState(
                "this search steps a decoding state after a newer one ran: a stateful OpenVINO model holds the "
                "keys/values of one batch (searches that keep several states, such as keep_state, need a "
                "stateless IR: export_decoder(..., stateful=False))"
            )
        backend = state.backend
        rows = int(y.shape[0])
        length, mask, identity = next_mask(state, rows)
        phys = state.phys
        cache_rows = int(mask.shape[0])
        kv = state.kv
        if backend.reorders:
            if not identity:
                mask, pos = mask[phys], state.pos[phys]  # shape: (rows, C), (rows,)
                if kv is not None:
                    kv = {name: np.take(a, phys, axis=0) for name, a in kv.items()}  # stateless: the host gather
            else:
                pos = state.pos
            ids = y[:, None]  # shape: (rows, 1)
            inputs = {"input_ids": ids, "attention_mask": np.ascontiguousarray(mask[:, :length])}
            if backend.stateful:
                inputs["beam_idx"] = backend.identity(rows) if identity else phys.astype(np.int32)
        else:  # no beam_idx: every cache row runs; the live ones keep their order and never fork
            if rows and bool((np.diff(phys) <= 0).any()):
                raise ValueError(
                    "this stateful OpenVINO model has no beam_idx input, so its rows cannot be reordered: it decodes "
                    "greedily only (export it with beam_idx, or stateless, for beam search)"
                )
            pos = state.pos
            ids = np.zeros((cache_rows, 1), dtype=np.int64)
            ids[phys, 0] = y
            inputs = {"input_ids": ids, "attention_mask": np.ascontiguousarray(mask[:, :length])}
        if backend.takes_positions:
            inputs["position_ids"] = pos[:, None]
        start = time.perf_counter()
        logits, new_kv = backend.run(inputs, kv)
        self.forward_seconds += time.perf_counter() - start
        if backend.reorders:
            out = OVRows(backend, np.arange(rows, dtype=np.int64), mask, pos + 1, state.row_request, length, new_kv)
            return logits, out
        out = OVRows(backend, phys, mask, pos + 1, state.row_request, length, new_kv)
        return logits[phys], out

    def _prefill(self, prompt: Prompt, backend: _Backend) -> tuple[np.ndarray, OVRows]:
        """The prompts' forward from an empty cache (the backend's state reset)."""
        ids = prompt.ids.numpy().astype(np.int64)  # shape: (n, P)
        mask = prompt.mask.numpy().astype(np.int64)  # shape: (n, P)
        n, width = ids.shape
        pos = np.where(mask != 0, mask.cumsum(axis=1) - 1, 0)  # Hugging Face's positions: 0 on padding
        inputs = {"input_ids": ids, "attention_mask": mask}
        if backend.takes_positions:
            inputs["position_ids"] = pos
        if backend.stateful:
            backend.request.reset_state()
            if backend.reorders:
                inputs["beam_idx"] = np.arange(n, dtype=np.int32)
        start = time.perf_counter()
        logits, kv = backend.run(inputs, None)
        self.forward_seconds += time.perf_counter() - start
        buf = np.concatenate([mask, np.ones((n, _CHUNK), dtype=np.int64)], axis=1)  # shape: (n, P + chunk)
        nxt = pos[:, -1] + 1 if width else np.zeros(n, dtype=np.int64)
        rows = np.arange(n, dtype=np.int64)
        return logits, OVRows(backend, rows, buf, nxt, rows.copy(), width, kv)

    def _merge(self, parts: list[OVRows]) -> OVRows:
        """One state for every part's rows (in order), on the main backend: keys/values, masks left-padded to the
        longest with masked columns, then the leading columns no row attends to dropped."""
        if len(parts) == 1:
            return parts[0]
        width = max(p.length for p in parts)
        arrays = [p.kv if p.kv is not None else p.backend.read() for p in parts]
        masks = [left_pad(p.mask[:, : p.length], width, 1) for p in parts]
        mask = np.concatenate(masks)  # shape: (rows, width)
        attended = mask.any(axis=0)
        drop = int(attended.argmax()) if attended.any() else 0
        kv = {
            name: np.concatenate([left_pad(a[name], width, 2) for a in arrays])[:, :, drop:] for name in arrays[0]
        }  # each: (rows, heads, width - drop, d)
        first = parts[0]
        offsets = np.cumsum([0] + [int(p.row_request.max()) + 1 if p.row_request.size else 0 for p in parts[:-1]])
        row_request = np.concatenate([p.row_request + off for p, off in zip(parts, offsets, strict=True)])
        cache_rows = np.cumsum([0] + [int(p.mask.shape[0]) for p in parts[:-1]])
        phys = np.concatenate([p.phys + off for p, off in zip(parts, cache_rows, strict=True)])
        buf = np.concatenate([mask[:, drop:], np.ones((mask.shape[0], _CHUNK), dtype=np.int64)], axis=1)
        pos = np.concatenate([p.pos for p in parts])
        if first.backend.stateful:
            first.backend.write(kv)
            first.backend.epoch += 1
            merged_kv = None
        else:
            merged_kv = kv
        return OVRows(first.backend, phys, buf, pos, row_request, width - drop, merged_kv)
