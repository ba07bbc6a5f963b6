"""The ``transformers`` releases the Hugging Face bridge supports, and the names that differ between them.

beamkit is tested with every release in :data:`TESTED_TRANSFORMERS`. transformers 5.24 renamed the key/value
cache of a model's forward pass from ``past_key_values`` to ``cache``, in both directions:

- the forward keyword: ``model(..., cache=c)``; the old keyword still works until 5.40 but warns
  (``FutureWarning``) on every call;
- the model output's field: ``out.cache``; reading ``out.past_key_values`` still works but logs a deprecation.

The step functions (:mod:`beamkit.hf.steps.step`) pass the cache under :func:`cache_keyword` (looked up once per model,
from its forward's signature) and read it back with :func:`output_cache`, so they use each release's own names
and no deprecated one.
"""

from __future__ import annotations

import inspect
from typing import Any

TESTED_TRANSFORMERS = ">=5.23,<5.25"  # the transformers releases the Hugging Face bridge is tested with


def release() -> tuple[int, int]:
    """The installed transformers release as (major, minor), e.g. ``(5, 24)``."""
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes its key/value cache under: ``"cache"`` where its signature names it
    (transformers 5.24 on), else ``"past_key_values"`` (transformers 5.23, and forwards that only take
    ``**kwargs``)."""
    try:
        names = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # no signature to read: the name every supported release accepts
        return "past_key_values"
    return "cache" if "cache" in names else "past_key_values"


def output_cache(out: Any) -> Any:
    """The key/value cache a model forward returned: the output's ``cache`` field where its class has one
    (transformers 5.24 on), else its ``past_key_values``."""
    fields = getattr(type(out), "__dataclass_fields__", None) or ()
    return out.cache if "cache" in fields else out.past_key_values
