"""Helpers shared by the model modules: batching source strings, joining per-request state, running a torch or
a numpy model."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_int
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


def seq2seq_config(emb: int, hidden: int, layers: int) -> dict[str, Any]:
    """The checked hyper-parameters of a Seq2Seq (torch or numpy), as saved in its ``config.json``."""
    if hidden % 2:
        raise ValueError(f"hidden must be even (a bidirectional encoder splits it), got {hidden}")
    check_int("layers", layers, 1)
    return {"emb": emb, "hidden": hidden, "layers": layers}


def transformer_config(
    d_model: int, heads: int, ff: int, enc_layers: int, dec_layers: int, max_len: int, dropout: float
) -> dict[str, Any]:
    """The checked hyper-parameters of a Transformer (torch or numpy), as saved in its ``config.json``."""
    if d_model % heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
    return {
        "d_model": d_model,
        "heads": heads,
        "ff": ff,
        "enc_layers": enc_layers,
        "dec_layers": dec_layers,
        "max_len": max_len,
        "dropout": dropout,
    }


def join_lstm_states(parts: Sequence[Any]) -> tuple[Any, ...]:
    """The fields ``(h, c, feed, req, memory)`` of Seq2Seq decoder states (torch or numpy) joined: rows
    concatenated, the encoder memories of the requests still decoding joined, request indices renumbered."""
    req, memory = join_requests([(p.req, p.memory) for p in parts], (1, 1, 1))
    return (
        tuple(ops.concat_rows(list(hs)) for hs in zip(*(p.h for p in parts), strict=True)),  # shape: (rows, hidden)
        tuple(ops.concat_rows(list(cs)) for cs in zip(*(p.c for p in parts), strict=True)),
        ops.concat_rows([p.feed for p in parts]),
        req,
        memory,
    )


def join_cross(parts: Sequence[Any]) -> tuple[Any, Shared]:
    """The request ids and cross-attention memory ``Shared((k per layer, v per layer, src mask))`` of
    Transformer states (torch or numpy) joined: sources padded and masked, request indices renumbered."""
    layers = len(parts[0].cross.value[0])
    flat = [(p.req, Shared((*p.cross.value[0], *p.cross.value[1], p.cross.value[2]))) for p in parts]
    req, cross = join_requests(flat, (2,) * (2 * layers) + (1,))
    return req, Shared((cross.value[:layers], cross.value[layers : 2 * layers], cross.value[-1]))


def join_self_cache(parts: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...], Any]:
    """The dense self-attention caches ``(self_k, self_v, length)`` of Transformer states (torch or numpy)
    joined: each left-padded to the longest, ``length`` holding each row's own (None when all are full)."""
    layers = len(parts[0].self_k)
    width = max(p.self_k[0].shape[2] for p in parts)
    lengths = [
        p.length if p.length is not None else ops.like(np.full(p.req.shape, p.self_k[0].shape[2], np.int64), p.req)
        for p in parts
    ]
    length = ops.concat_rows(lengths)  # shape: (rows,)
    # shape: (rows, heads, width, d_head) per layer
    k = tuple(ops.concat_rows([pad_axis(p.self_k[i], 2, width, left=True) for p in parts]) for i in range(layers))
    v = tuple(ops.concat_rows([pad_axis(p.self_v[i], 2, width, left=True) for p in parts]) for i in range(layers))
    return k, v, None if bool((length == width).all()) else length


def trim_self_cache(state: Any, max_len: int) -> tuple[tuple[Any, ...], tuple[Any, ...], Any]:
    """A Transformer state's dense self-attention cache ``(self_k, self_v, length)`` (torch or numpy) before
    the next token: columns no row uses any more dropped, ``length`` None once every row holds all columns.
    ValueError when the next token would be past the model's ``max_len``."""
    self_k, self_v, length = state.self_k, state.self_v, state.length
    if length is not None:  # rows of different lengths: drop columns no row uses any more
        lead = self_k[0].shape[2] - int(length.max())
        if lead > 0:
            self_k = tuple(k[:, :, lead:] for k in self_k)  # shape: (rows, heads, t, d_head)
            self_v = tuple(v[:, :, lead:] for v in self_v)
        if bool((length == self_k[0].shape[2]).all()):
            length = None
    t = self_k[0].shape[2]
    if (t if length is None else int(length.max())) >= max_len:
        raise ValueError(f"decoding past the model's max_len {max_len}")
    return self_k, self_v, length


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


def model_device(model: Any) -> Any:
    """The torch device a torch model's weights live on (the CPU for a model without parameters)."""
    import torch

    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def model_inputs(model: Any, *arrays: np.ndarray) -> tuple[Any, ...]:
    """Host int arrays (padded ids, lengths) as ``model.init_state`` takes them: numpy as they are, else tensors on
    the model's device."""
    if is_numpy_model(model):
        return arrays
    import torch

    device = model_device(model)
    return tuple(torch.as_tensor(a, device=device) for a in arrays)
