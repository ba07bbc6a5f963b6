"""Load test of ``beamkit serve`` against a naive server, with locust (headless, 127.0.0.1 only, bounded).

    python bench/serve_load.py [--users 32] [--seconds 60] [--beam 5] [--model dates-seq2seq] [--threads 1]

Locust runs of ``--users`` closed-loop users (no wait time), ``--seconds`` of load per server in all:

1. ``beamkit serve`` (one continuous-batching engine) with non-streaming completions, beam ``--beam``;
2. the naive server defined below: the same endpoint, but every request is one ``search_batch`` call of its
   own (``beamkit.models.translate``) in uvicorn's thread pool: no batching across requests;
   1 and 2 alternate in ``--rounds`` rounds (2 x 30 s each by default), both servers up all along, so that
   drifting load from other processes of a shared machine hits both alike;
3. ``beamkit serve`` with ``stream: true`` (a third of the time), for the time to the first streamed event.

Prompts are the dates test split; every answer must be 200 with an ISO-shaped date, else locust counts a
failure. Both servers run the model on ``--threads`` torch threads. Prints requests/s, p50/p99 latency,
failures, the time to first event, and ``serve-vs-naive[throughput]: X.XXx`` and ``serve[failures]: N``.
This file is also the locustfile (``locust -f bench/serve_load.py``) and the naive server (``--naive PORT``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISO = re.compile(r"^\d{4}-\d{2}-\d{2}$|^[\d-]*$")  # a date, or digits and dashes cut by max_tokens

# ---------------------------------------------------------------------------------------------- locust users
if os.environ.get("SERVE_LOAD_LOCUST"):
    import random

    from locust import HttpUser, events, task

    from beamkit.tasks.dates import split

    PROMPTS = [src for src, _ in split("test", limit=500)]
    MODEL = os.environ.get("SERVE_LOAD_MODEL", "dates-seq2seq")
    BEAM = int(os.environ.get("SERVE_LOAD_BEAM", "5"))
    STREAM = os.environ.get("SERVE_LOAD_STREAM") == "1"

    class Client(HttpUser):
        """A closed-loop client: one completion after another."""

        def wait_time(self) -> float:
            return 0.0

        @task
        def complete(self) -> None:
            body = {"model": MODEL, "prompt": random.choice(PROMPTS), "best_of": BEAM, "n": 1}
            if STREAM and random.random() < 1 / 3:
                self._stream(body)
                return
            with self.client.post("/v1/completions", json=body, catch_response=True, name="completion") as r:
                if r.status_code != 200:
                    r.failure(f"status {r.status_code}: {r.text[:200]}")
                elif not ISO.match(r.json()["choices"][0]["text"]):
                    r.failure(f"not a date: {r.text[:200]}")

        def _stream(self, body: dict) -> None:
            start = time.perf_counter()
            first_ms, last = None, b""
            with self.client.post(
                "/v1/completions", json={**body, "stream": True}, stream=True, catch_response=True, name="stream"
            ) as r:
                for line in r.iter_lines():  # unbuffered: lines as the events arrive
                    if line.startswith(b"data: "):
                        if first_ms is None:
                            first_ms = (time.perf_counter() - start) * 1000
                        last = line
                if r.status_code != 200 or last != b"data: [DONE]" or first_ms is None:
                    r.failure(f"bad stream: status {r.status_code}, last event {last[:100]!r}")
                    return
            events.request.fire(
                request_type="SSE",
                name="first-event",
                response_time=first_ms,
                response_length=0,
                exception=None,
                context={},
            )


# ---------------------------------------------------------------------------------------------- naive server
def naive_app(model_name: str, threads: int):
    """The baseline: the completions endpoint with one ``search_batch`` call per request (no batching)."""
    import torch
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from beamkit.models import load_model, translate

    torch.set_num_threads(threads)
    model = load_model(model_name)
    app = FastAPI()

    @app.post("/v1/completions")
    def complete(body: dict) -> JSONResponse:  # a plain def: uvicorn runs it in its thread pool
        out = translate(model, [body["prompt"]], beam_size=body["best_of"], num_return=body.get("n", 1))[0]
        return JSONResponse({"choices": [{"index": i, "text": t.text} for i, t in enumerate(out)]})

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


# ---------------------------------------------------------------------------------------------- driver
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def run_locust(url: str, args: argparse.Namespace, stream: bool, seconds: int, out: Path) -> dict[str, dict]:
    """One headless locust run; returns the stats rows by name (``Aggregated`` included)."""
    env = {
        **os.environ,
        "SERVE_LOAD_LOCUST": "1",
        "SERVE_LOAD_MODEL": args.model,
        "SERVE_LOAD_BEAM": str(args.beam),
        "SERVE_LOAD_STREAM": "1" if stream else "0",
    }
    cmd = [
        sys.executable, "-m", "locust", "-f", __file__, "--headless", "-u", str(args.users), "-r", str(args.users),
        "-t", f"{seconds}s", "--host", url, "--csv", str(out), "--only-summary", "--stop-timeout", "30",
        "--exit-code-on-error", "0", "--loglevel", "WARNING",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, timeout=seconds + 120, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"locust failed ({done.returncode}): {done.stderr[-2000:]}")
    with open(f"{out}_stats.csv") as f:
        return {row["Name"]: row for row in csv.DictReader(f)}


def summary(name: str, rows: dict[str, dict], key: str) -> tuple[int, int, float]:
    """Print one run's figures; return (requests, failures, seconds of load by locust's clock)."""
    row = rows[key]
    count, fails = int(row["Request Count"]), int(row["Failure Count"])
    rps = float(row["Requests/s"])
    print(
        f"{name}: {count} requests, {float(row['Requests/s']):.2f} req/s, p50 {row['50%']} ms, "
        f"p99 {row['99%']} ms, failures {fails}"
    )
    return count, fails, count / rps if rps > 0 else 0.0


def start(which: str, args: argparse.Namespace, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """Start ``beamkit serve`` or the naive server on a free loopback port; return it and its URL."""
    port = free_port()
    if which == "serve":
        cmd = [sys.executable, "-m", "beamkit.cli", "serve", "--model", args.model, "--port", str(port)]
        cmd += ["--threads", str(args.threads), "--max-queue", str(4 * args.users)]
    else:
        cmd = [sys.executable, __file__, "--naive", str(port), "--model", args.model, "--threads", str(args.threads)]
    return subprocess.Popen(cmd, env=env, cwd=ROOT), f"http://127.0.0.1:{port}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=60, help="load time per server, all rounds together")
    parser.add_argument("--rounds", type=int, default=2, help="alternate the servers this many times")
    parser.add_argument("--stream-seconds", type=int, default=20)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--model", default="dates-seq2seq")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--naive", type=int, default=None, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive is not None:
        import uvicorn

        uvicorn.run(naive_app(args.model, args.threads), host="127.0.0.1", port=args.naive, log_level="warning")
        return 0
    if args.users < 1 or not 1 <= args.seconds <= 600 or not 1 <= args.rounds <= args.seconds:
        parser.error("--users >= 1, --seconds in 1..600, --rounds in 1..seconds")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    tmp = Path(tempfile.mkdtemp(prefix="serve_load_"))
    servers = {which: start(which, args, env) for which in ("serve", "naive")}
    totals = {"serve": [0, 0, 0.0], "naive": [0, 0, 0.0]}  # requests, failures, seconds
    per_round = args.seconds // args.rounds
    try:
        for proc, url in servers.values():
            wait_up(url, proc)
        # alternating rounds: drifting load from other processes on a shared machine hits both servers alike
        for r in range(args.rounds):
            for which, (_, url) in servers.items():
                rows = run_locust(url, args, False, per_round, tmp / f"{which}{r}")
                for i, value in enumerate(summary(f"{which} (round {r + 1}, {per_round} s)", rows, "Aggregated")):
                    totals[which][i] += value
        rows = run_locust(servers["serve"][1], args, True, args.stream_seconds, tmp / "stream")
        _, stream_fails, _ = summary("serve (1/3 streaming)", rows, "Aggregated")
        first = rows.get("first-event")
        if first is not None:
            print(f"serve[first-event]: p50 {first['50%']} ms, p99 {first['99%']} ms")
    finally:
        for which, (proc, _) in servers.items():
            rc = stop(proc)
            if which == "serve" and rc != 0:
                print(f"beamkit serve exited with {rc} after SIGTERM")
    seconds = per_round * args.rounds
    rps = {which: count / max(busy, 1e-9) for which, (count, _, busy) in totals.items()}
    print(f"serve: {rps['serve']:.2f} req/s, naive: {rps['naive']:.2f} req/s (all rounds)")
    print(f"serve-vs-naive[throughput]: {rps['serve'] / max(rps['naive'], 1e-9):.2f}x")
    print(f"serve[failures]: {totals['serve'][1] + stream_fails}")
    print(json.dumps({"users": args.users, "seconds": seconds, "beam": args.beam, "model": args.model}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
