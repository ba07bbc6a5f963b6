"""Hugging Face bridge: decode any ``transformers`` model with beamkit's engine.

``beamkit.hf.generate(model, input_ids, attention_mask, num_beams=5, max_new_tokens=40)`` is a drop-in for
``model.generate(...)``: same arguments, same return value; ``beamkit.hf.patch(model)`` makes ``model.generate``
itself run through beamkit where beamkit reproduces Hugging Face exactly. Modules: :mod:`~beamkit.hf.settings`
(arguments + generation config -> one frozen settings object, with the refusal tables),
:mod:`~beamkit.hf.processors` (settings -> processors), :mod:`~beamkit.hf.search` (dispatch to the engine or a
variant), :mod:`~beamkit.hf.output` (Hugging Face's return values), :mod:`~beamkit.hf.step` (the step functions
over the model and its cache), :mod:`~beamkit.hf.paged` (decoder-only keys/values in beamkit's block pool),
:mod:`~beamkit.hf.generation` (``generate``), :mod:`~beamkit.hf.patching` (``patch``),
:mod:`~beamkit.hf.loading` (``load_pretrained``: the one loader of ``hf:DIR`` folders),
:mod:`~beamkit.hf.versions` (the supported ``transformers`` releases and the names that differ between them).

Needs ``torch`` and ``transformers`` (imported only when this module is).
"""

from beamkit.hf.generation import generate
from beamkit.hf.loading import Pretrained, load_pretrained
from beamkit.hf.output import (
    BeamDecoderOnlyOutput,
    BeamEncoderDecoderOutput,
    GreedyDecoderOnlyOutput,
    GreedyEncoderDecoderOutput,
)
from beamkit.hf.patching import Patch, patch
from beamkit.hf.processors import ForcedTokens
from beamkit.hf.settings import Settings, Unsupported
from beamkit.hf.step import CacheRows, DecoderOnlyStep, EncoderDecoderStep

__all__ = [
    "BeamDecoderOnlyOutput",
    "BeamEncoderDecoderOutput",
    "CacheRows",
    "DecoderOnlyStep",
    "EncoderDecoderStep",
    "ForcedTokens",
    "GreedyDecoderOnlyOutput",
    "GreedyEncoderDecoderOutput",
    "Patch",
    "Pretrained",
    "Settings",
    "Unsupported",
    "generate",
    "load_pretrained",
    "patch",
]
