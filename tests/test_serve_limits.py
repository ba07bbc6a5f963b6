"""``beamkit serve``'s limits and what it logs: the waiting list counts requests, the command refuses limits that
contradict each other, the API description pages are off unless asked for, a client that goes away mid-body is
one short log line, a pickle that holds code is refused in one line.

Servers run on a free 127.0.0.1 port (uvicorn in a thread of this process); the runner tests drive the engine
one iteration at a time, with no thread and no clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("fastapi")

from beamkit.scoring import as_length_penalty  # noqa: E402
from beamkit.serve.metrics import Metrics  # noqa: E402
from beamkit.serve.runner import Job, QueueFull, Runner  # noqa: E402
from tests.serve_toy import ToyAdapter  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_job(loop: asyncio.AbstractEventLoop, prompt: str, request: int, beam: int = 2) -> Job:
    options = {"beam_size": beam, "max_len": 5, "min_len": 5, "num_return": beam,
               "length_penalty": as_length_penalty(1.0), "early_stopping": False}  # fmt: skip
    return Job(tuple(ToyAdapter().encode(prompt)), options, beam, False, lambda event: None, loop, request=request)


# ------------------------------------------------------------------------------------------------ the queue
def test_the_queue_counts_requests_not_prompts():
    """--max-queue 64 (the default): one waiting request of 64 prompts leaves room for 63 more requests, and a
    request with more prompts than --max-queue is taken when the queue is empty (it used to be refused for ever)."""
    loop = asyncio.new_event_loop()
    try:
        runner = Runner(ToyAdapter(), Metrics("toy"), max_queue=64, max_rows=8)
        runner.submit([toy_job(loop, "abc", request=1) for _ in range(64)])
        assert runner.depth == 1
        for r in range(2, 65):
            runner.submit([toy_job(loop, "bad", request=r)])
        assert runner.depth == 64 and runner.metrics.queue_depth == 64
        with pytest.raises(QueueFull, match="64 requests are waiting"):
            runner.submit([toy_job(loop, "cab", request=65)])
        runner.iterate()  # the heavy request's first prompts join the engine with a few small ones
        running = {job.request for job in runner._running.values()}
        assert 1 in running and runner.depth == 64 - len(running - {1})  # the heavy one still waits (62 prompts)
        runner.cancel(runner._waiting[-1])  # the last small request goes away while it waits
        runner.iterate()
        assert runner.depth == 63 - len({job.request for job in runner._running.values()} - {1})
        runner.submit([toy_job(loop, "cab", request=65)])

        small = Runner(ToyAdapter(), Metrics("toy"), max_queue=2, max_rows=8)
        small.submit([toy_job(loop, "abc", request=1) for _ in range(5)])
        small.submit([toy_job(loop, "bad", request=2)])
        with pytest.raises(QueueFull):
            small.submit([toy_job(loop, "cab", request=3)])
    finally:
        loop.close()


# ------------------------------------------------------------------------------------------------ the command
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--max-request-rows", "300"], ("--max-request-rows 300", "--max-rows 256")),
        (["--max-rows", "8", "--max-request-rows", "9"], ("--max-request-rows 9", "--max-rows 8")),
    ],
)
def test_a_request_share_above_the_engine_rows_is_a_usage_error(capsys, argv, needles):
    """Refused in one line, exit 2, before the model is loaded (it used to be taken, and the share meant
    nothing)."""
    from beamkit.cli import main
    from tests.test_adapters import cli_error

    code, line = cli_error(capsys, main, ["serve", "--port", "0", "--model", "no/such/checkpoint", *argv])
    assert code == 2 and line.startswith("beamkit serve: error:")
    assert all(n in line for n in needles), line


def test_the_api_refuses_a_request_share_above_the_engine_rows():
    from beamkit.serve.app import create_app

    with pytest.raises(ValueError, match="max_request_rows must be between 1 and 8, got 9"):
        create_app(ToyAdapter(), max_rows=8, max_request_rows=9)
    with pytest.raises(ValueError, match="request_rows must be between 1 and 8, got 9"):
        Runner(ToyAdapter(), Metrics("toy"), max_rows=8, request_rows=9)
    create_app(ToyAdapter(), max_rows=8, max_request_rows=8)  # equal is fine: one request may fill the engine


# ------------------------------------------------------------------------------------------------ API pages
PAGES = ("/docs", "/redoc", "/openapi.json")


def test_the_api_description_pages_are_off_unless_asked_for():
    """/docs, /redoc and /openapi.json describe every route to whoever reaches the server: 404 by default; with
    api_docs they are served, and behind the key when there is one."""
    from starlette.testclient import TestClient

    from beamkit.serve.app import create_app

    client = TestClient(create_app(ToyAdapter()))
    assert [client.get(p).status_code for p in PAGES] == [404, 404, 404]
    client = TestClient(create_app(ToyAdapter(), api_docs=True))
    assert [client.get(p).status_code for p in PAGES] == [200, 200, 200]
    assert "/v1/completions" in client.get("/openapi.json").json()["paths"]
    client = TestClient(create_app(ToyAdapter(), api_docs=True, api_key="k3y"))
    assert [client.get(p).status_code for p in PAGES] == [401, 401, 401]
    key = {"Authorization": "Bearer k3y"}
    assert [client.get(p, headers=key).status_code for p in PAGES] == [200, 200, 200]


@pytest.mark.parametrize(("flag", "status"), [([], 404), (["--api-docs"], 200)])
def test_the_command_serves_the_api_pages_only_with_the_flag(monkeypatch, flag, status):
    """``beamkit serve`` builds its app with the pages only under ``--api-docs`` (the app is taken from the
    command instead of being served)."""
    from starlette.testclient import TestClient

    import beamkit.cli.serve
    from beamkit.cli import main

    served: list[Any] = []
    monkeypatch.setattr(beamkit.cli.serve, "run_server", lambda app, *args, **kw: served.append(app) or 0)
    assert main(["serve", "--port", "0", "--model", "dates-seq2seq", *flag]) == 0
    assert [TestClient(served[0]).get(p).status_code for p in PAGES] == [status] * 3
