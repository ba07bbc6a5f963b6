"""CTC decoding: :class:`Decoder` (prefix beam search with word n-gram fusion, greedy decoding, recorded
searches) with :class:`CTCOptions`, :class:`LexiconDecoder` (flashlight's lexicon beam search) with
:class:`LexiconOptions`, and the drop-ins :mod:`beamkit.ctc.compat` (pyctcdecode) and
:mod:`beamkit.ctc.compat.torchaudio` (torchaudio's ``ctc_decoder``).

The search is compiled by numba (the ``ctc`` extra: ``pip install ".[ctc]"``); without it the same code runs as
plain Python, much slower. The n-gram models are :mod:`beamkit.lm`'s (``kenlm`` used when installed).
"""

from .decoder import Decoder, normalize_logits
from .errors import CTCBatchDecodeError
from .greedy import greedy_ctc, labels_to_text
from .lexicon.decoder import LexiconDecoder, LexiconHypothesis
from .lexicon.options import LexiconOptions
from .lm import Hotwords, LanguageModelFusion, UnigramPrefixIndex, fusion_of
from .moved import MovedNameError
from .options import CTCOptions
from .prefix_search import prefix_beam_search
from .search import CTCHypothesis
from .vocab import Vocabulary

__all__ = [
    "CTCBatchDecodeError",
    "CTCHypothesis",
    "CTCOptions",
    "Decoder",
    "Hotwords",
    "LanguageModelFusion",
    "LexiconDecoder",
    "LexiconHypothesis",
    "LexiconOptions",
    "MovedNameError",
    "UnigramPrefixIndex",
    "Vocabulary",
    "fusion_of",
    "greedy_ctc",
    "labels_to_text",
    "normalize_logits",
    "prefix_beam_search",
]
