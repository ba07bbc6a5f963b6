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

from beamkit import RequestOptions  # noqa: E402
from beamkit.scoring import as_length_penalty  # noqa: E402
from beamkit.serve.metrics import Metrics  # noqa: E402
from beamkit.serve.runner import Job, Limits, QueueFull, Runner  # noqa: E402
from tests.serve_toy import ToyAdapter  # noqa: E402
from tests.test_serve_models import hf_dir, pickled_dir  # noqa: E402, F401, F811 (fixtures)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_job(loop: asyncio.AbstractEventLoop, prompt: str, request: int, beam: int = 2) -> Job:
    options = RequestOptions(**{"beam_size": beam, "max_len": 5, "min_len": 5, "num_return": beam,
               "length_penalty": as_length_penalty(1.0), "early_stopping": False})  # fmt: skip
    return Job(tuple(ToyAdapter().encode(prompt)), options, False, lambda event: None, loop, request=request)


# ------------------------------------------------------------------------------------------------ the queue
def test_the_queue_counts_requests_not_prompts():
    """--max-queue 64 (the default): one waiting request of 64 prompts leaves room for 63 more requests, and a
    request with more prompts than --max-queue is taken when the queue is empty (it used to be refused for ever)."""
    loop = asyncio.new_event_loop()
    try:
        runner = Runner(ToyAdapter(), Metrics("toy"), Limits(max_queue=64, max_rows=8))
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

        small = Runner(ToyAdapter(), Metrics("toy"), Limits(max_queue=2, max_rows=8))
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
        Runner(ToyAdapter(), Metrics("toy"), Limits(max_rows=8, request_rows=9))
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


# ------------------------------------------------------------------------------------------------ pickles
class _Runs:
    """Unpickling it runs ``os.system(command)``."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self) -> Any:
        import os

        return (os.system, (self.command,))


@pytest.fixture(scope="module")
def code_pickle_dir(hf_dir, tmp_path_factory):  # noqa: F811 (the fixture)
    """The tiny GPT-2 with pickled weights whose state dict also holds an object that runs a shell command when
    unpickled (it would create ``ran``)."""
    import shutil

    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny-gpt2-code")
    for f in hf_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), use_safetensors=True)
    weights = dict(model.state_dict())
    weights["lm_head.extra"] = _Runs(f"touch {folder / 'ran'}")
    torch.save(weights, folder / "pytorch_model.bin")
    return folder


def test_serving_a_pickle_that_holds_code_is_one_line(capsys, code_pickle_dir):
    """--allow-pickle lets a trusted folder's pickled weights load; a pickle that would run code is still refused,
    in one line naming it, and nothing in it runs (it used to end in a 12-frame traceback from torch)."""
    import os

    from beamkit.cli import main
    from tests.test_adapters import cli_error

    argv = ["serve", "--port", "0", "--allow-pickle", "--model", f"hf:{code_pickle_dir}"]
    code, line = cli_error(capsys, main, argv)
    assert code == 2 and line.startswith("beamkit serve: error:")
    assert "the pickle holds code" in line and "pytorch_model.bin" in line
    assert f"{os.system.__module__}.system" in line
    assert not (code_pickle_dir / "ran").exists()


def test_the_pickle_check_reads_every_format_and_passes_weights(tmp_path, pickled_dir):  # noqa: F811
    """Weights in torch's zip and legacy formats pass, whatever tensors they hold; code is found in both formats
    and in plain pickles of every protocol; a callable the file names by an extension code is refused too."""
    import os
    import pickle

    import torch

    from beamkit.hf.pickles import code_in_pickle

    assert code_in_pickle(pickled_dir / "pytorch_model.bin") is None
    tensors = {"a": torch.zeros(3, dtype=torch.bfloat16), "p": torch.nn.Parameter(torch.ones(2)), "i": [1, (2, "x")]}
    system = f"{os.system.__module__}.system"
    for legacy in (False, True):
        torch.save(tensors, tmp_path / "w.bin", _use_new_zipfile_serialization=not legacy)
        assert code_in_pickle(tmp_path / "w.bin") is None
        torch.save({**tensors, "x": _Runs("true")}, tmp_path / "w.bin", _use_new_zipfile_serialization=not legacy)
        assert code_in_pickle(tmp_path / "w.bin") == system
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        (tmp_path / "p.pkl").write_bytes(pickle.dumps({"w": [1.0], "x": _Runs("true")}, protocol=protocol))
        assert code_in_pickle(tmp_path / "p.pkl") == system, protocol
    (tmp_path / "ext.pkl").write_bytes(b"\x80\x02\x82\x01)R.")  # EXT1 1, an empty tuple, REDUCE
    assert code_in_pickle(tmp_path / "ext.pkl") == "a callable whose name it computes"
    (tmp_path / "text.bin").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="text.bin is not a pickle"):
        code_in_pickle(tmp_path / "text.bin")


# ------------------------------------------------------------------------------------------------ what is logged
DISCONNECT_SERVER = """
import sys
from beamkit.serve.app import create_app
from beamkit.cli.serve import run_server
from tests.serve_toy import ToyAdapter
sys.exit(run_server(create_app(ToyAdapter()), "127.0.0.1", int(sys.argv[1]), sys.argv[2]))
"""


@pytest.mark.parametrize("level", ["warning", "info"])
def test_a_client_gone_mid_body_is_one_info_line_not_a_traceback(level):
    """A real server process on a free loopback port, at the command's default log level and at info; three raw
    clients each send the headers and part of the body, then close. At warning nothing is logged, at info one
    line per client; never a traceback. The server still answers, then ends by SIGTERM (its PID only)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import beamkit
    from tests.test_serve import _up, free_port, post, wait_until

    root = Path(__file__).resolve().parents[1]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    under_test = Path(beamkit.__file__).resolve().parents[1]  # the server runs the beamkit this test imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(under_test), str(root)])}
    argv = [sys.executable, "-c", DISCONNECT_SERVER, str(port), level]
    proc = subprocess.Popen(argv, env=env, cwd=root, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _up(url), timeout=60)
        head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                raw.sendall(head + b"Content-Length: 100\r\n\r\n" + b'{"model": "toy", ')
                time.sleep(0.2)  # the body is being read when the client closes
        assert post(url, {"model": "toy", "prompt": "abc"}).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "Traceback" not in err and "ClientDisconnect" not in err and "ERROR" not in err, err
    gone = [line for line in err.splitlines() if "went away before sending the whole request body" in line]
    assert len(gone) == (3 if level == "info" else 0), err
