"""Dictionary constraints: a prefix trie of the valid output sequences (generative retrieval, semantic IDs).

:class:`Trie` holds the dictionary as flat numpy arrays (CSR, children sorted per node) and offers it three ways:

* ``trie.allowed(prefix)``: the ids that may follow a prefix (a Python lookup, for inspection);
* ``trie.prefix_allowed_tokens_fn(prompt_len=P)``: Hugging Face's ``prefix_allowed_tokens_fn`` protocol, so
  ``model.generate(prefix_allowed_tokens_fn=...)`` runs it unchanged; :func:`beamkit.hf.generate` and
  :func:`beamkit.hf.patch` recognise the callable and apply it vectorised instead;
* ``trie.mask()``: a :class:`TrieMask` processor for beamkit's own search: each row's trie node follows the row
  (``StepContext.carry``, gathered by parent with the row's tokens), one gather of the allowed ids per step.

A sequence ends where its last token is generated when that token is a stop token; an entry that does not end
with a stop token (or that is a prefix of a longer entry) marks its last node *terminal*, and the search's stop
tokens are allowed there as well as the node's children. A row at a node with nothing allowed (a leaf that is not
terminal cannot occur; a terminal leaf with no stop token to take) has no continuation: that beam ends.
"""

from __future__ import annotations

import functools
import os
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from beamkit import ops
from beamkit._checks import check_int, check_optional_int
from beamkit.processors import StepContext
from beamkit.search.inputs import eos_ids
from beamkit.textfiles import text_lines

ROOT = 0  # the node of the empty prefix
DEAD = -2  # a row whose tokens left the dictionary (never produced by a search that applies the mask)
FRESH = -1  # StepContext.carry of a row no processor has seen yet


class Trie:
    """A prefix trie of valid token sequences, as CSR arrays (see the module docstring for the semantics).

    ``Trie(source, vocab_size=None, pad=None)``: ``source`` is an iterable of token-id sequences (ragged allowed),
    an ``[n, L]`` integer array (``pad``: the id that fills the end of shorter rows), or a path to a file: ``.npy``
    (an ``[n, L]`` array, ``pad`` as above), ``.npz`` (saved by :meth:`save`), else text with one sequence of
    space-separated ids per line. Duplicates are kept once; an entry may be a prefix of another. ``vocab_size``:
    ids must be below it. Bad input (negative ids, ids past ``vocab_size``, an empty dictionary or an empty entry,
    non-integers) raises ValueError / TypeError naming the problem.

    Arrays (node 0 is the root; nodes are numbered breadth first, so the children of node ``p`` are the nodes
    ``indptr[p] + 1 .. indptr[p + 1]``, labelled ``labels[indptr[p]:indptr[p + 1]]`` in ascending order):
    ``indptr`` ``[nodes + 1]`` int64, ``labels`` ``[nodes - 1]`` int32, ``terminal`` ``[nodes]`` bool.
    """

    def __init__(self, source: Any, vocab_size: int | None = None, pad: int | None = None):
        self.vocab_size = check_optional_int("Trie vocab_size", vocab_size, 1)
        pad = check_optional_int("Trie pad", pad)
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            if path.suffix == ".npz":
                raise ValueError(f"{path} is a saved trie: use Trie.load({str(path)!r})")
            try:
                table, lengths = _read_file(path, pad)
                _check_ids(table, lengths, self.vocab_size)
            except (ValueError, TypeError) as err:  # every error about a file names the file
                if str(path) in str(err):
                    raise
                raise type(err)(f"dictionary file {str(path)!r}: {err}") from None
        else:
            table, lengths = _table(source, pad)
            _check_ids(table, lengths, self.vocab_size)
        self.indptr, self.labels, self.terminal, self.count, self.depth = _build(table, lengths)

    # ------------------------------------------------------------------------------------------ construction
    @classmethod
    def _from_arrays(
        cls, indptr: np.ndarray, labels: np.ndarray, terminal: np.ndarray, count: int, **meta: Any
    ) -> Trie:
        """A trie over given CSR arrays (what :meth:`load` reads)."""
        trie = cls.__new__(cls)
        trie.indptr, trie.labels, trie.terminal = indptr, labels, terminal
        trie.count, trie.depth, trie.vocab_size = int(count), int(meta["depth"]), meta.get("vocab_size")
        return trie

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trie to ``path`` (numpy ``.npz``; :meth:`load` reads it back)."""
        extra = {} if self.vocab_size is None else {"vocab_size": np.int64(self.vocab_size)}
        np.savez(
            path,
            indptr=self.indptr,
            labels=self.labels,
            terminal=self.terminal,
            count=np.int64(self.count),
            depth=np.int64(self.depth),
            **extra,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trie:
        """A trie written by :meth:`save`; ValueError naming the file for one that is not such a trie (not a numpy
        ``.npz`` archive, arrays missing, or arrays that do not form a well-formed trie: offsets out of order or
        out of range, labels that are not token ids or not sorted, counts that do not match)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Trie.load takes the path of a file Trie.save wrote, got {_cut(path)}")
        name = os.fspath(path)
        arrays = _read_npz(name)
        need = {"indptr", "labels", "terminal", "count", "depth"}
        if not need <= set(arrays):
            raise ValueError(f"{name!r} is not a saved Trie (it lacks {sorted(need - set(arrays))})")
        try:
            indptr, labels, terminal, count, depth, vocab = _check_saved(arrays)
        except ValueError as err:
            raise ValueError(f"{name!r} is not a well-formed saved Trie: {err}") from None
        return cls._from_arrays(indptr, labels, terminal, count, depth=depth, vocab_size=vocab)

    # ------------------------------------------------------------------------------------------ lookups
    def __len__(self) -> int:
        """The number of distinct sequences in the dictionary."""
        return self.count

    def __repr__(self) -> str:
        return f"Trie({self.count} sequences, {self.nodes} nodes, depth {self.depth}, {self.nbytes / 1e6:.1f} MB)"

    @property
    def nodes(self) -> int:
        """The number of nodes (distinct prefixes, the empty one included)."""
        return int(self.terminal.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by the trie's arrays."""
        return int(self.indptr.nbytes + self.labels.nbytes + self.terminal.nbytes)

    @functools.cached_property
    def max_id(self) -> int:
        """The largest token id in the dictionary (checked against the model's vocabulary at every step)."""
        return int(self.labels.max())

    def child(self, node: np.ndarray, token: np.ndarray) -> np.ndarray:
        """The child of each ``node[i]`` labelled ``token[i]`` (vectorised), :data:`DEAD` where there is none or
        the node is already dead."""
        node = np.asarray(node, dtype=np.int64)  # shape: (n,)
        token = np.asarray(token, dtype=np.int64)  # shape: (n,)
        live = node >= 0
        safe = np.where(live, node, 0)
        lo, hi = self.indptr[safe].copy(), self.indptr[safe + 1]  # shape: (n,) the children's entries
        end = hi.copy()
        while True:  # one binary search per row, all rows at once: ceil(log2(widest node + 1)) rounds
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            go_right = open_ & (self.labels[np.minimum(mid, self.labels.shape[0] - 1)] < token)
            lo = np.where(go_right, mid + 1, lo)
            hi = np.where(open_ & ~go_right, mid, hi)
        found = live & (lo < end) & (self.labels[np.minimum(lo, self.labels.shape[0] - 1)] == token)
        return np.where(found, lo + 1, DEAD)

    def walk(self, tokens: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
        """The node each row of ``tokens`` ``[n, t]`` reaches from ``start`` (default: the root); :data:`DEAD`
        for a row that leaves the dictionary."""
        tokens = np.asarray(tokens, dtype=np.int64)
        node = np.full(tokens.shape[0], ROOT, np.int64) if start is None else np.asarray(start, np.int64)
        for c in range(tokens.shape[1]):
            node = self.child(node, tokens[:, c])
        return node

    def children(self, node: int) -> np.ndarray:
        """The labels of the children of one node, ascending (empty for a leaf or a dead node)."""
        if node < 0:
            return np.zeros(0, np.int32)
        return self.labels[self.indptr[node] : self.indptr[node + 1]]

    def allowed(self, prefix: Sequence[int], eos: int | Sequence[int] | None = None) -> list[int]:
        """The ids that may follow ``prefix`` (ascending): its node's children, plus the stop tokens ``eos`` where
        an entry ends at ``prefix``; empty when ``prefix`` is not a prefix of any entry."""
        node = int(self.walk(_lookup(prefix, "Trie.allowed's prefix").reshape(1, -1))[0])
        out = self.children(node).tolist()
        stops = _stops(eos)
        if node >= 0 and self.terminal[node] and stops:
            out = sorted(set(out) | set(stops))
        return out

    def __contains__(self, sequence: Sequence[int]) -> bool:
        """Whether ``sequence`` is an entry of the dictionary."""
        node = int(self.walk(_lookup(sequence, "a sequence looked up in a Trie").reshape(1, -1))[0])
        return node > ROOT and bool(self.terminal[node])

    # ------------------------------------------------------------------------------------------ adapters
    def prefix_allowed_tokens_fn(self, prompt_len: int, eos_token_id: int | Sequence[int] | None = None) -> PrefixFn:
        """A callable with Hugging Face's ``prefix_allowed_tokens_fn`` protocol, ``fn(batch_id, input_ids) ->
        list[int]``, for ``model.generate``: ``input_ids`` are the row's prompt (``prompt_len`` columns: the
        padded prompt length for a decoder-only model, 1 for an encoder-decoder's start token) then its new
        tokens. ``eos_token_id``: allowed where an entry ends (leave it None when the entries end with their stop
        token). :func:`beamkit.hf.generate` and :func:`beamkit.hf.patch` apply it vectorised."""
        return PrefixFn(self, check_int("prompt_len", prompt_len, 0), _stops(eos_token_id))

    def mask(self, eos: int | Sequence[int] | None = None) -> TrieMask:
        """The processor that keeps only the dictionary's continuations, for beamkit's own search
        (``processors=[trie.mask()]``); ``eos``: the stop tokens allowed where an entry ends (default: each
        request's own)."""
        return TrieMask(self, None if eos is None else _stops(eos))


def _lookup(ids: Any, what: str) -> np.ndarray:
    """A looked-up sequence as int64 ``[t]``: integers only, as construction takes them (TypeError naming
    ``what`` for floats, strings, booleans)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{what} must be a sequence of token ids, got {_cut(ids)}")
    values = ops.to_numpy(ids).tolist() if ops.is_array(ids) else list(ids)
    try:
        return _int_array(values, what, ndim=1)
    except ValueError:  # an id beyond int64 is in no dictionary
        return np.full(1, -1, np.int64)


def _stops(eos: int | Sequence[int] | None) -> tuple[int, ...]:
    """Stop token ids as a tuple (empty for none); ValueError for a negative one."""
    out = eos_ids(eos)
    if any(e < 0 for e in out):
        raise ValueError(f"stop token ids are token ids (>= 0), got {list(out)}")
    return out


@dataclass(frozen=True)
class PrefixFn:
    """Hugging Face's ``prefix_allowed_tokens_fn`` over a :class:`Trie` (made by
    :meth:`Trie.prefix_allowed_tokens_fn`). Called per row it walks the row's new tokens; ``trie``,
    ``prompt_len`` and ``eos`` let beamkit apply the same constraint vectorised. A row that has left the
    dictionary (a beam Hugging Face keeps at ``-inf`` when fewer valid continuations than beams exist) gets the
    stop tokens, else the root's children, so that Hugging Face never sees an empty list for it."""

    trie: Trie
    prompt_len: int
    eos: tuple[int, ...] = ()

    def vectorised(self) -> TrieMask:
        """The same constraint as a :class:`TrieMask`, for a search whose rows hold generated tokens only
        (:class:`beamkit.PrefixAllowedTokens`); ValueError unless ``prompt_len`` is 0."""
        if self.prompt_len:
            raise ValueError(
                f"this prefix_allowed_tokens_fn skips a prompt of {self.prompt_len} tokens, but beamkit's engine hands "
                "it generated tokens only: make it with prompt_len=0 (or pass processors=[trie.mask()])"
            )
        return TrieMask(self.trie, self.eos)

    def __call__(self, batch_id: int, input_ids: Any) -> list[int]:
        new = input_ids[self.prompt_len :]
        tokens = np.asarray(new.tolist() if hasattr(new, "tolist") else list(new), dtype=np.int64)
        node = int(self.trie.walk(tokens.reshape(1, -1))[0])
        return allowed_list(self.trie, node, self.eos)


def allowed_list(trie: Trie, node: int, eos: tuple[int, ...]) -> list[int]:
    """What :class:`PrefixFn` returns at ``node``: the children, the stop tokens where an entry ends; for a
    dead node the stop tokens, else the root's children."""
    if node < 0:
        return list(eos) if eos else trie.children(ROOT).tolist()
    out = trie.children(node).tolist()
    if trie.terminal[node] and eos:
        out += [e for e in eos if e not in set(out)]
    return out


@dataclass(frozen=True)
class TrieMask:
    """Processor: every row keeps only the ids its trie node allows (children; the stop tokens where an entry
    ends), all else ``-inf``; the scores of the kept ids are untouched, so they stay normalised over the full
    vocabulary. Vectorised: the node is carried per row (``ctx.carry``, gathered by parent) and advanced by the
    row's last token, one gather of the allowed ids per step. ``eos``: the stop tokens allowed where an entry
    ends (None: each request's own). A row with nothing allowed yields no candidate: that beam ends. A request
    asking for more hypotheses than the dictionary holds gets fewer (:class:`beamkit.BeamSearch` warns)."""

    trie: Trie
    eos: tuple[int, ...] | None = None
    carries = True  # the engine keeps one int64 per row for it (StepContext.carry)
    bounds_outputs = True  # a dictionary may hold fewer sequences than the width: BeamSearch warns

    def nodes(self, ctx: StepContext) -> np.ndarray:
        """Each row's node after its tokens (``[rows]``), from the parent's carried node and the last token; a
        row without a carried node (a search that does not carry) walks its tokens."""
        rows = ctx.tokens.shape[0]
        if ctx.step == 0:
            return np.full(rows, ROOT, np.int64)
        carried = ctx.carry if ctx.carry is not None else np.full(rows, FRESH, np.int64)
        node = self.trie.child(carried, ctx.tokens[:, -1])
        lost = carried == FRESH
        if lost.any():
            node[lost] = self.trie.walk(ctx.tokens[lost])
        return node

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        vocab = int(scores.shape[1])
        check_vocab(self.trie, vocab, "the dictionary")
        node = self.nodes(ctx)  # shape: (rows,)
        if ctx.carry is not None:
            ctx.carry[:] = node
        stops = ctx.eos if self.eos is None else self.eos
        rows, cols = allowed_pairs(self.trie, node, tuple(e for e in stops if 0 <= e < vocab))
        return ops.keep_pairs(scores, rows, cols)


class TrieTable:
    """Processor for an engine shared by requests (a server's): named tries, each request constrained by the one
    it was :meth:`assign`-ed (none: unconstrained). Rows of one trie are masked together as :class:`TrieMask`
    masks them (nodes carried per row, the request's stop tokens allowed where an entry ends). Rows are matched to
    their request by the engine's request ids (``StepContext.request_id``).

    ``vocab_size``: the model's vocabulary (the logits' width): a trie holding an id past it is refused here; left
    None, it is learnt at the first step, and :meth:`assign` refuses such a trie from then on. A dictionary that
    fails at a step (an id past the vocabulary) fails only the requests constrained by it: their rows get no
    candidate, so each ends alone, and :meth:`failure` says why; every other request decodes as alone."""

    carries = True
    bounds_outputs = True

    def __init__(self, tries: dict[str, Trie], vocab_size: int | None = None):
        if not isinstance(tries, dict) or not all(isinstance(t, Trie) for t in tries.values()):
            raise TypeError(f"TrieTable takes a dict of beamkit.Trie by name, got {_cut(tries)}")
        self.names = tuple(tries)
        self.tries = tuple(tries.values())
        self.vocab_size = check_optional_int("TrieTable vocab_size", vocab_size, 1)
        if self.vocab_size is not None:
            for name, trie in tries.items():
                check_vocab(trie, self.vocab_size, f"the dictionary {name!r}")
        self._which: dict[int, int] = {}  # engine request id -> index into tries
        self._failed: dict[int, str] = {}  # engine request id -> why its dictionary failed it

    def assign(self, request_id: int, name: str | None) -> None:
        """Constrain request ``request_id`` by the trie called ``name`` (None: not at all); ValueError for a
        name not in the table, or a trie holding an id past the model's vocabulary (once it is known)."""
        if name is not None:
            self._which[request_id] = self.check(name)

    def check(self, name: str) -> int:
        """The index of the trie called ``name``; ValueError for a name not in the table, or a trie holding an id
        past the model's vocabulary (once it is known)."""
        if name not in self.names:
            raise ValueError(f"no dictionary {name!r}; this table has {list(self.names)}")
        k = self.names.index(name)
        if self.vocab_size is not None:
            check_vocab(self.tries[k], self.vocab_size, f"the dictionary {name!r}")
        return k

    def forget(self, request_id: int) -> None:
        """Drop a completed request."""
        self._which.pop(request_id, None)
        self._failed.pop(request_id, None)

    def failure(self, request_id: int) -> str | None:
        """Why the dictionary of request ``request_id`` failed it (None: it did not)."""
        return self._failed.get(request_id)

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        if self.vocab_size is None:
            self.vocab_size = int(scores.shape[1])
        if not self._which or ctx.request.size == 0:
            return scores
        if ctx.request_id is None:
            raise ValueError("TrieTable needs each row's request id (StepContext.request_id), as an Engine gives it")
        rids = ctx.request_id  # shape: (rows,) request ids
        uniq, inverse = np.unique(rids, return_inverse=True)  # per request, not per row
        trie_of = np.array([self._which.get(int(r), -1) for r in uniq.tolist()], np.int64)[inverse.reshape(-1)]
        for k in np.unique(trie_of[trie_of >= 0]).tolist():
            sel = np.flatnonzero(trie_of == k)  # shape: (rows of trie k,)
            trie, vocab = self.tries[k], int(scores.shape[1])
            try:
                check_vocab(trie, vocab, f"the dictionary {self.names[k]!r}")
                carried = None if ctx.carry is None else ctx.carry[sel]
                part = StepContext(ctx.step, ctx.tokens[sel], ctx.request[sel], ctx.eos, carry=carried)
                node = TrieMask(trie).nodes(part)  # shape: (rows of trie k,)
                rows, cols = allowed_pairs(trie, node, tuple(e for e in ctx.eos if 0 <= e < vocab))
            except (ValueError, IndexError) as exc:  # this dictionary's requests fail, the others go on
                for r in np.unique(rids[sel]).tolist():
                    self._failed.setdefault(int(r), str(exc))
                node, rows, cols = np.full(sel.size, DEAD, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
            if ctx.carry is not None:
                ctx.carry[sel] = node
            scores = ops.keep_pairs(scores, sel[rows], cols, among=sel)
        return scores


def check_vocab(trie: Trie, vocab: int, what: str) -> None:
    """ValueError when ``trie`` holds an id the model's ``vocab`` ids do not reach."""
    if trie.max_id >= vocab:
        raise ValueError(f"{what} holds token id {trie.max_id} but the model's vocabulary has {vocab} ids")


def allowed_pairs(trie: Trie, node: np.ndarray, eos: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The (row, id) pairs the rows at ``node`` ``[rows]`` may take: each node's children (one gather from the
    CSR arrays), plus ``eos`` at terminal nodes (dead nodes: none)."""
    live = node >= 0
    safe = np.where(live, node, 0)
    start = trie.indptr[safe]
    counts = np.where(live, trie.indptr[safe + 1] - start, 0)  # shape: (rows,)
    total = int(counts.sum())
    rows = np.repeat(np.arange(node.shape[0]), counts)  # shape: (total,)
    first = np.cumsum(counts) - counts
    cols = trie.labels[np.repeat(start - first, counts) + np.arange(total)].astype(np.int64)
    if eos:
        ends = np.flatnonzero(live & trie.terminal[safe])
        if ends.size:
            stop = np.asarray(eos, np.int64)
            e_rows, e_cols = np.repeat(ends, stop.size), np.tile(stop, ends.size)
            rows, cols = np.concatenate([rows, e_rows]), np.concatenate([cols, e_cols])
    return rows, cols


# ---------------------------------------------------------------------------------------------- building
def _table(source: Any, pad: int | None) -> tuple[np.ndarray, np.ndarray]:
    """An ``[n, L]`` int64 table (padding -1) and the lengths ``[n]`` of the sequences of ``source`` (``pad``:
    the id that ends shorter sequences, as in an array)."""
    if isinstance(source, (str, bytes, bytearray, dict)) or not isinstance(source, Iterable):
        raise TypeError(f"Trie takes token-id sequences, an [n, L] integer array or a file path, got {source!r}")
    if ops.is_array(source):
        return _from_array(ops.to_numpy(source), pad)
    seqs = [s.tolist() if ops.is_array(s) else s for s in source]
    if not seqs:
        return np.zeros((0, 0), np.int64), np.zeros(0, np.int64)
    if all(isinstance(s, (list, tuple)) for s in seqs):
        lengths = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
        if lengths.size and lengths.min() == lengths.max():  # rectangular: one conversion
            rect = _int_array(seqs, "Trie", ndim=2) if lengths.min() else np.zeros((len(seqs), 0), np.int64)
            return _from_array(rect, pad) if pad is not None else (rect, lengths)
        table = np.full((len(seqs), int(lengths.max(initial=0))), -1, np.int64)
        for i, s in enumerate(seqs):
            row = _int_array(s, f"Trie sequence {i}", ndim=1)
            if pad is not None:
                row = _strip_pad(row, pad, i)
                lengths[i] = row.shape[0]
            table[i, : row.shape[0]] = row
        return table, lengths
    for i, s in enumerate(seqs):
        if isinstance(s, (str, bytes)) or not isinstance(s, Iterable):
            raise TypeError(f"Trie sequence {i} must be a sequence of token ids, got {s!r}")
    return _table([list(s) for s in seqs], pad)


def _strip_pad(row: np.ndarray, pad: int, i: int) -> np.ndarray:
    """``row`` without the ``pad`` ids that end it; ValueError for a pad id before a token id."""
    keep = np.flatnonzero(row != pad)
    end = int(keep[-1]) + 1 if keep.size else 0
    if (row[:end] == pad).any():
        raise ValueError(f"row {i} has the pad id {pad} before a token id: padding goes at the end of a row")
    return row[:end]


def _int_array(values: Any, what: str, ndim: int | None = None) -> np.ndarray:
    """``values`` as an int64 array (of ``ndim`` dimensions where given); TypeError naming ``what`` for
    anything but integers, ValueError for an id no Trie can hold (beyond int64 included)."""
    try:
        arr = np.asarray(values)
    except (ValueError, OverflowError) as err:  # ragged nesting
        raise TypeError(f"{what} must hold integer token ids, got {_cut(values)} ({err})") from None
    if arr.size == 0 and (ndim is None or arr.ndim == ndim):
        return arr.astype(np.int64)
    if arr.dtype == bool:
        raise TypeError(f"{what} must hold integer token ids, got booleans")
    if arr.dtype.kind in "fO":  # Python ints beyond int64 come as floats or objects: say which id
        big = _beyond_int64(values)
        if big is not None:
            raise ValueError(f"token id {big} is out of range: ids must be >= 0 and below 2**31 - 1")
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{what} must hold integer token ids, got {arr.dtype} values")
    if ndim is not None and arr.ndim != ndim:
        shape = "one id per position" if ndim == 1 else "one sequence of ids per row"
        raise TypeError(f"{what} must hold {shape}, got nested values of shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"token id {int(arr.max())} is out of range: ids must be below 2**31 - 1")
    return arr.astype(np.int64, copy=False)


def _beyond_int64(values: Any) -> int | None:
    """The first integer of the nested lists ``values`` that int64 cannot hold (None: none)."""
    for v in values.tolist() if isinstance(values, np.ndarray) else values:
        if isinstance(v, (list, tuple)):
            found = _beyond_int64(v)
            if found is not None:
                return found
        elif isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
            return v
    return None


def _cut(values: Any) -> str:
    """``values`` for an error message, at most 80 characters."""
    text = repr(values)
    return text if len(text) <= 80 else text[:77] + "..."


def _from_array(arr: np.ndarray, pad: int | None) -> tuple[np.ndarray, np.ndarray]:
    """An ``[n, L]`` integer array (``pad`` ends shorter rows) as (table with -1 padding, lengths)."""
    if arr.ndim != 2:
        raise ValueError(f"a Trie array must be [n, L] (one sequence per row), got shape {arr.shape}")
    table = _int_array(arr, "a Trie array", ndim=2)
    if pad is None:
        return table, np.full(table.shape[0], table.shape[1], np.int64)
    is_pad = table == pad
    lengths = table.shape[1] - is_pad.sum(axis=1)
    inside = np.arange(table.shape[1])[None, :] < lengths[:, None]  # shape: (n, L) the positions before padding
    if (is_pad & inside).any():
        row = int(np.flatnonzero((is_pad & inside).any(axis=1))[0])
        raise ValueError(f"row {row} has the pad id {pad} before a token id: padding goes at the end of a row")
    return np.where(inside, table, -1), lengths.astype(np.int64)


def _read_file(path: Path, pad: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A dictionary file: ``.npy`` (an ``[n, L]`` array) or UTF-8 text, one sequence of space-separated ids a
    line; ValueError naming the file for anything else (a binary file, an archive, an array of objects)."""
    name = str(path)
    if not path.is_file():
        raise ValueError(f"no dictionary file {name!r}")
    head = _head(name, "dictionary file")
    if path.suffix == ".npy" or head.startswith(NPY_MAGIC):
        if not head.startswith(NPY_MAGIC):
            raise ValueError(f"dictionary file {name!r} is not a numpy .npy array file")
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as err:
            why = "it holds Python objects, not token ids" if "pickle" in str(err) else str(err)
            raise ValueError(f"cannot read {name!r} as a numpy array: {why}") from None
        except (OSError, EOFError) as err:
            raise ValueError(f"cannot read {name!r} as a numpy array: {err}") from None
        return _from_array(arr, pad)
    if head.startswith(ZIP_MAGIC):
        raise ValueError(
            f"dictionary file {name!r} is an archive, not text: a trie saved by Trie.save loads with Trie.load"
        )
    lines = [line.split() for line in text_lines(path, "dictionary file") if line.strip()]
    try:
        seqs = [[int(t) for t in line] for line in lines]
    except ValueError as err:
        raise ValueError(f"{name!r}: every line must be token ids separated by spaces ({err})") from None
    return _table(seqs, pad)


def _check_ids(table: np.ndarray, lengths: np.ndarray, vocab_size: int | None) -> None:
    """ValueError for an empty dictionary, an empty entry, a negative id or one past ``vocab_size``."""
    if table.shape[0] == 0:
        raise ValueError("the dictionary is empty: a Trie needs at least one sequence")
    if lengths.min() == 0:
        raise ValueError(f"sequence {int(np.argmin(lengths))} of the dictionary is empty")
    negative = table < 0  # shape: (n, L)
    if lengths.min() < table.shape[1]:  # ragged: the padding (-1) is not an id
        negative &= np.arange(table.shape[1])[None, :] < lengths[:, None]
    if negative.any():
        raise ValueError(f"token ids must be >= 0, got {int(table[negative].min())}")
    if vocab_size is not None and table.max() >= vocab_size:
        raise ValueError(f"token id {int(table.max())} is outside the vocabulary of {vocab_size} ids")
    if table.max() >= 2**31 - 1:
        raise ValueError(f"token id {int(table.max())} must be below 2**31 - 1")


def _build(table: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """CSR arrays of the trie of the rows of ``table`` ``[n, L]`` (-1 after each row's length), vectorised:
    sort the rows (lexsort, padding first, so a prefix precedes its extensions), drop duplicates, then per
    depth the rows whose prefix of that depth is new are the nodes of that depth, breadth first."""
    n, depth = table.shape
    table = table.astype(np.int32)  # ids are below 2**31 - 1 (checked): half the memory of the sort
    order = np.lexsort(table.T[::-1])  # shape: (n,) rows in lexicographic order
    rows = table[order]
    del table, order
    if n > 1:
        differ = rows[1:] != rows[:-1]  # shape: (n - 1, L)
        keep = np.concatenate([[True], differ.any(axis=1)])
        rows, differ = rows[keep], differ[keep[1:]]
        first_diff = np.concatenate([[0], np.where(differ.any(axis=1), differ.argmax(axis=1), depth)])
        del differ
    else:
        first_diff = np.zeros(1, np.int64)
    lengths = (rows >= 0).sum(axis=1)  # shape: (m,) padding is -1 and only at the end
    m = rows.shape[0]
    kind = np.int32 if m * depth < 2**31 - 1 else np.int64  # node ids
    parent_of_row = np.zeros(m, kind)  # shape: (m,) the node of each row's prefix of the previous depth
    labels, parents = [], []
    next_id = 1
    ends = np.zeros(m, kind)  # shape: (m,) the node where each row ends
    for d in range(1, depth + 1):
        valid = lengths >= d
        new = valid & (first_diff < d)  # shape: (m,) rows whose prefix of length d is a new node
        ids = np.cumsum(new, dtype=kind)
        ids += next_id - 1  # shape: (m,) the id of each row's prefix node of length d
        node_of_row = np.where(valid, ids, 0).astype(kind, copy=False)
        del ids
        labels.append(rows[new, d - 1])
        parents.append(parent_of_row[new])
        next_id += int(new.sum())
        done = lengths == d
        ends[done] = node_of_row[done]
        parent_of_row = node_of_row
    nodes = next_id
    del rows, parent_of_row
    parent = np.concatenate(parents) if parents else np.zeros(0, kind)  # shape: (nodes - 1,) ascending
    del parents
    counts = np.bincount(parent, minlength=nodes)  # shape: (nodes,)
    indptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    terminal = np.zeros(nodes, bool)
    terminal[ends] = True
    label = np.concatenate(labels).astype(np.int32) if labels else np.zeros(0, np.int32)
    return indptr, label, terminal, m, int(lengths.max())


# ---------------------------------------------------------------------------------------------- saved tries
ZIP_MAGIC = b"PK\x03\x04"  # a numpy .npz archive is a zip file
NPY_MAGIC = b"\x93NUMPY"


def _head(path: str, what: str) -> bytes:
    """The first bytes of the regular file ``path``; ValueError naming it when it cannot be read."""
    if not os.path.isfile(path):
        raise ValueError(f"no {what} {path!r}" if not os.path.exists(path) else f"{what} {path!r} is not a file")
    try:
        with open(path, "rb") as fh:
            return fh.read(8)
    except OSError as err:
        raise ValueError(f"cannot read {what} {path!r}: {err.strerror or err}") from None


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` archive ``path`` (never unpickled); ValueError naming the file for anything
    that is not a readable numpy archive of plain arrays."""
    if not _head(path, "saved trie").startswith(ZIP_MAGIC):
        raise ValueError(
            f"cannot read a trie from {path!r}: it is not a numpy .npz archive as Trie.save writes (for a "
            "dictionary of token ids, a text file or a .npy array, use Trie(path))"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as err:
        if "pickle" in str(err):  # an array of Python objects: a saved trie holds none, and none is unpickled
            raise ValueError(f"cannot read a trie from {path!r}: it holds arrays of Python objects") from None
        raise ValueError(f"cannot read a trie from {path!r}: {err}") from None
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise ValueError(f"cannot read a trie from {path!r}: the archive is damaged ({err})") from None


def _scalar(arrays: dict[str, np.ndarray], key: str, least: int) -> int:
    """The integer scalar ``arrays[key]`` (ValueError unless it is one, at least ``least``)."""
    value = arrays[key]
    if value.shape != () or value.dtype.kind not in "iu":
        raise ValueError(f"{key!r} is not an integer scalar (dtype {value.dtype}, shape {value.shape})")
    if int(value) < least:
        raise ValueError(f"{key!r} is {int(value)}, below {least}")
    return int(value)


def _check_saved(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int | None]:
    """The saved arrays checked as a well-formed trie (see :class:`Trie` for the layout): ``indptr`` starts at 0,
    never decreases and ends at ``nodes - 1``, every child is numbered after its parent (so the arrays form one
    tree), labels are token ids (below ``vocab_size`` where saved) sorted and distinct among siblings, every leaf
    ends an entry, the root does not, and ``count`` / ``depth`` are the trie's own. Returns (indptr, labels,
    terminal, count, depth, vocab_size); ValueError naming the first fault."""
    indptr, labels, terminal = arrays["indptr"], arrays["labels"], arrays["terminal"]
    for key, arr, kinds in (("indptr", indptr, "iu"), ("labels", labels, "iu"), ("terminal", terminal, "b")):
        if arr.ndim != 1 or arr.dtype.kind not in kinds:
            raise ValueError(f"{key!r} is a {arr.ndim}-d {arr.dtype} array, not the 1-d array a trie saves")
    nodes = terminal.shape[0]
    if nodes == 0 or indptr.shape[0] != nodes + 1 or labels.shape[0] != nodes - 1:
        raise ValueError("the trie's arrays do not fit together (indptr, labels and terminal sizes)")
    count, depth = _scalar(arrays, "count", 1), _scalar(arrays, "depth", 1)
    vocab = _scalar(arrays, "vocab_size", 1) if "vocab_size" in arrays else None
    ptr = indptr.astype(np.int64)
    if ptr[0] != 0 or ptr[-1] != nodes - 1 or (np.diff(ptr) < 0).any():
        raise ValueError(f"indptr is not offsets from 0 to {nodes - 1} in ascending order")
    parent = np.repeat(np.arange(nodes, dtype=np.int64), np.diff(ptr))  # shape: (nodes - 1,) of nodes 1..
    if (parent >= np.arange(1, nodes)).any():
        raise ValueError("a node is numbered before its parent (the arrays do not form one tree)")
    ids = labels.astype(np.int64)
    top = vocab if vocab is not None else 2**31 - 1
    if labels.size and (ids.min() < 0 or ids.max() >= top):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise ValueError(f"label {bad} is not a token id below {top}")
    same_parent = parent[1:] == parent[:-1]
    if (same_parent & (ids[1:] <= ids[:-1])).any():
        raise ValueError("the labels of a node's children are not sorted and distinct")
    has_children = np.diff(ptr) > 0
    if terminal[0] or not terminal[~has_children].all():
        raise ValueError("the root ends an entry, or a leaf ends none")
    if int(terminal.sum()) != count:
        raise ValueError(f"count is {count} but {int(terminal.sum())} nodes end an entry")
    level = np.zeros(nodes, np.int64)  # shape: (nodes,) each node's depth: parents come first, one pass a level
    for _ in range(nodes):
        deeper = level[parent] + 1
        if np.array_equal(deeper, level[1:]):
            break
        level[1:] = deeper
    if int(level.max()) != depth:
        raise ValueError(f"depth is {depth} but the deepest entry has {int(level.max())} tokens")
    return ptr, ids.astype(np.int32), terminal.astype(bool), count, depth, vocab
