"""One model-adapter layer for every command and the server: :class:`ModelAdapter` (what a model offers the
engine), one module per model kind (:mod:`~beamkit.adapters.checkpoint`: beamkit checkpoints,
:mod:`~beamkit.adapters.g2p`: the g2p-en GRU, :mod:`~beamkit.adapters.hf`: Hugging Face folders),
:class:`FusedAdapter` (any of them fused with a language model), :func:`load` (the one ``--model`` grammar) and
:func:`decode_texts` (the one batched text driver, each text's n-best as :class:`TextHypothesis` records), through
which :func:`translate` decodes texts with a beamkit checkpoint and :func:`beamkit.adapters.g2p.decode_words` words
with the g2p-en GRU."""

from beamkit.adapters.base import Ask, ModelAdapter
from beamkit.adapters.checkpoint import CheckpointAdapter
from beamkit.adapters.driver import TextHypothesis, decode_texts, search
from beamkit.adapters.fusion import FusedAdapter
from beamkit.adapters.g2p import G2PAdapter
from beamkit.adapters.hf import HFAdapter
from beamkit.adapters.load import G2P_MODEL, HF_PREFIX, KINDS, ModelSpec, load, parse
from beamkit.adapters.translation import translate

__all__ = [
    "Ask",
    "G2P_MODEL",
    "HF_PREFIX",
    "KINDS",
    "CheckpointAdapter",
    "FusedAdapter",
    "G2PAdapter",
    "HFAdapter",
    "ModelAdapter",
    "ModelSpec",
    "TextHypothesis",
    "decode_texts",
    "load",
    "parse",
    "search",
    "translate",
]
