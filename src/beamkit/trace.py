"""Search traces: what the engine actually did for one request, step by step, as plain data.

With ``record_trace=True`` (a :class:`beamkit.SearchOptions` field) the engine keeps one :class:`Trace` per
request: the tree of every candidate it considered (the top-m continuations of each running row), each with its
rank, running log-probability, key and length-penalised score, and what happened to it: it ran on (``running``),
was cut (``pruned``, with the reason), ended in the finished pool (``finished``, or ``unfinished`` when cut off at
``max_len``), possibly to be evicted from that pool later. Per step, the rows that went into the model call and
the pool after it; at the end, why the request stopped and which nodes were returned.

``Completed.trace`` / ``SearchResult.trace`` hold them; ``trace.to_json()`` is the JSON text and
:func:`beamkit.viz.to_html` draws one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the engine imports this module, not the other way round
    from beamkit.engine import Completed, Engine, _Candidates, _Finished, _Rows

STATUSES = ("root", "running", "pruned", "finished", "unfinished")


@dataclass
class TraceNode:
    """One node of the search tree: the root (the empty prefix) or a candidate the engine considered.

    ``step`` is the token position (0 for the first generated token, -1 for the root); ``parent`` the parent's
    node id; ``rank`` the candidate's rank within its request at that step (0 = best key); ``logprob`` the running
    log-probability, ``token_logprob`` its last token's step score, ``key`` what the selector ranked it by,
    ``score`` its length-penalised score at its length (the pool's score for pool entries). ``status`` is one of
    :data:`STATUSES`; ``reason`` says why a node was pruned (``"beam"``: ranked out; ``"threshold"``: cut by
    ``beam_threshold``; ``"pool"``: an ending not admitted to the finished pool; ``"stopped"``: its request
    stopped at this step). ``evicted`` is the step at which a pool entry was pushed out (None: never).
    """

    id: int
    parent: int | None
    step: int
    token: int | None
    logprob: float
    token_logprob: float
    key: float
    score: float
    rank: int
    status: str
    reason: str | None = None
    evicted: int | None = None


@dataclass
class TraceStep:
    """One model call of a request: its step, the running nodes fed to the model, the pool after the step."""

    step: int
    rows: list[int]
    candidates: int
    pool: list[int]


@dataclass
class Trace:
    """The search one request ran: its tree (``nodes``, node id = index, 0 = root), its model calls (``steps``),
    why it stopped, and the node ids it returned (``result``, best first).

    ``greedy``: optionally, the greedy decode's tokens for the same request (set by ``beamkit explain``), drawn
    along the tree. ``vocab``: optional token texts by id (see :meth:`with_vocab`).
    """

    request_id: int
    beam_size: int
    max_len: int
    policy: str
    alpha: float
    eos: list[int]
    nodes: list[TraceNode]
    steps: list[TraceStep] = field(default_factory=list)
    stop_reason: str = ""
    result: list[int] = field(default_factory=list)
    greedy: list[int] | None = None
    vocab: list[str] | None = None
    source: str | None = None

    # ------------------------------------------------------------------------------------------ queries
    def path(self, node: int) -> list[int]:
        """Node ids from the first token to ``node`` (the root left out)."""
        out = []
        while node:
            out.append(node)
            parent = self.nodes[node].parent
            if parent is None:
                break
            node = parent
        return out[::-1]

    def tokens(self, node: int) -> list[int]:
        """The tokens of the prefix ``node`` stands for."""
        return [int(self.nodes[i].token) for i in self.path(node)]  # type: ignore[arg-type]

    def text(self, token: int | None) -> str:
        """A token's text: the vocabulary's entry when one is set, else the id."""
        if token is None:
            return "<s>"
        if self.vocab is not None and 0 <= token < len(self.vocab):
            return self.vocab[token]
        return str(token)

    def count(self, status: str) -> int:
        """How many nodes have ``status``."""
        return sum(1 for n in self.nodes if n.status == status)

    def with_vocab(self, vocab: Any) -> Trace:
        """This trace with token texts: ``vocab`` is a list of strings, a ``{id: text}`` mapping, an object with
        ``symbols`` (beamkit's vocabularies) or a tokenizer with ``convert_ids_to_tokens``."""
        self.vocab = token_texts(vocab, self.nodes)
        return self

    # ------------------------------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The trace as JSON-ready dicts and lists (non-finite numbers as ``null``); nodes carry ``text`` when
        a vocabulary is set."""
        out = asdict(self)
        for node in out["nodes"]:
            for name in ("logprob", "token_logprob", "key", "score"):
                if not np.isfinite(node[name]):
                    node[name] = None
            if self.vocab is not None:
                node["text"] = self.text(node["token"])
        return out

    def to_json(self, indent: int | None = None) -> str:
        """The trace as JSON text (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> Trace:
        """Read back what :meth:`to_json` wrote."""
        raw = dict(json.loads(text) if isinstance(text, str) else text)
        nodes = []
        for n in raw.pop("nodes"):
            n = {k: v for k, v in n.items() if k != "text"}
            for name in ("logprob", "token_logprob", "key", "score"):
                n[name] = float("nan") if n[name] is None else float(n[name])
            nodes.append(TraceNode(**n))
        steps = [TraceStep(**s) for s in raw.pop("steps")]
        return cls(nodes=nodes, steps=steps, **raw)

    def _repr_html_(self) -> str:
        """Jupyter: the interactive search tree."""
        from beamkit.viz import to_html

        return to_html(self, standalone=False)


def token_texts(vocab: Any, nodes: Sequence[TraceNode] = ()) -> list[str]:
    """Token texts by id from a list, a mapping, an object with ``symbols`` or a tokenizer."""
    if vocab is None:
        raise TypeError("vocab must be a list of strings, a mapping, a beamkit Vocab or a tokenizer, not None")
    if hasattr(vocab, "symbols"):
        return [str(s) for s in vocab.symbols]
    if hasattr(vocab, "convert_ids_to_tokens"):
        top = max((n.token for n in nodes if n.token is not None), default=-1)
        return [str(t) for t in vocab.convert_ids_to_tokens(list(range(top + 1)))]
    if isinstance(vocab, Mapping):
        top = max((int(k) for k in vocab), default=-1)
        return [str(vocab.get(i, i)) for i in range(top + 1)]
    if isinstance(vocab, str) or not isinstance(vocab, Sequence):
        raise TypeError(f"vocab must be a list of strings, a mapping, a Vocab or a tokenizer, got {type(vocab)}")
    return [str(s) for s in vocab]


class TraceRecorder:
    """Builds the :class:`Trace` of every request an :class:`beamkit.Engine` runs (only when ``record_trace``).

    The engine calls :meth:`considered` with the ranked candidates of a step (before ``beam_threshold``),
    :meth:`selected` once the policy has picked survivors and updated the pools, and :meth:`close` when a request
    completes. Running rows are tracked as node ids per request, in slot order (the engine's row order).
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.traces: dict[int, Trace] = {}
        self.running: dict[int, list[int]] = {}  # request -> node id of each running row, by slot
        self.pool: dict[int, list[tuple[_Finished, int]]] = {}  # request -> (pool entry, node id)
        self._cand_nodes: np.ndarray = np.zeros(0, np.int64)  # shape: (n,) node id of each considered candidate
        self._by_key: dict[tuple[int, int, int], int] = {}  # (request, parent slot, token) -> node id
        self._pools_before: dict[int, list[_Finished]] = {}
        self._considered: _Candidates | None = None  # this step's candidates as ranked, before beam_threshold

    def _trace(self, r: int) -> Trace:
        trace = self.traces.get(r)
        if trace is None:
            b, eng = self.engine.book, self.engine
            root = TraceNode(0, None, -1, None, 0.0, 0.0, 0.0, 0.0, 0, "root")
            trace = Trace(
                request_id=r,
                beam_size=int(b.beam[r]),
                max_len=int(b.max_len[r]),
                policy=eng.options.policy,
                alpha=float(b.alpha[r]),
                eos=list(eng._eos[int(b.eos[r])]),
                nodes=[root],
            )
            self.traces[r] = trace
            self.running[r] = [0]
            self.pool[r] = []
        return trace

    def considered(self, rows: _Rows, cand: _Candidates) -> None:
        """A step's ranked candidates, before any pruning: one node each."""
        b = self.engine.book
        slots = rows.slots()
        step_of = b.t
        lengths = step_of[cand.req] + 1
        scores = self.engine._penalised(cand.lp, lengths, cand.req)
        parent_lp = rows.lp[cand.row]
        ids = np.empty(cand.req.shape[0], np.int64)
        self._by_key = {}
        columns = zip(
            cand.req.tolist(),
            cand.row.tolist(),
            cand.tok.tolist(),
            cand.lp.tolist(),
            (cand.lp - parent_lp).tolist(),
            cand.key.tolist(),
            scores.tolist(),
            cand.rank.tolist(),
            strict=True,
        )
        for i, (r, row, tok, lp, tlp, key, score, rank) in enumerate(columns):
            trace = self._trace(r)
            parent = self.running[r][int(slots[row])]
            t = int(step_of[r])
            node = TraceNode(len(trace.nodes), parent, t, tok, lp, tlp, key, score, rank, "pruned", "beam")
            trace.nodes.append(node)
            ids[i] = node.id
            self._by_key[(r, int(slots[row]), tok)] = node.id
        for r in np.unique(rows.req).tolist():
            trace = self._trace(r)
            trace.steps.append(TraceStep(int(step_of[r]), list(self.running[r]), 0, []))
        for r, n in zip(*np.unique(cand.req, return_counts=True), strict=True):
            self.traces[int(r)].steps[-1].candidates = int(n)
        self._cand_nodes = ids
        self._considered = cand
        self._pools_before = {r: list(b.pools[r]) for r in np.unique(rows.req).tolist()}

    def selected(self, rows: _Rows, cand: _Candidates, surv: np.ndarray) -> None:
        """After the policy: survivors run on, pool entries in and out, threshold cuts, stopped requests."""
        b = self.engine.book
        before = self._considered
        assert before is not None, "selected() follows considered() within one step"
        if cand is not before:  # beam_threshold cut some: the kept ones are a subset, matched by (row, token)
            width = int(max(before.tok.max(initial=0), cand.tok.max(initial=0))) + 1
            kept = np.isin(before.row * width + before.tok, cand.row * width + cand.tok)
            for r, node in zip(before.req[~kept].tolist(), self._cand_nodes[~kept].tolist(), strict=True):
                self.traces[r].nodes[node].reason = "threshold"
            ids = self._cand_nodes[kept]
        else:
            ids = self._cand_nodes
        new_running: dict[int, list[int]] = {r: [] for r in self._pools_before}
        for r, node in zip(cand.req[surv].tolist(), ids[surv].tolist(), strict=True):
            self.traces[r].nodes[node].status = "running"
            self.traces[r].nodes[node].reason = None
            new_running[r].append(node)
        eng = self.engine
        for r in self._pools_before:
            trace = self.traces[r]
            step = trace.steps[-1]
            self._pool_changes(r, trace, step.step)
            step.pool = [node for _, node in self.pool[r]]
            self.running[r] = new_running[r]
            if not new_running[r]:
                trace.stop_reason = self._stop_reason(r, trace, step.step)
        for r, tok, node in zip(cand.req.tolist(), cand.tok.tolist(), ids.tolist(), strict=True):
            n = self.traces[r].nodes[node]
            admissible = eng.options.policy == "pool" and n.rank < int(b.beam[r])  # ranked in, refused by the pool
            if admissible and n.status == "pruned" and n.reason == "beam" and tok in eng._eos[int(b.eos[r])]:
                n.reason = "pool"
        for r, trace in self.traces.items():
            if r in self._pools_before and not new_running[r] and self._stopped_early(r, trace):
                # the best k endless candidates would have run on, had the stopping rule not ended the request
                at = trace.steps[-1].step
                live = [n for n in trace.nodes if n.step == at and n.reason == "beam" and n.token not in trace.eos]
                for n in live[: int(b.beam[r])]:
                    n.reason = "stopped"

    def _pool_changes(self, r: int, trace: Trace, step: int) -> None:
        """Entries that joined or left request r's finished pool at this step."""
        now = self.engine.book.pools[r]
        kept = []
        for entry, node in self.pool[r]:
            if any(entry is e for e in now):
                kept.append((entry, node))
            else:
                trace.nodes[node].evicted = step
        known = [e for e, _ in kept]
        for entry in now:
            if any(entry is e for e in known):
                continue
            slot = int(entry.paths.slot[entry.i])
            node = self._by_key[(r, slot, int(entry.tok))]
            n = trace.nodes[node]
            n.status = "finished" if entry.finished else "unfinished"
            n.reason = None
            n.score = float(entry.score)
            kept.append((entry, node))
        order = {id(e): i for i, e in enumerate(now)}
        kept.sort(key=lambda pair: order[id(pair[0])])
        self.pool[r] = kept

    def _stopped_early(self, r: int, trace: Trace) -> bool:
        """Whether request r was ended by the pool's stopping rule (not by max_len, an error or a full beam)."""
        return self.engine.options.policy == "pool" and (
            "bound" in trace.stop_reason or "exit" in trace.stop_reason or "early_stopping" in trace.stop_reason
        )

    def _stop_reason(self, r: int, trace: Trace, step: int) -> str:
        """Why request r has no running row after this step."""
        b, opt = self.engine.book, self.engine.options
        if r in b.errors:
            return f"error: {b.errors[r]}"
        if step + 1 >= int(b.max_len[r]):
            return f"max_len ({int(b.max_len[r])} tokens)"
        if opt.policy == "narrow":
            return "every beam slot holds a finished hypothesis"
        if opt.policy == "compete":
            return "finished hypotheses hold every beam slot"
        count, size = int(b.count[r]), int(b.pool[r])
        ending = set(trace.eos)
        live = [n for n in trace.nodes if n.step == step and n.token not in ending and n.reason != "threshold"]
        if not live:
            return "no candidate left to run on"
        best = max(n.logprob for n in live)
        pool = f"pool {count}/{size}" + (f" (patience {opt.patience:g})" if size != int(b.beam[r]) else "")
        if opt.exact_exit and float(b.nth[r]) >= best:
            return f"exact exit: the n-th best finished score {float(b.nth[r]):.4f} >= best running {best:.4f}"
        es = int(b.es[r])
        if es == 1:
            return f"{pool} full (early_stopping=True)"
        at = "max_len" if es == 2 and float(b.alpha[r]) > 0 else "its current length"
        return f"{pool} full and bound: the best running beam scored at {at} cannot beat the pool's worst"

    def close(self, r: int, done: Completed) -> Trace:
        """The finished trace of request r: the returned hypotheses as node ids, best first."""
        trace = self._trace(r)
        self.running.pop(r, None)
        self.pool.pop(r, None)
        if done.error is not None:
            trace.stop_reason = trace.stop_reason or f"error: {done.error}"
            if done.error == "cancelled":
                trace.stop_reason = "cancelled"
        ends = [n.id for n in trace.nodes if n.status in ("finished", "unfinished") and n.evicted is None]
        by_tokens = {tuple(trace.tokens(i)): i for i in ends}
        trace.result = [by_tokens[tuple(h.tokens)] for h in done.hypotheses if tuple(h.tokens) in by_tokens]
        return self.traces.pop(r)


def traced_search(
    step_fn: Callable[[Any, Any], Any],
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int] | None,
    beam_size: int,
    max_len: int,
    **options: Any,
) -> tuple[list[list[Any]], list[Trace]]:
    """:func:`beamkit.search_batch` with tracing on: each request's hypotheses and its :class:`Trace`."""
    from beamkit.engine import BeamSearch, make_options
    from beamkit.hypothesis import BatchDecodeError

    result = BeamSearch(make_options(beam_size, max_len, record_trace=True, **options)).search(
        step_fn, init_state, bos, eos
    )
    if result.errors:
        raise BatchDecodeError(result.errors, result.hypotheses)
    assert result.trace is not None
    return result.hypotheses, [t for t in result.trace if t is not None]
