"""Real models for the engine: a Seq2Seq with Luong attention and a small Transformer (torch, with numpy twins
for inference), and a numpy loader for the pretrained g2p-en GRU. The trained dates checkpoints ship inside the
package (``shipped/``); :func:`load_model` runs them with torch when it is installed, else with numpy.

Everything here decodes through :func:`beamkit.search_batch`: one call per batch of sentences.
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
from beamkit.models.translation import Translation, translate

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "SHIPPED_DIR",
    "Translation",
    "load_model",
    "resolve_model",
    "shipped_models",
    "torch_available",
    "translate",
]
