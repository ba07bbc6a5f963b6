"""How the engine picks each row's candidate continuations: the :class:`Selector` protocol and its default."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from beamkit import ops
from beamkit.processors import StepContext


class Selector(Protocol):
    """Picks each row's candidate continuations (the sampler of AllenNLP's design).

    ``scores`` ``[rows, V]`` (backend) plus ``offset`` ``[rows]`` are the step's log-probabilities
    (``scores + offset``); ``parent_key`` ``[rows]`` is each row's ranking key so far. Returns host arrays
    ``(logp, token, key)``, each ``[rows, m']``: the log-probability to accumulate, the token, and the key the
    engine ranks candidates by (descending). ``-inf`` keys are never chosen. A selector whose rows come ordered
    (key descending, equal keys by token ascending) may say so with a class attribute ``ordered = True``: the
    engine then ranks by a cheaper stable sort.
    """

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class Deterministic:
    """The default selector: the m best tokens per row, key = running log-probability."""

    ordered = True  # top_candidates orders each row by value descending, column ascending

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The m best tokens of each row by log-probability; the key is the running log-probability."""
        vals, idx = ops.top_candidates(scores, m)  # shape: (rows, m)
        with np.errstate(invalid="ignore"):  # +inf scores in a failed row: inf - inf, dropped as not finite
            logp = vals + offset[:, None]
        return logp, idx, parent_key[:, None] + logp
