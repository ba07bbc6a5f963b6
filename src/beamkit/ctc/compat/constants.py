"""pyctcdecode 0.5.0's public constants, under the same names and values."""

from __future__ import annotations

import math

DEFAULT_ALPHA = 0.5
DEFAULT_BETA = 1.5
DEFAULT_UNK_LOGP_OFFSET = -10.0
DEFAULT_BEAM_WIDTH = 100
DEFAULT_HOTWORD_WEIGHT = 10.0
DEFAULT_PRUNE_LOGP = -10.0
DEFAULT_PRUNE_BEAMS = False
DEFAULT_MIN_TOKEN_LOGP = -5.0
DEFAULT_SCORE_LM_BOUNDARY = True

AVG_TOKEN_LEN = 6  # characters per word assumed when scaling the unknown-partial-word penalty
MIN_TOKEN_CLIP_P = 1e-15  # probabilities are clipped here before the log
LOG_BASE_CHANGE_FACTOR = 1.0 / math.log10(math.e)  # log10 -> ln
