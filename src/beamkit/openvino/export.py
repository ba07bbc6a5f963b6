"""``export_decoder``: a Hugging Face decoder-only model as an OpenVINO IR folder, in the layout that
``optimum-cli export openvino`` writes and OpenVINO GenAI reads.

The folder holds ``openvino_model.xml`` / ``.bin`` (inputs ``input_ids``, ``attention_mask``, ``position_ids`` and,
stateful, ``beam_idx``; output ``logits`` of the last position), the model's ``config.json`` and
``generation_config.json``, and the tokenizer's files when one is given. It is made with OpenVINO's public
conversion API: :func:`openvino.convert_model` over a wrapper module that takes the past keys/values as inputs and
returns the new ones, then (``stateful=True``, the default) ``beam_idx`` added as a row gather of every past
key/value and the keys/values turned into the model's internal state by OpenVINO's ``MakeStateful`` pass, as
optimum-intel does. ``stateful=False`` keeps them as inputs ``past_key_values.{i}.key`` / ``.value`` and outputs
``present.{i}.key`` / ``.value``.

Needs ``torch``, ``transformers`` and ``openvino`` (the ``openvino`` extra).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from beamkit._checks import check_bool
from beamkit.openvino.model import IR_XML


def load_folder(folder: str | Path, auto_class: Any, tokenizer: Any) -> tuple[Any, Any]:
    """The model in ``folder`` (loaded by the ``transformers`` ``auto_class``) and ``tokenizer``, or when that is
    None the folder's own tokenizer (None when the folder has no tokenizer files)."""
    import transformers

    source = Path(folder)
    model = auto_class.from_pretrained(source)
    if tokenizer is None:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError, TypeError):  # no tokenizer files in the folder
            tokenizer = None
    return model, tokenizer


def export_decoder(
    model: Any,
    out_dir: str | Path,
    *,
    tokenizer: Any = None,
    stateful: bool = True,
    beam_idx: bool = True,
    shared_prompt: bool = False,
) -> Path:
    """Convert ``model`` (a ``transformers`` decoder-only model with a key/value cache, e.g. GPT-2, Llama;
    or the folder of one) to an OpenVINO IR folder ``out_dir`` and return its path. ``tokenizer`` (a
    ``transformers`` tokenizer) is saved beside it, so ``--model ov:DIR`` finds one; a folder's own tokenizer
    is copied when it has one. The weights are kept in their float32 (or given) precision; the model is not
    changed. ``beam_idx=False`` (stateful only) leaves out the ``beam_idx`` input: such a model decodes greedily
    only. ``shared_prompt=True`` also writes beamkit's shared-prompt IR beside it
    (:mod:`beamkit.openvino.export_shared`: wide beams hold their request's prompt keys/values once; decoded with
    ``generate(..., shared_prompt=True)``). Raises TypeError for an encoder-decoder model or a model without a
    key/value cache."""
    import openvino as ov
    import torch
    import transformers

    check_bool("stateful", stateful)
    check_bool("beam_idx", beam_idx)
    check_bool("shared_prompt", shared_prompt)
    if isinstance(model, (str, Path)):
        model, tokenizer = load_folder(model, transformers.AutoModelForCausalLM, tokenizer)
    config = getattr(model, "config", None)
    if config is None or not callable(model):
        raise TypeError(f"export_decoder needs a transformers model, got {type(model).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise TypeError("export_decoder converts decoder-only models; this one is an encoder-decoder")
    layers = int(config.get_text_config().num_hidden_layers)
    wrapper = _KeysValuesIO(model, layers).eval()
    example = _example(model, layers)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on values it keeps constant (checked by the tests)
        ov_model = ov.convert_model(wrapper, example_input=example)
    _name(ov_model, layers, _kv_dims(model))
    if stateful:
        if beam_idx:
            _add_beam_idx(ov_model, layers)
        _make_stateful(ov_model, layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov_model, out / IR_XML, compress_to_fp16=False)
    config.save_pretrained(out)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    if shared_prompt:
        from beamkit.openvino.export_shared import export_shared_prompt

        export_shared_prompt(model, out)
    return out


class _KeysValuesIO:
    """Built lazily (torch is optional): see :func:`_wrapper_class`."""

    def __new__(cls, model: Any, layers: int) -> Any:
        return _wrapper_class()(model, layers)


def _wrapper_class() -> Any:
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from beamkit.hf.versions import cache_keyword, output_cache

    class KeysValuesIO(torch.nn.Module):
        """The model's forward with its past keys/values as flat inputs and the new ones as flat outputs, and
        the logits of the last position only."""

        def __init__(self, model: Any, layers: int):
            super().__init__()
            self.model = model
            self.layers = layers
            self.cache_key = cache_keyword(model)

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> tuple[Any, ...]:
            cache = DynamicCache()
            layers: list[Any] = []
            for i in range(self.layers):  # filled directly: an empty layer's lazy start would be traced as rank 1
                layer = DynamicLayer()
                layer.dtype, layer.device = past[2 * i].dtype, past[2 * i].device
                layer.keys, layer.values, layer.is_initialized = past[2 * i], past[2 * i + 1], True
                layers.append(layer)
            cache.layers = layers
            out = self.model(
                input_ids=input_ids, attention_mask=_attention(input_ids, attention_mask), position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1, return_dict=True, **{self.cache_key: cache},
            )  # fmt: skip
            new = output_cache(out)
            flat = []
            for layer in new.layers:
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    return KeysValuesIO


def _attention(input_ids: Any, attention_mask: Any) -> Any:
    """The boolean attention mask ``[rows, 1, new, past + new]`` (True: attend) of the new tokens: causal and
    the padding mask; a query that would attend to nothing (a padding position of a left-padded prompt) attends
    to every column instead, so its output is finite (no row reads it: every real query masks that column).
    Left fully masked, the padding rows' NaN would reach the real ones through the next layer's keys/values."""
    import torch

    new, total = input_ids.shape[1], attention_mask.shape[1]
    keys = torch.arange(total, device=input_ids.device)  # shape: (past + new,)
    queries = torch.arange(new, device=input_ids.device) + (total - new)  # shape: (new,)
    allowed = (keys[None, :] <= queries[:, None])[None] & attention_mask[:, None, :].bool()  # shape: (rows, new, L)
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return allowed[:, None]  # shape: (rows, 1, new, past + new)


def _kv_dims(model: Any) -> tuple[int, int]:
    """Key/value heads and head width of the model's layers, from its config."""
    cfg = model.config.get_text_config()
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return heads, head_dim


def _example(model: Any, layers: int) -> tuple[Any, ...]:
    """Inputs to trace with: 2 rows of 3 new tokens (the first row padded on the left) after 2 past positions."""
    import torch

    heads, head_dim = _kv_dims(model)
    dtype = next(model.parameters()).dtype
    ids = torch.ones((2, 3), dtype=torch.long)
    mask = torch.ones((2, 5), dtype=torch.long)
    mask[0, 0] = 0
    pos = torch.tensor([[1, 2, 3], [2, 3, 4]], dtype=torch.long)
    past = tuple(torch.zeros((2, heads, 2, head_dim), dtype=dtype) for _ in range(2 * layers))
    return (ids, mask, pos, *past)


def _name(ov_model: Any, layers: int, kv: tuple[int, int]) -> None:
    """Name the inputs and outputs as optimum-intel does, every dimension but the fixed head sizes dynamic."""
    inputs = {name: [-1, -1] for name in ("input_ids", "attention_mask", "position_ids")}
    inputs |= {f"past_key_values.{i}.{p}": [-1, kv[0], -1, kv[1]] for i in range(layers) for p in ("key", "value")}
    outs = ["logits"] + [f"present.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    name_ports(
        ov_model, inputs, outs, "the converted model", ": its cache does not hold one key and one value per layer"
    )


def name_ports(ov_model: Any, inputs: dict[str, list[int]], outs: list[str], what: str, why: str = "") -> None:
    """Name ``ov_model``'s inputs in order, each with its dimensions (-1: dynamic), and its outputs; a model with
    other counts is refused (``what`` names it in the error, ``why`` says what that means)."""
    import openvino as ov

    if len(ov_model.inputs) != len(inputs) or len(ov_model.outputs) != len(outs):
        raise TypeError(
            f"{what} has {len(ov_model.inputs)} inputs and {len(ov_model.outputs)} outputs, expected "
            f"{len(inputs)} and {len(outs)}{why}"
        )
    shapes = {}
    for port, (name, dims) in zip(ov_model.inputs, inputs.items(), strict=True):
        port.get_tensor().set_names({name})
        shapes[port] = ov.PartialShape(dims)
    for port, name in zip(ov_model.outputs, outs, strict=True):
        port.get_tensor().set_names({name})
    ov_model.reshape(shapes)


def _add_beam_idx(ov_model: Any, layers: int) -> None:
    """A ``beam_idx`` input ``[rows]`` (int32) that gathers the rows of every past key/value: the beam reorder
    runs inside the model."""
    import openvino as ov
    from openvino import opset13

    beam_idx = opset13.parameter(ov.PartialShape([-1]), ov.Type.i32, name="beam_idx")
    beam_idx.output(0).get_tensor().set_names({"beam_idx"})
    ov_model.add_parameters([beam_idx])
    axis = opset13.constant(np.int64(0))
    for i in range(layers):
        for part in ("key", "value"):
            port = ov_model.input(f"past_key_values.{i}.{part}")
            consumers = port.get_target_inputs()
            gathered = opset13.gather(port, beam_idx, axis)
            for consumer in consumers:
                consumer.replace_source_output(gathered.output(0))
    ov_model.validate_nodes_and_infer_types()


def _make_stateful(ov_model: Any, layers: int) -> None:
    """Past keys/values inputs and present outputs become the model's state (``MakeStateful``), initialised to
    zero positions for as many rows as ``input_ids`` has."""
    from openvino import opset13
    from openvino.passes import MakeStateful, Manager

    pairs = {}
    for i in range(layers):
        for part in ("key", "value"):
            pairs[f"past_key_values.{i}.{part}"] = f"present.{i}.{part}"
    manager = Manager()
    manager.register_pass(MakeStateful(pairs))
    manager.run_passes(ov_model)
    ids = ov_model.input("input_ids")
    rows = opset13.gather(
        opset13.shape_of(ids, output_type="i64"), opset13.constant(np.array([0], dtype=np.int64)),
        opset13.constant(np.int64(0)),
    )  # fmt: skip
    for op in ov_model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        shape = op.get_output_partial_shape(0)
        dims = [rows] + [
            opset13.constant(np.array([0 if i == 2 else shape[i].get_length()], dtype=np.int64)) for i in (1, 2, 3)
        ]
        zero = opset13.constant(np.zeros((), dtype=op.get_output_element_type(0).to_dtype()))
        op.set_arguments([opset13.broadcast(zero, opset13.concat(dims, axis=0))])
    ov_model.validate_nodes_and_infer_types()
