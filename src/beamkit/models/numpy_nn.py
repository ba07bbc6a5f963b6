"""The layers of the numpy dates models, in float32 numpy with PyTorch's conventions (weights as ``nn`` saves them).

Each function is the forward computation of one ``torch.nn`` layer in eval mode: ``linear`` (``nn.Linear``),
``lstm_cell`` (``nn.LSTMCell``, gates i, f, g, o), ``layer_norm`` (``nn.LayerNorm``, eps 1e-5), ``softmax``
(max-shifted, ``-inf`` entries give 0). :class:`Params` looks weights up by their ``state_dict`` names and
refuses a missing name or a wrong shape, naming the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


class Params:
    """Float32 weights by ``state_dict`` name; :meth:`take` checks each one's shape and records its use."""

    def __init__(self, weights: dict[str, np.ndarray], source: str | Path = "weights") -> None:
        """Wrap ``weights`` (name -> array); ``source`` names them in errors (the checkpoint folder)."""
        self.weights, self.source = weights, source
        self.used: set[str] = set()

    def take(self, name: str, shape: Sequence[int]) -> np.ndarray:
        """The weight ``name`` as a contiguous float32 array; ValueError when it is missing or of another shape."""
        if name not in self.weights:
            raise ValueError(f"checkpoint {self.source}: weights do not match its config: missing {name!r}")
        value = np.ascontiguousarray(self.weights[name], dtype=np.float32)
        if value.shape != tuple(shape):
            raise ValueError(
                f"checkpoint {self.source}: weights do not match its config: {name!r} has shape "
                f"{value.shape}, the config needs {tuple(shape)}"
            )
        self.used.add(name)
        return value

    def check_all_used(self) -> None:
        """ValueError naming the weights no layer took (the checkpoint is of another model)."""
        extra = sorted(set(self.weights) - self.used)
        if extra:
            raise ValueError(f"checkpoint {self.source}: weights do not match its config: unexpected {extra[:5]}")


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``nn.Linear``: x (..., in) @ weight.T (out, in) + bias (out,) -> (..., out)."""
    y = x @ weight.T
    return y if bias is None else y + bias


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function, elementwise, in the dtype of ``x``."""
    return 1.0 / (1.0 + np.exp(-x))


def lstm_cell(
    x: np.ndarray,
    h: np.ndarray,
    c: np.ndarray,
    w_ih: np.ndarray,
    w_hh: np.ndarray,
    b_ih: np.ndarray,
    b_hh: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """One ``nn.LSTMCell`` step (gates i, f, g, o): x (rows, E), h and c (rows, H) -> new h, c (rows, H)."""
    gates = x @ w_ih.T + b_ih + (h @ w_hh.T + b_hh)  # shape: (rows, 4H)
    hidden = h.shape[1]
    i = sigmoid(gates[:, :hidden])
    f = sigmoid(gates[:, hidden : 2 * hidden])
    g = np.tanh(gates[:, 2 * hidden : 3 * hidden])
    o = sigmoid(gates[:, 3 * hidden :])
    c_new = f * c + i * g
    return o * np.tanh(c_new), c_new


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """``nn.LayerNorm`` over the last axis (biased variance, as torch)."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(eps)) * weight + bias


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` with the maximum shifted out; ``-inf`` entries get probability 0."""
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)
