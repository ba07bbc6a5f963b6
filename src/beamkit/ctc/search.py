"""What a CTC prefix beam search returns and tells a recorder: :class:`CTCHypothesis` (one decoded hypothesis),
:class:`FrameSnapshot` (one frame of a traced search) and the :class:`CTCRecorder` protocol. The search itself is
:mod:`beamkit.ctc.prefix`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np


@dataclass
class CTCHypothesis:
    """One decoded hypothesis.

    ``text``: whitespace-normalised output; ``score``: combined score (logit + LM + hotwords);
    ``logit_score``: log-probability of the prefix under the CTC model (sum over the kept alignments);
    ``lm_score``: ``score - logit_score``; ``word_frames``: ``(word, (start_frame, end_frame))`` per word
    along the best alignment; ``lm_state``: the LM state after the last word (None without an LM).
    """

    text: str
    score: float
    logit_score: float
    lm_score: float
    word_frames: list[tuple[str, tuple[int, int]]] = field(default_factory=list)
    lm_state: Any = None


class FrameSnapshot(NamedTuple):
    """What one frame of a traced search did (see ``beamkit.ctc.trace``): the frame's candidates, and every
    merged beam, kept ones first (best first), then the pruned ones."""

    t: int  # the frame
    cand_labels: np.ndarray  # shape: (K,) int64 candidate labels of the frame
    cand_lp: np.ndarray  # shape: (K,) float64 their log-probabilities
    prefix: np.ndarray  # shape: (M,) int64 prefix id (0: the empty prefix)
    source: np.ndarray  # shape: (M,) int64 the previous frame's kept beam behind the most probable row
    label: np.ndarray  # shape: (M,) int64 the label that row added (-1: the prefix stayed)
    ends_in_blank: np.ndarray  # shape: (M,) bool
    p_b: np.ndarray  # shape: (M,) float64
    p_nb: np.ndarray  # shape: (M,) float64
    lm: np.ndarray  # shape: (M,) float64 the prefix's fused LM + hotword score
    total: np.ndarray  # shape: (M,) float64 logaddexp(p_b, p_nb) + lm
    merged: np.ndarray  # shape: (M,) int64 rows merged into the beam
    fate: np.ndarray  # shape: (M,) int8 0 kept, 1 threshold, 2 beam width, 3 history


class CTCRecorder(Protocol):
    """What a traced search tells a recorder (``beamkit.ctc.trace.CTCTraceRecorder``)."""

    def begin(self, utt: int, n_frames: int, text_of: Callable[[int], str]) -> None: ...

    def frame(self, utt: int, snap: FrameSnapshot) -> None: ...

    def end(self, utt: int, hyps: list[CTCHypothesis], prefix_ids: list[int]) -> None: ...
