"""pyctcdecode 0.5.0's public API over beamkit's CTC search: ``import beamkit.ctc.compat as pyctcdecode``."""

from .alphabet import Alphabet
from .constants import (
    AVG_TOKEN_LEN,
    DEFAULT_ALPHA,
    DEFAULT_BEAM_WIDTH,
    DEFAULT_BETA,
    DEFAULT_HOTWORD_WEIGHT,
    DEFAULT_MIN_TOKEN_LOGP,
    DEFAULT_PRUNE_BEAMS,
    DEFAULT_PRUNE_LOGP,
    DEFAULT_SCORE_LM_BOUNDARY,
    DEFAULT_UNK_LOGP_OFFSET,
    LOG_BASE_CHANGE_FACTOR,
    MIN_TOKEN_CLIP_P,
)
from .decoder import BeamSearchDecoderCTC, build_ctcdecoder
from .language_model import (
    AbstractLanguageModel,
    HotwordScorer,
    LanguageModel,
    MultiLanguageModel,
    load_unigram_set_from_arpa,
)

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
    "AbstractLanguageModel",
    "Alphabet",
    "BeamSearchDecoderCTC",
    "HotwordScorer",
    "LanguageModel",
    "MultiLanguageModel",
    "build_ctcdecoder",
    "load_unigram_set_from_arpa",
]
