"""Reading entries of ``[rows, V]`` arrays in their own library and device: copies, rows and columns gathered,
picked entries and row extremes brought to the host, float64 offsets and row divisions, left padding."""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit.ops.backend import cpu_view, is_torch, to_numpy


def copy(x: Any) -> Any:
    """A copy of ``x`` in its own library, device and dtype."""
    return x.clone() if is_torch(x) else np.array(x, copy=True)


def gather_rows(x: Any, idx: np.ndarray) -> Any:
    """Return ``x[idx]`` along axis 0 (rows may repeat), in ``x``'s library and device."""
    if is_torch(x):
        return x.index_select(0, _torch_index(idx, x.device))
    return x[idx]


def _torch_index(idx: np.ndarray, device: Any) -> Any:
    """A host index array as a torch tensor on ``device`` (a zero-copy view on the CPU)."""
    import torch

    if device.type == "cpu" and isinstance(idx, np.ndarray) and idx.dtype == np.int64 and idx.flags.writeable:
        return torch.from_numpy(np.ascontiguousarray(idx))
    return torch.as_tensor(idx, device=device)


def concat_rows(parts: list[Any]) -> Any:
    """Concatenate arrays along axis 0 in their own library."""
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=0)
    return np.concatenate(parts, axis=0)


def left_pad(x: Any, width: int, axis: int) -> Any:
    """``x`` widened to ``width`` along ``axis`` by zeros (False) on the left, in its own library, device and
    dtype; ``x`` itself when it is that wide already."""
    extra = width - x.shape[axis]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[axis] = extra
    if is_torch(x):
        import torch

        return torch.cat([x.new_zeros(shape), x], dim=axis)
    return np.concatenate([np.zeros(shape, dtype=x.dtype), x], axis=axis)


def plus_offset64(scores: Any, offset: np.ndarray) -> Any:
    """``scores + offset[:, None]`` in float64, in the scores' library and device (``[rows, V]``)."""
    if is_torch(scores):
        import torch

        return scores.double() + torch.as_tensor(offset, device=scores.device)[:, None]
    return np.asarray(scores, dtype=np.float64) + offset[:, None]


def take_cols(x: Any, cols: np.ndarray) -> Any:
    """``x[:, cols]`` (columns may repeat) in ``x``'s library and device."""
    if is_torch(x):
        import torch

        return x.index_select(1, torch.as_tensor(cols, device=x.device))
    return x[:, cols]


def row_max(x: Any) -> np.ndarray:
    """The maximum of each row of ``x`` ``[rows, V]``, on the host as float64 ``[rows]``: NaN anywhere in a row
    gives NaN, else +inf when the row holds one, -inf for an all ``-inf`` row (one cheap pass, no exp)."""
    x = cpu_view(x)
    if is_torch(x):
        return to_numpy(x.amax(dim=1)).astype(np.float64)
    return np.asarray(x).max(axis=1).astype(np.float64)


def row_min(x: Any) -> Any:
    """The minimum of each row of ``x`` ``[rows, V]``, as a ``[rows, 1]`` column in ``x``'s library."""
    if is_torch(x):
        return x.amin(dim=1, keepdim=True)
    return x.min(axis=1, keepdims=True)


def pick(x: Any, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``x[rows[i], cols[i]]`` for every i, as a float64 host vector (only the picked values leave the device)."""
    if is_torch(x):
        import torch

        picked = x[torch.as_tensor(rows, device=x.device), torch.as_tensor(cols, device=x.device)]
        return to_numpy(picked).astype(np.float64)
    return np.asarray(x[rows, cols], dtype=np.float64)


def gather_cols(x: Any, idx: np.ndarray) -> np.ndarray:
    """``x[r, idx[r, j]]`` for a ``[rows, V]`` array and host ``idx`` ``[rows, m]``, as float64 on the host."""
    if is_torch(x):
        import torch

        return to_numpy(x.gather(1, torch.as_tensor(idx, device=x.device))).astype(np.float64)
    return np.take_along_axis(x, idx, axis=1).astype(np.float64)


def div_rows(x: Any, d: np.ndarray) -> Any:
    """``x / d[:, None]`` for ``x`` ``[rows, V]`` and host ``d`` ``[rows]``, in ``x``'s library, device and dtype."""
    if is_torch(x):
        import torch

        return x / torch.as_tensor(d, device=x.device, dtype=x.dtype)[:, None]
    return (x / np.asarray(d, dtype=np.float64)[:, None]).astype(x.dtype, copy=False)
