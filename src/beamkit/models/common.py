"""Helpers shared by the model modules: batching source strings, joining per-request state, running a torch or
a numpy model."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.models.vocab import Vocab
from beamkit.state import Shared


def pad_batch(seqs: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad id sequences to one length; return ids (B, S) int64 and lengths (B,) int64."""
    if not seqs:
        raise ValueError("empty batch")
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    if lengths.min() == 0:
        raise ValueError("empty input: every source needs at least one character")
    out = np.full((len(seqs), int(lengths.max())), pad, dtype=np.int64)  # shape: (B, S)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, lengths


def encode_sources(vocab: Vocab, texts: Sequence[str]) -> list[list[int]]:
    """Encode source strings, rejecting non-strings, empty or blank strings and unknown characters."""
    if isinstance(texts, str):
        raise TypeError("expected a sequence of strings, got one string")
    out = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"expected a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("empty input: give a non-blank string to translate")
        out.append(vocab.encode(text))
    return out


def pad_axis(x: Any, axis: int, size: int, value: float | bool = 0, left: bool = False) -> Any:
    """Array ``x`` (numpy or torch) padded with ``value`` along ``axis`` to ``size`` (on the right, or the ``left``)."""
    extra = size - x.shape[axis]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[axis] = extra
    if not ops.is_torch(x):
        fill = np.full(shape, value, dtype=x.dtype)
        return np.concatenate([fill, x] if left else [x, fill], axis=axis)
    import torch

    fill = x.new_full(shape, value)
    return torch.cat([fill, x] if left else [x, fill], dim=axis)


def join_requests(parts: Sequence[tuple[Any, Shared]], source_axes: Sequence[int]) -> tuple[Any, Shared]:
    """Join the per-request data of states whose rows are concatenated (requests joining a running search).

    Each part is ``(req, Shared(values))``: the request index of each row and a flat tuple of per-request arrays
    (numpy or torch, as ``req``; axis 0 = request; ``source_axes[i]`` = the source-length axis of ``values[i]``,
    padded with zeros / False to the longest source: masks keep padded positions out of attention). Only the
    requests some row still reads are kept (finished requests' memory is dropped), and the rows' indices are
    renumbered.
    """
    if not ops.is_torch(parts[0][0]):
        return _join_numpy(parts, source_axes)
    import torch

    reqs: list[Any] = []
    columns: list[list[Any]] = [[] for _ in source_axes]
    offset = 0
    for req, shared in parts:
        used, local = torch.unique(req, return_inverse=True)
        reqs.append(local + offset)
        offset += int(used.shape[0])
        for i, v in enumerate(shared.value):
            columns[i].append(v.index_select(0, used.to(v.device)))
    values = []
    for axis, col in zip(source_axes, columns, strict=True):
        size = max(int(v.shape[axis]) for v in col)
        values.append(torch.cat([pad_axis(v, axis, size) for v in col], dim=0))
    return torch.cat(reqs), Shared(tuple(values))


def _join_numpy(parts: Sequence[tuple[Any, Shared]], source_axes: Sequence[int]) -> tuple[np.ndarray, Shared]:
    """:func:`join_requests` for numpy states (the same rule: used requests kept, sources padded, renumbered)."""
    reqs: list[np.ndarray] = []
    columns: list[list[np.ndarray]] = [[] for _ in source_axes]
    offset = 0
    for req, shared in parts:
        used, local = np.unique(np.asarray(req), return_inverse=True)
        reqs.append(local.reshape(-1).astype(np.int64) + offset)
        offset += int(used.shape[0])
        for i, v in enumerate(shared.value):
            columns[i].append(v[used])
    values = []
    for axis, col in zip(source_axes, columns, strict=True):
        size = max(int(v.shape[axis]) for v in col)
        values.append(np.concatenate([pad_axis(v, axis, size) for v in col], axis=0))
    return np.concatenate(reqs), Shared(tuple(values))


def is_numpy_model(model: Any) -> bool:
    """True for the numpy inference models (``backend == "numpy"``); any other model is taken to be torch."""
    return getattr(model, "backend", "torch") == "numpy"


@contextmanager
def inference(model: Any) -> Iterator[None]:
    """The context a model decodes in: ``torch.inference_mode()`` for a torch model, nothing for a numpy one
    (torch is then never imported)."""
    if is_numpy_model(model):
        yield
        return
    import torch

    with torch.inference_mode():
        yield


def model_inputs(model: Any, *arrays: np.ndarray) -> tuple[Any, ...]:
    """Host int arrays (padded ids, lengths) as ``model.init_state`` takes them: numpy as they are, else tensors."""
    if is_numpy_model(model):
        return arrays
    import torch

    return tuple(torch.as_tensor(a) for a in arrays)
