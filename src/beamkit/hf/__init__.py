"""Hugging Face bridge: decode any ``transformers`` model with beamkit.

``beamkit.hf.generate(model, input_ids, attention_mask, num_beams=5, max_new_tokens=40)`` is a drop-in for
``model.generate(...)``: same arguments, same return value, decoded on beamkit's engine. ``beamkit.hf.patch(model)``
makes ``model.generate`` itself run through beamkit, and there beam search runs in a loop that reproduces Hugging
Face's float32 arithmetic (its float32 sums and tie order, inside Hugging Face's own ``generate``), beside the
engine: the engine ranks by float64 sums, so hypotheses that tie within float32 rounding can come out in another
order; ``patch(model, fast=True)`` runs those beam searches on the engine. Where a call runs (the engine, the loop
or Hugging Face's own decoding) is decided once, as a printable record, by :func:`beamkit.hf.route.route`.

Modules: :mod:`~beamkit.hf.settings` (arguments + generation config -> one frozen settings object, with the
refusal tables), :mod:`~beamkit.hf.processors` (settings -> processors), :mod:`~beamkit.hf.search` (dispatch to
the engine or a variant), :mod:`~beamkit.hf.output` (Hugging Face's return values), :mod:`~beamkit.hf.step` (the
step functions over the model and its cache), :mod:`~beamkit.hf.paged` (decoder-only keys/values in beamkit's
block pool), :mod:`~beamkit.hf.generation` (``generate`` and the engine bridge), :mod:`~beamkit.hf.route` (the
route of a call), :mod:`~beamkit.hf.loop` (the loop inside Hugging Face's ``generate``), :mod:`~beamkit.hf.patching`
(``patch``), :mod:`~beamkit.hf.loading` (``load_pretrained``: the one loader of ``hf:DIR`` folders),
:mod:`~beamkit.hf.versions` (the supported ``transformers`` releases and the names that differ between them),
:mod:`~beamkit.hf.internals` (every private ``transformers`` member the loop touches), :mod:`~beamkit.hf.quantize`
(``quantize_int8``: a copy of a model with int8 linear layers, for CPU decoding), :mod:`~beamkit.hf.direct` (the
decoding step that runs a known family's layers directly) and :mod:`~beamkit.hf.compiled` (that step compiled
over static shapes, ``compile=``).

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
from beamkit.hf.quantize import Int8Linear, quantize_int8
from beamkit.hf.route import Route, route
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
    "Int8Linear",
    "Patch",
    "Pretrained",
    "Route",
    "Settings",
    "Unsupported",
    "generate",
    "load_pretrained",
    "patch",
    "quantize_int8",
    "route",
]
