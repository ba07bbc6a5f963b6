"""Which library and device an array lives on, and moving small tables between them: the torch test (without
importing torch), host copies and zero-copy views, torch's thread count and inference mode, the logits check."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

NEG_INF = float("-inf")


def is_torch(x: Any) -> bool:
    """Return True when ``x`` is a torch tensor (checked without importing torch)."""
    kind = type(x)
    known = _TENSOR_TYPES.get(kind)
    if known is None:
        known = _TENSOR_TYPES[kind] = kind.__module__.startswith("torch") and hasattr(x, "device")
    return known


_TENSOR_TYPES: dict[type, bool] = {np.ndarray: False}  # type -> is it a torch tensor (types don't change)


def torch_threads() -> int | None:
    """torch's CPU thread count, or None when torch has not been imported (it is not imported here)."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())


def set_torch_threads(count: int | None) -> int | None:
    """Set torch's CPU thread count to ``count`` (None: leave it) and return the count before; torch is imported
    only when a count is given and it is installed (without it there is nothing to set: None)."""
    if count is None:
        return torch_threads()
    try:
        import torch
    except ImportError:
        return None
    before = int(torch.get_num_threads())
    torch.set_num_threads(int(count))
    return before


@contextlib.contextmanager
def torch_threads_set(count: int | None) -> Iterator[None]:
    """Run the block with torch's CPU thread count at ``count`` (None: as it is), put back afterwards."""
    before = set_torch_threads(count)
    try:
        yield
    finally:
        if count is not None and before is not None:
            set_torch_threads(before)


@contextlib.contextmanager
def inference_mode(uses_torch: bool = True) -> Iterator[None]:
    """Run the block under ``torch.inference_mode()`` when ``uses_torch`` (torch then imported), else as it is."""
    if not uses_torch:
        yield
        return
    import torch

    with torch.inference_mode():
        yield


def is_array(x: Any) -> bool:
    """Return True for numpy arrays and torch tensors with at least one dimension (the gatherable leaves)."""
    if isinstance(x, np.ndarray):
        return x.ndim >= 1
    return is_torch(x) and x.dim() >= 1


def to_numpy(x: Any) -> np.ndarray:
    """Copy a small array (a ``[rows]`` or ``[rows, m]`` table) to a host numpy array."""
    if is_torch(x):
        x = x.detach()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):  # numpy has no bfloat16
            x = x.double()
        return x.cpu().numpy()
    return np.asarray(x)


def cpu_view(x: Any) -> Any:
    """A zero-copy numpy view of a CPU float32/float64 torch tensor (numpy's kernels are faster there), else x.

    Nothing moves between devices: a CUDA tensor, or a dtype numpy lacks (bfloat16, float16), stays as it is.
    """
    if is_torch(x) and x.device.type == "cpu" and not x.requires_grad and str(x.dtype) in NUMPY_FLOATS:
        return x.numpy()
    return x


NUMPY_FLOATS = ("torch.float32", "torch.float64")


def like(values: np.ndarray, ref: Any) -> Any:
    """Return host ``values`` in the library and on the device of ``ref`` (numpy stays numpy)."""
    if is_torch(ref):
        import torch

        if ref.device.type == "cpu":  # shares the host memory, no copy
            return torch.from_numpy(np.ascontiguousarray(values))
        return torch.as_tensor(values, device=ref.device)
    return values


def check_logits(logits: Any, rows: int) -> None:
    """Raise ValueError unless ``logits`` is a float ``[rows, V]`` array with V >= 1."""
    if not (isinstance(logits, np.ndarray) or is_torch(logits)):
        raise TypeError(f"step_fn must return logits as a numpy array or torch tensor, got {type(logits).__name__}")
    shape = tuple(logits.shape)
    if len(shape) != 2 or shape[0] != rows or shape[1] < 1:
        raise ValueError(f"step_fn returned logits of shape {shape}; expected [{rows}, V] for the {rows} rows sent")
    kind = str(logits.dtype)
    if "float" not in kind:
        raise TypeError(f"logits must be floating point, got dtype {kind}")


def dtype_kind(x: Any) -> str:
    """The kind of an array's values as numpy names it: "f" float, "i" integer (signed or not), "b" bool, "c"
    complex, "O" object; a torch tensor's dtype is read the same way."""
    dtype = x.dtype
    if isinstance(dtype, np.dtype):
        return "i" if dtype.kind == "u" else dtype.kind
    if dtype.is_complex:  # a torch dtype
        return "c"
    if dtype.is_floating_point:
        return "f"
    return "b" if str(dtype) == "torch.bool" else "i"


def to_library(x: Any, ref: Any) -> Any:
    """``x`` (numpy or torch, its dtype kept) in the library and on the device of ``ref``."""
    if is_torch(ref):
        import torch

        return x.to(device=ref.device) if is_torch(x) else torch.as_tensor(np.asarray(x), device=ref.device)
    return to_numpy(x)
