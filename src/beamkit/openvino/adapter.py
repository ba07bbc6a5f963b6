"""``--model ov:DIR``: an OpenVINO IR folder with its tokenizer, decoded by every command and the server as
``hf:DIR`` is (:class:`beamkit.adapters.hf.HFAdapter`: the same settings over the folder's generation config, the
same search options), with :class:`beamkit.openvino.OVDecoderStep` or :class:`beamkit.openvino.OVSeq2SeqStep` as
the step function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beamkit.adapters.base import Ask
from beamkit.adapters.hf import HFAdapter


class OVAdapter(HFAdapter):
    """An OpenVINO IR folder (:class:`beamkit.openvino.Model`, decoder-only or encoder-decoder) and the tokenizer
    saved in it, run at ``precision`` (default ``"f32"``: Hugging Face's float32 results) with ``threads``
    inference threads."""

    owned_by = "openvino"

    def __init__(self, directory: str | Path, name: str | None = None, precision: str = "f32", threads: Any = None):
        from beamkit.openvino.model import Model
        from beamkit.openvino.seq2seq import make_step

        self.model = Model(directory)
        self.tokenizer = self.model.tokenizer()
        self.config = self.model.config
        self.encoder_decoder = self.model.encoder_decoder
        self.vocab = self.tokenizer
        folder = self.model.path
        self.name = name or folder.name or str(folder)
        base = self.settings(Ask(beam=1, n_best=1, max_len=1))
        self.eos = base.eos
        self.bos = base.start  # decoder-only: ignored, the first call runs the prompt
        self.engine_options = {"policy": "pool"}
        found = getattr(self.config, "max_position_embeddings", None) or getattr(self.config, "n_positions", None)
        positions = int(found) if found is not None else 1024
        self.max_prompt_tokens = positions if self.encoder_decoder else positions - 1
        self.max_tokens_limit = positions if self.encoder_decoder else positions - 1
        self.context = None if self.encoder_decoder else positions
        self.default_max_tokens = 16  # the OpenAI completions default (a server's; the commands ask for 20)
        self._step: Any = make_step(self.model, precision, threads)
