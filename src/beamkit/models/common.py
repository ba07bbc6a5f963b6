"""Helpers shared by the model modules: batching source strings, joining per-request state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

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
    """Tensor ``x`` padded with ``value`` along ``axis`` to ``size`` (on the right, or on the ``left``)."""
    import torch

    extra = size - x.shape[axis]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[axis] = extra
    fill = x.new_full(shape, value)
    return torch.cat([fill, x] if left else [x, fill], dim=axis)


def join_requests(parts: Sequence[tuple[Any, Shared]], source_axes: Sequence[int]) -> tuple[Any, Shared]:
    """Join the per-request data of states whose rows are concatenated (requests joining a running search).

    Each part is ``(req, Shared(values))``: the request index of each row and a flat tuple of per-request tensors
    (axis 0 = request; ``source_axes[i]`` = the source-length axis of ``values[i]``, padded with zeros / False to
    the longest source: masks keep padded positions out of attention). Only the requests some row still reads
    are kept (finished requests' memory is dropped), and the rows' indices are renumbered.
    """
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
