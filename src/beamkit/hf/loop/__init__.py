"""The loop: beamkit's decoding method inside Hugging Face's own ``generate``.

``model.generate(..., custom_generate=beamkit.hf.loop.decode)`` lets Hugging Face prepare the call as it always
does and hands the decoding to :func:`~beamkit.hf.loop.decoding.decode`, which keeps Hugging Face's row layout,
float32 arithmetic and per-step tables (:mod:`~beamkit.hf.loop.decoding`); a :class:`beamkit.Trie`'s
``prefix_allowed_tokens_fn`` is applied there vectorised (:mod:`~beamkit.hf.loop.trie`). Whisper's steps run
directly or compiled (:mod:`beamkit.hf.steps`); every private ``transformers`` member it touches is reached
through :mod:`beamkit.hf.internals`.
"""

from beamkit.hf.loop.decoding import decode

__all__ = ["decode"]
