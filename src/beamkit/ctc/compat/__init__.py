"""pyctcdecode 0.5.0's public API over beamkit's CTC search: ``import beamkit.ctc.compat as pyctcdecode``."""

from . import constants
from .alphabet import Alphabet
from .constants import *  # noqa: F403 (every constant of pyctcdecode.constants, listed in its __all__)
from .decoder import BeamSearchDecoderCTC, build_ctcdecoder
from .language_model import (
    AbstractLanguageModel,
    HotwordScorer,
    LanguageModel,
    MultiLanguageModel,
    load_unigram_set_from_arpa,
)

__all__ = [
    *constants.__all__,
    "AbstractLanguageModel",
    "Alphabet",
    "BeamSearchDecoderCTC",
    "HotwordScorer",
    "LanguageModel",
    "MultiLanguageModel",
    "build_ctcdecoder",
    "load_unigram_set_from_arpa",
]
