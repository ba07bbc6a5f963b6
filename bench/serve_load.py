"""Load tests of ``beamkit serve`` (127.0.0.1 only, bounded): against a naive server with locust, or against a
static-batching server under Poisson arrivals (``--hf``).

    python bench/serve_load.py [--users 32] [--seconds 60] [--beam 5] [--model dates-seq2seq] [--threads 1]
    python bench/serve_load.py --hf [--load 0.8] [--seconds 60] [--max-rows 64] [--threads 1] [--compile BACKEND]

**Locust mode** (the default, needs ``locust``).

Locust runs of ``--users`` closed-loop users (no wait time), ``--seconds`` of load per server in all:

1. ``beamkit serve`` (one continuous-batching engine) with non-streaming completions, beam ``--beam``;
2. the naive server defined below: the same endpoint, but every request is one ``search_batch`` call of its
   own (``beamkit.adapters.translate``) in uvicorn's thread pool: no batching across requests;
   1 and 2 alternate in ``--rounds`` rounds (2 x 30 s each by default), both servers up all along, so that
   drifting load from other processes of a shared machine hits both alike;
3. ``beamkit serve`` with ``stream: true`` (a third of the time), for the time to the first streamed event.

Prompts are the dates test split; every answer must be 200 with an ISO-shaped date, else locust counts a
failure. Both servers run the model on ``--threads`` torch threads. Prints requests/s, p50/p99 latency,
failures, the time to first event, and ``serve-vs-naive[throughput]: X.XXx`` and ``serve[failures]: N``.
This file is also the locustfile (``locust -f bench/serve_load.py``) and the naive server (``--naive PORT``).

**Open-loop mode** (``--hf``): the Hugging Face workload of ``bench/continuous_batching.py`` (its GPT-2 built
offline with a fixed seed, saved with a word-level tokenizer to a temporary folder and served as ``hf:DIR``; beam 4,
prompts of 8 tokens, each request's stop token firing at its own step, 2-128, through ``min_tokens``), one torch
thread per server, both servers up all along:

1. ``beamkit serve --model hf:DIR`` (continuous batching: requests join the running engine at every step);
2. the static-batching baseline defined below (``--static-server PORT``): the same server, adapter and limits,
   except that requests join only an idle engine (a batch runs to completion before the next one starts; each
   answer is sent as soon as its request ends).

With ``--compile BACKEND`` the second server is ``beamkit serve --compile BACKEND`` instead (the decoding steps
through ``torch.compile``; both warmed first with the capacity run's requests, which compiles the row and column
buckets they reach), and the lines read ``compiled-vs-eager[...]``; answers may then differ at near-ties
(float32 rounding), which are counted, not failed.

Capacity is measured first, on ``beamkit serve`` (``--capacity-requests`` sent at once); then the same requests
arrive as a Poisson process at ``--load`` times it for ``--seconds``, open loop (each sent at its time whatever
the answers before it), to each server in turn. Every answer must be 200, end at its request's stop step
(``usage.completion_tokens``) and equal the other server's text. Prints requests/s and p50/p99 latency for each,
then ``serve-vs-static[throughput]: X.XXx``, ``serve-vs-static[p99-latency]: X.XXx`` and ``serve[failures]: N``.
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
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEAMKIT = [sys.executable, "-c", "import sys; from beamkit.cli import main; sys.exit(main())"]  # the command
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

    from beamkit.adapters import translate
    from beamkit.models import load_model

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


def static_server(model: str, threads: int, max_rows: int, port: int) -> None:
    """The baseline of ``--hf``: ``beamkit serve``'s app over the same adapter, requests joining an idle engine only."""
    from beamkit import ops
    from beamkit.adapters import load
    from beamkit.serve.app import create_app
    from beamkit.serve.listen import run_server

    adapter = load(model)
    adapter.joins_mid_flight = False  # static batching: the next batch starts once the engine is idle
    ops.set_torch_threads(threads)
    app = create_app(adapter, max_queue=100_000, max_rows=max_rows, max_request_rows=max_rows)
    run_server(app, "127.0.0.1", port, "warning")


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
        cmd = [*BEAMKIT, "serve", "--model", args.model, "--port", str(port)]
        cmd += ["--threads", str(args.threads), "--max-queue", str(4 * args.users)]
    else:
        cmd = [sys.executable, __file__, "--naive", str(port), "--model", args.model, "--threads", str(args.threads)]
    return subprocess.Popen(cmd, env=env, cwd=ROOT), f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------- open loop (--hf)
def post(url: str, body: dict, timeout: float = 900) -> tuple[int, dict]:
    """POST ``body`` as JSON; (status, the JSON answer or {"error": text})."""
    req = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read()[:300].decode(errors="replace")}
    except OSError as exc:
        return 0, {"error": str(exc)}


def open_loop(url: str, bodies: list[dict], arrivals: list[float]) -> list[tuple[float, int, dict]]:
    """Send ``bodies[i]`` at ``arrivals[i]`` s (open loop, one thread per request in flight); per request
    (latency s, status, answer)."""
    from concurrent.futures import ThreadPoolExecutor

    out: list[Any] = [None] * len(bodies)
    t0 = time.perf_counter()

    def one(i: int) -> None:
        status, answer = post(url, bodies[i])
        out[i] = (time.perf_counter() - t0 - arrivals[i], status, answer)

    with ThreadPoolExecutor(max_workers=min(len(bodies), 1024)) as pool:
        for i, at in enumerate(arrivals):
            left = t0 + at - time.perf_counter()
            if left > 0:
                time.sleep(left)
            pool.submit(one, i)
    return out


def check_answers(name: str, got: list, steps: list[int]) -> tuple[int, list[str]]:
    """Count the failures (not 200, or not ended at the request's stop step); the texts."""
    fails, texts = 0, []
    for (_, status, answer), k in zip(got, steps, strict=True):
        ok = status == 200 and answer.get("usage", {}).get("completion_tokens") == k
        ok = ok and answer["choices"][0].get("finish_reason") == "stop"
        if not ok:
            fails += 1
            if fails <= 3:
                print(f"{name}: bad answer (status {status}, stop step {k}): {str(answer)[:300]}")
        texts.append(answer["choices"][0]["text"] if status == 200 else "")
    return fails, texts


def open_summary(name: str, got: list, arrivals: list[float]) -> tuple[float, float]:
    """Print and return (requests/s from the first arrival to the last answer, p99 latency in ms)."""
    import numpy as np

    lat = np.array([g[0] for g in got])
    end = max(a + x for a, x in zip(arrivals, lat, strict=True))
    rps = len(got) / (end - min(arrivals))
    p50, p99 = np.percentile(lat * 1000, [50, 99])
    print(f"{name}: {len(got)} requests, {rps:.2f} req/s, p50 {p50:.0f} ms, p99 {p99:.0f} ms; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    return rps, float(p99)


def hf_main(args: argparse.Namespace) -> int:
    """The open-loop comparison (``--hf``)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from continuous_batching import HF_BEAM, HF_LONGEST, build_hf_model, hf_requests, hf_words, save_hf_folder

    tmp = Path(tempfile.mkdtemp(prefix="serve_load_hf_"))
    folder = tmp / "bench-gpt2"
    torch.set_num_threads(args.threads)
    save_hf_folder(build_hf_model(args.seed), folder)
    model = f"hf:{folder}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env["HF_HUB_OFFLINE"] = "1"
    other = "compiled" if args.compile else "static"  # the server beamkit serve is compared with
    ports = {"serve": free_port(), other: free_port()}

    def serve_cmd(port: int) -> list[str]:
        cmd = [*BEAMKIT, "serve", "--model", model, "--port", str(port)]
        cmd += ["--threads", str(args.threads), "--max-queue", "100000", "--max-rows", str(args.max_rows)]
        return [*cmd, "--max-request-rows", str(args.max_rows)]

    if args.compile:
        base = [*serve_cmd(ports[other]), "--compile", args.compile]
    else:
        base = [sys.executable, __file__, "--static-server", str(ports[other]), "--model", model]
        base += ["--threads", str(args.threads), "--max-rows", str(args.max_rows)]
    servers = {
        "serve": subprocess.Popen(serve_cmd(ports["serve"]), env=env, cwd=ROOT),
        other: subprocess.Popen(base, env=env, cwd=ROOT),
    }
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    words = hf_words()
    try:
        for which, proc in servers.items():
            wait_up(urls[which], proc)
        with urllib.request.urlopen(f"{urls['serve']}/v1/models", timeout=10) as r:
            name = json.loads(r.read())["data"][0]["id"]

        def bodies_of(reqs: list) -> list[dict]:
            return [
                {"model": name, "prompt": " ".join(words[t] for t in ids), "best_of": HF_BEAM, "n": 1,
                 "max_tokens": HF_LONGEST, "min_tokens": k - 1}
                for ids, k in reqs
            ]  # fmt: skip

        warm = hf_requests(8, args.seed + 2)
        cap_reqs = hf_requests(args.capacity_requests, args.seed + 3)
        for url in urls.values():
            open_loop(url, bodies_of(warm), [0.0] * len(warm))
            if args.compile:  # the buckets the capacity run reaches, compiled before anything is timed
                open_loop(url, bodies_of(cap_reqs), [0.0] * len(cap_reqs))
        got = open_loop(urls["serve"], bodies_of(cap_reqs), [0.0] * len(cap_reqs))
        capacity = len(got) / max(g[0] for g in got)
        rate = args.load * capacity
        rng = np.random.default_rng(args.seed)
        gaps = rng.exponential(1.0 / rate, size=int(rate * args.seconds * 2) + 10)
        arrivals = np.cumsum(gaps) - gaps[0]
        arrivals = arrivals[arrivals < args.seconds].tolist()
        reqs = hf_requests(len(arrivals), args.seed + 1)
        steps = [k for _, k in reqs]
        print(
            f"hf gpt2 (bench/continuous_batching.py's), beam {HF_BEAM}, --max-rows {args.max_rows}: capacity "
            f"{capacity:.2f} req/s ({len(cap_reqs)} at once); {len(arrivals)} requests at {rate:.2f} req/s "
            f"({args.load:.2f}x) over {arrivals[-1]:.1f} s; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if args.compile:  # the compiled server's capacity too, measured the same way
            got = open_loop(urls[other], bodies_of(cap_reqs), [0.0] * len(cap_reqs))
            compiled_capacity = len(got) / max(g[0] for g in got)
            print(f"compiled capacity {compiled_capacity:.2f} req/s, eager {capacity:.2f} req/s", flush=True)
            print(f"compiled-vs-eager[capacity]: {compiled_capacity / capacity:.2f}x")
        labels = {"serve": "continuous", "static": "static", "compiled": f"continuous, --compile {args.compile}"}
        results = {}
        for which in ("serve", other):
            got = open_loop(urls[which], bodies_of(reqs), arrivals)
            fails, texts = check_answers(which, got, steps)
            results[which] = (*open_summary(f"{which} ({labels[which]})", got, arrivals), fails, texts)
    finally:
        for which, proc in servers.items():
            rc = stop(proc)
            if rc != 0:
                print(f"{which} exited with {rc} after SIGTERM")
    (t_c, p_c, f_c, x_c), (t_s, p_s, f_s, x_s) = results["serve"], results[other]
    differ = sum(a != b for a, b in zip(x_c, x_s, strict=True))
    print(f"{other}[failures]: {f_s}; answers that differ between the servers: {differ}")
    if args.compile:  # the compiled server over the eager one (near-ties may differ: counted above)
        print(f"compiled-vs-eager[throughput]: {t_s / t_c:.2f}x")
        print(f"compiled-vs-eager[p99-latency]: {p_s / p_c:.2f}x")
        print(f"serve[failures]: {f_c}")
        return 1 if f_c or f_s else 0
    print(f"serve-vs-static[throughput]: {t_c / t_s:.2f}x")
    print(f"serve-vs-static[p99-latency]: {p_c / p_s:.2f}x")
    print(f"serve[failures]: {f_c}")
    return 1 if f_c or f_s or differ else 0


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
    parser.add_argument("--hf", action="store_true", help="open-loop Poisson arrivals, Hugging Face model")
    parser.add_argument("--load", type=float, default=0.8, help="--hf: arrival rate / beamkit serve's capacity")
    parser.add_argument("--capacity-requests", type=int, default=64, help="--hf: requests of the capacity run")
    parser.add_argument("--max-rows", type=int, default=64, help="--hf: beam rows in each server at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile", default=None, metavar="BACKEND", help="--hf: compare with beamkit serve --compile BACKEND"
    )
    parser.add_argument("--static-server", type=int, default=None, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.static_server is not None:
        static_server(args.model, args.threads, args.max_rows, args.static_server)
        return 0
    if args.hf:
        if not 1 <= args.seconds <= 600 or not 0 < args.load <= 2 or args.capacity_requests < 1:
            parser.error("--seconds in 1..600, --load in (0, 2], --capacity-requests >= 1")
        return hf_main(args)
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
