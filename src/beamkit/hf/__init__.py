"""Hugging Face bridge: decode any ``transformers`` model with beamkit.

``beamkit.hf.generate(model, input_ids, attention_mask, num_beams=5, max_new_tokens=40)`` is a drop-in for
``model.generate(...)``: same arguments, same return value, decoded on beamkit's engine. ``beamkit.hf.patch(model)``
makes ``model.generate`` itself run through beamkit, and there beam search runs in a loop that reproduces Hugging
Face's float32 arithmetic (its float32 sums and tie order, inside Hugging Face's own ``generate``), beside the
engine: the engine ranks by float64 sums, so hypotheses that tie within float32 rounding can come out in another
order; ``patch(model, fast=True)`` runs those beam searches on the engine. Where a call runs (the engine, the loop
or Hugging Face's own decoding) is decided once, as a printable record, by :func:`beamkit.hf.bridge.route.route`.

Subpackages, each importing only the ones after it: :mod:`beamkit.hf.bridge` (a call's settings, its route and its
decoding on the engine; ``patch``), :mod:`beamkit.hf.loop` (beamkit's decoding method inside Hugging Face's
``generate``), :mod:`beamkit.hf.retrieval` (the output layer over a dictionary's allowed ids),
:mod:`beamkit.hf.steps` (the step functions: through the model's forward over a dense or paged cache, direct,
compiled). Beside them, used by all: :mod:`~beamkit.hf.errors` (:class:`Unsupported`), :mod:`~beamkit.hf.versions`
(the supported ``transformers`` releases and the names that differ between them), :mod:`~beamkit.hf.internals`
(every private ``transformers`` member beamkit touches), :mod:`~beamkit.hf.loading` (``load_pretrained``: the one
loader of ``hf:DIR`` folders, with :mod:`~beamkit.hf.pickles`) and :mod:`~beamkit.hf.quantize` (``quantize_int8``:
a copy of a model with int8 linear layers, for CPU decoding).

Needs ``torch`` and ``transformers`` (imported only when this module is).
"""

from beamkit.hf.bridge.output import (
    BeamDecoderOnlyOutput,
    BeamEncoderDecoderOutput,
    GreedyDecoderOnlyOutput,
    GreedyEncoderDecoderOutput,
)
from beamkit.hf.bridge.patching import Patch, patch
from beamkit.hf.bridge.processors import ForcedTokens
from beamkit.hf.bridge.route import Route, generate, route
from beamkit.hf.bridge.settings import Settings
from beamkit.hf.errors import Unsupported
from beamkit.hf.loading import Pretrained, load_pretrained
from beamkit.hf.quantize import Int8Linear, quantize_int8
from beamkit.hf.steps.step import CacheRows, DecoderOnlyStep, EncoderDecoderStep

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
