"""The engine's step function over an OpenVINO encoder-decoder IR folder (:mod:`beamkit.openvino.export_seq2seq`).

The encoder runs once per request, then the first decoder step (the start token) computes each request's
cross-attention keys/values, once, and later steps run the decoder with past. The IRs are stateless: the state
(:class:`Seq2SeqRows`) holds the keys/values on the host; the self-attention ones are views of the outputs of
the infer request that made them (no copy), and each step runs on another request (a pool: one per part of
the step, plus those the state views), so those views stay valid until the step after the next. Stepping an
older state whose request has run since raises :class:`~beamkit.openvino.StaleState`. ``beamkit_select`` only composes
``phys`` (the cache row each row reads); the next step gathers the self-attention keys/values by it, and the
cross-attention keys/values and encoder mask only when rows move between requests (a request's beams read the
same ones). Requests joining mid-flight form a cohort of their own (one decoder call per cohort and step: their
self-attention caches have other lengths), as :mod:`beamkit.hf.steps.join` describes.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from beamkit.hf.steps.join import Cohorts, Prompt, rows_of
from beamkit.openvino.step import Counted, OVDecoderStep, StaleState


class Seq2SeqRows:
    """Rows of one cohort: ``phys`` ``[rows]`` (the cache row each reads), ``row_request`` ``[rows]``; per cache
    row the encoder mask ``mask`` ``[cache rows, S]`` and the keys/values ``own`` (self-attention, by input name,
    ``[cache rows, heads, L, d]``) and ``cross`` (cross-attention); ``cross_request`` ``[cache rows]`` the request
    of each cross-attention row. ``own`` may be views of an infer request's outputs (``owner``, as of its run
    ``owner_run``): valid until that request runs again."""

    def __init__(self, phys: np.ndarray, row_request: np.ndarray, mask: np.ndarray, own: dict[str, np.ndarray],
                 cross: dict[str, np.ndarray], cross_request: np.ndarray, owner: Any = None,
                 owner_run: int = 0):  # fmt: skip
        self.phys = phys  # shape: (rows,)
        self.row_request = row_request  # shape: (rows,)
        self.mask = mask  # shape: (cache rows, S)
        self.own = own
        self.cross = cross
        self.cross_request = cross_request  # shape: (cache rows,)
        self.owner, self.owner_run = owner, owner_run

    def beamkit_select(self, idx: np.ndarray) -> Seq2SeqRows:
        """The rows ``idx`` (parents): ``phys`` composed, nothing else moved."""
        idx = np.asarray(idx, dtype=np.int64)
        return Seq2SeqRows(self.phys[idx], self.row_request[idx], self.mask, self.own, self.cross, self.cross_request,
                           self.owner, self.owner_run)  # fmt: skip

    def beamkit_concat(self, others: list[Any]) -> Cohorts:
        """These rows, then the joining requests' encoder inputs, as parts of their own."""
        return Cohorts([self, *others])


class OVSeq2SeqStep(Counted):
    """Step function of the engine over an encoder-decoder :class:`~beamkit.openvino.Model` compiled at
    ``precision`` with ``threads``; ``stats`` / ``forward_seconds`` as :class:`~beamkit.openvino.OVDecoderStep`'s."""

    def __init__(self, model: Any, precision: str = "f32", threads: int | None = None):
        compiled = model.compiled(precision, threads)
        self.compiled = compiled
        self.requests = {kind: c.create_infer_request() for kind, c in compiled.items()}
        self.pool: list[Any] = []  # decoder-with-past requests; a step runs each part on one no live state views
        self.runs: dict[int, int] = {}  # runs of each pool request, by id
        self.own_names = [n for n in model.layers if ".decoder." in n]
        self.cross_names = [n for n in model.layers if ".encoder." in n]
        super().__init__()  # stats, forward_seconds

    def init_state(self, input_ids: Any, attention_mask: Any) -> Prompt:
        """The engine's initial state: one row per request (encoder inputs ``[n, S]``, right-padded)."""
        return Prompt(input_ids, attention_mask.long(), left=False)

    def __call__(self, state: Any, y_prev: Any) -> tuple[Any, Any]:
        """One engine step: ``(logits [rows, V] float32 torch tensor, new state)``."""
        import torch

        y = self.counted(y_prev)
        parts = state.parts if isinstance(state, Cohorts) else [state]
        busy = {id(p.owner) for p in parts if isinstance(p, Seq2SeqRows) and p.owner is not None}
        outs, new, start = [], [], 0
        for part in parts:
            n = rows_of(part)
            got, rows = self._part(part, y[start : start + n], busy)
            outs.append(got)  # each: (rows of the part, V)
            new.append(rows)
            start += n
        logits = outs[0] if len(outs) == 1 else np.concatenate(outs)  # shape: (rows, V)
        return torch.from_numpy(logits), new[0] if len(new) == 1 else Cohorts(new)

    def _free(self, busy: set[int]) -> Any:
        """A decoder-with-past request whose outputs no state of this step views (added to ``busy``)."""
        for request in self.pool:
            if id(request) not in busy:
                break
        else:
            request = self.compiled["past"].create_infer_request()
            self.pool.append(request)
            self.runs[id(request)] = 0
        busy.add(id(request))
        return request

    def _run(self, kind: str, inputs: dict[str, np.ndarray], request: Any = None) -> Any:
        request = self.requests[kind] if request is None else request
        start = time.perf_counter()
        request.infer(inputs, share_inputs=True, share_outputs=True)  # outputs read as views: none copied
        self.forward_seconds += time.perf_counter() - start
        return request

    def _part(self, state: Any, y: np.ndarray, busy: set[int]) -> tuple[np.ndarray, Seq2SeqRows]:
        if isinstance(state, Prompt):
            return self._first(state, y)
        if not isinstance(state, Seq2SeqRows):
            raise TypeError(f"beamkit.openvino steps take their own states, got {type(state).__name__}")
        if state.owner is not None and self.runs[id(state.owner)] != state.owner_run:
            raise StaleState(
                "this search steps a decoding state after a newer one ran on the keys/values it reads (searches "
                "that step several states of one encoder-decoder IR at once are not supported)"
            )
        phys = state.phys
        rows = int(phys.shape[0])
        own, cross, mask, cross_request = state.own, state.cross, state.mask, state.cross_request
        if not (rows == mask.shape[0] and bool((phys == np.arange(rows)).all())):
            own = {n: np.take(a, phys, axis=0) for n, a in own.items()}  # shape: (rows, heads, L, d) each
            moved = cross_request[phys]
            if rows != mask.shape[0] or not np.array_equal(moved, cross_request):  # rows left or changed request
                cross = {n: np.take(a, phys, axis=0) for n, a in cross.items()}  # shape: (rows, heads, S, d) each
                mask, cross_request = mask[phys], moved
        inputs = {"input_ids": y[:, None], "encoder_attention_mask": mask, **own, **cross}
        request = self._run("past", inputs, self._free(busy))
        self.runs[id(request)] += 1
        logits = request.get_tensor("logits").data[:, -1, :]  # shape: (rows, V) view, valid until its next run
        new = {n: request.get_tensor(n.replace("past_key_values", "present", 1)).data for n in self.own_names}
        out = Seq2SeqRows(np.arange(rows), state.row_request, mask, new, cross, cross_request, request,
                          self.runs[id(request)])  # fmt: skip
        return logits, out

    def _first(self, prompt: Prompt, y: np.ndarray) -> tuple[np.ndarray, Seq2SeqRows]:
        """The encoder over the requests' inputs, then the first decoder step (the start tokens ``y``)."""
        ids = prompt.ids.numpy().astype(np.int64)  # shape: (n, S)
        mask = prompt.mask.numpy().astype(np.int64)  # shape: (n, S)
        encoder = self._run("encoder", {"input_ids": ids, "attention_mask": mask})
        hidden = encoder.get_tensor("last_hidden_state").data  # shape: (n, S, d)
        request = self._run("decoder", {"input_ids": y[:, None], "encoder_hidden_states": hidden,
                                        "encoder_attention_mask": mask})  # fmt: skip
        logits = request.get_tensor("logits").data[:, -1, :].copy()  # shape: (n, V)

        def present(name: str) -> np.ndarray:
            return request.get_tensor(name.replace("past_key_values", "present", 1)).data.copy()

        own = {n: present(n) for n in self.own_names}
        cross = {n: present(n) for n in self.cross_names}
        n = int(ids.shape[0])
        rows = np.arange(n, dtype=np.int64)
        return logits, Seq2SeqRows(rows, rows.copy(), mask, own, cross, rows.copy())


def make_step(model: Any, precision: str = "f32", threads: int | None = None, shared_prompt: bool = False) -> Any:
    """The step function for ``model``: :class:`OVSeq2SeqStep` for an encoder-decoder folder, else
    :class:`~beamkit.openvino.OVDecoderStep`, or with ``shared_prompt`` the folder's shared-prompt IR's
    :class:`~beamkit.openvino.shared.OVSharedPromptStep` (ValueError where the folder has none)."""
    if shared_prompt:
        from beamkit.openvino.shared import OVSharedPromptStep

        if model.encoder_decoder:
            raise ValueError("shared_prompt is for decoder-only models; this folder holds an encoder-decoder")
        return OVSharedPromptStep(model, precision, threads)
    if model.encoder_decoder:
        return OVSeq2SeqStep(model, precision, threads)
    return OVDecoderStep(model, precision, threads)
