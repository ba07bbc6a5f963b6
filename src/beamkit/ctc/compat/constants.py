"""pyctcdecode 0.5.0's public constants, under the same names and values."""

from __future__ import annotations

import math

from ..lm import AVG_TOKEN_LEN
from ..posteriors import MIN_TOKEN_CLIP_P

DEFAULT_ALPHA = 0.5
DEFAULT_BETA = 1.5
DEFAULT_UNK_LOGP_OFFSET = -10.0
DEFAULT_BEAM_WIDTH = 100
DEFAULT_HOTWORD_WEIGHT = 10.0
DEFAULT_PRUNE_LOGP = -10.0
DEFAULT_PRUNE_BEAMS = False
DEFAULT_MIN_TOKEN_LOGP = -5.0
DEFAULT_SCORE_LM_BOUNDARY = True

LOG_BASE_CHANGE_FACTOR = 1.0 / math.log10(math.e)  # log10 -> ln

__all__ = [
    "AVG_TOKEN_LEN",
    "DEFAULT_ALPHA",
    "DEFAULT_BEAM_WIDTH",
    "DEFAULT_BETA",
    "DEFAULT_HOTWORD_WEIGHT",
    "DEFAULT_MIN_TOKEN_LOGP",
    "DEFAULT_PRUNE_BEAMS",
    "DEFAULT_PRUNE_LOGP",
    "DEFAULT_SCORE_LM_BOUNDARY",
    "DEFAULT_UNK_LOGP_OFFSET",
    "LOG_BASE_CHANGE_FACTOR",
    "MIN_TOKEN_CLIP_P",
]
