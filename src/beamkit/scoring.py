"""Scores of finished hypotheses: length penalties, the GNMT coverage penalty, final scorers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from beamkit._checks import check_float, check_number
from beamkit.hypothesis import Hypothesis

MAX_ALPHA = 100.0  # |alpha| beyond this leaves the float range within a few tokens (2 ** 1024 overflows)
_MAX_EXPONENT = 600.0  # |alpha * log(lp base)| below this keeps lp(n) and logprob / lp(n) finite and non-zero


@dataclass(frozen=True)
class LengthPenalty:
    """``score = logprob / lp(n)`` with ``lp(n) = ((shift + n) / (shift + 1)) ** alpha``; n counts eos.

    ``shift = 0`` is the power penalty ``n ** alpha`` (Hugging Face, and the exact beam-search contract);
    ``shift = 5`` is GNMT's ``((5 + n) / 6) ** alpha``; another shift ``m`` is the ``((m + 1) / (m + n)) ** alpha``
    factor of a batched Transformer decoder's length normalisation (written as a divisor). ``alpha = 0`` ranks by
    raw log-probability.

    ``alpha`` must be a finite number between -100 and 100 (``MAX_ALPHA``) and ``shift`` a finite number >= 0,
    else ValueError. A search also refuses (:meth:`check_max_len`) an alpha whose ``lp(max_len)`` would leave the
    float range, where every score would become ``-0`` or ``-inf``: ``|alpha * log((shift + max_len) / (shift +
    1))|`` must stay below 600, so for example ``alpha = 100`` allows ``max_len`` up to 403 with ``shift = 0``.
    """

    alpha: float = 1.0
    shift: float = 0.0

    @classmethod
    def power(cls, alpha: float) -> LengthPenalty:
        """``logP / n ** alpha``."""
        return cls(alpha, 0.0)

    @classmethod
    def gnmt(cls, alpha: float) -> LengthPenalty:
        """GNMT: ``logP / ((5 + n) / 6) ** alpha``."""
        return cls(alpha, 5.0)

    @classmethod
    def shifted(cls, alpha: float, min_length: float) -> LengthPenalty:
        """A batched Transformer decoder's normalisation: ``logP * ((min_length + 1) / (min_length + n)) ** alpha``."""
        return cls(alpha, float(min_length))

    def __post_init__(self) -> None:
        alpha, shift = self.alpha, self.shift
        check_float("length_penalty alpha", alpha, least=-MAX_ALPHA, most=MAX_ALPHA)
        check_float("length_penalty shift", shift, least=0)

    def check_max_len(self, max_len: int) -> None:
        """ValueError unless ``lp(n)`` and the scores it divides stay finite and non-zero for every length up to
        ``max_len`` (``lp`` is monotone in ``n``, so ``max_len`` is the extreme)."""
        base = math.log((self.shift + max_len) / (self.shift + 1.0))
        if abs(self.alpha) * base > _MAX_EXPONENT:
            raise ValueError(
                f"length_penalty alpha={self.alpha} is too large for max_len={max_len}: lp(max_len) leaves the "
                f"float range; use |alpha| <= {_MAX_EXPONENT / base:.4g} or a shorter max_len"
            )

    def divisor(self, length: np.ndarray | int) -> np.ndarray:
        """``lp(n)`` for lengths ``n >= 1``, float64."""
        n = np.asarray(length, dtype=np.float64)
        return ((self.shift + n) / (self.shift + 1.0)) ** self.alpha

    def __call__(self, logprob: np.ndarray | float, length: np.ndarray | int) -> np.ndarray:
        """The length-normalised score of ``logprob`` at ``length``."""
        return np.asarray(logprob, dtype=np.float64) / self.divisor(length)


def as_length_penalty(value: float | LengthPenalty) -> LengthPenalty:
    """Accept a plain alpha (the power penalty) or a :class:`LengthPenalty`."""
    if isinstance(value, LengthPenalty):
        return value
    return LengthPenalty.power(check_number("length_penalty (a number or a LengthPenalty)", value))


@dataclass(frozen=True)
class CoveragePenalty:
    """GNMT coverage penalty ``beta * sum_i log(min(sum_j p_ij, 1))`` over source positions ``i``.

    ``p_ij`` is the attention of target step ``j`` on source position ``i``, returned by the step function as
    ``extras["attention"]`` ``[rows, S]``. Positions never attended at all (exactly zero: padding) are left out
    of the sum, since their log would be ``-inf`` for every hypothesis alike.
    """

    beta: float = 0.2

    def __call__(self, coverage: np.ndarray) -> np.ndarray:
        """Penalty for accumulated attention ``coverage`` ``[n, S]`` -> ``[n]`` (always <= 0)."""
        c = np.minimum(np.asarray(coverage, dtype=np.float64), 1.0)
        with np.errstate(divide="ignore"):
            logs = np.where(c > 0, np.log(np.where(c > 0, c, 1.0)), 0.0)
        return self.beta * logs.sum(axis=-1)


class FinalScorer(Protocol):
    """Re-scores the final hypotheses of one request (AllenNLP's ``FinalSequenceScorer``).

    Called once per request after the search with its hypotheses; returns one score each. Results are then
    re-ranked by these scores (stable for ties).
    """

    def __call__(self, hypotheses: Sequence[Hypothesis]) -> Sequence[float]: ...
