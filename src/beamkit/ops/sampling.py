"""What the samplers draw with: random generators (numpy or torch), Gumbel and uniform noise, rows sorted
descending, cumulative masses, nucleus sizes and inverse-CDF draws; the sums stay on the logits' device."""

from __future__ import annotations

from typing import Any

import numpy as np

from beamkit.ops.backend import is_torch, like, to_numpy


def sort_desc(x: Any) -> Any:
    """Each row of ``x`` ``[rows, V]`` sorted in descending order, in ``x``'s library and device."""
    if is_torch(x):
        return x.sort(dim=1, descending=True).values
    return -np.sort(-x, axis=1)


def cumsum_exp(x: Any) -> np.ndarray:
    """Row-wise cumulative sum of ``exp(x)`` for ``[rows, V]``, on the host."""
    if is_torch(x):
        return to_numpy(x.exp().cumsum(dim=1))
    return np.cumsum(np.exp(x), axis=1)


def is_generator(x: Any) -> bool:
    """True for a random generator the samplers can draw from: a ``numpy.random.Generator`` or a
    ``torch.Generator`` (checked without importing torch)."""
    return isinstance(x, np.random.Generator) or type(x).__module__.startswith("torch")


def gumbel(rng: Any, shape: tuple[int, ...], ref: Any) -> Any:
    """Standard Gumbel noise of ``shape`` as float64 from ``rng`` (a numpy or torch generator), in the library
    and on the device of ``ref``."""
    if isinstance(rng, np.random.Generator):
        return like(rng.gumbel(size=shape), ref)
    import torch

    u = torch.rand(shape, generator=rng, dtype=torch.float64, device=rng.device)
    tiny = torch.finfo(torch.float64).tiny
    g = -torch.log(-torch.log(u.clamp(min=tiny)))
    return g.to(ref.device) if is_torch(ref) else g.cpu().numpy()


def uniform(rng: Any, shape: tuple[int, ...], ref: Any) -> Any:
    """Uniform noise on ``[0, 1)`` of ``shape`` as float64 from ``rng`` (a numpy or torch generator), in the
    library and on the device of ``ref``."""
    if isinstance(rng, np.random.Generator):
        return like(rng.random(size=shape), ref)
    import torch

    u = torch.rand(shape, generator=rng, dtype=torch.float64, device=rng.device)
    return u.to(ref.device) if is_torch(ref) else u.cpu().numpy()


def nucleus_size(srt: Any, p: float) -> np.ndarray:
    """For rows of log-probabilities sorted descending (``[rows, V]``), how many lead entries have a mass before
    them below ``p`` (at least 1), as host int64 ``[rows]``; the sums stay on the device."""
    rows = int(srt.shape[0])
    if is_torch(srt):
        import torch

        cum = srt.exp().cumsum(dim=1)  # shape: (rows, V)
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)
        n = to_numpy((before < p).sum(dim=1)).astype(np.int64)
    else:
        acc = np.cumsum(np.exp(srt), axis=1)
        ahead = np.concatenate([np.zeros((rows, 1), dtype=acc.dtype), acc[:, :-1]], axis=1)
        n = (ahead < p).sum(axis=1).astype(np.int64)
    return np.maximum(n, 1)


def inverse_cdf(log_weights: Any, u: Any) -> np.ndarray:
    """Draws with replacement by inverse transform sampling: for each row of ``log_weights`` ``[rows, V]``
    (unnormalised log-weights; ``-inf`` is never drawn) and each uniform of ``u`` ``[rows, m]`` (on ``[0, 1)``,
    in the weights' library), the first column whose cumulative probability under ``softmax(row)`` exceeds the
    uniform. Host int64 ``[rows, m]``; a row without a finite weight gives arbitrary columns (the caller drops
    them). The cumulative sums stay on the device; only the ``[rows, m]`` columns come back."""
    rows, v = int(log_weights.shape[0]), int(log_weights.shape[1])
    if is_torch(log_weights):
        import torch

        w = log_weights.double()
        top = w.amax(dim=1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        prob = (w - top).exp()  # shape: (rows, V) weights relative to the row's largest
        cum = prob.cumsum(dim=1)
        target = u.to(device=cum.device, dtype=torch.float64) * cum[:, -1:]  # shape: (rows, m)
        col = torch.searchsorted(cum, target.contiguous(), right=True)
        ids = torch.arange(v, device=cum.device)
        last = torch.where(prob > 0, ids, torch.zeros_like(ids)).amax(dim=1, keepdim=True)  # last drawable column
        return to_numpy(torch.minimum(col, last)).astype(np.int64)
    x = np.asarray(log_weights, dtype=np.float64)
    peak = x.max(axis=1, keepdims=True) if v else np.zeros((rows, 1))
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(invalid="ignore"):
        rel = np.exp(x - peak)  # shape: (rows, V) weights relative to the row's largest
    acc = np.cumsum(rel, axis=1)
    goal = np.asarray(u, dtype=np.float64) * acc[:, -1:]  # shape: (rows, m)
    found = np.empty(goal.shape, dtype=np.int64)
    for r in range(rows):  # one binary search per row: [rows, m] work, no [rows, m, V] table
        found[r] = np.searchsorted(acc[r], goal[r], side="right")
    end = np.where(rel > 0, np.arange(v), 0).max(axis=1, keepdims=True) if v else np.zeros((rows, 1), np.int64)
    return np.minimum(found, end)
