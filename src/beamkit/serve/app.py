"""The HTTP side of ``beamkit serve``: FastAPI routes over one :class:`~beamkit.serve.runner.Runner`.

``POST /v1/completions`` (OpenAI completions shape, ``stream`` as server-sent events), ``GET /v1/models``,
``GET /health``, ``GET /metrics``. A request is checked completely (:mod:`beamkit.serve.protocol`) before its
jobs are queued; a client that disconnects has its jobs cancelled in the engine.

Streaming (``"stream": true``): beams change their mind, so progress events are not deltas. Each one carries the
**whole** current best text of one prompt in ``choices[0].text``, which *replaces* the text of the previous
event for the same ``beamkit.prompt_index``; ``beamkit.step`` counts that request's model calls. An event is sent
after a step only when the best hypothesis changed. Then one final event (``beamkit.final: true``) carries the
n-best of every prompt exactly as the non-streaming response would, and ``data: [DONE]``. A decoding failure
after the stream began is an ``{"error": ...}`` event before ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from beamkit._checks import check_bool, check_int, is_int
from beamkit.adapters import ModelAdapter
from beamkit.hypothesis import Hypothesis
from beamkit.search.inputs import unpack_step
from beamkit.search.options import RequestOptions
from beamkit.serve.malloc import IdleTrim
from beamkit.serve.metrics import Metrics
from beamkit.serve.protocol import (
    ApiError,
    Completion,
    Limits,
    parse_body,
    parse_completion,
    trim_stop,
)
from beamkit.serve.runner import Done, Job, QueueFull, Runner, ShuttingDown, Update
from beamkit.strictjson import finite

RETRY_AFTER_S = 1  # what a 503 asks a client to wait
LOG = logging.getLogger("uvicorn.error")  # uvicorn's own server log, so that --log-level governs these lines too


def _error(err: ApiError, metrics: Metrics, headers: dict[str, str] | None = None) -> JSONResponse:
    metrics.response(err.status)
    return StrictJSONResponse(err.body(), status_code=err.status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 as soon as it is known to exceed ``limit`` bytes: from its Content-Length, or
    while a chunked body arrives (the rest is never read)."""
    too_large = ApiError(413, f"the request body exceeds this server's limit of {limit} bytes (--max-body-bytes)")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _disconnected(request: Request) -> None:
    """Return once the client has gone away (the body was read already, so only disconnects arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _choice(adapter: ModelAdapter, c: Completion, h: Hypothesis, index: int) -> dict[str, Any]:
    text, hit = trim_stop(adapter.decode(h.tokens), c.stop)
    out: dict[str, Any] = {
        "index": index,
        "text": text,
        "finish_reason": "stop" if h.finished or hit else "length",
        "logprobs": None,
        "logprob": h.logprob,
        "score": h.score,
    }
    if c.logprobs:
        pieces = [adapter.token_text(t) for t in h.tokens]
        offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        out["logprobs"] = {
            "tokens": pieces,
            "token_logprobs": h.token_logprobs,
            "top_logprobs": [{p: lp} for p, lp in zip(pieces, h.token_logprobs, strict=True)],
            "text_offset": offsets,
        }
    return out


def _body(adapter: ModelAdapter, c: Completion, done: list[Done], rid: str, created: int) -> dict[str, Any]:
    choices = [
        _choice(adapter, c, h, i * c.n + j) for i, d in enumerate(done) for j, h in enumerate(d.hypotheses[: c.n])
    ]
    prompt_tokens = sum(len(ids) for ids in c.prompt_ids)
    completion_tokens = sum(len(d.hypotheses[j].tokens) for d in done for j in range(min(c.n, len(d.hypotheses))))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": adapter.name,
        "choices": choices,
        "usage": usage,
    }


def _failure(done: list[Done]) -> ApiError | None:
    errors = [d.error for d in done if d.error is not None]
    if not errors:
        return None
    return ApiError(500, f"decoding failed: {errors[0]}", None, "server_error")


def dumps(payload: Any) -> str:
    """Strict JSON (a non-finite score or logprob is ``null``): every body and event the server sends."""
    return json.dumps(finite(payload), allow_nan=False)


class StrictJSONResponse(JSONResponse):
    """A JSON response encoded by :func:`dumps`."""

    def render(self, content: Any) -> bytes:
        """The body as strict JSON."""
        return dumps(content).encode()


class KeyCheck:
    """ASGI middleware: every path but ``/health`` needs ``Authorization: Bearer KEY`` (compared in constant
    time); anything else is a 401 with an OpenAI-style error object."""

    OPEN = frozenset({"/health"})

    def __init__(self, app: ASGIApp, key: str, metrics: Metrics):
        self.app, self.key, self.metrics = app, key.encode(), metrics

    def authorized(self, scope: Scope) -> bool:
        """Whether the request carries the key."""
        scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a request without the key; pass the others on."""
        if scope["type"] != "http" or scope["path"] in self.OPEN or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        err = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", None)
        if scope["path"] == "/v1/completions":
            self.metrics.response(401)
        response = StrictJSONResponse(err.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


def _sse(payload: Any) -> str:
    return f"data: {dumps(payload)}\n\n"


class Completions:
    """The handler of ``POST /v1/completions`` (and the small pages beside it) over one :class:`Runner`: a
    request is read and checked whole (:func:`~beamkit.serve.protocol.parse_completion`, then this server's
    limits), its :class:`~beamkit.adapters.Ask` becomes the model's :class:`beamkit.RequestOptions`
    (:meth:`~beamkit.adapters.ModelAdapter.request`), each prompt is one :class:`Job` holding them, and the
    answer is one JSON body or a stream of events."""

    def __init__(self, adapter: ModelAdapter, runner: Runner, limits: Limits, tries: dict[str, Any] | None):
        self.adapter, self.runner, self.metrics, self.limits = adapter, runner, runner.metrics, limits
        self.tries = dict(tries or {})
        self.numbers = itertools.count(1)  # requests take turns for rows by this number
        self.started = int(time.time())
        # once the engine has been idle a while, the freed key/value buffers go back to the system (glibc)
        self.idle_trim = IdleTrim(lambda: runner.engine.idle and not runner.depth)

    async def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the one served model."""
        a = self.adapter
        entry = {"id": a.name, "object": "model", "created": self.started, "owned_by": a.owned_by}
        return {"object": "list", "data": [entry]}

    async def health(self) -> JSONResponse:
        """``GET /health``: up, the model, the waiting requests."""
        return JSONResponse({"status": "ok", "model": self.adapter.name, "queue": self.runner.depth})

    async def prometheus(self) -> PlainTextResponse:
        """``GET /metrics``: Prometheus' text format."""
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def complete(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        try:
            c = parse_completion(parse_body(await _read_body(request, self.limits.max_body_bytes)), self.adapter)
            self.check_limits(c)
            options = self.request_options(c)
        except ApiError as err:
            return _error(err, self.metrics)
        except ClientDisconnect:  # a client's own doing, not a server fault: one line at info, no traceback
            client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
            LOG.info("%s went away before sending the whole request body; nothing was decoded", client)
            self.metrics.response(499)
            return Response(status_code=499)
        events: asyncio.Queue[tuple[int, Update | Done]] = asyncio.Queue()
        jobs = self.jobs(c, options, events)
        try:
            self.runner.submit(jobs)
        except QueueFull as exc:
            busy = ApiError(503, f"the server is busy: {exc}; retry later", None, "server_busy")
            return _error(busy, self.metrics, {"Retry-After": str(RETRY_AFTER_S)})
        except ShuttingDown as exc:
            return _error(ApiError(503, str(exc), None, "server_busy"), self.metrics)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if c.stream:
            self.metrics.response(200)
            stream = _stream(request, self.runner, self.adapter, c, jobs, events, rid, created, self.idle_trim)
            return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self.answer(request, c, jobs, events, rid, created)

    def check_limits(self, c: Completion) -> None:
        """This server's limits on a checked request: a dictionary it loaded, the beam within ``max_rows``, the
        request's cost within ``max_request_cost`` (ApiError 400 naming each)."""
        limits = self.limits
        if c.trie is not None and c.trie not in self.tries:
            have = ", ".join(repr(name) for name in self.tries) or "none (start it with --trie NAME=FILE)"
            raise ApiError(400, f"no dictionary {c.trie!r}; this server loaded {have}", "trie")
        table = self.runner.table
        if c.trie is not None and table is not None and table.vocab_size is not None:
            trie = self.tries[c.trie]
            if trie.max_id >= table.vocab_size:  # known once the model has run: the request fails alone, here
                raise ApiError(
                    400,
                    f"the dictionary {c.trie!r} holds token id {trie.max_id} but the model's vocabulary has "
                    f"{table.vocab_size} ids: it cannot constrain this model",
                    "trie",
                )
        if c.beam > limits.max_rows:
            raise ApiError(400, f"'best_of' ({c.beam}) exceeds the server's --max-rows {limits.max_rows}", "best_of")
        cost = len(c.prompt_ids) * c.beam * c.max_tokens
        if cost > limits.max_request_cost:
            raise ApiError(
                400,
                f"the request asks for {len(c.prompt_ids)} prompts x {c.beam} beams ('best_of') x {c.max_tokens} "
                f"'max_tokens' = {cost} beam steps; this server takes at most {limits.max_request_cost} per "
                "request (--max-request-cost): send fewer prompts, a narrower beam or fewer tokens",
            )

    def request_options(self, c: Completion) -> RequestOptions:
        """The model's engine options for the request (ApiError 400 for settings it refuses, or that a running
        engine shared by other requests cannot apply as the model would alone)."""
        ask = c.ask()
        try:
            options = self.adapter.request(ask)
            refusal = self.adapter.continuous_refusal(ask)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, str(exc)) from exc
        if refusal is not None:
            raise ApiError(400, f"this server cannot decode the request as the model would alone: {refusal}")
        return options

    def jobs(
        self, c: Completion, options: RequestOptions, events: asyncio.Queue[tuple[int, Update | Done]]
    ) -> list[Job]:
        """One job per prompt, each delivering its events to ``events`` tagged with the prompt's index."""
        loop, number = asyncio.get_running_loop(), next(self.numbers)

        def deliver_to(i: int) -> Any:
            def deliver(event: Update | Done) -> None:
                events.put_nowait((i, event))

            return deliver

        return [
            Job(ids, options, c.stream, deliver_to(i), loop, request=number, trie=c.trie)
            for i, ids in enumerate(c.prompt_ids)
        ]

    async def answer(
        self,
        request: Request,
        c: Completion,
        jobs: list[Job],
        events: asyncio.Queue[tuple[int, Update | Done]],
        rid: str,
        created: int,
    ) -> Response:
        """The JSON answer once every job is done (499 when the client went away first, its jobs cancelled)."""
        done = await _collect(request, self.runner, jobs, events)
        self.idle_trim.poke()
        if done is None:
            self.metrics.response(499)
            return Response(status_code=499)
        failure = _failure(done)
        if failure is not None:
            return _error(failure, self.metrics)
        body = _body(self.adapter, c, done, rid, created)
        self.metrics.generated(body["usage"]["completion_tokens"])
        self.metrics.response(200)
        return StrictJSONResponse(body)


def create_app(
    adapter: ModelAdapter,
    max_queue: int = Limits.max_queue,
    max_rows: int = Limits.max_rows,
    api_key: str | None = None,
    max_body_bytes: int = Limits.max_body_bytes,
    max_request_cost: int = Limits.max_request_cost,
    max_request_rows: int | None = None,
    api_docs: bool = False,
    tries: dict[str, Any] | None = None,
    vocab_size: int | None = None,
) -> FastAPI:
    """The FastAPI application serving ``adapter``'s model; its engine thread runs for the app's lifespan.

    ``api_key``: when set, every endpoint but ``/health`` needs ``Authorization: Bearer API_KEY`` (401 otherwise).
    ``max_body_bytes``: a larger request body is a 413. ``max_request_cost``: prompts x beam width x
    ``max_tokens`` of one request at most (400 beyond). ``max_request_rows``: beam rows one request holds at
    most, leaving room for requests that arrive behind it (default half of ``max_rows``). ``api_docs``: serve the
    API description pages ``/docs``, ``/redoc`` and ``/openapi.json`` (off by default: they describe the server
    to anyone who reaches it; with ``api_key`` they need the key like every other page). ``tries``: dictionaries
    by name (:class:`beamkit.Trie`); a request's ``"trie": NAME`` constrains its outputs to that one (an unknown
    name is a 400). Each dictionary is checked against the model's vocabulary here (``vocab_size``, else
    :func:`model_vocab`): one holding an id past it is a ValueError naming it, and the server does not start.
    """
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty")
    limits = Limits(max_body_bytes, max_request_cost, max_rows, max_queue)
    if max_request_rows is not None:
        check_int("max_request_rows", max_request_rows, 1, max_rows)
        limits = replace(limits, request_rows=max_request_rows)
    metrics = Metrics(adapter.name)
    if tries and vocab_size is None:
        vocab_size = model_vocab(adapter)
    runner = Runner(adapter, metrics, limits, tries=tries, vocab_size=vocab_size)
    handler = Completions(adapter, runner, limits, tries)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner.start()
        yield
        await asyncio.to_thread(runner.close)

    pages: dict[str, Any] = (
        {} if check_bool("api_docs", api_docs) else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    )
    app = FastAPI(title="beamkit serve", lifespan=lifespan, default_response_class=StrictJSONResponse, **pages)
    if api_key is not None:
        app.add_middleware(KeyCheck, key=api_key, metrics=metrics)
    app.state.runner, app.state.metrics, app.state.idle_trim = runner, metrics, handler.idle_trim
    app.add_api_route("/v1/models", handler.models, methods=["GET"])
    app.add_api_route("/health", handler.health, methods=["GET"])
    app.add_api_route("/metrics", handler.prometheus, methods=["GET"])
    app.add_api_route("/v1/completions", handler.complete, methods=["POST"])
    return app


def model_vocab(adapter: ModelAdapter) -> int | None:
    """The width of the model's logits (the ids a dictionary may hold): an adapter's ``vocab_size`` where it sets
    one, a Hugging Face model's output layer, else one model step on the prompt ``"a"``; None where none of
    these works (a dictionary is then checked at the first step)."""
    size: Any = getattr(adapter, "vocab_size", None)
    if is_int(size):
        return int(size)
    output = getattr(getattr(adapter, "model", None), "get_output_embeddings", None)
    weight = getattr(output() if callable(output) else None, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    try:
        with adapter.step_context():
            state = adapter.init_state([adapter.encode("a")])
            logits = unpack_step(adapter.step_fn(state, np.full(1, adapter.bos, np.int64)))[0]
        return int(logits.shape[1])
    except Exception:  # noqa: BLE001 - a model that cannot take this prompt: checked at the first step instead
        return None


async def _next(
    events: asyncio.Queue[tuple[int, Update | Done]], gone: asyncio.Future[None]
) -> tuple[int, Update | Done] | None:
    """The next event of a request's jobs, or None once the client has disconnected."""
    get = asyncio.ensure_future(events.get())
    waiting: set[asyncio.Future[Any]] = {get, gone}
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    return None


async def _events(
    request: Request, runner: Runner, jobs: list[Job], events: asyncio.Queue[tuple[int, Update | Done]]
) -> AsyncGenerator[tuple[int, Update | Done], None]:
    """Each job's events ``(prompt index, event)`` as they come, until every job is done or the client
    disconnects (the iteration then ends early); whatever job is not done when it ends is cancelled."""
    finished: set[int] = set()
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        while len(finished) < len(jobs):
            got = await _next(events, gone)
            if got is None:
                return
            if isinstance(got[1], Done):
                finished.add(got[0])
            yield got
    finally:
        gone.cancel()
        for i, job in enumerate(jobs):
            if i not in finished:
                runner.cancel(job)


async def _collect(
    request: Request, runner: Runner, jobs: list[Job], events: asyncio.Queue[tuple[int, Update | Done]]
) -> list[Done] | None:
    """Every job's :class:`Done`, in prompt order; None (and the jobs cancelled) if the client disconnects."""
    done: dict[int, Done] = {}
    async with contextlib.aclosing(_events(request, runner, jobs, events)) as stream:
        async for i, event in stream:
            if isinstance(event, Done):
                done[i] = event
    return [done[i] for i in range(len(jobs))] if len(done) == len(jobs) else None


async def _stream(
    request: Request,
    runner: Runner,
    adapter: ModelAdapter,
    c: Completion,
    jobs: list[Job],
    events: asyncio.Queue[tuple[int, Update | Done]],
    rid: str,
    created: int,
    idle_trim: IdleTrim,
) -> AsyncIterator[str]:
    """Server-sent events: progress (replace semantics), the final n-best, ``[DONE]``."""
    done: dict[int, Done] = {}
    async with contextlib.aclosing(_events(request, runner, jobs, events)) as stream:
        async for i, event in stream:
            if isinstance(event, Done):
                done[i] = event
                continue
            h = event.hypothesis
            text, _ = trim_stop(adapter.decode(h.tokens), c.stop)
            yield _sse(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": adapter.name,
                    "choices": [{"index": i * c.n, "text": text, "finish_reason": None, "logprobs": None}],
                    "beamkit": {"replace": True, "prompt_index": i, "step": event.step, "score": h.score},
                }
            )
    idle_trim.poke()
    if len(done) < len(jobs):
        return  # the client is gone
    ordered = [done[i] for i in range(len(jobs))]
    failure = _failure(ordered)
    if failure is not None:
        yield _sse(failure.body())
    else:
        body = _body(adapter, c, ordered, rid, created)
        runner.metrics.generated(body["usage"]["completion_tokens"])
        yield _sse({**body, "beamkit": {"final": True}})
    yield "data: [DONE]\n\n"
