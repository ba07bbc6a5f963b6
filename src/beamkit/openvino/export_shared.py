"""The shared-prompt decoder IR: the prompt's keys/values held once per request, each beam's generated ones apart.

A stateful IR with ``beam_idx`` (:func:`beamkit.openvino.export_decoder`) holds every row's whole key/value history
in its state, so a request decoded with 64 beams holds its prompt's keys/values 64 times, and each step's
``beam_idx`` gather and attention read all those copies. :func:`export_shared_prompt` writes a second IR into the
folder, :data:`SHARED_XML`, whose attention reads two parts:

- the **prompt** part: inputs ``prompt_key_values.{i}.key`` / ``.value`` ``[requests, heads, P, d]``, one row per
  request, with ``prompt_mask`` ``[requests, P]`` (1: a prompt position, 0: padding). Every query of a request's
  beams meets the request's prompt keys in one batched product: ``grid_rows`` ``[requests * W]`` lays the rows out
  as a ``[requests, W]`` grid (W: the most rows a request has; a padding slot repeats one of the request's rows) and
  ``row_slot`` ``[rows]`` says where each row sits in it;
- the **generated** part: the model's state (``past_key_values.{i}.*``, gathered by ``beam_idx`` as in the usual
  IR), each row's own positions after its prompt, with ``attention_mask`` ``[rows, G + T]`` (its past generated
  positions and the ``T`` new ones; causal among the new ones).

The two softmax parts merge exactly (maxima, sums and unnormalised outputs, as in :mod:`beamkit.kv.attention`). The
same IR runs the prompts: one row per request, the new tokens being the prompt and the prompt part a single masked
column; the keys/values the state then holds are read out as that request's prompt part and the state is reset.

The attention is beamkit's function in ``transformers``' ``AttentionInterface`` (so GPT-2, Llama and the like
need no code of ours), traced through OpenVINO's public conversion API. Needs ``torch``, ``transformers`` and
``openvino``.
"""

from __future__ import annotations

import warnings
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from beamkit.openvino.export import name_ports
from beamkit.openvino.model import SHARED_XML

SHARED_ATTENTION = "beamkit_openvino_shared_prompt"  # the attention function's name in transformers' AttentionInterface
#: the shared-prompt IR's inputs besides the keys/values, in order
INPUTS = ("input_ids", "position_ids", "attention_mask", "prompt_mask", "grid_rows", "row_slot")

_PARTS: ContextVar[Any] = ContextVar("beamkit_openvino_shared_prompt", default=None)


def export_shared_prompt(model: Any, out_dir: str | Path) -> Path:
    """Write the shared-prompt IR of ``model`` (a ``transformers`` decoder-only model whose attention layers attend
    through ``transformers``' ``AttentionInterface``, e.g. GPT-2, Llama) into ``out_dir`` (an IR folder of the
    same model) as :data:`SHARED_XML`, and return its path. The model is not changed. Raises TypeError for a model
    whose layers do not all attend through the interface."""
    import openvino as ov
    import torch

    from beamkit.hf.internals import register_attention
    from beamkit.hf.steps.views import with_attention
    from beamkit.openvino.export import _add_beam_idx, _kv_dims, _make_stateful

    register_attention(SHARED_ATTENTION, _attention)
    layers = int(model.config.get_text_config().num_hidden_layers)
    view = with_attention(model, SHARED_ATTENTION)
    wrapper = _wrapper_class()(view, layers).eval()
    heads, head_dim = _kv_dims(model)
    example = _example(model, layers, heads, head_dim)
    calls: list[int] = []
    token = _PARTS.set(None)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on values it keeps constant (checked by the tests)
            wrapper.calls = calls
            ov_model = ov.convert_model(wrapper, example_input=example)
    except Exception:
        if wrapper.refused:  # the attention refused the model (raised inside the tracer, which rewraps it)
            raise TypeError(f"this model has no shared-prompt IR: {wrapper.refused[0]}") from None
        raise
    finally:
        _PARTS.reset(token)
    if not calls or len(set(calls)) != layers:
        raise TypeError(
            "this model's attention layers do not all attend through transformers' AttentionInterface: it has no "
            "shared-prompt IR (decode it with the folder's usual IR)"
        )
    _name(ov_model, layers, heads, head_dim)
    _add_beam_idx(ov_model, layers)
    _make_stateful(ov_model, layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov_model, out / SHARED_XML, compress_to_fp16=False)
    return out / SHARED_XML


class _Parts:
    """What every layer's attention reads during one traced forward."""

    def __init__(self, prompt: tuple[Any, ...], gen_bias: Any, prompt_bias: Any, grid_rows: Any, row_slot: Any):
        self.prompt = prompt  # per layer: key, value, each (requests, heads, P, d)
        self.gen_bias = gen_bias  # shape: (rows, 1, 1, T, G + T) 0 / min
        self.prompt_bias = prompt_bias  # shape: (requests, 1, 1, 1, P) 0 / min
        self.grid_rows = grid_rows  # shape: (requests * W,)
        self.row_slot = row_slot  # shape: (rows,)
        self.calls: list[int] = []


def _wrapper_class() -> Any:
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from beamkit.hf.versions import cache_keyword, output_cache

    class SharedPromptIO(torch.nn.Module):
        """The model's forward over the new tokens with the generated keys/values as flat inputs and outputs and
        the prompt's keys/values as further inputs (read by :func:`_attention`); the last position's logits."""

        def __init__(self, model: Any, layers: int):
            super().__init__()
            self.model = model
            self.layers = layers
            self.cache_key = cache_keyword(model)
            self.calls: list[int] = []
            self.refused: list[str] = []  # why the attention refused this model, when it did

        def forward(
            self,
            input_ids: Any,
            position_ids: Any,
            attention_mask: Any,
            prompt_mask: Any,
            grid_rows: Any,
            row_slot: Any,
            *kv: Any,
        ) -> tuple[Any, ...]:
            past, prompt = kv[: 2 * self.layers], kv[2 * self.layers :]
            cache = DynamicCache()
            layers: list[Any] = []
            for i in range(self.layers):
                layer = DynamicLayer()
                layer.dtype, layer.device = past[2 * i].dtype, past[2 * i].device
                layer.keys, layer.values, layer.is_initialized = past[2 * i], past[2 * i + 1], True
                layers.append(layer)
            cache.layers = layers
            gen_bias, prompt_bias = _biases(input_ids, attention_mask, prompt_mask, past[0].dtype)
            parts = _Parts(prompt, gen_bias, prompt_bias, grid_rows, row_slot)
            token = _PARTS.set(parts)
            try:
                out = self.model(
                    input_ids=input_ids, position_ids=position_ids, use_cache=True, logits_to_keep=1,
                    return_dict=True, **{self.cache_key: cache},
                )  # fmt: skip
            except TypeError as err:
                self.refused.append(str(err))
                raise
            finally:
                _PARTS.reset(token)
            self.calls[:] = parts.calls
            flat = []
            for layer in output_cache(out).layers:
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    return SharedPromptIO


def _biases(input_ids: Any, attention_mask: Any, prompt_mask: Any, dtype: Any) -> tuple[Any, Any]:
    """The additive masks (0: attend, the dtype's lowest: not) of the generated part ``[rows, 1, 1, T, G + T]``
    (causal among the ``T`` new positions and the rows' ``attention_mask``) and of the prompt part ``[requests,
    1, 1, 1, P]``. Finite, so that a query attending nowhere (a left-padded prompt's padding) stays finite."""
    import torch

    low = torch.full((), torch.finfo(dtype).min, dtype=dtype)
    zero = torch.zeros((), dtype=dtype)
    new, total = input_ids.shape[1], attention_mask.shape[1]
    keys = torch.arange(total)  # shape: (G + T,)
    queries = torch.arange(new) + (total - new)  # shape: (T,)
    allowed = (keys[None, :] <= queries[:, None])[None] & (attention_mask[:, None, :] != 0)  # shape: (rows, T, G+T)
    gen_bias = torch.where(allowed, zero, low)[:, None, None]
    prompt_bias = torch.where(prompt_mask != 0, zero, low)[:, None, None, None]
    return gen_bias, prompt_bias


def _attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """One layer's attention (``transformers``' attention-function signature) while the shared-prompt IR is traced:
    ``query`` ``[rows, q_heads, T, d]`` against the rows' generated keys/values (``key`` / ``value`` ``[rows,
    heads, G + T, d]``, the cache's past and the new ones) and their requests' prompt keys/values; returns
    ``([rows, T, q_heads, d], None)``."""
    import torch

    parts = _PARTS.get()
    layer = getattr(module, "layer_idx", None)
    if parts is None:
        raise TypeError("the shared-prompt attention runs only while beamkit exports a shared-prompt IR")
    if layer is None or dropout or kwargs.get("sliding_window") is not None:
        raise TypeError("its attention layers need a layer_idx and full attention (no sliding window, no dropout)")
    if kwargs.get("s_aux", kwargs.get("sinks")) is not None or kwargs.get("softcap") is not None:
        raise TypeError("the shared-prompt IR does not compute attention sinks or soft-capped scores")
    parts.calls.append(int(layer))
    pk, pv = parts.prompt[2 * layer], parts.prompt[2 * layer + 1]  # each: (requests, heads, P, d)
    rows, q_heads, new, d = query.shape
    heads = key.shape[1]
    g = q_heads // heads
    scale = float(scaling) if scaling is not None else d**-0.5
    q = (query * scale).reshape(rows, heads, g, new, d)  # shape: (rows, heads, g, T, d)
    s_gen = torch.matmul(q, key[:, :, None].transpose(-1, -2)) + parts.gen_bias  # shape: (rows, heads, g, T, G+T)
    m_gen = s_gen.amax(dim=-1, keepdim=True)
    e_gen = torch.exp(s_gen - m_gen)
    z_gen = e_gen.sum(dim=-1, keepdim=True)
    o_gen = torch.matmul(e_gen, value[:, :, None])  # shape: (rows, heads, g, T, d)
    requests = pk.shape[0]
    grid = q.index_select(0, parts.grid_rows).reshape(requests, -1, heads, g, new, d)  # (requests, W, heads, g, T, d)
    grid = grid.permute(0, 2, 3, 1, 4, 5).reshape(requests, heads, g, -1, d)  # shape: (requests, heads, g, W*T, d)
    s_pr = torch.matmul(grid, pk[:, :, None].transpose(-1, -2)) + parts.prompt_bias  # (requests, heads, g, W*T, P)
    m_pr = s_pr.amax(dim=-1, keepdim=True)
    e_pr = torch.exp(s_pr - m_pr)
    z_pr = e_pr.sum(dim=-1, keepdim=True)
    o_pr = torch.matmul(e_pr, pv[:, :, None])  # shape: (requests, heads, g, W*T, d)

    def to_rows(x: Any) -> Any:  # (requests, heads, g, W*T, k) -> (rows, heads, g, T, k)
        k = x.shape[-1]
        x = x.reshape(requests, heads, g, -1, new, k).permute(0, 3, 1, 2, 4, 5)  # (requests, W, heads, g, T, k)
        return x.reshape(-1, heads, g, new, k).index_select(0, parts.row_slot)

    m_pr, z_pr, o_pr = to_rows(m_pr), to_rows(z_pr), to_rows(o_pr)
    top = torch.maximum(m_gen, m_pr)
    a, b = torch.exp(m_gen - top), torch.exp(m_pr - top)
    out = (o_gen * a + o_pr * b) / (z_gen * a + z_pr * b)  # shape: (rows, heads, g, T, d)
    return out.reshape(rows, q_heads, new, d).transpose(1, 2), None  # shape: (rows, T, q_heads, d)


def _example(model: Any, layers: int, heads: int, head_dim: int) -> tuple[Any, ...]:
    """Inputs to trace with: 3 rows of 2 new tokens after 2 generated positions, 2 requests of 4 prompt
    positions, a grid 2 wide (sizes all different, so that no dimension is taken for another)."""
    import torch

    dtype = next(model.parameters()).dtype
    ids = torch.ones((3, 2), dtype=torch.long)
    pos = torch.tensor([[5, 6], [5, 6], [4, 5]], dtype=torch.long)
    mask = torch.ones((3, 4), dtype=torch.long)
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.long)
    grid_rows = torch.tensor([0, 1, 2, 2], dtype=torch.long)
    row_slot = torch.tensor([0, 1, 2], dtype=torch.long)
    past = tuple(torch.zeros((3, heads, 2, head_dim), dtype=dtype) for _ in range(2 * layers))
    prompt = tuple(torch.zeros((2, heads, 4, head_dim), dtype=dtype) for _ in range(2 * layers))
    return (ids, pos, mask, prompt_mask, grid_rows, row_slot, *past, *prompt)


def _name(ov_model: Any, layers: int, heads: int, head_dim: int) -> None:
    """Name the inputs and outputs, every dimension but the fixed head sizes dynamic."""
    inputs = {name: [-1] if name in ("grid_rows", "row_slot") else [-1, -1] for name in INPUTS}
    for part in ("past", "prompt"):
        inputs |= {
            f"{part}_key_values.{i}.{p}": [-1, heads, -1, head_dim] for i in range(layers) for p in ("key", "value")
        }
    outs = ["logits"] + [f"present.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    name_ports(ov_model, inputs, outs, "the converted shared-prompt model")
