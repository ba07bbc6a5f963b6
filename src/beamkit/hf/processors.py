"""Logit processors that reproduce Hugging Face generation-config behaviour the core set does not cover."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from beamkit import ops
from beamkit.processors import StepContext


@dataclass(frozen=True)
class ForcedTokens:
    """At generated step ``step``, allow only ``tokens``, each with log-probability 0 (everything else ``-inf``).

    This is what Hugging Face's ``ForcedBOSTokenLogitsProcessor`` / ``ForcedEOSTokenLogitsProcessor`` do to the
    log-probabilities: the forced token's own score is replaced by 0, not kept.
    """

    step: int
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("ForcedTokens needs at least one token id")

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        if ctx.step != self.step:
            return scores
        cols = np.asarray(self.tokens, dtype=np.int64)
        if ops.is_torch(scores):
            import torch

            scores[:] = float("-inf")
            scores[:, torch.as_tensor(cols, device=scores.device)] = 0.0
            return scores
        scores[:] = -np.inf
        scores[:, cols] = 0.0
        return scores
