"""The server's metrics: one writer per count (the :class:`beamkit.serve.metrics.Metrics` methods, under its lock)
and exact counts under load.

Oracles: the source itself (no module assigns a metrics field), and the clients' own tally of N concurrent
requests (every response, every prompt token sent, every completion token received, every model call the toy
model saw), compared exactly while other clients read ``/metrics`` all along.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tests.serve_toy import ToyAdapter  # noqa: E402
from tests.test_serve import metric, post, serving  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "beamkit"


def _metrics_target(node: ast.expr) -> bool:
    """Whether an assignment target writes into a metrics object: ``x.metrics.f``, ``metrics.f``,
    ``x.metrics.f[k]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if not isinstance(node, ast.Attribute):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "metrics") or (
        isinstance(owner, ast.Attribute) and owner.attr == "metrics"
    )


def test_no_module_writes_a_metrics_field_directly():
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "metrics.py" and path.parent.name == "serve":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign | ast.AnnAssign
            ) else []  # fmt: skip
            found += [f"{path.relative_to(SRC)}:{node.lineno}" for t in targets if _metrics_target(t)]
    assert not found, f"count through Metrics' methods (one lock), not by writing its fields: {found}"


def test_the_detector_finds_planted_writes():
    planted = "self.metrics.running = 1\nmetrics.outcomes['x'] += 1\nrunner.metrics.a.b = 2\nself.other.x = 1\n"
    tree = ast.parse(planted)
    hits = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AugAssign)
            and any(_metrics_target(t) for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]  # fmt: skip
    assert sorted(hits) == [1, 2]


N = 48


def test_counters_equal_the_requests_exactly_under_load():
    """N requests sent at once from N threads (with 1 to 3 prompts each), /metrics read all the while: every
    counter equals the clients' own tally."""
    toy = ToyAdapter(delay=0.002)
    prompts = ["abc", "bad", "cafe", "dead", "face", "head", "ace", "bead"]
    bodies = [
        {"model": "toy", "prompt": [prompts[(i + k) % 8] for k in range(1 + i % 3)], "best_of": 1 + i % 4,
         "n": 1, "max_tokens": 3 + i % 5}
        for i in range(N)
    ]  # fmt: skip
    results: list = [None] * N
    reads: list[int] = []
    stop = threading.Event()
    with serving(toy, max_queue=N, max_rows=32) as (url, _):

        def send(i: int) -> None:
            results[i] = post(url, bodies[i], timeout=120)

        def read() -> None:
            while not stop.is_set():
                reads.append(httpx.get(f"{url}/metrics", timeout=30).status_code)

        readers = [threading.Thread(target=read) for _ in range(2)]
        senders = [threading.Thread(target=send, args=(i,)) for i in range(N)]
        for t in [*readers, *senders]:
            t.start()
        for t in senders:
            t.join(120)
        stop.set()
        for t in readers:
            t.join(30)
        assert all(r is not None and r.status_code == 200 for r in results), [r and r.text for r in results]
        jobs = sum(len(b["prompt"]) for b in bodies)
        prompt_tokens = sum(len(p) for b in bodies for p in b["prompt"])
        completion = sum(r.json()["usage"]["completion_tokens"] for r in results)
        assert metric(url, "beamkit_requests_total", status="200") == N
        assert metric(url, "beamkit_engine_requests_total", outcome="completed") == jobs
        assert metric(url, "beamkit_prompt_tokens_total") == prompt_tokens
        assert metric(url, "beamkit_generation_tokens_total") == completion
        assert metric(url, "beamkit_model_calls_total") == len(toy.calls)
        assert metric(url, "beamkit_step_rows_sum") == sum(toy.calls)
        assert metric(url, "beamkit_running_requests") == 0 and metric(url, "beamkit_queue_depth") == 0
        assert metric(url, "beamkit_rows_reserved") == 0
    assert reads and set(reads) == {200}
