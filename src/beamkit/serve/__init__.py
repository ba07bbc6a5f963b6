"""``beamkit serve``: an OpenAI-compatible completions server on one continuous-batching engine.

Needs the ``serve`` extra (FastAPI, uvicorn): ``pip install ".[serve]"``. The application itself is
:func:`beamkit.serve.app.create_app` (importing it imports FastAPI).
"""

from beamkit.serve.adapters import DatesAdapter, HFAdapter, ModelAdapter, load_adapter

__all__ = ["DatesAdapter", "HFAdapter", "ModelAdapter", "load_adapter"]
