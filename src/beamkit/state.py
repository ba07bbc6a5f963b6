"""Model state handling: gather rows by parent, concatenate states of new requests.

A state is any nesting of tuples, NamedTuples, lists and dicts. Its array leaves (numpy arrays and torch tensors
with at least one dimension) hold one row per live hypothesis on axis 0. Everything else is passed through,
including values wrapped in :class:`Shared` (data per request rather than per row, such as an encoder's memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamkit import ops


@dataclass(frozen=True)
class Shared:
    """A state leaf that is not per row: ``select_state`` passes it through untouched.

    Use it for per-request data that every beam of a request reads (encoder memory, cross-attention keys and
    values), indexed inside the step function by a per-row request id kept as an ordinary array leaf.
    """

    value: Any


def _map_leaves(state: Any, fn: Callable[[Any], Any]) -> Any:
    """Rebuild ``state`` with ``fn`` applied to every array leaf, keeping container types."""
    if isinstance(state, Shared):
        return state
    if ops.is_array(state):
        return fn(state)
    if isinstance(state, tuple):
        items = [_map_leaves(s, fn) for s in state]
        if hasattr(state, "_fields"):  # NamedTuple: keep the type so state.h still works
            return type(state)(*items)
        return tuple(items)
    if isinstance(state, list):
        return [_map_leaves(s, fn) for s in state]
    if isinstance(state, dict):
        return type(state)((k, _map_leaves(v, fn)) for k, v in state.items())
    if isinstance(state, (set, frozenset)):
        raise TypeError("select_state: a set has no order, so its rows cannot be gathered; use a tuple or list")
    if hasattr(state, "beamkit_select"):
        return fn(state)
    return state


def select_state(state: Any, idx: Any) -> Any:
    """Gather every array leaf of ``state`` by ``idx`` along axis 0 (rows may repeat).

    ``idx`` is a 1-D integer array of parent rows. Objects with a ``beamkit_select(idx)`` method (for example a
    wrapped key/value cache) are asked to gather themselves. Non-array leaves and :class:`Shared` values are
    passed through; a set raises TypeError.
    """
    index = ops.to_numpy(idx).astype(np.int64).ravel()

    def gather(leaf: Any) -> Any:
        if ops.is_array(leaf):
            return ops.gather_rows(leaf, index)
        return leaf.beamkit_select(index)

    return _map_leaves(state, gather)


def state_row(state: Any, i: int) -> Any:
    """Row ``i`` of ``state`` as a one-row state: a view (``leaf[i : i + 1]``) of every array leaf; objects with
    ``beamkit_select`` are asked for the row. Cheaper than :func:`select_state` for one row, and it shares the
    leaves' memory."""

    def row(leaf: Any) -> Any:
        if ops.is_array(leaf):
            return leaf[i : i + 1]
        return leaf.beamkit_select(np.array([i], dtype=np.int64))

    return _map_leaves(state, row)


def _array_leaves(state: Any, path: str) -> Any:
    """(path, leaf) for every array leaf of ``state``, depth first (Shared values and custom objects skipped)."""
    if isinstance(state, Shared):
        return
    if ops.is_array(state):
        yield path, state
    elif isinstance(state, tuple):
        names = getattr(state, "_fields", None)
        for i, s in enumerate(state):
            yield from _array_leaves(s, f"{path}.{names[i]}" if names else f"{path}[{i}]")
    elif isinstance(state, list):
        for i, s in enumerate(state):
            yield from _array_leaves(s, f"{path}[{i}]")
    elif isinstance(state, dict):
        for k, s in state.items():
            yield from _array_leaves(s, f"{path}[{k!r}]")


def check_rows(state: Any, rows: int, what: str = "state") -> None:
    """Raise ValueError naming the first array leaf of ``state`` whose axis 0 does not hold ``rows`` rows."""
    for path, leaf in _array_leaves(state, what):
        n = int(leaf.shape[0])
        if n != rows:
            raise ValueError(f"{path} has {n} rows on axis 0, expected {rows} (one per live row)")


def first_array(state: Any) -> Any:
    """The first array leaf of a state (depth first, dicts in insertion order), or None."""
    if ops.is_array(state):
        return state
    if isinstance(state, dict):
        state = list(state.values())
    if isinstance(state, (tuple, list)):
        for s in state:
            found = first_array(s)
            if found is not None:
                return found
    return None


def is_identity(idx: np.ndarray, rows: int) -> bool:
    """True when ``idx`` is ``0..rows-1`` in order, so gathering would copy rows onto themselves."""
    return idx.shape[0] == rows and bool((idx == np.arange(rows)).all())


def concat_state(states: list[Any]) -> Any:
    """Concatenate states of the same structure along axis 0 (new requests joining a running batch).

    Array leaves are concatenated in their own library; :class:`Shared` values of different states are
    concatenated too (their rows are requests, so a per-row request id of the joining state must be offset by
    the caller), while one Shared object found in every state (rows of the same requests) is kept as it is.
    Other leaves must be equal and are taken from the first state. Array leaves must hold values of one kind
    (all floating point, all integers, all objects, ...): a TypeError names the two dtypes otherwise, since
    joining would silently convert the running rows.
    """
    if not states:
        raise ValueError("concat_state needs at least one state")
    first = states[0]
    custom = getattr(first, "beamkit_concat", None)
    if custom is not None:  # a state that knows how to join (a KV cache, a model's own state tuple)
        return custom(states[1:])
    if isinstance(first, Shared):
        if all(s is first for s in states):
            return first
        return Shared(concat_state([s.value for s in states]))
    if ops.is_array(first):
        kind = ops.dtype_kind(first)
        for s in states[1:]:
            if ops.is_array(s) and ops.dtype_kind(s) != kind:
                raise TypeError(f"a state leaf of dtype {s.dtype} cannot join rows of dtype {first.dtype}")
        return ops.concat_rows(list(states))
    if isinstance(first, tuple):
        items = [concat_state([s[i] for s in states]) for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else tuple(items)
    if isinstance(first, list):
        return [concat_state([s[i] for s in states]) for i in range(len(first))]
    if isinstance(first, dict):
        return type(first)((k, concat_state([s[k] for s in states])) for k in first)
    return first
