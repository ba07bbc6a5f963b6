"""Real models for the engine: a Seq2Seq with Luong attention and a small Transformer (torch, with numpy twins
for inference), and a numpy loader for the pretrained g2p-en GRU. The trained dates checkpoints ship inside the
package (``shipped/``); :func:`load_model` runs them with torch when it is installed, else with numpy.

Models are what a search runs; decoding texts with them (:func:`beamkit.adapters.translate`,
:func:`beamkit.adapters.g2p.decode_words`) lives one floor up, in :mod:`beamkit.adapters`.
"""

from beamkit.models.loading import (
    BACKENDS,
    DEFAULT_MODEL,
    SHIPPED_DIR,
    load_model,
    resolve_model,
    shipped_models,
    torch_available,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "SHIPPED_DIR",
    "load_model",
    "resolve_model",
    "shipped_models",
    "torch_available",
]
