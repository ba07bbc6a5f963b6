"""The one engine of a server process, stepping in a background thread; requests join it as they arrive.

HTTP handlers :meth:`Runner.submit` jobs (one per prompt, all of one request at once) into a waiting list bounded
in requests and :meth:`Runner.cancel`
them when their client goes away. The thread admits waiting jobs into the :class:`beamkit.Engine` before each
step (while their beams fit in ``max_rows``; requests take turns, and one request holds at most
``request_rows`` of them, so a small request does not wait behind a heavy one), runs :meth:`beamkit.Engine.step`, and
hands each job its events: a :class:`Update` after each step for streaming jobs whose best text changed,
then one :class:`Done`. Events are passed to the job's ``deliver`` callback on the job's event ``loop``, all of
one step's events in one ``call_soon_threadsafe`` (waking the loop once per event costs more than a step).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from beamkit.adapters import ModelAdapter
from beamkit.constraints import TrieTable
from beamkit.hypothesis import Hypothesis
from beamkit.search import Completed, Engine, RequestOptions
from beamkit.serve.metrics import Metrics
from beamkit.serve.protocol import Limits


class QueueFull(Exception):
    """``--max-queue`` requests are waiting already: answer 503 with Retry-After."""


class ShuttingDown(Exception):
    """The server stopped accepting requests."""


@dataclass(frozen=True)
class Update:
    """A streaming job's current best hypothesis after its ``step``-th model call."""

    step: int
    hypothesis: Hypothesis


@dataclass(frozen=True)
class Done:
    """A job ended: its hypotheses (best first), or the error (``"cancelled"`` after :meth:`Runner.cancel`)."""

    hypotheses: list[Hypothesis]
    error: str | None
    steps: int


@dataclass(eq=False)
class Job:
    """One prompt of one HTTP request, with its engine options and where its events go (``deliver`` is called
    on ``loop``)."""

    ids: tuple[int, ...]
    options: RequestOptions  # the engine's per-request options (from the model's adapter), its beam width among them
    stream: bool
    deliver: Callable[[Update | Done], None]
    loop: asyncio.AbstractEventLoop
    request: int = 0  # the HTTP request the job belongs to: requests take turns for rows
    trie: str | None = None  # the dictionary its outputs are constrained to (Runner's tries), None: none
    rid: int | None = None  # the engine's request id once admitted
    steps: int = 0
    last: tuple[int, ...] | None = field(default=None, repr=False)  # tokens of the last streamed best

    @property
    def beam(self) -> int:
        """The beam rows the job holds in the engine: its options' width (kept there only; unset: one beam, the
        engine's default)."""
        return self.options.beam_size or 1


class Runner:
    """Owns the engine and its thread, within ``limits`` (:class:`Limits`: the engine's rows, the queue, a
    request's rows); ``tries``: the
    dictionaries jobs may name (:class:`beamkit.Trie` by name), applied by one :class:`beamkit.constraints.TrieTable`
    after the adapter's processors; ``vocab_size``: the model's vocabulary, each dictionary checked against it
    (ValueError naming the dictionary; None: checked at the first step, a dictionary that does not fit then
    failing only its own requests). The runner is the one writer of the metrics' engine counts and gauges."""

    def __init__(
        self,
        adapter: ModelAdapter,
        metrics: Metrics,
        limits: Limits | None = None,
        tries: dict[str, Any] | None = None,
        vocab_size: int | None = None,
    ):
        limits = Limits() if limits is None else limits
        self.adapter = adapter
        self.metrics = metrics
        self.max_queue, self.max_rows, self.request_rows = (
            limits.max_queue,
            limits.max_rows,
            limits.rows_per_request,
        )
        self.tries = dict(tries or {})
        self.vocab_size = vocab_size
        self.table: TrieTable | None = None
        self.engine = self._new_engine()
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._waiting_jobs: Counter[int] = Counter()  # request -> its jobs in _waiting
        self._running: dict[int, Job] = {}
        self._cancel: list[Job] = []
        self._outbox: list[tuple[Job, Update | Done]] = []  # events of this iteration, sent by _flush
        self._reserved = 0  # beam rows of the running jobs
        self._accepting = True
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="beamkit-engine", daemon=True)

    def _new_engine(self) -> Engine:
        """An engine over the adapter's step function with the options of a shared engine (the adapter's
        :meth:`~beamkit.adapters.ModelAdapter.continuous_options`), the dictionaries' table after its processors."""
        options = self.adapter.continuous_options()
        if self.tries:
            self.table = TrieTable(self.tries, self.vocab_size if self.table is None else self.table.vocab_size)
            options = replace(options, processors=(*(options.processors or ()), self.table))
        return Engine(self.adapter.step_fn, on_step_error="fail", **options.given())

    # ------------------------------------------------------------------------------------ handler side
    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    def submit(self, jobs: list[Job]) -> None:
        """Queue all ``jobs`` (the prompts of one request) or none: :class:`QueueFull` when ``max_queue``
        requests are waiting already, :class:`ShuttingDown` after :meth:`close`."""
        with self._cond:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            new = {job.request for job in jobs} - set(self._waiting_jobs)
            if len(self._waiting_jobs) + len(new) > self.max_queue:
                raise QueueFull(f"{len(self._waiting_jobs)} requests are waiting (--max-queue {self.max_queue})")
            self._waiting.extend(jobs)
            self._waiting_jobs.update(job.request for job in jobs)
            self.metrics.gauges(queue_depth=len(self._waiting_jobs))
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Cancel a job whose client went away: dropped if it waits, its rows leave the engine at the next step."""
        with self._cond:
            self._cancel.append(job)
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting, let the running and waiting jobs finish, stop the thread."""
        with self._cond:
            self._accepting = False
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def depth(self) -> int:
        """Requests waiting to join the engine (a request waits while any of its prompts has not joined)."""
        return len(self._waiting_jobs)

    def _unqueue(self, job: Job) -> None:
        """Take ``job`` out of the waiting list (called holding the lock)."""
        self._waiting.remove(job)
        self._waiting_jobs[job.request] -= 1
        if not self._waiting_jobs[job.request]:
            del self._waiting_jobs[job.request]

    # ------------------------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._cancel or not self.engine.idle or self._stop):
                    self._cond.wait()
                if self._stop and not self._waiting and self.engine.idle:
                    return
            self.iterate()

    def iterate(self) -> None:
        """One turn of the engine thread: apply cancellations, admit waiting jobs, step, send the events. (The
        thread calls it in a loop; a test may drive a runner that was never started with it, step by step.)"""
        with self._cond:
            cancels, self._cancel = self._cancel, []
            for job in cancels:
                if job in self._waiting:
                    self._unqueue(job)
                    self._outbox.append((job, Done([], "cancelled", 0)))
                    self.metrics.outcome("cancelled")
            admit = self._take_admissible()
            self.metrics.gauges(queue_depth=len(self._waiting_jobs))
        for job in cancels:
            if job.rid is not None and job.rid in self._running:
                self.engine.cancel(job.rid)
        self._admit(admit)
        if not self.engine.idle:
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - an engine fault fails its jobs, not the server
                self._reset(f"{type(exc).__name__}: {exc}")
        self._flush()

    def _flush(self) -> None:
        """Send the iteration's events: one wake-up per event loop."""
        by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list[tuple[Job, Update | Done]]]] = {}
        for job, event in self._outbox:
            by_loop.setdefault(id(job.loop), (job.loop, []))[1].append((job, event))
        self._outbox = []
        for loop, items in by_loop.values():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # the loop is closed: nobody listens any more
                pass

    def _take_admissible(self) -> list[Job]:
        """Waiting jobs that join before the next step (called holding the lock). Requests take turns: the next
        job is the earliest one of the request holding the fewest rows, and no request holds more than
        ``request_rows`` rows while it has a job running, so rows stay free for a request arriving behind a heavy
        one. A job that does not fit waits, and so do the jobs behind it (none is passed over for ever)."""
        out: list[Job] = []
        if not self.adapter.joins_mid_flight and not self.engine.idle:
            return out
        held: Counter[int] = Counter()
        for running in self._running.values():
            held[running.request] += running.beam
        width = None
        while True:
            fair = [j for j in self._waiting if not held[j.request] or held[j.request] + j.beam <= self.request_rows]
            if not fair:
                break
            job = min(fair, key=lambda j: held[j.request])  # the first of the least served: arrival order on ties
            if self._reserved + job.beam > self.max_rows and (self._reserved or out):
                break
            if not self.adapter.joins_mid_flight:  # joining one idle engine together: prompts of one length
                width = len(job.ids) if width is None else width
                if len(job.ids) != width:
                    break
            self._unqueue(job)
            self._reserved += job.beam
            held[job.request] += job.beam
            out.append(job)
        return out

    def _admit(self, jobs: list[Job]) -> None:
        """Add the admitted jobs to the engine: one ``init_state`` call and one ``add_batch`` per group of jobs
        with the same options (and the same :meth:`ModelAdapter.batch_key`)."""
        a = self.adapter
        groups: list[tuple[Any, list[Job]]] = []
        for job in self._dictionary_refusals(jobs):
            key = (job.options, a.batch_key(job.ids))
            for k, members in groups:
                if k == key:
                    members.append(job)
                    break
            else:
                groups.append((key, [job]))
        for _, members in groups:
            try:
                with a.step_context():
                    state = a.init_state([list(job.ids) for job in members])
                ids = self.engine.add_batch(state, a.bos, a.eos, len(members), request=members[0].options)
            except Exception as exc:  # noqa: BLE001 - the jobs fail, the server goes on
                for job in members:
                    self._refuse(job, f"{type(exc).__name__}: {exc}")
                continue
            for job, rid in zip(members, ids, strict=True):
                job.rid = rid
                self._running[rid] = job
                if self.table is not None:
                    self.table.assign(rid, job.trie)
            self.metrics.admitted(sum(len(job.ids) for job in members))
        self.metrics.gauges(running=len(self._running), rows_reserved=self._reserved)

    def _dictionary_refusals(self, jobs: list[Job]) -> list[Job]:
        """The jobs whose dictionary can constrain the model; the others fail alone before they join (a
        dictionary holding an id past the model's vocabulary, found out at a step after the request was
        checked)."""
        if self.table is None:
            return jobs
        out = []
        for job in jobs:
            try:
                if job.trie is not None:
                    self.table.check(job.trie)
                out.append(job)
            except ValueError as exc:
                self._refuse(job, str(exc))
        return out

    def _refuse(self, job: Job, message: str) -> None:
        """Fail a job that was taken from the queue and never joined the engine."""
        self._reserved -= job.beam
        self.metrics.outcome("failed")
        self._outbox.append((job, Done([], message, 0)))

    def _step(self) -> None:
        stats = self.engine.stats
        calls = stats.model_calls
        start = time.perf_counter()
        with self.adapter.step_context():
            done = self.engine.step()
        seconds = time.perf_counter() - start
        if stats.model_calls > calls:
            self.metrics.step(seconds, stats.rows_per_call[-1])
            for job in self._running.values():
                job.steps += 1
        # the engine's per-call lists grow with every call: a server reads the last entry and lets them go
        for counts in (stats.rows_per_call, stats.joined_per_call, stats.left_per_call):
            counts.clear()
        for c in done:
            self._finish(c)
        for rid, job in self._running.items():
            if job.stream:
                best = self.engine.best(rid)
                if best is not None and tuple(best.tokens) != job.last:
                    job.last = tuple(best.tokens)
                    self._outbox.append((job, Update(job.steps, best)))
        self.metrics.gauges(running=len(self._running), rows_reserved=self._reserved)

    def _reset(self, message: str) -> None:
        """The engine raised outside the step function: fail every running job and start a fresh engine."""
        for job in self._running.values():
            self.metrics.outcome("failed")
            self._outbox.append((job, Done([], message, job.steps)))
        self._running.clear()
        self._reserved = 0
        self.engine = self._new_engine()
        self.metrics.gauges(running=0, rows_reserved=0)

    def _finish(self, c: Completed) -> None:
        job = self._running.pop(c.request_id)
        error = c.error
        if self.table is not None:
            why = self.table.failure(c.request_id)  # its dictionary failed it: say so, not "no candidate"
            error = error if why is None else f"the dictionary {job.trie!r} cannot constrain this model: {why}"
            self.table.forget(c.request_id)
        self._reserved -= job.beam
        outcome = "completed" if error is None else ("cancelled" if error == "cancelled" else "failed")
        self.metrics.outcome(outcome)
        self._outbox.append((job, Done(c.hypotheses, error, c.steps)))


def _deliver_all(items: list[tuple[Job, Update | Done]]) -> None:
    """On the event loop: hand each job its event."""
    for job, event in items:
        job.deliver(event)
