"""int8 weights for CPU decoding: a copy of a model whose linear layers multiply in int8.

``beamkit.hf.quantize_int8(model)`` returns a copy of a float32 model on the CPU in which every
``torch.nn.Linear`` (and GPT-2's ``Conv1D``, a linear layer with its weight stored transposed) is an
:class:`Int8Linear`; the original model is not modified. Decode the copy with ``beamkit.hf.generate`` (or its own
``generate``) as any model.

The scheme (that of torchao's int8 dynamic quantisation: per-channel weights, per-token activations; written here
in plain torch ops):

* weights: symmetric, one scale per output channel, ``scale[c] = max_k |W[c, k]| / 127`` and
  ``q[c, k] = round(W[c, k] / scale[c])`` in -127..127, so ``|W - q * scale| <= scale / 2`` per weight;
* activations: quantised at each call the same way, one scale per row (per token), so a layer's output for a
  row depends on that row only, not on the rows batched with it (``torch.ao.quantization.quantize_dynamic``
  scales the whole batch with one number instead, so there a row's logits change with its neighbours and
  beamkit's decoding, which batches differently from Hugging Face's, gives other tokens; it is also
  deprecated);
* the product: int8 x int8 with int32 sums (``torch._int_mm``, exact), scaled back to float32, bias added in
  float32.

The output projection (``lm_head``) is quantised too by default, as CTranslate2 does; ``lm_head=False`` keeps it
float32 (tied to the input embeddings in GPT-2-style models: the embeddings themselves are never quantised).

Rounding to int8 is a step function: where two computations of the same activation differ by one float32 ulp
(the paged cache's shared-prefix attention and Hugging Face's dense attention do), one of them can land one
int8 step away, which changes the logits far more than float32 rounding does and can change a token at a
near-tie. So on the paged cache (decoder-only models, the default) beam search on the int8 copy can differ from
the copy's own ``generate`` at near-ties; ``cache_implementation="dynamic"`` (the dense cache) decodes as it
does.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from beamkit._checks import check_bool

QMAX = 127  # symmetric int8: -127..127 (-128 unused, so that q and -q are both representable)
TINY = torch.finfo(torch.float32).tiny
MAX_INNER = (2**31 - 1) // (QMAX * QMAX)  # longest inner dimension whose int32 sums cannot overflow


class Int8Linear(torch.nn.Module):
    """A linear layer with int8 weights (one scale per output channel) and int8 activations (one scale per row).

    ``weight`` (int8, ``(out_features, in_features)``), ``weight_scale`` (float32, ``(out_features,)``) and
    ``bias`` (float32 or None) are buffers: they move with ``.to()`` and are saved in ``state_dict``.
    """

    weight: torch.Tensor  # shape: (out, in), int8
    weight_scale: torch.Tensor  # shape: (out,), float32
    bias: torch.Tensor | None  # shape: (out,), float32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().to(torch.float32)  # shape: (out, in)
        self.out_features, self.in_features = int(w.shape[0]), int(w.shape[1])
        scale = w.abs().amax(dim=1) / QMAX  # shape: (out,)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale is exact
        q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)  # shape: (out, in)
        self.register_buffer("weight", q)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).clone())

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear) -> Int8Linear:
        """The int8 copy of a ``torch.nn.Linear`` (``y = x @ W.T + b``)."""
        return cls(layer.weight, layer.bias)

    @classmethod
    def from_conv1d(cls, layer: Any) -> Int8Linear:
        """The int8 copy of a ``transformers`` ``Conv1D`` (``y = x @ W + b``, ``W`` of shape ``(in, out)``)."""
        return cls(layer.weight.t(), layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` through int8: each row of ``x`` quantised with its own scale."""
        if x.device.type != "cpu":
            raise ValueError(
                f"int8 layers run on the CPU, got an input on {x.device}: keep the quantized copy on the CPU"
            )
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).to(torch.float32)  # shape: (rows, in)
        # shape: (rows, 1); an all-zero row gets the smallest scale (its int8 values are 0 under any scale)
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(TINY) / QMAX
        q = (rows / scale).round_().to(torch.int8)  # shape: (rows, in); |rows / scale| <= 127
        acc = torch._int_mm(q, self.weight.t())  # shape: (rows, out), exact int32 sums
        y = acc * self.weight_scale  # shape: (rows, out), float32
        y = y * scale if self.bias is None else torch.addcmul(self.bias, y, scale)
        return y.reshape(*lead, self.out_features).to(x.dtype)  # shape: (..., out)

    def extra_repr(self) -> str:
        """The layer's sizes, as ``torch.nn.Linear`` prints them."""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _conv1d_type() -> type | None:
    """``transformers``' ``Conv1D`` (GPT-2's linear layer), or None without transformers."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return None
    return Conv1D


def _output_layer(model: Any) -> Any:
    """The module ``model.get_output_embeddings()`` returns (None when the model has no such method)."""
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _check_int_mm() -> None:
    """RuntimeError, naming the problem, when this torch cannot multiply int8 matrices on the CPU."""
    if not hasattr(torch, "_int_mm"):
        raise RuntimeError(
            f"int8 weights need torch's int8 matrix multiply (torch._int_mm), which torch {torch.__version__} "
            "does not have: install torch >= 2.2"
        )
    a = torch.ones((1, 8), dtype=torch.int8)
    try:
        torch._int_mm(a, a.t())
    except RuntimeError as err:
        raise RuntimeError(
            f"int8 weights need torch's int8 matrix multiply on the CPU, which this torch build "
            f"({torch.__version__}) does not provide: {err}"
        ) from err


def _check_model(model: Any) -> None:
    """TypeError unless ``model`` is a torch module; ValueError unless all its tensors are on the CPU and its
    floating-point ones float32."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"quantize_int8 needs a torch.nn.Module (a transformers model), got {type(model).__name__}")
    tensors = [*model.parameters(), *model.buffers()]
    devices = sorted({str(t.device) for t in tensors if t.device.type != "cpu"})
    if devices:
        raise ValueError(
            f"int8 weights run on the CPU only: the model is on {', '.join(devices)} (move it with model.to('cpu'))"
        )
    dtypes = sorted({str(t.dtype) for t in tensors if t.is_floating_point() and t.dtype != torch.float32})
    if dtypes:
        raise ValueError(
            f"int8 quantisation needs a float32 model, this one holds {', '.join(dtypes)} weights "
            "(convert it with model.float() first)"
        )


def _replace(module: torch.nn.Module, keep: torch.nn.Module | None, conv1d: type | None) -> int:
    """Replace, in place, every ``Linear`` / ``Conv1D`` below ``module`` except ``keep`` by its
    :class:`Int8Linear`; return how many were replaced."""
    count = 0
    for name, child in list(module.named_children()):
        if child is keep:
            continue
        if isinstance(child, torch.nn.Linear):
            new = Int8Linear.from_linear(child)
        elif conv1d is not None and isinstance(child, conv1d):
            new = Int8Linear.from_conv1d(child)
        else:
            count += _replace(child, keep, conv1d)
            continue
        if new.in_features > MAX_INNER:
            raise ValueError(
                f"{name}: a layer of {new.in_features} inputs overflows the int32 sums of int8 products "
                f"(at most {MAX_INNER} inputs)"
            )
        setattr(module, name, new)
        count += 1
    return count


def quantize_int8(model: Any, *, lm_head: bool = True) -> Any:
    """A copy of ``model`` (float32, on the CPU) whose linear layers run in int8; ``model`` is left unchanged.

    Every ``torch.nn.Linear`` and ``transformers`` ``Conv1D`` (GPT-2's layers, converted as ``nn.Linear`` with
    the weight transposed) becomes an :class:`Int8Linear`: per-output-channel int8 weights, per-row int8
    activations, exact int32 products. ``lm_head``: quantise the output projection too (the default, as
    CTranslate2's int8 does; False keeps it float32). Embeddings, norms and attention stay float32. The copy
    is in eval mode and is meant for decoding in this process (no gradients flow through int8 layers, and its
    ``save_pretrained`` folder does not load back: save the float32 model and quantise after loading). It takes
    the memory of a second float32 model while it is built.

    Raises TypeError for something that is not a torch module, ValueError for a model that is not on the CPU,
    not float32 or has no linear layer, RuntimeError when this torch cannot multiply int8 matrices.
    """
    _check_model(model)
    lm_head = check_bool("lm_head", lm_head)
    _check_int_mm()
    conv1d = _conv1d_type()
    linear = (torch.nn.Linear,) if conv1d is None else (torch.nn.Linear, conv1d)
    if not lm_head and not isinstance(_output_layer(model), linear):
        raise ValueError(
            f"lm_head=False: {type(model).__name__} names no linear output layer (get_output_embeddings) to keep"
        )
    quantised = copy.deepcopy(model)
    keep = None if lm_head else _output_layer(quantised)
    with torch.no_grad():
        count = _replace(quantised, keep, conv1d)
    if count == 0:
        raise ValueError(f"{type(model).__name__} has no linear layer to quantise (is it already int8?)")
    return quantised.eval()
