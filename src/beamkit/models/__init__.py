"""Real models for the engine: a Seq2Seq with Luong attention and a small Transformer (torch, with numpy twins
for inference), and a numpy loader for the pretrained g2p-en GRU. The trained dates checkpoints ship inside the
package (``shipped/``); :func:`load_model` runs them with torch when it is installed, else with numpy.

:func:`translate` and :meth:`beamkit.models.g2p.G2PModel.decode` decode batches of texts through the one batched
text driver, :func:`beamkit.adapters.decode_texts`.
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
from beamkit.models.translation import translate

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "SHIPPED_DIR",
    "load_model",
    "resolve_model",
    "shipped_models",
    "torch_available",
    "translate",
]
