"""beamkit's own checkpoints (a shipped dates model or a checkpoint folder; Seq2Seq or Transformer, numpy or
torch backend): the prompt is the source sentence. :func:`beamkit.adapters.translate` decodes a checkpoint through
this adapter."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from beamkit.adapters.base import ModelAdapter

SEQ2SEQ_MAX_SOURCE = 256  # an LSTM has no position table: beamkit's own bound on a source sentence


class CheckpointAdapter(ModelAdapter):
    """A loaded beamkit checkpoint (:func:`beamkit.models.load_model`) under ``name``: policy ``"narrow"`` (the
    engine's default), the power length penalty, the checkpoint's ``max_len`` by default."""

    def __init__(self, model: Any, name: str):
        self.model = model
        self.name = name
        self.tv = model.tgt_vocab
        self.vocab = self.tv
        self.bos, self.eos = self.tv.bos, (self.tv.eos,)
        self.default_max_tokens = int(getattr(model, "meta", {}).get("max_len", 12))
        limit = getattr(model, "max_len", None)  # the Transformer's position table
        self.max_prompt_tokens = int(limit) if limit is not None else SEQ2SEQ_MAX_SOURCE
        self.prompt_limit = "the model's max_len" if limit is not None else ""
        self.max_tokens_limit = int(limit) if limit is not None else SEQ2SEQ_MAX_SOURCE

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The model's own step function."""
        return self.model.step(state, y_prev)

    def encode(self, prompt: str) -> list[int]:
        """Characters to source ids (printable ASCII); a blank prompt is refused."""
        from beamkit.models.common import encode_sources

        return encode_sources(self.model.src_vocab, [prompt])[0]

    def init_state(self, prompts: list[list[int]]) -> Any:
        """Encode the source sentences as one padded batch, as ``translate`` encodes its texts."""
        from beamkit.models.common import model_inputs, pad_batch

        src, lengths = pad_batch(prompts, self.model.src_vocab.pad)  # shape: (B, S), (B,)
        return self.model.init_state(*model_inputs(self.model, src, lengths))

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """Torch's inference mode for a torch model, nothing for numpy."""
        from beamkit.models.common import inference

        with inference(self.model):
            yield

    def decode(self, tokens: Sequence[int]) -> str:
        """Target ids to text, stopping at eos."""
        return str(self.tv.decode(list(tokens)))

    def token_text(self, token: int) -> str:
        """One target symbol (``<eos>`` for the stop token)."""
        return str(self.tv.symbols[int(token)])
