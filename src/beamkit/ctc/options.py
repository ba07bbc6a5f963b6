"""The knobs of one CTC prefix beam search, checked once, as a frozen record."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SearchOptions:
    """How a search prunes and what it returns.

    ``beam_width``: hypotheses kept per utterance; ``beam_prune_logp``: drop hypotheses scoring below
    ``best + beam_prune_logp``; ``token_min_logp``: a frame's candidate labels are those with
    ``lp >= token_min_logp`` (plus the argmax); ``prune_history``: keep only the best hypothesis among those
    sharing the last ``order - 1`` words and the partial word; ``split_blank``: pyctcdecode's beam unit (a
    prefix ending in blank and the same prefix ending in a label compete for separate slots);
    ``pyctcdecode_compat``: pyctcdecode's end-of-utterance quirks; ``hotwords``/``hotword_weight``: a bonus
    per listed word; ``num_hypotheses``: hypotheses returned per utterance (None: up to ``beam_width``);
    ``word_frames``: build each hypothesis's word offsets."""

    beam_width: int = 100
    beam_prune_logp: float = -10.0
    token_min_logp: float = -5.0
    prune_history: bool = False
    split_blank: bool = False
    pyctcdecode_compat: bool = False
    hotwords: tuple[str, ...] | None = None
    hotword_weight: float = 10.0
    num_hypotheses: int | None = None
    word_frames: bool = True

    def __post_init__(self) -> None:
        """Refuse knobs that make no sense (ValueError naming the knob)."""
        bw = self.beam_width
        if isinstance(bw, bool) or not isinstance(bw, (int, np.integer)) or bw < 1:
            raise ValueError(f"beam_width must be a positive integer, got {bw!r}")
        for name in ("beam_prune_logp", "token_min_logp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 0:
                raise ValueError(f"{name} must be a number <= 0 (or -inf), got {value!r}")
        k = self.num_hypotheses
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
            raise ValueError(f"num_hypotheses must be a positive integer or None, got {k!r}")

    @property
    def out_k(self) -> int:
        """Hypotheses returned per utterance."""
        return self.beam_width if self.num_hypotheses is None else min(self.beam_width, int(self.num_hypotheses))
