"""``beamkit serve`` over HTTP: the API, behaviour under load and faults, outputs against the offline decoders.

Servers run on a free 127.0.0.1 port: in-process uvicorn in a thread (``serving``), or a subprocess ended by its
PID (the SIGTERM test). Oracles: ``beamkit translate`` (the dates models), ``beamkit.hf.generate`` (a tiny GPT-2
built offline), and each toy request decoded alone with ``search_batch``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from beamkit.serve.app import create_app  # noqa: E402
from tests.serve_toy import ToyAdapter, toy_alone  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(adapter: Any, **options: Any) -> Iterator[tuple[str, Any]]:
    """The app for ``adapter`` served by uvicorn in a thread on a free loopback port: (base url, app)."""
    app = create_app(adapter, **options)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(20)


def post(url: str, body: Any, timeout: float = 60.0) -> Any:
    """POST a completions request (a dict as JSON, bytes as they are)."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/v1/completions", content=content, timeout=timeout)


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of ``GET /metrics`` (0 when absent)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        base, _, rest = key.partition("{")
        got = dict(p.split("=", 1) for p in rest.rstrip("}").split(",")) if rest else {}
        if base == name and all(got.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return 0.0


def wait_until(check: Any, timeout: float = 20.0) -> None:
    """Poll ``check()`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn(*args)`` in a thread; its result lands in the dict under "out" (or "error")."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def texts(response: Any) -> list[tuple[str, float]]:
    return [(c["text"], c["logprob"]) for c in response.json()["choices"]]


def same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> None:
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-5)


def sse_events(response_lines: Any) -> list[Any]:
    """The ``data:`` payloads of a server-sent event stream (JSON decoded, ``[DONE]`` kept as the string)."""
    out = []
    for line in response_lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ------------------------------------------------------------------------------------------------ the API
def test_models_health_and_metrics():
    with serving(ToyAdapter()) as (url, _):
        models = httpx.get(f"{url}/v1/models").json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["toy"]
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        r = post(url, {"model": "toy", "prompt": "abc", "best_of": 3, "n": 2})
        assert r.status_code == 200
        assert metric(url, "beamkit_requests_total", status="200") == 1
        assert metric(url, "beamkit_engine_requests_total", outcome="completed") == 1
        assert metric(url, "beamkit_prompt_tokens_total") == 3
        assert metric(url, "beamkit_generation_tokens_total") == r.json()["usage"]["completion_tokens"] > 0
        calls = metric(url, "beamkit_model_calls_total")
        assert calls >= 1 and metric(url, "beamkit_step_seconds_count") == calls
        assert metric(url, "beamkit_step_rows_count") == calls
        assert metric(url, "beamkit_queue_depth") == 0 and metric(url, "beamkit_running_requests") == 0


def test_completion_matches_the_request_decoded_alone():
    with serving(ToyAdapter()) as (url, _):
        r = post(url, {"model": "toy", "prompt": ["abc", "bad"], "best_of": 3, "n": 2, "max_tokens": 12})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    same(texts(r)[:2], toy_alone("abc", 3, 2, 12))
    same(texts(r)[2:], toy_alone("bad", 3, 2, 12))
    assert body["usage"]["prompt_tokens"] == 6
    assert body["object"] == "text_completion" and body["model"] == "toy"


def test_logprobs_and_finish_reason():
    with serving(ToyAdapter()) as (url, _):
        r = post(url, {"model": "toy", "prompt": "bad", "best_of": 3, "n": 2, "logprobs": 1, "max_tokens": 2})
    for choice in r.json()["choices"]:
        lp = choice["logprobs"]
        assert sum(lp["token_logprobs"]) == pytest.approx(choice["logprob"])
        finished = lp["tokens"][-1] == "<eos>"
        assert choice["finish_reason"] == ("stop" if finished else "length")
        assert "".join(t for t in lp["tokens"] if t != "<eos>") == choice["text"]
        assert lp["text_offset"][1:] == [len("".join(lp["tokens"][:i])) for i in range(1, len(lp["tokens"]))]


def test_stop_sequences_cut_the_text():
    body = {"model": "toy", "prompt": "abc", "best_of": 3, "n": 3, "max_tokens": 12}
    full = toy_alone("abc", 3, 3, 12)
    longest = max((t for t, _ in full), key=len)
    stop = longest[2:4]  # some text inside the longest hypothesis
    with serving(ToyAdapter()) as (url, _):
        r = post(url, {**body, "stop": [stop, "zz"]})
    for choice, (text, _) in zip(r.json()["choices"], full, strict=True):
        at = text.find(stop)
        assert choice["text"] == (text[:at] if at >= 0 else text)
        if at >= 0:
            assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        ({"prompt": "abc"}, 400, "model"),
        ({"model": "gpt-5", "prompt": "abc"}, 404, "model"),
        ({"model": "toy"}, 400, "prompt"),
        ({"model": "toy", "prompt": 7}, 400, "prompt"),
        ({"model": "toy", "prompt": []}, 400, "prompt"),
        ({"model": "toy", "prompt": "xyz"}, 400, "prompt"),
        ({"model": "toy", "prompt": "a" * 33}, 400, "prompt"),
        ({"model": "toy", "prompt": "abc", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "toy", "prompt": "abc", "max_tokens": "5"}, 400, "max_tokens"),
        ({"model": "toy", "prompt": "abc", "n": 3, "best_of": 2}, 400, "n"),
        ({"model": "toy", "prompt": "abc", "best_of": 0}, 400, "best_of"),
        ({"model": "toy", "prompt": "abc", "use_beam_search": True}, 400, "best_of"),
        ({"model": "toy", "prompt": "abc", "length_penalty": "x"}, 400, "length_penalty"),
        ({"model": "toy", "prompt": "abc", "early_stopping": "soon"}, 400, "early_stopping"),
        ({"model": "toy", "prompt": "abc", "early_stopping": 1}, 400, "early_stopping"),
        ({"model": "toy", "prompt": "abc", "min_tokens": 20, "max_tokens": 10}, 400, "min_tokens"),
        ({"model": "toy", "prompt": "abc", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"model": "toy", "prompt": "abc", "stop": [""]}, 400, "stop"),
        ({"model": "toy", "prompt": "abc", "logprobs": 5}, 400, "logprobs"),
        ({"model": "toy", "prompt": "abc", "stream": "yes"}, 400, "stream"),
        ({"model": "toy", "prompt": "abc", "temperature": 0.7}, 400, "temperature"),
        ({"model": "toy", "prompt": "abc", "frequency_penalty": 0.5}, 400, "frequency_penalty"),
        ({"model": "toy", "prompt": "abc", "best_of": 9}, 400, "best_of"),  # over --max-rows 8
    ],
)
def test_bad_requests_are_refused_before_the_engine(body, status, param):
    toy = ToyAdapter()
    with serving(toy, max_rows=8) as (url, _):
        r = post(url, body)
        assert r.status_code == status
        error = r.json()["error"]
        assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"
        if param is not None:
            assert param in error["message"]
        assert metric(url, "beamkit_requests_total", status=str(status)) == 1
    assert toy.inits == [] and toy.calls == []


def test_beam_search_spellings():
    """vLLM's use_beam_search with n as the width, and best_of, decode the same beam."""
    with serving(ToyAdapter()) as (url, _):
        a = post(url, {"model": "toy", "prompt": "fed", "use_beam_search": True, "n": 3})
        b = post(url, {"model": "toy", "prompt": "fed", "best_of": 3, "n": 3})
    assert texts(a) == texts(b)
    same(texts(a), toy_alone("fed", 3, 3, 12))


# ------------------------------------------------------------------------------------------------ streaming
def test_stream_replaces_then_ends_with_the_same_n_best():
    body = {"model": "toy", "prompt": ["abc", "hgf"], "best_of": 4, "n": 3, "max_tokens": 12, "logprobs": 1}
    with serving(ToyAdapter()) as (url, _):
        plain = post(url, body).json()
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    final, progress = events[-2], events[:-2]
    assert final["beamkit"] == {"final": True}
    assert final["choices"] == plain["choices"] and final["usage"] == plain["usage"]
    assert progress, "no progress event"
    for i in (0, 1):
        mine = [e for e in progress if e["beamkit"]["prompt_index"] == i]
        steps = [e["beamkit"]["step"] for e in mine]
        assert steps == sorted(set(steps)) and steps[0] == 1
        assert all(e["beamkit"]["replace"] and e["choices"][0]["index"] == i * 3 for e in mine)
        assert all(e["choices"][0]["finish_reason"] is None for e in mine)
        # the first event is the best one-token prefix, which the full n-best extends
        assert len(mine[0]["choices"][0]["text"]) == 1


# ------------------------------------------------------------------------------------------------ load and faults
def test_queue_bound_answers_503_with_retry_after():
    toy = ToyAdapter(delay=0.05)
    short = {"model": "toy", "best_of": 2, "max_tokens": 10}
    with serving(toy, max_queue=2, max_rows=2) as (url, _):
        first, box = in_thread(post, url, {**short, "prompt": "abc", "max_tokens": 80, "min_tokens": 80})
        wait_until(lambda: metric(url, "beamkit_running_requests") == 1)
        waiting = [in_thread(post, url, {**short, "prompt": p}) for p in ("bad", "cab")]
        wait_until(lambda: metric(url, "beamkit_queue_depth") == 2)
        r = post(url, {**short, "prompt": "fed"})
        assert first.is_alive()  # the queue was full behind a running request
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_busy"
        for t, b in [(first, box), *waiting]:
            t.join(60)
            assert b["out"].status_code == 200
        assert max(toy.calls) <= 2  # --max-rows: never more than one 2-beam request in the engine
        assert len(toy.inits) == 3


def test_disconnect_cancels_the_request():
    toy = ToyAdapter(delay=0.02)
    body = {"model": "toy", "prompt": "abc", "best_of": 3, "max_tokens": 400, "min_tokens": 400}
    with serving(toy) as (url, _):
        with pytest.raises(httpx.ReadTimeout):
            post(url, body, timeout=0.5)
        wait_until(lambda: metric(url, "beamkit_engine_requests_total", outcome="cancelled") == 1)
        assert metric(url, "beamkit_running_requests") == 0
        calls = len(toy.calls)
        assert calls < 200  # it left long before its 400 steps
        time.sleep(0.2)
        assert len(toy.calls) == calls  # no more model calls: its rows are gone
        # a streaming client that goes away after the first event
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
            next(r.iter_lines())
        wait_until(lambda: metric(url, "beamkit_engine_requests_total", outcome="cancelled") == 2)
        assert metric(url, "beamkit_running_requests") == 0


def test_nan_request_fails_alone():
    toy = ToyAdapter(delay=0.05, nan_at=3)
    body = {"model": "toy", "best_of": 3, "n": 2, "max_tokens": 12, "min_tokens": 8}
    with serving(toy) as (url, _):
        a, box_a = in_thread(post, url, {**body, "prompt": "abc"})
        wait_until(lambda: metric(url, "beamkit_running_requests") == 1)
        bad, box_bad = in_thread(post, url, {**body, "prompt": "nan"})
        b, box_b = in_thread(post, url, {**body, "prompt": "hgf"})
        for t in (a, bad, b):
            t.join(60)
    r = box_bad["out"]
    assert r.status_code == 500
    assert "NaN" in r.json()["error"]["message"] and r.json()["error"]["type"] == "server_error"
    assert max(toy.calls) > 3  # the three were decoded together
    want = {p: toy_alone(p, 3, 2, 12, min_len=8) for p in ("abc", "hgf")}
    same(texts(box_a["out"]), want["abc"])
    same(texts(box_b["out"]), want["hgf"])


SERVER_SCRIPT = """
import sys
from beamkit.serve.app import create_app
from beamkit.cli.serve import run_server
from tests.serve_toy import ToyAdapter
sys.exit(run_server(create_app(ToyAdapter(delay=0.1)), "127.0.0.1", int(sys.argv[1])))
"""


def test_sigterm_finishes_running_requests_then_exits_0():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(port)], env=env, cwd=ROOT)
    try:
        wait_until(lambda: _up(url), timeout=60)
        body = {"model": "toy", "prompt": "abc", "best_of": 2, "n": 2, "max_tokens": 50, "min_tokens": 50}
        t, box = in_thread(post, url, body)
        wait_until(lambda: metric(url, "beamkit_running_requests") == 1)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: not _up(url), timeout=10)  # new connections are refused ...
        assert t.is_alive()  # ... while the running request goes on
        t.join(60)
        assert box["out"].status_code == 200
        same(texts(box["out"]), toy_alone("abc", 2, 2, 50, min_len=50))
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


# ------------------------------------------------------------------------------------------------ command line
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--port", "-1"], "--port"),
        (["--max-queue", "0"], "--max-queue"),
        (["--max-rows", "0"], "--max-rows"),
        (["--model", "no/such/checkpoint"], "checkpoint not found"),
        (["--model", "hf:no/such/dir"], "not a Hugging Face model directory"),
        (["--model", "hf:"], "hf:DIR"),
    ],
)
def test_cli_refuses_bad_arguments_in_one_line(capsys, argv, needle):
    from beamkit.cli import main
    from tests.test_adapters import cli_error

    code, line = cli_error(capsys, main, ["serve", *argv])
    assert code == 2 and line.startswith("beamkit serve: error:") and needle in line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--threads", "0"], "--threads"),
        (["--log-level", "bogus"], "--log-level"),
        (["--host", "256.0.0.1"], "256.0.0.1"),
    ],
)
def test_cli_refuses_bad_server_options_in_one_line(capsys, argv, needle):
    from beamkit.cli import main
    from tests.test_adapters import cli_error

    code, line = cli_error(capsys, main, ["serve", "--port", "0", *argv])
    assert code == 2 and line.startswith("beamkit serve: error:") and needle in line


def test_cli_port_in_use_is_one_error_line_exit_1(capsys):
    from beamkit.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("beamkit serve: error:") and str(port) in err[0]


@contextlib.contextmanager
def serve_command(*args: str, **env: str) -> Iterator[subprocess.Popen]:
    """``beamkit serve ARGS`` as a subprocess of this checkout (stderr piped as text, ``env`` added to the
    environment); killed at exit unless it has ended (only this PID)."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), **env}
    code = "import sys; from beamkit.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "serve", *args]
    proc = subprocess.Popen(argv, env=full_env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_cli_port_0_reports_the_bound_port_and_reads_the_key_from_the_environment():
    with serve_command("--port", "0", BEAMKIT_API_KEY="k3y") as proc:
        reader, box = in_thread(proc.stderr.readline)
        reader.join(60)
        line = box.get("out", "")
        assert "listening on http://127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1])
        assert port > 0 and _up(f"http://127.0.0.1:{port}")
        models = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(models, timeout=10).status_code == 401
        assert httpx.get(models, headers={"Authorization": "Bearer k3y"}, timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


# ------------------------------------------------------------------------------------------------ strict JSON
def strict_loads(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity, which are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "toy", "prompt": "abc", "length_penalty": -700}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": -1e308}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": 1e308}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": 1e400}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": Infinity}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": -Infinity}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": NaN}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": -700, "stream": true}',
        b'{"model": "toy", "prompt": "abc", "length_penalty": 1' + b"0" * 400 + b"}",
    ],
)
def test_extreme_length_penalty_is_a_400_naming_the_field(body):
    toy = ToyAdapter()
    with serving(toy) as (url, _):
        r = post(url, body)
        assert r.status_code == 400, r.text
        error = strict_loads(r.text)["error"]
        assert error["param"] == "length_penalty" and "length_penalty" in error["message"]
        assert len(error["message"]) < 400
    assert toy.inits == []


def test_non_standard_json_constants_are_refused():
    with serving(ToyAdapter()) as (url, _):
        r = post(url, b'{"model": "toy", "prompt": "abc", "max_tokens": NaN}')
        assert r.status_code == 400 and "NaN" in strict_loads(r.text)["error"]["message"]


def test_deeply_nested_json_is_a_400():
    deep = b"[" * 100_000 + b"]" * 100_000
    with serving(ToyAdapter()) as (url, _):
        for body in (deep, b'{"model": "toy", "prompt": ' + deep + b"}"):
            r = post(url, body)
            assert r.status_code == 400, r.text
            assert "nested" in strict_loads(r.text)["error"]["message"]
        assert httpx.get(f"{url}/health").status_code == 200


def test_every_event_is_strict_json_and_non_finite_scores_are_null():
    from beamkit.serve.app import _sse

    body = {"model": "toy", "prompt": ["abc", "hgf"], "best_of": 3, "n": 2, "length_penalty": 10, "stream": True}
    with serving(ToyAdapter()) as (url, _):
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]" and all(strict_loads(x) for x in lines[:-1])
    event = _sse({"score": float("-inf"), "choices": [{"logprob": float("nan"), "ok": 1.5}]})
    assert strict_loads(event[len("data: ") :]) == {"score": None, "choices": [{"logprob": None, "ok": 1.5}]}


# ------------------------------------------------------------------------------------------------ authentication
def test_api_key_is_required_except_for_health():
    toy = ToyAdapter()
    body = {"model": "toy", "prompt": "abc"}
    with serving(toy, api_key="s3cret") as (url, _):
        assert httpx.get(f"{url}/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}, {"Authorization": ""}):
            for r in (
                httpx.post(f"{url}/v1/completions", json=body, headers=headers),
                httpx.get(f"{url}/v1/models", headers=headers),
                httpx.get(f"{url}/metrics", headers=headers),
            ):
                assert r.status_code == 401, (headers, r.request.url)
                error = strict_loads(r.text)["error"]
                assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
                assert "s3cret" not in r.text
        assert toy.inits == []
        good = {"Authorization": "Bearer s3cret"}
        assert httpx.post(f"{url}/v1/completions", json=body, headers=good).status_code == 200
        assert httpx.get(f"{url}/v1/models", headers={"authorization": "bearer s3cret"}).status_code == 200
        assert "beamkit_requests_total" in httpx.get(f"{url}/metrics", headers=good).text


@pytest.mark.parametrize(
    ("host", "key", "warn"),
    [
        ("127.0.0.1", None, False),
        ("127.0.0.2", None, False),
        ("::1", None, False),
        ("localhost", None, False),
        ("0.0.0.0", None, True),
        ("::", None, True),
        ("192.168.1.20", None, True),
        ("myhost.example", None, True),
        ("0.0.0.0", "k", False),
    ],
)
def test_a_reachable_address_without_a_key_is_warned_about(host, key, warn):
    from beamkit.cli.serve import needs_key_warning

    assert needs_key_warning(host, key) is warn


def test_empty_api_key_is_refused(capsys):
    from beamkit.cli import main

    assert main(["serve", "--port", "0", "--api-key", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--api-key" in err[0]


# ------------------------------------------------------------------------------------------------ limits
def test_a_body_over_the_limit_is_a_413_with_or_without_content_length():
    toy = ToyAdapter()
    big = json.dumps({"model": "toy", "prompt": "a" * 5000}).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    with serving(toy, max_body_bytes=4096) as (url, _):
        r = post(url, big)
        assert r.status_code == 413 and "4096" in strict_loads(r.text)["error"]["message"]
        r = httpx.post(f"{url}/v1/completions", content=chunks(), timeout=60)  # chunked: no Content-Length
        assert r.status_code == 413 and "4096" in strict_loads(r.text)["error"]["message"]
        assert metric(url, "beamkit_requests_total", status="413") == 2
        assert post(url, {"model": "toy", "prompt": "abc"}).status_code == 200
    assert len(toy.inits) == 1


def test_errors_never_echo_a_long_prompt_whole():
    with serving(ToyAdapter(max_prompt=10**6)) as (url, _):
        r = post(url, {"model": "toy", "prompt": "z" * 100_000})
        assert r.status_code == 400 and strict_loads(r.text)["error"]["param"] == "prompt"
        assert len(r.text) < 2000
        r = post(url, {"model": "toy", "prompt": "abc", "max_tokens": "9" * 100_000})
        assert r.status_code == 400 and len(r.text) < 2000


def test_a_request_over_the_cost_cap_is_a_400_naming_the_numbers():
    toy = ToyAdapter()
    with serving(toy, max_request_cost=100) as (url, _):
        r = post(url, {"model": "toy", "prompt": ["abc", "bad"], "best_of": 5, "max_tokens": 12})
        assert r.status_code == 400
        message = strict_loads(r.text)["error"]["message"]
        assert all(f" {x} " in f" {message} ".replace("(", " ").replace(")", " ") for x in (2, 5, 12, 120, 100))
        assert "--max-request-cost" in message
        assert post(url, {"model": "toy", "prompt": ["abc", "bad"], "best_of": 4, "max_tokens": 12}).status_code == 200
    assert len(toy.inits) == 2


def test_a_small_request_behind_a_heavy_one_starts_within_a_few_steps():
    """The engine driven one iteration at a time (no thread, no clock): a heavy request's 8 prompts fill the
    waiting list; a small request arriving after 3 steps is done a few steps after its own length."""
    import asyncio

    from beamkit import RequestOptions
    from beamkit.scoring import as_length_penalty
    from beamkit.serve.metrics import Metrics
    from beamkit.serve.runner import Done, Job, Limits, Runner

    loop = asyncio.new_event_loop()
    got: dict[str, Done] = {}

    def job(name: str, prompt: str, beam: int, length: int, request: int) -> Job:
        options = RequestOptions(**{"beam_size": beam, "max_len": length, "min_len": length, "num_return": beam,
                   "length_penalty": as_length_penalty(1.0), "early_stopping": False})  # fmt: skip

        def deliver(event: Any) -> None:
            if isinstance(event, Done):
                got[name] = event

        return Job(tuple(ToyAdapter().encode(prompt)), options, False, deliver, loop, request=request)

    try:
        toy = ToyAdapter()
        runner = Runner(toy, Metrics("toy"), Limits(max_queue=64, max_rows=8))
        heavy = [job(f"heavy{i}", "abcdefgh"[i] * 3, 4, 50, request=1) for i in range(8)]
        runner.submit(heavy)
        for _ in range(3):
            runner.iterate()
            loop.run_until_complete(asyncio.sleep(0))
        runner.submit([job("small", "bad", 2, 3, request=2)])
        steps = 0
        while "small" not in got and steps < 1000:
            runner.iterate()
            loop.run_until_complete(asyncio.sleep(0))
            steps += 1
        assert "small" in got and got["small"].error is None
        assert steps <= 3 + 2  # its own 3 tokens, at most 2 steps of waiting
        want = toy_alone("bad", 2, 2, 3, min_len=3)
        same([(toy.decode(h.tokens), h.logprob) for h in got["small"].hypotheses], want)
        while len(got) < 9 and steps < 2000:
            runner.iterate()
            loop.run_until_complete(asyncio.sleep(0))
            steps += 1
        assert all(got[f"heavy{i}"].error is None for i in range(8))
        same(
            [(toy.decode(h.tokens), h.logprob) for h in got["heavy5"].hypotheses],
            toy_alone("fff", 4, 4, 50, min_len=50),
        )
        assert max(toy.calls) <= 8
    finally:
        loop.close()
