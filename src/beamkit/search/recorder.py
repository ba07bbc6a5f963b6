"""Recorders: what a search tells an observer at each step, as records (the candidates it considered, the
decision its policy took, the request it completed). :class:`TraceRecorder` builds a
:class:`beamkit.trace.Trace` per request from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from beamkit.search.book import Book
from beamkit.search.records import Completed, StepDecision, StepView, Stop
from beamkit.trace import Trace, TraceNode, TraceStep


class Recorder(Protocol):
    """What a search with ``record_trace`` tells its recorder."""

    def considered(self, view: StepView) -> None:
        """A step's ranked candidates (``view.considered``: before ``beam_threshold``)."""
        ...

    def decided(self, view: StepView, decision: StepDecision) -> None:
        """What the policy decided at that step (survivors of failed requests already left out)."""
        ...

    def closed(self, slot: int, done: Completed, stop: Stop | None) -> Trace | None:
        """A request completed (``stop``: why its search ended); returns its trace."""
        ...


@dataclass(frozen=True)
class TraceContext:
    """What a :class:`TraceRecorder` reads besides the step records: the book (each request's options by slot),
    the policy's name, the table of stop-token sets (indexed by ``book.eos``) and the length-penalised score of
    ``(logprob, length, slot)`` arrays."""

    book: Book
    policy: str
    eos: list[tuple[int, ...]]
    penalised: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class TraceRecorder:
    """Builds the :class:`Trace` of every request an engine runs, from the step records and a
    :class:`TraceContext` alone.

    Running rows are tracked as node ids per request, in slot order (the engine's row order); pool entries by
    their entry id.
    """

    def __init__(self, context: TraceContext):
        self.context = context
        self.traces: dict[int, Trace] = {}
        self.running: dict[int, list[int]] = {}  # request -> node id of each running row, by slot
        self.entry_node: dict[int, dict[int, int]] = {}  # request -> pool entry id -> its node id
        self._nodes = np.zeros(0, np.int64)  # shape: (n,) node id of each considered candidate of this step

    def _trace(self, r: int) -> Trace:
        trace = self.traces.get(r)
        if trace is None:
            ctx = self.context
            b = ctx.book
            root = TraceNode(0, None, -1, None, 0.0, 0.0, 0.0, 0.0, 0, "root")
            trace = Trace(
                request_id=r,
                beam_size=int(b.beam[r]),
                max_len=int(b.max_len[r]),
                policy=ctx.policy,
                alpha=float(b.alpha[r]),
                eos=list(ctx.eos[int(b.eos[r])]),
                nodes=[root],
            )
            self.traces[r] = trace
            self.running[r] = [0]
            self.entry_node[r] = {}
        return trace

    def considered(self, view: StepView) -> None:
        """One node per considered candidate (status ``pruned`` / ``beam`` until the decision says otherwise)."""
        rows, cand, b = view.rows, view.considered, self.context.book
        n = cand.req.shape[0]
        scores = self.context.penalised(cand.lp, b.t[cand.req] + 1, cand.req).tolist() if n else []
        parent = rows.slots()[cand.row].tolist()
        req, tok, lp, key, rank = (a.tolist() for a in (cand.req, cand.tok, cand.lp, cand.key, cand.rank))
        token_lp = (cand.lp - rows.lp[cand.row]).tolist()
        ids = np.empty(n, np.int64)
        for i in range(n):
            r = req[i]
            trace = self._trace(r)
            node = TraceNode(
                len(trace.nodes),
                self.running[r][parent[i]],
                int(b.t[r]),
                tok[i],
                lp[i],
                token_lp[i],
                key[i],
                scores[i],
                rank[i],
                "pruned",
                "beam",
            )
            trace.nodes.append(node)
            ids[i] = node.id
        for r in np.unique(rows.req).tolist():
            self._trace(r).steps.append(TraceStep(int(b.t[r]), list(self.running[r]), 0, []))
        for r, count in np.column_stack(np.unique(cand.req, return_counts=True)).tolist():
            self.traces[r].steps[-1].candidates = count
        self._nodes = ids

    def decided(self, view: StepView, decision: StepDecision) -> None:
        """Survivors run on, pool entries in and out, threshold cuts, refused endings, halted requests."""
        nodes = self._nodes
        if view.kept is not None:  # beam_threshold cut some
            cut = np.ones(nodes.shape[0], dtype=bool)
            cut[view.kept] = False
            self._mark(view.considered.req[cut], nodes[cut], "threshold")
            nodes = nodes[view.kept]
        cand, pool = view.cand, decision.pool
        step_reqs = np.unique(view.rows.req).tolist()
        new_running: dict[int, list[int]] = {r: [] for r in step_reqs}
        surv = decision.survivors
        for r, node in np.column_stack((cand.req[surv], nodes[surv])).tolist():
            n = self.traces[r].nodes[node]
            n.status, n.reason = "running", None
            new_running[r].append(node)
        gone = np.isin(view.pool.eid, decision.evicted)
        for eid, r in np.column_stack((view.pool.eid[gone], view.pool.req[gone])).tolist():
            trace = self.traces[r]
            trace.nodes[self.entry_node[r].pop(eid)].evicted = trace.steps[-1].step
        for j in decision.admitted_rows().tolist():
            r, node = int(pool.req[j]), int(nodes[pool.cand[j]])
            n = self.traces[r].nodes[node]
            n.status = "finished" if pool.finished[j] else "unfinished"
            n.reason, n.score = None, float(pool.score[j])
            self.entry_node[r][int(pool.eid[j])] = node
        for r in step_reqs:
            known = self.entry_node[r]
            self.traces[r].steps[-1].pool = [known[e] for e in pool.eid[pool.of(r)].tolist()]
            self.running[r] = new_running[r]
        self._mark(cand.req[decision.refused], nodes[decision.refused], "pool")
        self._mark(cand.req[decision.halted], nodes[decision.halted], "stopped")
        for r, stop in decision.stops.items():
            self.traces[r].stop_reason = stop.detail

    def _mark(self, req: np.ndarray, nodes: np.ndarray, reason: str) -> None:
        """Give the nodes ``nodes`` (of the requests ``req``) the pruning reason ``reason``."""
        for r, node in np.column_stack((req, nodes)).tolist():
            self.traces[r].nodes[node].reason = reason

    def closed(self, slot: int, done: Completed, stop: Stop | None) -> Trace:
        """The finished trace of request ``slot``: why it stopped, the returned hypotheses as node ids."""
        trace = self._trace(slot)
        self.running.pop(slot, None)
        self.entry_node.pop(slot, None)
        if stop is not None:
            trace.stop_reason = stop.detail
        ends = [n.id for n in trace.nodes if n.status in ("finished", "unfinished") and n.evicted is None]
        by_tokens = {tuple(trace.tokens(i)): i for i in ends}
        trace.result = [by_tokens[tuple(h.tokens)] for h in done.hypotheses if tuple(h.tokens) in by_tokens]
        return self.traces.pop(slot)
