"""Drivers of the engine over a closed batch: :class:`BeamSearch` (options once, many searches),
:func:`search_batch` (one call) and :func:`traced_search` (one call, each request's trace too)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.search.engine import Engine
from beamkit.search.greedy import greedy_applies, greedy_search
from beamkit.search.inputs import StepFn
from beamkit.search.options import SearchOptions, make_options
from beamkit.search.records import Completed, SearchResult
from beamkit.trace import Trace


class BeamSearch:
    """A configured search over a closed batch: ``BeamSearch(options).search(step_fn, init_state, bos, eos)``.

    A thin driver of :class:`Engine`: add every request, step until idle. Plain greedy decoding (one beam, see
    :func:`beamkit.search.greedy.greedy_applies`) skips the beam machinery: the same results, less work a step.
    """

    def __init__(self, options: SearchOptions):
        self.options = options

    def search(
        self,
        step_fn: StepFn,
        init_state: Any,
        bos: int | Sequence[int],
        eos: int | Sequence[int] | None,
        batch_size: int | None = None,
    ) -> SearchResult:
        """Decode every request of ``init_state`` (one row each) together; results in row order.

        ``eos`` is the stop token, or several (any of them finishes a hypothesis); ``None`` means no stop token:
        every hypothesis runs to ``max_len``.
        """
        if greedy_applies(self.options):  # one beam: the same results without the beam machinery
            result = greedy_search(self.options, step_fn, init_state, bos, eos, batch_size)
            self._warn_short(result.hypotheses, result.errors)  # type: ignore[arg-type]
            return result
        engine = Engine(step_fn, self.options, on_step_error="raise")
        ids = engine.add_batch(init_state, bos, eos, batch_size)
        done: dict[int, Completed] = {}
        for _ in range(self.options.max_len + 1):  # every request ends within max_len model calls
            for c in engine.step():
                done[c.request_id] = c
            if engine.idle:
                break
        else:
            raise RuntimeError(f"the search did not end within max_len={self.options.max_len} steps")
        results = [done[i].hypotheses for i in ids]
        errors = {n: done[i].error for n, i in enumerate(ids) if done[i].error is not None}
        self._warn_short(results, errors)
        traces = [done[i].trace for i in ids] if self.options.record_trace else None
        return SearchResult(results, engine.stats, errors, traces)  # type: ignore[arg-type]

    def _warn_short(self, results: list[list[Hypothesis]], errors: dict[int, str | None]) -> None:
        """Warn when a processor that bounds the outputs (a dictionary constraint) left a request with fewer
        hypotheses than asked: the dictionary holds fewer valid sequences than that (none of them is invalid)."""
        opt = self.options
        if not any(getattr(p, "bounds_outputs", False) for p in opt.processors or ()):
            return
        wanted = opt.num_return or opt.beam_size
        short = [n for n, hyps in enumerate(results) if n not in errors and len(hyps) < wanted]
        if short:
            got = ", ".join(f"request {n}: {len(results[n])}" for n in short[:5]) + (", ..." if len(short) > 5 else "")
            warnings.warn(
                f"the dictionary allows fewer sequences than the {wanted} asked ({got}): those requests return "
                "fewer hypotheses",
                stacklevel=3,
            )


def search_batch(
    step_fn: StepFn,
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int] | None,
    beam_size: int,
    max_len: int,
    **options: Any,
) -> list[list[Hypothesis]]:
    """Decode a batch of requests together: one ``step_fn`` call per step for all live rows.

    ``init_state`` has one row per request (axis 0 of every array leaf); ``bos`` is an int or one id per
    request. Options are the fields of :class:`SearchOptions` (``length_penalty`` may be a float). Returns each
    request's hypotheses, best first. If some requests fail (NaN logits, nothing finite to choose), the others
    still finish and a :class:`BatchDecodeError` carrying their results is raised.
    """
    result = BeamSearch(make_options(beam_size, max_len, **options)).search(step_fn, init_state, bos, eos)
    BatchDecodeError.raise_if(result.errors, result.hypotheses)
    return result.hypotheses


def traced_search(
    step_fn: StepFn,
    init_state: Any,
    bos: int | Sequence[int],
    eos: int | Sequence[int] | None,
    beam_size: int,
    max_len: int,
    **options: Any,
) -> tuple[list[list[Hypothesis]], list[Trace]]:
    """:func:`search_batch` with tracing on: each request's hypotheses and its :class:`~beamkit.trace.Trace`."""
    result = BeamSearch(make_options(beam_size, max_len, record_trace=True, **options)).search(
        step_fn, init_state, bos, eos
    )
    BatchDecodeError.raise_if(result.errors, result.hypotheses)
    assert result.trace is not None
    return result.hypotheses, [t for t in result.trace if t is not None]
