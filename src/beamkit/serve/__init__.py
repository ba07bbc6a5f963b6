"""``beamkit serve``: an OpenAI-compatible completions server on one continuous-batching engine.

Needs the ``serve`` extra (FastAPI, uvicorn): ``pip install ".[serve]"``. The application itself is
:func:`beamkit.serve.app.create_app` (importing it imports FastAPI); :mod:`beamkit.serve.listen` binds and runs
it. The models it serves are :mod:`beamkit.adapters`.
"""

from typing import Any

from beamkit.adapters.base import ModelAdapter

__all__ = ["ModelAdapter"]


def __getattr__(name: str) -> Any:
    """``DatesAdapter``, ``HFAdapter`` and ``load_adapter`` moved to :mod:`beamkit.adapters` (DeprecationWarning)."""
    from beamkit.serve import adapters

    return getattr(adapters, name)
