"""What a search is given: the step function's contract and the start tokens, stop tokens and batch size."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from beamkit.state import first_array

StepFn = Callable[[Any, Any], Any]


def eos_ids(eos: int | Sequence[int] | None) -> tuple[int, ...]:
    """The stop tokens as a tuple of distinct ints: ``None`` -> ``()``, an id -> ``(id,)``, ids kept in order."""
    if eos is None:
        return ()
    raw = np.asarray(eos)
    if raw.size == 0 and raw.ndim == 1:
        return ()
    if raw.dtype.kind not in "iu" or raw.ndim > 1:
        raise TypeError(f"eos must be an int, a sequence of ints or None, got {eos!r}")
    return tuple(dict.fromkeys(raw.reshape(-1).tolist()))


def unpack_step(out: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Split a step function's return value into ``(logits, new_state, extras)``."""
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise TypeError("step_fn must return (logits, new_state) or (logits, new_state, extras)")
    if len(out) == 2:
        return out[0], out[1], {}
    if not isinstance(out[2], dict):
        raise TypeError(f"step_fn's extras (the third value it returns) must be a dict, got {type(out[2]).__name__}")
    return out[0], out[1], out[2]


def bos_array(bos: int | Sequence[int], n_req: int) -> np.ndarray:
    """``bos`` as int64 ``[n_req]``: one int for every request, or one id per request."""
    raw = np.asarray(bos)
    if raw.dtype.kind not in "iu":
        raise TypeError(f"bos must be an int or a sequence of ints, got dtype {raw.dtype}")
    out = np.full(n_req, raw, dtype=np.int64) if raw.ndim == 0 else raw.astype(np.int64)
    if out.shape != (n_req,):
        raise ValueError(f"bos must be an int or one id per request ({n_req}), got shape {raw.shape}")
    return out


def count_requests(init_state: Any, bos: int | Sequence[int]) -> int:
    """Requests in a batch: rows of the state's first array leaf, else ``len(bos)``, else 1."""
    lead = first_array(init_state)
    if lead is not None:
        return int(lead.shape[0])
    return int(np.shape(bos)[0]) if np.ndim(bos) == 1 else 1
