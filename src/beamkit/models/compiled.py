"""A compiled one-token decode step: ``torch.compile`` over static shapes, keys/values in preallocated buffers.

The step of :class:`beamkit.models.transformer.Transformer` with ``init_state(..., compile=True)``: rows are
padded to a few buckets (powers of two), the self-attention keys/values live in buffers of the model's
``max_len`` columns that the step writes one column of in place and reads whole under a mask (masks and
positions are tensors), and the source is padded to a bucket too, so one compiled graph serves every step
of every call whose rows fall in one bucket. Graphs are compiled on first use of a bucket and reused (and
inductor keeps its compiled kernels in its on-disk cache across processes). Where ``torch.compile`` is not
available (no C compiler for inductor, an unsupported Python), the same static step runs eagerly, with the
reason logged once on the ``beamkit`` logger. A first compilation that takes more than two seconds prints
one line on standard error.

``compile="max-autotune"`` compiles with inductor, its matrix products autotuned (inductor's C++ templates
against the ATen ones, timed on this machine) and the model's weights frozen into the graphs as constants
(packed for those templates). Where the rows are few (greedy decoding, a handful of requests) this runs the
step's matrix products much faster on a CPU; the first compilation of each bucket takes longer, and the
packed weights are a second copy of the linear layers' weights in memory. The weights are checked before each
step (address and in-place version of every parameter and buffer): a model whose weights changed since is
compiled again, with a line on the ``beamkit`` logger (weights created in inference mode have no version
counter: their in-place changes cannot be seen).

Between steps, the rows that survive (parents, may repeat) are copied into a second set of buffers
(:func:`copy_parents`: their filled columns, or whole rows once more than half the columns are filled): the
dense cache's gather, without its concatenation. The same copy serves the Hugging Face compiled step.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import types
import unittest.mock
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger("beamkit")

SLOW_COMPILE_SECONDS = 2.0  # a first compilation longer than this is announced on standard error
MAX_AUTOTUNE = "max-autotune"  # the compile= value for inductor with autotuned matrix products, weights frozen
_FROZEN = {"freezing": True, "max_autotune": True}  # the inductor settings of MAX_AUTOTUNE
MIN_ROWS = 4  # the smallest row bucket
MIN_SOURCE = 8  # the smallest source bucket
# graphs one step may hold (torch.compile's own default, 8 per function, would silently run a model with many
# row and source buckets eagerly)
RECOMPILE_LIMIT = 64


def bucket(n: int, least: int) -> int:
    """The bucket holding ``n``: the smallest power of two >= ``n`` and >= ``least``."""
    if n < 0:
        raise ValueError(f"a bucket holds a count >= 0, got {n}")
    size = least
    while size < n:
        size *= 2
    return size


def compile_setting(value: Any) -> str | None:
    """The ``torch.compile`` backend a ``compile=`` switch asks for: False / None -> None (eager), True ->
    ``"inductor"``, a string -> that backend (``"max-autotune"``: inductor, matrix products autotuned and weights
    frozen; see the module doc). Raises TypeError for anything else, ValueError for a name that is no backend
    of the installed torch (naming the ones it has)."""
    if value is None or value is False:
        return None
    if value is True:
        return "inductor"
    if not (isinstance(value, str) and value):
        raise TypeError(f"compile must be True, False or a torch.compile backend name, got {value!r}")
    known = backends()
    if known and value not in known:
        shown = ", ".join(known[: len(SHOWN) + 1])
        raise ValueError(f"compile={value!r} is no torch.compile backend; this torch has {shown} (and its debug ones)")
    return value


SHOWN = ("cudagraphs", "eager", "aot_eager", "inductor", "openvino", "openxla", "tvm")


def backends() -> list[str]:
    """The backend names ``compile=`` takes: ``"max-autotune"`` and torch.compile's registered backends, the
    common ones first (empty without torch: nothing to check against, and nothing runs compiled)."""
    try:
        import torch
    except ImportError:
        return []
    names = set(torch.compiler.list_backends(exclude_tags=()))
    common = [n for n in SHOWN if n in names]
    return ["max-autotune", *common, *sorted(names - set(common))]


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a function or a bound method) running a copy of its code object. ``torch.compile`` keeps its
    graphs and guards on the code object, which lives as long as its module: on a shared one they would keep
    every model ever compiled alive (through ``self``); on a copy they are freed with the step that holds it."""
    func = getattr(fn, "__func__", fn)
    fresh = types.FunctionType(
        func.__code__.replace(), func.__globals__, func.__name__, func.__defaults__, func.__closure__
    )
    fresh.__kwdefaults__ = func.__kwdefaults__
    fresh.__qualname__ = func.__qualname__
    owner = getattr(fn, "__self__", None)
    return fresh if owner is None else types.MethodType(fresh, owner)


class _Counting:
    """The backend torch.compile calls once per graph: counts the graph on its step, then hands it to the chosen
    backend. torch keeps every backend it was given for the life of the process, so this one holds its step
    only weakly (the step, and the model it runs, are freed with their owner)."""

    def __init__(self, step: CompiledStep, backend: str) -> None:
        self.step, self.backend = weakref.ref(step), backend

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo import lookup_backend

        step = self.step()
        if step is not None:
            step.compilations += 1
        backend = "inductor" if self.backend == MAX_AUTOTUNE else self.backend  # its settings: CompiledStep
        return lookup_backend(backend)(gm, example_inputs)  # type: ignore[arg-type]


def weights_stamp(tensors: Iterable[Tensor]) -> tuple[tuple[int, int], ...]:
    """Each tensor's address and in-place version (-1 for a tensor made in inference mode, which keeps none):
    what changes when a model's weights are replaced or edited in place."""
    return tuple((int(t.data_ptr()), -1 if t.is_inference() else int(t._version)) for t in tensors)


class CompiledStep:
    """One model's static decode step compiled per shape bucket: ``fn`` is the eager step, ``backend`` the
    ``torch.compile`` backend (None: always eager). ``compilations`` counts the graphs compiled so far.
    ``weights``: the model's parameters and buffers, read before each step with ``"max-autotune"`` (which freezes
    them into its graphs): where they changed, the graphs are dropped and compiled again."""

    def __init__(
        self,
        fn: Callable[..., Tensor],
        backend: str | None,
        weights: Callable[[], Iterable[Tensor]] | None = None,
    ) -> None:
        self.fn, self.backend = own_code(fn), backend
        self.compilations = 0
        self.seen: set[tuple[Any, ...]] = set()
        self.compiled: Callable[..., Tensor] | None = None
        self.eager_reason: str | None = None if backend is not None else "compile=False"
        self.weights = weights if backend == MAX_AUTOTUNE else None
        self.stamp: tuple[tuple[int, int], ...] | None = None  # the weights the graphs froze

    def _settings(self) -> Any:
        """The inductor settings a first call (which compiles) runs under: ``"max-autotune"`` 's, or none."""
        stack = contextlib.ExitStack()
        if self.backend != MAX_AUTOTUNE:
            return stack
        from torch._inductor import config, select_algorithm

        stack.enter_context(config.patch({**_FROZEN, "max_autotune_report_choices_stats": False}))
        if hasattr(select_algorithm, "PRINT_AUTOTUNE"):  # inductor's table of timings on standard error
            stack.enter_context(unittest.mock.patch.object(select_algorithm, "PRINT_AUTOTUNE", False))
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")  # inductor's autotuning's own
        return stack

    def _check_weights(self) -> None:
        """Drop the graphs (a fresh copy of the step's code, so torch.compile keeps none of them) where the
        weights changed since they were frozen into them."""
        assert self.weights is not None
        stamp = weights_stamp(self.weights())
        if self.stamp is not None and stamp != self.stamp and self.compiled is not None:
            log.warning(
                "beamkit: the model's weights changed since its step was compiled (max-autotune freezes them "
                "into the graphs): compiling it again"
            )
            self.fn, self.compiled, self.seen = own_code(self.fn), None, set()
        self.stamp = stamp

    def _fall_back(self, reason: str) -> None:
        if self.eager_reason is None:
            self.eager_reason = reason
            log.warning("beamkit: the compiled decode step is not available (%s); running it eagerly", reason)

    def __call__(self, key: tuple[Any, ...], *args: Any) -> Tensor:
        """Run the step on inputs of the shape bucket ``key`` (its sizes; also the device and dtype where they
        may change: compiled on the bucket's first call)."""
        if self.eager_reason is not None:
            return self.fn(*args)
        if self.weights is not None:
            self._check_weights()
        if self.compiled is None:
            try:
                counter = _Counting(self, self.backend)  # type: ignore[arg-type]
                self.compiled = torch.compile(self.fn, backend=counter, dynamic=False, fullgraph=True)
            except Exception as exc:  # torch.compile itself refuses (an unsupported Python, say)
                self._fall_back(f"{type(exc).__name__}: {exc}")
                return self.fn(*args)
        first = key not in self.seen
        start = time.perf_counter()
        try:
            if first:
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT), self._settings():
                    out = self.compiled(*args)
            else:
                out = self.compiled(*args)
        except Exception as exc:  # compilation failed (no C compiler, a backend error): eager from now on
            if not first:
                raise
            self._fall_back(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return self.fn(*args)
        if first:
            self.seen.add(key)
            spent = time.perf_counter() - start
            if spent > SLOW_COMPILE_SECONDS:
                sizes = "x".join(str(k) for k in key if isinstance(k, int))
                print(
                    f"beamkit: compiled the decode step for {key[0]} rows in {spent:.1f} s "
                    f"(once per shape bucket, here {sizes}; later calls reuse it)",
                    file=sys.stderr,
                )
        return out


def copy_parents(
    live: list[Tensor], spare: list[Tensor] | None, index: Tensor, t: int
) -> tuple[list[Tensor], list[Tensor]]:
    """Rows ``index`` (parents, may repeat) of the buffers ``live`` (each ``[cap, heads, columns, d]``, the first
    ``t`` columns filled) copied into ``spare`` (made at the first call with the live buffers' rows, or grown to
    a larger rows bucket when more rows come back than they hold). Returns ``(live, spare)`` for the next step:
    the filled copy, and the old live set (grown as well when too small to be the next target). While the
    filled columns are at most half the buffer only they move (through a temporary: two passes over t columns),
    else whole rows (one pass over every column, no temporary)."""
    n, rows = int(index.shape[0]), int(live[0].shape[0])
    cap = rows if n <= rows else bucket(n, MIN_ROWS)  # the live buffers' rows, or the bucket of more rows
    if spare is None or cap > int(spare[0].shape[0]):
        spare = [x.new_zeros((cap, *x.shape[1:])) for x in live]
    columns = int(live[0].shape[2])
    for src, dst in zip(live, spare, strict=True):
        if 2 * t <= columns:
            dst[:n, :, :t].copy_(src[:, :, :t].index_select(0, index))  # shape: (n, heads, t, d)
        else:
            torch.index_select(src, 0, index, out=dst[:n])  # shape: (n, heads, columns, d)
    old = live
    if int(old[0].shape[0]) < cap:
        old = [x.new_zeros((cap, *x.shape[1:])) for x in old]
    return spare, old


class StaticKV:
    """The self-attention keys/values of the compiled step: per layer a buffer ``(cap, heads, max_len, d_head)``
    of which the first ``rows`` rows and ``t`` columns are filled, and the compiled step that fills them. A
    state leaf for beamkit: ``beamkit_select`` copies the chosen rows into the spare buffers and consumes this
    handle (use the one it returns)."""

    def __init__(
        self, keys: list[Tensor], values: list[Tensor], spare: list[Tensor], rows: int, t: int, step: CompiledStep
    ) -> None:
        self.keys, self.values = keys, values  # per layer, shape: (cap, heads, max_len, d_head)
        self.step = step  # the model's compiled step, shared by every handle of one search
        self.spare = spare  # 2 x layers buffers of the same shape, the target of the next select
        self.rows, self.t = rows, t
        self._live = True

    @property
    def cap(self) -> int:
        """Rows the buffers hold (the row bucket)."""
        return int(self.keys[0].shape[0]) if self.keys else 0

    def __len__(self) -> int:
        return self.rows

    def __repr__(self) -> str:
        return f"StaticKV(rows={self.rows}, cap={self.cap}, t={self.t}, {'live' if self._live else 'consumed'})"

    def check(self) -> None:
        """Raise ValueError when this handle was consumed by a select."""
        if not self._live:
            raise ValueError("this StaticKV handle was consumed by beamkit_select: use the one that call returned")

    def advance(self) -> StaticKV:
        """The handle after one step wrote column ``t`` of every row (consumes this one)."""
        self.check()
        self._live = False
        return StaticKV(self.keys, self.values, self.spare, self.rows, self.t + 1, self.step)

    def kv_bytes(self) -> int:
        """Bytes of the buffers (both sets)."""
        return sum(int(x.numel()) * x.element_size() for x in (*self.keys, *self.values, *self.spare))

    def beamkit_select(self, idx: np.ndarray) -> StaticKV:
        """Rows ``idx`` (parents, may repeat), copied into the spare buffers by :func:`copy_parents`."""
        self.check()
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.rows):
            raise IndexError(f"row index out of range for {self.rows} rows")
        self._live = False
        n = int(idx.shape[0])
        if n == self.rows and bool((idx == np.arange(n)).all()):
            return StaticKV(self.keys, self.values, self.spare, n, self.t, self.step)
        layers = len(self.keys)
        at = torch.as_tensor(idx, device=self.keys[0].device)
        live, spare = copy_parents([*self.keys, *self.values], self.spare, at, self.t)
        return StaticKV(live[:layers], live[layers:], spare, n, self.t, self.step)
