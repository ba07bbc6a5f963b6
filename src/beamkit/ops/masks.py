"""Writing entries of ``[rows, V]`` arrays in their own library and device: masks (an entry set to ``-inf`` or a
value), additions and penalties at ``(row, column)`` pairs, the columns kept of a row."""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit.ops.backend import is_torch


def fill(x: Any, rows: np.ndarray, cols: np.ndarray, value: float) -> Any:
    """Set ``x[rows[i], cols[i]] = value`` in place (a mask scatter) and return ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        x[r, c] = value
        return x
    x[rows, cols] = value
    return x


def add_at(x: Any, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> Any:
    """``x[rows[i], cols[i]] += values[i]`` in place (repeated pairs add up) and return ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        index = (torch.as_tensor(rows, device=x.device), torch.as_tensor(cols, device=x.device))
        x.index_put_(index, torch.as_tensor(values, device=x.device, dtype=x.dtype), accumulate=True)
        return x
    np.add.at(x, (rows, cols), np.asarray(values, dtype=x.dtype))
    return x


def where_cols(x: Any, missing: np.ndarray, fill: Any) -> Any:
    """``x`` ``[rows, V]`` with the columns ``missing`` (bool ``[V]``) replaced by ``fill`` (a float, or a
    ``[rows, 1]`` column in ``x``'s library); a new array."""
    if is_torch(x):
        import torch

        mask = torch.as_tensor(missing, device=x.device)[None, :]
        value = fill if is_torch(fill) else torch.as_tensor(fill, dtype=x.dtype, device=x.device)
        return torch.where(mask, value, x)
    return np.where(missing[None, :], fill, x)


def keep_only(x: Any, rows: np.ndarray, cols: np.ndarray) -> Any:
    """Set every entry of the rows ``rows`` to ``-inf`` except column ``cols[i]`` of row ``rows[i]``, in place;
    returns ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        kept = x[r, c].clone()
        x[r] = float("-inf")
        x[r, c] = kept
        return x
    kept = x[rows, cols].copy()
    x[rows] = float("-inf")
    x[rows, cols] = kept
    return x


def penalize_at(x: Any, rows: np.ndarray, cols: np.ndarray, penalty: float) -> Any:
    """``x[rows[i], cols[i]]`` multiplied by ``penalty`` where negative, divided by it elsewhere (pairs distinct),
    in place; returns ``x``."""
    if len(rows) == 0:
        return x
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        v = x[r, c]
        x[r, c] = torch.where(v < 0, v * penalty, v / penalty)
        return x
    v = x[rows, cols]
    x[rows, cols] = np.where(v < 0, v * penalty, v / penalty)
    return x


def mask_below(x: Any, threshold: np.ndarray) -> Any:
    """``x`` ``[rows, V]`` with every entry below its row's ``threshold`` (host ``[rows]``) set to ``-inf``; a new
    array in ``x``'s library."""
    if is_torch(x):
        import torch

        thr = torch.as_tensor(threshold, device=x.device, dtype=x.dtype)[:, None]
        return torch.where(x >= thr, x, torch.full_like(x, float("-inf")))
    return np.where(x >= threshold[:, None], x, float("-inf"))


def keep_pairs(x: Any, rows: np.ndarray, cols: np.ndarray, among: np.ndarray | None = None) -> Any:
    """Set every entry of the rows ``among`` of ``x`` ``[rows, V]`` (None: all rows) to ``-inf`` except
    ``x[rows[i], cols[i]]``, in place (a row of ``among`` with no pair becomes all ``-inf``); returns ``x``. One
    write of the rows and one gather / scatter of the kept entries, no ``[rows, V]`` mask."""
    if is_torch(x):
        import torch

        r = torch.as_tensor(rows, device=x.device)
        c = torch.as_tensor(cols, device=x.device)
        kept = x[r, c].clone()
        if among is None:
            x.fill_(float("-inf"))
        else:
            x[torch.as_tensor(among, device=x.device)] = float("-inf")
        x[r, c] = kept
        return x
    kept = x[rows, cols].copy()
    if among is None:
        x.fill(-np.inf)
    else:
        x[among] = -np.inf
    x[rows, cols] = kept
    return x
