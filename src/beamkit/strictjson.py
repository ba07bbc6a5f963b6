"""Strict JSON out of decoding results: a score or log-probability may be ``-inf`` (a masked token) or NaN (a
failed request), which JSON cannot hold. :func:`finite` turns them into ``null`` for the server's bodies and the
corpus runner's records alike."""

from __future__ import annotations

import math
from typing import Any


def finite(payload: Any) -> Any:
    """``payload`` with every NaN or infinite float replaced by None (inside dicts, lists and tuples too), so that
    it encodes as strict JSON (``json.dumps(..., allow_nan=False)``)."""
    if isinstance(payload, float):
        return payload if math.isfinite(payload) else None
    if isinstance(payload, dict):
        return {k: finite(v) for k, v in payload.items()}
    if isinstance(payload, (list, tuple)):
        return [finite(v) for v in payload]
    return payload
