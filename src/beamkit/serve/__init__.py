"""``beamkit serve``: an OpenAI-compatible completions server on one continuous-batching engine.

Needs the ``serve`` extra (FastAPI, uvicorn): ``pip install ".[serve]"``. The application itself is
:func:`beamkit.serve.app.create_app` (importing it imports FastAPI); :mod:`beamkit.serve.listen` binds and runs
it. The models it serves are :mod:`beamkit.adapters`.
"""
