"""The engine's step function over a folder's shared-prompt IR (:mod:`beamkit.openvino.export_shared`): each
request's prompt keys/values held once, whatever its beam count; each row's generated keys/values in the model's
state, reordered by ``beam_idx``.

A request's prompt runs once on the shared-prompt IR (one row per request); the keys/values that run leaves in the
state are read out once into the request's rows of the prompt arrays (``[requests, heads, P, d]`` per layer, bound
to the model's prompt inputs, no copy per step) and the state is reset. Every later step runs one token per live
row: ``beam_idx`` gathers the rows' generated keys/values, ``grid_rows`` / ``row_slot`` place the rows on their
requests' prompts. When a request has no row left its prompt rows are dropped (one copy of the others, once).

Requests join mid-flight (``beamkit.Engine``): the joining prompts run on a second infer request, their prompt
keys/values are appended to the prompt arrays (padded to the longer prompt with masked columns) and their rows join
the state with no generated position yet (the state is written once per join, not per step).

A stateful model holds one batch's keys/values: stepping an older state raises
:class:`~beamkit.openvino.step.StaleState`.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np

from beamkit.hf.steps.join import Cohorts, Prompt
from beamkit.openvino.step import Counted, StaleState, infer, input_dtypes, next_mask

_CHUNK = 64  # columns added to the generated positions' mask buffer at a time
_STATE_NAME = re.compile(r"past_key_values\.(\d+)\.(key|value)")


class _SharedBackend:
    """One infer request of the compiled shared-prompt IR, the prompt arrays bound to it and their mask."""

    def __init__(self, compiled: Any, model: Any):
        self.request = compiled.create_infer_request()
        self.dtypes = input_dtypes(compiled)
        self.names = [f"prompt_key_values.{i}.{p}" for i in range(model.shared_layers) for p in ("key", "value")]
        self.dims = {}  # prompt input name -> (heads, d)
        for name in self.names:
            shape = model.shared_ir.input(name).get_partial_shape()
            self.dims[name] = (shape[1].get_length(), shape[3].get_length())
        self.prompt: dict[str, np.ndarray] = {}  # name -> (requests, heads, P, d) float32, bound to the request
        self.prompt_mask = np.zeros((0, 1), dtype=np.int64)  # shape: (requests, P)
        self.epoch = 0

    def bind(self, prompt: dict[str, np.ndarray], mask: np.ndarray) -> None:
        """Bind the prompt arrays and mask (kept alive here: the request reads their memory)."""
        import openvino as ov

        self.prompt = {n: np.ascontiguousarray(prompt[n], dtype=self.dtypes[n]) for n in self.names}
        self.prompt_mask = np.ascontiguousarray(mask, dtype=np.int64)
        for name, array in self.prompt.items():
            self.request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        self.request.set_tensor("prompt_mask", ov.Tensor(self.prompt_mask, shared_memory=True))

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Run ``inputs``; the logits of each row's last position ``[rows, V]`` (a view of the output)."""
        infer(self.request, inputs, self.dtypes)
        self.epoch += 1
        return self.request.get_tensor("logits").data[:, -1, :]  # shape: (rows, V)

    def read(self) -> dict[str, np.ndarray]:
        """The state's keys/values (copies) under the prompt inputs' names."""
        out = {}
        for s in self.request.query_state():
            found = _STATE_NAME.match(s.name)
            if found is None:
                raise ValueError(f"the shared-prompt IR has a state {s.name!r} that is not a layer's keys/values")
            out[f"prompt_key_values.{found[1]}.{found[2]}"] = np.array(s.state.data, dtype=np.float32)
        return out

    def write(self, arrays: dict[str, np.ndarray]) -> None:
        """Set the state's keys/values (``arrays`` under the prompt inputs' names)."""
        import openvino as ov

        for s in self.request.query_state():
            found = _STATE_NAME.match(s.name)
            assert found is not None
            array = arrays[f"prompt_key_values.{found[1]}.{found[2]}"]
            s.state = ov.Tensor(np.ascontiguousarray(array, dtype=np.float32))

    def state_bytes(self) -> int:
        """Bytes of the state's keys/values and the bound prompt arrays."""
        held = sum(int(s.state.data.nbytes) for s in self.request.query_state())
        return held + sum(int(a.nbytes) for a in self.prompt.values())


class SharedRows:
    """The rows of a decoding batch over the shared-prompt IR: ``phys`` ``[rows]`` (the state row each row reads),
    ``prompt_of`` ``[rows]`` (its request's row of the prompt arrays), per state row the mask of its generated
    positions ``mask`` ``[state rows, C]`` (C >= ``length``) and next position ``pos``; ``length`` the generated
    positions the state holds."""

    def __init__(
        self,
        backend: _SharedBackend,
        phys: np.ndarray,
        prompt_of: np.ndarray,
        mask: np.ndarray,
        pos: np.ndarray,
        length: int,
    ):
        self.backend = backend
        self.phys = phys  # shape: (rows,) int64
        self.prompt_of = prompt_of  # shape: (rows,) int64
        self.mask = mask  # shape: (state rows, C) int64
        self.pos = pos  # shape: (state rows,) int64
        self.length = length
        self.epoch = backend.epoch

    @property
    def row_request(self) -> np.ndarray:
        """The request (its prompt row) of each row."""
        return self.prompt_of

    def beamkit_select(self, idx: np.ndarray) -> SharedRows:
        """The rows ``idx`` (parents): ``phys`` and ``prompt_of`` gathered, nothing else moved."""
        idx = np.asarray(idx, dtype=np.int64)
        out = SharedRows(self.backend, self.phys[idx], self.prompt_of[idx], self.mask, self.pos, self.length)
        out.epoch = self.epoch
        return out

    def beamkit_concat(self, others: list[Any]) -> Cohorts:
        """These rows, then the joining requests' prompts."""
        return Cohorts([self, *others])


def grid(prompt_of: np.ndarray, requests: int) -> tuple[np.ndarray, np.ndarray]:
    """``(grid_rows [requests * W], row_slot [rows])``: the rows laid out as a ``[requests, W]`` grid, W the most
    rows of one request; a request's padding slots repeat its first row (every request has a row)."""
    rows = int(prompt_of.shape[0])
    counts = np.bincount(prompt_of, minlength=requests)  # shape: (requests,)
    width = int(counts.max()) if rows else 1
    order = np.argsort(prompt_of, kind="stable")  # shape: (rows,)
    starts = np.cumsum(counts) - counts
    ranked = prompt_of[order]
    slots = ranked * width + (np.arange(rows) - starts[ranked])
    row_slot = np.empty(rows, dtype=np.int64)
    row_slot[order] = slots
    grid_rows = np.repeat(order[np.minimum(starts, max(rows - 1, 0))], width)  # shape: (requests * W,)
    grid_rows[slots] = order
    return grid_rows.astype(np.int64), row_slot


class OVSharedPromptStep(Counted):
    """Step function of the engine over a :class:`~beamkit.openvino.Model`'s shared-prompt IR compiled at
    ``precision`` with ``threads`` (see the module docstring). ``stats`` counts model calls and rows per call;
    ``forward_seconds`` the time inside OpenVINO's inference; ``peak_state_bytes`` the most bytes of keys/values
    (state and prompt arrays) held after a call."""

    def __init__(self, model: Any, precision: str = "f32", threads: int | None = None):
        if getattr(model, "shared_ir", None) is None:
            raise ValueError(
                f"{model.path} has no shared-prompt IR: export the folder with "
                "beamkit.openvino.export_decoder(..., shared_prompt=True)"
            )
        self.model = model
        self.compiled = model.compiled_shared(precision, threads)
        self.main = _SharedBackend(self.compiled, model)
        self.spare: _SharedBackend | None = None
        super().__init__()  # stats, forward_seconds
        self.peak_state_bytes = 0

    def init_state(self, input_ids: Any, attention_mask: Any) -> Prompt:
        """The engine's initial state: one row per request (left-padded ``[n, P]`` torch tensors)."""
        return Prompt(input_ids, attention_mask.long(), left=True)

    def __call__(self, state: Any, y_prev: Any) -> tuple[Any, Any]:
        """One engine step: ``(logits [rows, V] float32 torch tensor, new state)``."""
        import torch

        y = self.counted(y_prev)
        parts = state.parts if isinstance(state, Cohorts) else [state]
        running = parts[0] if isinstance(parts[0], SharedRows) else None
        prompts = [p for p in parts if isinstance(p, Prompt)]
        if len(prompts) + (running is not None) != len(parts) or len(prompts) > 1:
            raise TypeError(f"beamkit.openvino steps take their own states, got {[type(p).__name__ for p in parts]}")
        outs = []
        new = None
        if running is not None:
            n = int(running.phys.shape[0])
            logits, new = self._step(running, y[:n])
            outs.append(logits)
        if prompts:
            if new is None:
                logits, new = self._prefill(prompts[0], self.main, join=None)
            else:
                logits, new = self._prefill(prompts[0], self._spare(), join=new)
            outs.append(logits)
        assert new is not None
        self.peak_state_bytes = max(self.peak_state_bytes, self.main.state_bytes())
        out = outs[0] if len(outs) == 1 else np.concatenate(outs)  # shape: (rows, V)
        return torch.from_numpy(out), new

    def _spare(self) -> _SharedBackend:
        if self.spare is None:
            self.spare = _SharedBackend(self.compiled, self.model)
        return self.spare

    def _step(self, state: SharedRows, y: np.ndarray) -> tuple[np.ndarray, SharedRows]:
        """One token per live row."""
        backend = state.backend
        if state.epoch != backend.epoch:
            raise StaleState(
                "this search steps a decoding state after a newer one ran: the shared-prompt IR holds the "
                "keys/values of one batch"
            )
        prompt_of = self._compact(state.prompt_of, backend)
        rows = int(y.shape[0])
        length, mask, identity = next_mask(state, rows)
        phys = state.phys
        if identity:
            pos = state.pos
        else:
            mask, pos = mask[phys], state.pos[phys]  # shape: (rows, C), (rows,)
        grid_rows, row_slot = grid(prompt_of, int(backend.prompt_mask.shape[0]))
        inputs = {
            "input_ids": y[:, None],
            "position_ids": pos[:, None],
            "attention_mask": np.ascontiguousarray(mask[:, :length]),
            "grid_rows": grid_rows,
            "row_slot": row_slot,
            "beam_idx": phys.astype(np.int32),
        }
        start = time.perf_counter()
        logits = backend.run(inputs)
        self.forward_seconds += time.perf_counter() - start
        return logits, SharedRows(backend, np.arange(rows, dtype=np.int64), prompt_of, mask, pos + 1, length)

    def _compact(self, prompt_of: np.ndarray, backend: _SharedBackend) -> np.ndarray:
        """Drop the prompt rows of requests no row reads any more (one copy of the others); ``prompt_of`` renumbered."""
        requests = int(backend.prompt_mask.shape[0])
        used = np.unique(prompt_of)
        if used.shape[0] == requests:
            return prompt_of
        backend.bind({n: a[used] for n, a in backend.prompt.items()}, backend.prompt_mask[used])
        return np.searchsorted(used, prompt_of).astype(np.int64)

    def _prefill(
        self, prompt: Prompt, backend: _SharedBackend, join: SharedRows | None
    ) -> tuple[np.ndarray, SharedRows]:
        """The prompts' forward from an empty state, their keys/values read out as prompt arrays; with ``join``
        (the running rows, just stepped on the main request) appended to its prompts and state."""
        ids = prompt.ids.numpy().astype(np.int64)  # shape: (n, P)
        mask = prompt.mask.numpy().astype(np.int64)  # shape: (n, P)
        n = int(ids.shape[0])
        pos = np.where(mask != 0, mask.cumsum(axis=1) - 1, 0)  # Hugging Face's positions: 0 on padding
        rows = np.arange(n, dtype=np.int64)
        inputs: dict[str, np.ndarray] = {
            "input_ids": ids,
            "position_ids": pos,
            "attention_mask": mask,
            "prompt_mask": np.zeros((n, 1), dtype=np.int64),
            "grid_rows": rows,
            "row_slot": rows,
            "beam_idx": rows.astype(np.int32),
        }
        for name, (heads, d) in backend.dims.items():
            inputs[name] = np.zeros((n, heads, 1, d), dtype=np.float32)  # one masked column: no prompt part
        backend.request.reset_state()
        start = time.perf_counter()
        logits = backend.run(inputs).copy()  # shape: (n, V)
        self.forward_seconds += time.perf_counter() - start
        arrays = backend.read()  # each: (n, heads, P, d)
        backend.request.reset_state()
        nxt = pos[:, -1] + 1 if ids.shape[1] else np.zeros(n, dtype=np.int64)
        main = self.main
        if join is None:
            main.bind(arrays, mask)
            buf = np.ones((n, _CHUNK), dtype=np.int64)
            return logits, SharedRows(main, rows, rows.copy(), buf, nxt, 0)
        # joining: prompts appended (padded on the right to the longer prompt), rows added with no generated column
        old_p, new_p = int(main.prompt_mask.shape[1]), int(mask.shape[1])
        width = max(old_p, new_p)
        requests = int(main.prompt_mask.shape[0])
        held = {
            name: np.concatenate([_right_pad(main.prompt[name], width, 2), _right_pad(arrays[name], width, 2)])
            for name in main.names
        }
        main.bind(held, np.concatenate([_right_pad(main.prompt_mask, width, 1), _right_pad(mask, width, 1)]))
        state = main.read()  # each: (state rows, heads, G, d)
        g = join.length
        for name in state:
            heads, d = main.dims[name]
            state[name] = np.concatenate([state[name], np.zeros((n, heads, g, d), dtype=np.float32)])
        main.write(state)
        main.epoch += 1
        state_rows = int(join.mask.shape[0])
        buf = np.concatenate([join.mask, np.zeros((n, join.mask.shape[1]), dtype=np.int64)])
        buf[state_rows:, g:] = 1  # the new rows' generated positions start after the running rows' g
        phys = np.concatenate([join.phys, state_rows + rows])
        prompt_of = np.concatenate([join.prompt_of, requests + rows])
        out = SharedRows(main, phys, prompt_of, buf, np.concatenate([join.pos, nxt]), g)
        return logits, out


def _right_pad(x: np.ndarray, width: int, axis: int) -> np.ndarray:
    """``x`` widened to ``width`` along ``axis`` with zeros on the right."""
    extra = width - x.shape[axis]
    if extra <= 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, extra)
    return np.pad(x, pad)
