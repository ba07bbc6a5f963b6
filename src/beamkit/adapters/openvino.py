"""``--model ov:DIR``: an OpenVINO IR folder with its tokenizer, decoded by every command and the server as
``hf:DIR`` is (:class:`beamkit.adapters.hf.HFAdapter`: the same settings over the folder's generation config, the
same search options), with :class:`beamkit.openvino.OVDecoderStep` or :class:`beamkit.openvino.OVSeq2SeqStep` as
the step function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beamkit.adapters.hf import HFAdapter


class OVAdapter(HFAdapter):
    """An OpenVINO IR folder (:class:`beamkit.openvino.Model`, decoder-only or encoder-decoder) and the tokenizer
    saved in it, run at ``precision`` (default ``"f32"``: Hugging Face's float32 results) with ``threads``
    inference threads; ``shared_prompt=True`` decodes on the folder's shared-prompt IR (each request's prompt
    keys/values held once, whatever its beam count; see :mod:`beamkit.openvino.shared`). ``vocab_size``: the width
    of the IR's logits (its static last dimension; None where it is dynamic), so a server checks its dictionaries
    without running the model."""

    owned_by = "openvino"

    def __init__(
        self,
        directory: str | Path,
        name: str | None = None,
        precision: str = "f32",
        threads: Any = None,
        shared_prompt: bool = False,
    ):
        from beamkit._checks import check_bool
        from beamkit.openvino.model import Model
        from beamkit.openvino.seq2seq import make_step

        check_bool("shared_prompt", shared_prompt)
        model = Model(directory)
        self._describe(model, model.tokenizer(), model.config, model.encoder_decoder, model.path, name)
        self._step: Any = make_step(model, precision, threads, shared_prompt)
        self.vocab_size = logits_width(model.ir)


def logits_width(ir: Any) -> int | None:
    """The static last dimension of an OpenVINO model's ``logits`` output, or None (dynamic, or no such output)."""
    try:
        shape = ir.output("logits").get_partial_shape()
    except RuntimeError:  # no output named logits
        return None
    last = shape[shape.rank.get_length() - 1] if shape.rank.is_static else None
    return int(last.get_length()) if last is not None and last.is_static else None
