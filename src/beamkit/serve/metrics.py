"""The server's counters, rendered in the Prometheus text format (no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)  # seconds
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """A cumulative Prometheus histogram: counts per upper bound, sum and count."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        """Count one observation."""
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        """The ``_bucket``, ``_sum`` and ``_count`` sample lines."""
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.bounds, self.counts, strict=True)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        return [*out, f"{name}_sum {self.total:.6f}", f"{name}_count {self.n}"]


class Metrics:
    """Everything ``GET /metrics`` reports. The HTTP handlers and the engine thread both count, so every count
    goes through a method below, each under the one lock that :meth:`render` reads under: no field is written
    from outside this class."""

    def __init__(self, model: str):
        self.model = model
        self.lock = threading.Lock()
        self.http = Counter[str]()  # responses by status code
        self.outcomes = Counter[str]()  # engine requests by outcome: completed, failed, cancelled
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.model_calls = 0
        self.step_seconds = Histogram(STEP_BUCKETS)
        self.step_rows = Histogram(ROW_BUCKETS)
        self.queue_depth = 0
        self.running = 0
        self.rows_reserved = 0

    def response(self, status: int) -> None:
        """Count one HTTP response to the completions endpoint."""
        with self.lock:
            self.http[str(status)] += 1

    def generated(self, tokens: int) -> None:
        """Count the tokens of one answer's returned choices."""
        with self.lock:
            self.generated_tokens += tokens

    def admitted(self, prompt_tokens: int) -> None:
        """Count the prompt tokens of jobs that joined the engine."""
        with self.lock:
            self.prompt_tokens += prompt_tokens

    def outcome(self, kind: str, jobs: int = 1) -> None:
        """Count ``jobs`` engine requests that ended as ``kind`` (completed, failed, cancelled)."""
        with self.lock:
            self.outcomes[kind] += jobs

    def gauges(
        self, queue_depth: int | None = None, running: int | None = None, rows_reserved: int | None = None
    ) -> None:
        """Set the gauges given (None: leave it)."""
        with self.lock:
            if queue_depth is not None:
                self.queue_depth = queue_depth
            if running is not None:
                self.running = running
            if rows_reserved is not None:
                self.rows_reserved = rows_reserved

    def step(self, seconds: float, rows: int) -> None:
        """Count one model call of ``rows`` rows."""
        with self.lock:
            self.model_calls += 1
            self.step_seconds.observe(seconds)
            self.step_rows.observe(rows)

    def render(self) -> str:
        """The Prometheus text exposition."""
        m = f'model="{self.model}"'
        with self.lock:
            lines = [
                "# HELP beamkit_requests_total Completions responses by HTTP status.",
                "# TYPE beamkit_requests_total counter",
            ]
            lines += [f'beamkit_requests_total{{{m},status="{k}"}} {v}' for k, v in sorted(self.http.items())]
            lines += [
                "# HELP beamkit_engine_requests_total Engine requests by outcome.",
                "# TYPE beamkit_engine_requests_total counter",
            ]
            lines += [
                f'beamkit_engine_requests_total{{{m},outcome="{k}"}} {v}' for k, v in sorted(self.outcomes.items())
            ]
            for name, kind, value, text in (
                ("beamkit_prompt_tokens_total", "counter", self.prompt_tokens, "Prompt tokens of admitted requests."),
                ("beamkit_generation_tokens_total", "counter", self.generated_tokens, "Tokens of returned choices."),
                ("beamkit_model_calls_total", "counter", self.model_calls, "Engine steps (one model call each)."),
                ("beamkit_queue_depth", "gauge", self.queue_depth, "Requests waiting to join the engine."),
                ("beamkit_running_requests", "gauge", self.running, "Requests in the engine."),
                ("beamkit_rows_reserved", "gauge", self.rows_reserved, "Beam rows the running requests may use."),
            ):
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{{{m}}} {value}"]
            lines += ["# HELP beamkit_step_seconds Time of one engine step.", "# TYPE beamkit_step_seconds histogram"]
            lines += self.step_seconds.lines("beamkit_step_seconds")
            lines += ["# HELP beamkit_step_rows Rows in one model call.", "# TYPE beamkit_step_rows histogram"]
            lines += self.step_rows.lines("beamkit_step_rows")
        return "\n".join(lines) + "\n"
