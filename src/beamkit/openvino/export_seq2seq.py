"""``export_seq2seq``: a Hugging Face encoder-decoder model (Marian, BART, T5) as an OpenVINO IR folder of three
models, in the layout optimum-intel used for them before its decoders became stateful:

* ``openvino_encoder_model.xml``: ``input_ids``, ``attention_mask`` -> ``last_hidden_state``;
* ``openvino_decoder_model.xml`` (the first decoder step): ``input_ids`` ``[rows, 1]``, ``encoder_hidden_states``,
  ``encoder_attention_mask`` -> ``logits``, ``present.{i}.decoder.key`` / ``.value`` (self-attention) and
  ``present.{i}.encoder.key`` / ``.value`` (cross-attention, computed once here);
* ``openvino_decoder_with_past_model.xml`` (every later step): ``input_ids``, ``encoder_attention_mask``,
  ``past_key_values.{i}.decoder.*`` and ``past_key_values.{i}.encoder.*`` -> ``logits`` and the new
  ``present.{i}.decoder.*``;

plus ``config.json``, ``generation_config.json`` and the tokenizer's files. Made with OpenVINO's public conversion
API (:func:`openvino.convert_model`) over wrapper modules that take and return the keys/values.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from beamkit.openvino.export import load_folder
from beamkit.openvino.model import SEQ2SEQ_XML


def export_seq2seq(model: Any, out_dir: str | Path, *, tokenizer: Any = None) -> Path:
    """Convert ``model`` (a ``transformers`` encoder-decoder model with a cross-attention cache, e.g. Marian,
    BART, T5; or the folder of one) to an OpenVINO IR folder ``out_dir`` and return its path; ``tokenizer`` is
    saved beside it (a folder's own is copied). The weights keep their precision; the model is not changed.
    Raises TypeError for a decoder-only model."""
    import openvino as ov
    import torch
    import transformers

    if isinstance(model, (str, Path)):
        model, tokenizer = load_folder(model, transformers.AutoModelForSeq2SeqLM, tokenizer)
    config = getattr(model, "config", None)
    if config is None or not getattr(config, "is_encoder_decoder", False):
        raise TypeError(f"export_seq2seq converts encoder-decoder models, got {type(model).__name__}")
    layers, heads, head_dim = _dims(model)
    classes = _wrappers()
    ids = torch.ones((2, 3), dtype=torch.long)
    mask = torch.ones((2, 3), dtype=torch.long)
    mask[1, 2] = 0
    start = torch.full((2, 1), int(config.decoder_start_token_id), dtype=torch.long)
    encoder, first, later = (cls(model, layers, heads, head_dim).eval() for cls in classes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on values it keeps constant (checked by the tests)
        hidden = encoder(ids, mask)
        kv = first(start, hidden, mask)[1:]
        converted = {
            "encoder": ov.convert_model(encoder, example_input=(ids, mask)),
            "decoder": ov.convert_model(first, example_input=(start, hidden, mask)),
            "past": ov.convert_model(later, example_input=(start, mask, *kv)),
        }
    width = int(hidden.shape[-1])
    _name(converted, layers, (heads, head_dim), width)
    for kind, ir in converted.items():
        ov.save_model(ir, out / SEQ2SEQ_XML[kind], compress_to_fp16=False)
    config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def _dims(model: Any) -> tuple[int, int, int]:
    """Decoder layers, self-attention key/value heads and head width, read from one probe step's cache."""
    import torch

    from beamkit.hf.versions import output_cache

    start = int(model.config.decoder_start_token_id)
    with torch.no_grad():
        out = model(
            input_ids=torch.ones((1, 2), dtype=torch.long), decoder_input_ids=torch.full((1, 1), start),
            use_cache=True, return_dict=True,
        )  # fmt: skip
    cache = output_cache(out)
    own = getattr(cache, "self_attention_cache", None)
    if own is None or not getattr(own, "layers", None):
        raise TypeError(f"{type(model).__name__} keeps no EncoderDecoderCache of layers: it cannot be exported")
    keys = own.layers[0].keys
    return len(own.layers), int(keys.shape[1]), int(keys.shape[3])


def _wrappers() -> tuple[Any, Any, Any]:
    """The encoder, first-step and later-step wrapper modules (classes; torch imported here)."""
    import torch
    from transformers import EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput

    from beamkit.hf.versions import cache_keyword, output_cache

    filled, flat = _filled, _flat

    class Base(torch.nn.Module):
        def __init__(self, model: Any, layers: int, heads: int, head_dim: int):
            super().__init__()
            self.model, self.layers, self.heads, self.head_dim = model, layers, heads, head_dim
            self.cache_key = cache_keyword(model)

        def decode(self, ids: Any, hidden: Any, mask: Any, cache: Any) -> Any:
            return self.model(
                encoder_outputs=BaseModelOutput(last_hidden_state=hidden), attention_mask=mask, decoder_input_ids=ids,
                use_cache=True, return_dict=True, **{self.cache_key: cache},
            )  # fmt: skip

    class Encoder(Base):
        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            encoder = self.model.get_encoder()
            return encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state

    class First(Base):
        def forward(self, input_ids: Any, encoder_hidden_states: Any, encoder_attention_mask: Any) -> Any:
            rows = input_ids.shape[0]
            dtype = encoder_hidden_states.dtype

            def empty() -> Any:
                return torch.zeros((rows, self.heads, 0, self.head_dim), dtype=dtype)

            cache = EncoderDecoderCache(
                filled([(empty(), empty()) for _ in range(self.layers)]),
                filled([(empty(), empty()) for _ in range(self.layers)]),
            )
            cache.is_updated = {i: False for i in range(self.layers)}
            out = self.decode(input_ids, encoder_hidden_states, encoder_attention_mask, cache)
            new = output_cache(out)
            return (out.logits[:, -1:], *flat(new.self_attention_cache), *flat(new.cross_attention_cache))

    class Later(Base):
        def forward(self, input_ids: Any, encoder_attention_mask: Any, *past: Any) -> Any:
            n = self.layers
            own = filled([(past[2 * i], past[2 * i + 1]) for i in range(n)])
            cross = filled([(past[2 * n + 2 * i], past[2 * n + 2 * i + 1]) for i in range(n)])
            cache = EncoderDecoderCache(own, cross)
            cache.is_updated = {i: True for i in range(n)}
            rows, width = encoder_attention_mask.shape
            # the cross-attention reads the cached keys/values; the model only takes the output's shape
            hidden = torch.zeros((rows, width, self.model.config.d_model), dtype=past[0].dtype)
            out = self.decode(input_ids, hidden, encoder_attention_mask, cache)
            return (out.logits[:, -1:], *flat(output_cache(out).self_attention_cache))

    return Encoder, First, Later


def _filled(pairs: list[tuple[Any, Any]]) -> Any:
    """A ``DynamicCache`` holding the keys/values ``pairs`` (one per layer), its layers filled directly: an empty
    layer's lazy start would be traced as a rank-1 tensor."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    layers: list[Any] = []
    for k, v in pairs:
        layer = DynamicLayer()
        layer.dtype, layer.device = k.dtype, k.device
        layer.keys, layer.values, layer.is_initialized = k, v, True
        layers.append(layer)
    cache.layers = layers
    return cache


def _flat(cache: Any) -> list[Any]:
    """A cache's keys and values, layer by layer."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def _kv_names(prefix: str, layers: int, side: str) -> list[str]:
    return [f"{prefix}.{i}.{side}.{part}" for i in range(layers) for part in ("key", "value")]


def _name(converted: dict[str, Any], layers: int, kv: tuple[int, int], width: int) -> None:
    """Name every input and output as optimum-intel does; every dimension dynamic but the fixed widths."""
    import openvino as ov

    ids, kv_shape = ov.PartialShape([-1, -1]), ov.PartialShape([-1, kv[0], -1, kv[1]])
    hidden = ov.PartialShape([-1, -1, width])
    past = _kv_names("past_key_values", layers, "decoder") + _kv_names("past_key_values", layers, "encoder")
    plan = {
        "encoder": ([("input_ids", ids), ("attention_mask", ids)], ["last_hidden_state"]),
        "decoder": (
            [("input_ids", ids), ("encoder_hidden_states", hidden), ("encoder_attention_mask", ids)],
            ["logits", *_kv_names("present", layers, "decoder"), *_kv_names("present", layers, "encoder")],
        ),
        "past": (
            [("input_ids", ids), ("encoder_attention_mask", ids), *((name, kv_shape) for name in past)],
            ["logits", *_kv_names("present", layers, "decoder")],
        ),
    }
    for kind, (inputs, outputs) in plan.items():
        ir = converted[kind]
        shapes = {}
        for port, (name, shape) in zip(ir.inputs, inputs, strict=True):
            port.get_tensor().set_names({name})
            shapes[port] = shape
        for port, name in zip(ir.outputs, outputs, strict=True):
            port.get_tensor().set_names({name})
        ir.reshape(shapes)
