"""CTC posterior matrices in: checked, read as the kind they are, normalised, and cut down to candidates.

A posterior matrix is ``(T, V)``: one row per frame, one column per label. It may hold logits, log-probabilities
or probabilities (``input_kind``). ``"auto"`` reads it as probabilities when every value lies in ``[0, 1]`` and
every row sums to 1 within a tolerance that fits the input's dtype (:func:`sum_tolerance`); rows that sum to 1
only roughly (a float32 softmax cast to float64, say) are read as probabilities too, with a warning that it
guessed; anything else is read as logits (log-softmax; log-probabilities pass through unchanged). Values are
clipped at ``log 1e-15`` as pyctcdecode does.

The search only ever looks at each frame's *candidates* (labels with ``lp >= token_min_logp``, or the argmax
when none is), so utterances are normalised one at a time and only their candidates are kept
(:class:`FrameCandidates`): memory is O(candidates), never O(N x T x V).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .jit import njit

MIN_TOKEN_CLIP_P = 1e-15  # probabilities are clipped here before the log
_LOG_MIN_P = math.log(MIN_TOKEN_CLIP_P)
INPUT_KINDS = ("auto", "logits", "log_probs", "probs")
_GUESS_BAND = 1e-2  # rows summing to 1 within this (but not within the dtype's tolerance): probabilities, warned


def as_real_array(x: Any, name: str = "log_probs", keep_dtype: bool = False) -> np.ndarray:
    """A numpy array of real numbers from a numpy array, torch tensor or nested list: float64, or (with
    ``keep_dtype``) the input's own float dtype. Booleans, complex numbers, strings and objects are refused
    with a TypeError."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    try:
        arr = np.asarray(x)
    except ValueError as exc:  # ragged nested lists
        raise TypeError(f"{name} must be a rectangular array of numbers: {exc}") from None
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if arr.dtype.kind != "f" or not keep_dtype:
        arr = arr.astype(np.float64, copy=False)
    return arr


def sum_tolerance(dtype: np.dtype, width: int) -> float:
    """How far from 1 a row of ``width`` probabilities computed in ``dtype`` may sum from rounding alone:
    ``8 * sqrt(width)`` units of the dtype's epsilon (rounding errors of a softmax add up like a random walk),
    at least 1e-9, at most ``_GUESS_BAND``."""
    eps = float(np.finfo(dtype).eps) if np.dtype(dtype).kind == "f" else float(np.finfo(np.float64).eps)
    return min(_GUESS_BAND, max(1e-9, 8.0 * math.sqrt(max(width, 1)) * eps))


def reads_as_probabilities(arr: np.ndarray, input_kind: str = "auto") -> bool:
    """Whether a ``(T, V)`` matrix (in its own dtype) is read as probabilities under ``input_kind`` (see the
    module docstring); warns (``UserWarning``) when ``"auto"`` has to guess."""
    if input_kind not in INPUT_KINDS:
        raise ValueError(f"input_kind must be one of {', '.join(INPUT_KINDS)}; got {input_kind!r}")
    if input_kind != "auto":
        return input_kind == "probs"
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        return False
    lo = float(arr.min())
    if not lo >= 0.0:  # logits and log-probabilities stop here, after one pass (NaN too)
        return False
    hi = float(arr.max())
    if not hi <= 1.0:
        return False
    sums = arr.sum(axis=1, dtype=np.float64)  # shape: (T,)
    off = float(np.abs(sums - 1.0).max())
    tol = sum_tolerance(arr.dtype, arr.shape[1])
    if off <= tol:
        return True
    if off <= _GUESS_BAND:
        warnings.warn(
            f"posteriors in [0, 1] whose rows sum to 1 only within {off:.2g} (more than {arr.dtype} rounding, "
            f"{tol:.2g}): read as probabilities; pass input_kind='probs' or 'logits' to say which they are",
            UserWarning,
            stacklevel=3,
        )
        return True
    if lo == hi:  # a constant matrix (all zeros, say) reads the same either way: uniform
        return False
    warnings.warn(
        f"posteriors lie in [0, 1] but rows sum to {float(sums.min()):.3g}..{float(sums.max()):.3g}, not 1: "
        "read as logits; pass input_kind='probs' or 'logits' to say which they are",
        UserWarning,
        stacklevel=3,
    )
    return False


def normalize_posteriors(x: Any, input_kind: str = "auto", name: str = "logits") -> np.ndarray:
    """One ``(T, V)`` matrix as float64 log-probabilities: ``log(clip(p, 1e-15, 1))`` for probabilities,
    a log-softmax clipped to ``[log 1e-15, 0]`` otherwise (pyctcdecode's values, bit for bit). Refuses NaN,
    and frames that normalise to NaN (all ``-inf``, or a ``+inf``)."""
    raw = as_real_array(x, name, keep_dtype=True)
    if raw.ndim != 2:
        raise ValueError(f"{name} must be 2-D (time, vocabulary), got shape {raw.shape}")
    if input_kind != "logits" and np.isnan(raw).any():  # logits: found below, by the row maxima
        raise ValueError(f"{name} contains NaN")
    if reads_as_probabilities(raw, input_kind):
        if (raw < 0).any() or (raw > 1 + _GUESS_BAND).any():
            raise ValueError(f"{name} given as probabilities must lie in [0, 1]")
        return np.log(np.clip(raw.astype(np.float64), MIN_TOKEN_CLIP_P, 1.0))
    out, lse = _shifted_logits(raw, name)
    out -= lse
    np.maximum(out, math.log(MIN_TOKEN_CLIP_P), out=out)
    return out


def _shifted_logits(raw: np.ndarray, name: str, own: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(x - max, log(sum(exp(x - max))))`` per row of a logit matrix in float64 (the log-softmax is their
    difference); refuses NaN and rows that normalise to NaN. ``own``: ``raw`` may be shifted in place."""
    bad = 3
    if raw.ndim == 2 and raw.shape[0] > 0 and raw.shape[1] > 0 and raw.dtype in _SHIFTED_DTYPES:
        out, bad = _shift_rows(raw)  # shape: (T, V) a new float64 matrix; the row maxima and the shift compiled
    if bad == 3:  # another dtype, an empty matrix, or a maximum numpy is to choose: numpy throughout
        # shape: (T, V) shifted in place (a copy unless ``raw`` is ours and already float64)
        out = np.asarray(raw, dtype=np.float64, order="C") if own else np.array(raw, dtype=np.float64, order="C")
        if out.shape[0] == 0:
            return out, np.zeros((0, 1))
        m = out.max(axis=1, keepdims=True)  # shape: (T, 1) NaN where a row holds NaN, +inf where it holds +inf
        bad = 0 if np.isfinite(m).all() else 1 if np.isnan(m).any() else 2
        if not bad:
            out -= m
    if bad == 1:
        raise ValueError(f"{name} contains NaN")
    if bad == 2:
        raise ValueError(f"{name} has a frame that is all -inf or holds +inf (it normalises to NaN)")
    # each row's maximum is now 0, so its sum of exponentials is at least 1: the log never meets a zero
    lse = np.log(np.sum(np.exp(out), axis=1, keepdims=True))  # shape: (T, 1)
    return out, lse


_SHIFTED_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))  # what the compiled shift reads (native order)


@njit
def _shift_rows(raw: np.ndarray) -> tuple[np.ndarray, int]:
    """``raw - max`` per row in float64 (the values numpy gives: a float32 value widens exactly, the maximum
    and the difference are exact operations) and what is wrong: 0 nothing, 1 a row holds NaN, 2 a row's
    maximum is -inf or +inf (NaN takes precedence, as numpy's maximum propagates it); 3: a row's maximum is
    both 0 and -0 (numpy is asked instead)."""
    T, V = raw.shape
    out = np.empty((T, V), dtype=np.float64)
    bad = 0
    for t in range(T):
        m = -np.inf
        for j in range(V):
            v = np.float64(raw[t, j])
            if np.isnan(v):
                return out, 1
            if v > m:
                m = v
        if np.isinf(m):
            bad = 2
        elif m == 0.0:  # a row whose maximum is 0 and -0 at once: which one numpy keeps is its own affair
            signs = 0
            for j in range(V):
                if raw[t, j] == 0.0:
                    signs |= 2 if np.signbit(raw[t, j]) else 1
            if signs == 3:
                return out, 3
        for j in range(V):
            out[t, j] = np.float64(raw[t, j]) - m
    return out, bad


@njit
def _cut_shifted(
    shifted: np.ndarray, lse: np.ndarray, floor: float, token_min_logp: float, blank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The candidates of ``max(shifted - lse, floor)`` (a normalised matrix, never built; ``lse`` per row) and
    its blank column, in one pass: per frame the labels with a value ``>= token_min_logp``, in label order, or
    the frame's argmax (the first of equal values) when there is none. Returns ``(count (T,), labels (C,),
    values (C,), blank values (T,))``."""
    T, V = shifted.shape
    count = np.zeros(T, dtype=np.int64)
    labels = np.empty(T * V, dtype=np.int64)
    values = np.empty(T * V, dtype=np.float64)
    lp_blank = np.empty(T, dtype=np.float64)
    n = 0
    for t in range(T):
        c = lse[t, 0]
        best, arg = -np.inf, 0
        for j in range(V):
            v = max(shifted[t, j] - c, floor)
            if j == blank:
                lp_blank[t] = v
            if v > best:
                best, arg = v, j
            if v >= token_min_logp:
                labels[n] = j
                values[n] = v
                n += 1
                count[t] += 1
        if count[t] == 0:  # no candidate: the frame's argmax (the first of equal values)
            labels[n] = arg
            values[n] = best
            n += 1
            count[t] = 1
    return count, labels[:n], values[:n], lp_blank


@dataclass(frozen=True)
class FrameCandidates:
    """The candidate labels of every frame of ``N`` utterances, padded to ``T`` frames.

    ``lens``: ``(N,)`` frames per utterance; ``count``: ``(N * T,)`` candidates per (utterance, frame) row
    (0 on padding rows); ``labels``/``values``: ``(C,)`` the candidates and their log-probabilities, by row
    then label; ``lp_blank``: ``(N, T)`` the blank's log-probability per frame (0 on padding)."""

    lens: np.ndarray
    T: int
    count: np.ndarray
    labels: np.ndarray
    values: np.ndarray
    lp_blank: np.ndarray

    @property
    def n(self) -> int:
        """Number of utterances."""
        return len(self.lens)


Part = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # one utterance: count, labels, values, lp_blank


def frame_candidates(lp: np.ndarray, token_min_logp: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FrameCandidates of one ``(T, V)`` log-probability matrix: labels with ``lp >= token_min_logp``, or the
    argmax of a frame where none is. Returns ``(count (T,), labels (C,), values (C,))``, by frame then label."""
    lp = np.ascontiguousarray(lp, dtype=np.float64)  # shape: (T, V)
    count, labels, values, _ = _cut_shifted(lp, np.zeros((len(lp), 1)), -math.inf, token_min_logp, 0)
    return count, labels, values


def dense_part(lp: np.ndarray, token_min_logp: float, blank: int) -> Part:
    """The candidates of one normalised ``(T, V)`` matrix and its blank column."""
    count, labels, values = frame_candidates(lp, token_min_logp)
    return count, labels, values, lp[:, blank].copy()


def _log_clip(p: np.ndarray) -> np.ndarray:
    """``log(clip(p, 1e-15, 1))`` in float64 (the probability rule, element by element)."""
    return np.log(np.clip(p.astype(np.float64), MIN_TOKEN_CLIP_P, 1.0))


def posterior_part(x: Any, input_kind: str, token_min_logp: float, blank: int, name: str = "logits") -> Part:
    """The candidates of one ``(T, V)`` matrix as :func:`normalize_posteriors` would give them, without the dense
    log of probability matrices: only values that may reach ``token_min_logp`` (and the blank column) are
    logged, so a frame of 6,625 OCR labels costs a comparison, not a logarithm, per label."""
    raw = as_real_array(x, name, keep_dtype=True)
    if raw.ndim != 2 or raw.shape[0] == 0 or not reads_as_probabilities(raw, input_kind):
        return dense_part(
            normalize_posteriors(raw, "logits" if raw.ndim == 2 else input_kind, name), token_min_logp, blank
        )
    if np.isnan(raw).any():
        raise ValueError(f"{name} contains NaN")
    if (raw < 0).any() or (raw > 1 + _GUESS_BAND).any():
        raise ValueError(f"{name} given as probabilities must lie in [0, 1]")
    if token_min_logp <= math.log(MIN_TOKEN_CLIP_P):  # every label is a candidate
        return dense_part(_log_clip(raw), token_min_logp, blank)
    T, V = raw.shape
    flat = np.flatnonzero(raw >= 0.99 * math.exp(token_min_logp))  # a superset in the input's dtype
    values = _log_clip(raw.reshape(-1)[flat])
    keep = values >= token_min_logp  # the exact rule on the logged values
    flat, values = flat[keep], values[keep]
    rows = flat // V
    count = np.bincount(rows, minlength=T)
    empty = (count == 0).nonzero()[0]
    labels = flat - rows * V
    if len(empty):  # frames without a candidate take their argmax
        best = _log_clip(raw[empty])
        arg = best.argmax(axis=1)
        rows = np.concatenate((rows, empty))
        labels = np.concatenate((labels, arg))
        values = np.concatenate((values, best[np.arange(len(empty)), arg]))
        order = np.argsort(rows, kind="stable")
        labels, values = labels[order], values[order]
        count[empty] = 1
    return count, labels, values, _log_clip(raw[:, blank])


def utterance_parts(
    xs: Iterable[Any], input_kind: str, token_min_logp: float, blank: int, block_cells: int = 1 << 18
) -> Iterator[Part]:
    """:func:`posterior_part` of each matrix, in order; logit matrices are normalised together in blocks of
    about ``block_cells`` values (rows are independent, so the values are the same), which saves the fixed
    cost of a dozen numpy calls per utterance when there are many short ones."""
    pending: list[np.ndarray] = []
    cells = 0

    def flush() -> Iterator[Part]:
        if not pending:
            return
        block = np.concatenate(pending) if len(pending) > 1 else pending[0]  # shape: (rows, V)
        shifted, lse = _shifted_logits(block, "logits", own=len(pending) > 1)  # shape: (rows, V), (rows, 1)
        count, labels, values, lp_blank = _cut_shifted(shifted, lse, _LOG_MIN_P, token_min_logp, blank)
        if len(pending) == 1:  # one matrix: its candidates as they are
            pending.clear()
            yield count, labels, values, lp_blank
            return
        c_end = np.concatenate(([0], np.cumsum(count)))  # shape: (rows + 1,) candidates before each row
        start = 0
        for m in pending:
            end = start + len(m)
            lo, hi = int(c_end[start]), int(c_end[end])
            yield count[start:end], labels[lo:hi], values[lo:hi], lp_blank[start:end]
            start = end
        pending.clear()

    for x in xs:
        raw = as_real_array(x, "logits", keep_dtype=True)
        if raw.ndim == 2 and raw.shape[0] > 0 and not reads_as_probabilities(raw, input_kind):
            pending.append(raw)  # normalize_posteriors copies it to float64
            cells += raw.size
            if cells >= block_cells:
                yield from flush()
                cells = 0
            continue
        yield from flush()
        cells = 0
        yield posterior_part(raw, "probs" if raw.ndim == 2 and raw.shape[0] > 0 else input_kind, token_min_logp, blank)
    yield from flush()


def collect_candidates(parts: Iterable[Part], lens: np.ndarray) -> FrameCandidates:
    """:class:`FrameCandidates` of the utterances' parts (:func:`dense_part`, :func:`posterior_part`; consumed one at a
    time, so a generator keeps only one dense matrix alive), of lengths ``lens``."""
    N = len(lens)
    T = int(lens.max(initial=0))
    if N == 1:  # one utterance: its arrays as they are (no padding to add)
        part = next(iter(parts), None)
        if part is not None and len(part[0]) == T:
            c, lab, val, lpb = part
            return FrameCandidates(
                lens=lens,
                T=T,
                count=np.ascontiguousarray(c, dtype=np.int64),
                labels=np.ascontiguousarray(lab, dtype=np.int64),
                values=np.ascontiguousarray(val, dtype=np.float64),
                lp_blank=np.ascontiguousarray(lpb, dtype=np.float64).reshape(1, T),  # shape: (1, T)
            )
        parts = [] if part is None else [part]
    count = np.zeros((N, T), dtype=np.int64)  # shape: (N, T)
    lp_blank = np.zeros((N, T))  # shape: (N, T)
    labels: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for i, (c, lab, val, lpb) in enumerate(parts):
        n = len(c)
        if n == 0:
            continue
        count[i, :n] = c
        lp_blank[i, :n] = lpb
        labels.append(lab)
        values.append(val)
    return FrameCandidates(
        lens=lens,
        T=T,
        count=count.reshape(-1),
        labels=np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64),
        values=np.concatenate(values) if values else np.zeros(0),
        lp_blank=lp_blank,
    )
