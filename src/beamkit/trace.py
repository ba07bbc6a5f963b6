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

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

DRAWING_PACKAGE = "beamkit.viz"  # where a trace's drawing code lives (see Trace._repr_html_)
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
    along the tree. ``vocab``: optional token texts by id (see :meth:`with_vocab`). ``best_text``: optionally,
    the best hypothesis as the model's own text (set by ``beamkit explain``).
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
    best_text: str | None = None

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
        """Jupyter: the interactive search tree (:func:`beamkit.viz.to_html`, as a fragment)."""
        # the drawing package sits above this plain-data module and imports it: it is looked up by name, only
        # when a notebook displays a trace, so that loading the data never loads the drawing code
        draw = importlib.import_module(DRAWING_PACKAGE)
        return str(draw.to_html(self, standalone=False))


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
