"""OLMo's ``BeamSearch`` on beamkit's engine.

The search is the engine's ``compete`` policy: a batch element's finished hypotheses and its new candidates
compete by log-probability for its ``beam_size`` places at every step, which is OLMo's rule (OLMo keeps a
finished hypothesis as a beam fed end tokens at log-probability 0). The step function's log-probabilities are
used as given (not renormalised); samplers, constraints and the final scorer keep OLMo's protocols.

What differs from OLMo (the results agree otherwise):

* Rows are compact: the step function is called on the live hypotheses only, so the number of rows varies from
  step to step (OLMo always sends ``batch * beam`` after the first step) and finished hypotheses are never
  evaluated. The state is gathered by row like OLMo's (every tensor of the dict along axis 0; ``None`` values
  are passed through).
* Ties between equal log-probabilities go to the lower token id, then to the better-ranked parent (OLMo's order
  is whatever ``torch.topk`` gives). Running log-probabilities are summed in float64 and returned in the step's
  dtype (OLMo sums in the step's dtype), so candidates closer than the dtype's rounding can rank apart.
* ``min_steps`` masks the end token with ``-inf`` (OLMo: the dtype's most negative value). A batch element with
  fewer finite continuations than ``beam_size`` returns the hypotheses it has, the remaining places padded with
  end tokens at log-probability ``-inf`` (OLMo fills them with arbitrary tokens); both warn about negligible
  log-probabilities.
* ``predictions`` is as wide as the longest returned hypothesis (OLMo may add columns of end tokens).
* The caller's state dict, when the step function returns the dict it is given, is left holding each returned
  hypothesis's final state row, ``[batch * beam, ...]`` in the returned (sorted) order: the row of the call
  that chose its last token (OLMo keeps feeding end tokens to finished beams, and leaves its final beams' rows in
  the order before the final scorer's sort). An entry whose rows differ in shape between hypotheses (a growing
  token buffer, for hypotheses that ended at different steps) is left as it was, with a RuntimeWarning.
* Constraints are applied to one hypothesis at a time (see :mod:`beamkit.compat.olmo.constraints`). A sampler's
  state is kept for the whole search (OLMo passes it from step to step), except :class:`GumbelSampler`'s per-row
  ``phi_S`` / ``G_phi_S``, which beamkit keeps per hypothesis. A custom ``sample_beams`` chooses which of the new
  candidates may run on; they then compete with the finished hypotheses by log-probability.
* A step that returns NaN or ``+inf`` log-probabilities fails its batch element: :class:`beamkit.BatchDecodeError`
  (a ValueError) is raised with every element's message and the others' results.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import signature
from typing import Any, TypeVar

import numpy as np

from beamkit import ops
from beamkit._checks import check_int
from beamkit.compat.olmo.constraints import Constraint
from beamkit.compat.olmo.samplers import (
    DeterministicSampler,
    GumbelSampler,
    Sampler,
    StateType,
    _Drawing,
)
from beamkit.compat.olmo.scorers import FinalSequenceScorer, SequenceLogProbabilityScorer
from beamkit.hypothesis import BatchDecodeError, Hypothesis
from beamkit.processors import StepContext
from beamkit.scoring import LengthPenalty
from beamkit.search.drivers import BeamSearch as EngineSearch
from beamkit.search.options import SearchOptions
from beamkit.search.selectors import Deterministic

StepFunctionTypeWithTimestep = Callable[[Any, StateType, int], tuple[Any, StateType]]
StepFunctionTypeNoTimestep = Callable[[Any, StateType], tuple[Any, StateType]]
StepFunctionType = TypeVar("StepFunctionType", StepFunctionTypeWithTimestep, StepFunctionTypeNoTimestep)

EMPTY_WARNING = (
    "Empty sequences predicted. You may want to increase the beam size or ensure your step function is working "
    "properly."
)
NEGLIGIBLE_WARNING = (
    "Negligible log probabilities encountered ('-inf' or equivalent). Some final sequences may not make sense. "
    "This can happen when the beam size is larger than the number of valid (non-zero probability) transitions "
    "that the step function produces."
)


class BeamSearch:
    """OLMo's beam search: ``search(start_predictions, start_state, step)`` ->
    ``(predictions [batch, beam, steps], log_probabilities [batch, beam])``, best first.

    ``end_index``: the end token. ``max_steps``: the most tokens a hypothesis gets (the end token counted).
    ``beam_size``: hypotheses kept per batch element. ``per_node_beam_size``: candidates each hypothesis offers
    per step (default ``beam_size``). ``sampler``: how candidates are picked (default
    :class:`DeterministicSampler`). ``min_steps``: tokens before the end token may come. ``final_sequence_scorer``:
    the final ranking (default :class:`SequenceLogProbabilityScorer`). ``constraints``: :class:`Constraint` objects
    applied every step. The attributes may be changed between searches.
    """

    def __init__(
        self,
        end_index: int,
        *,
        max_steps: int = 50,
        beam_size: int = 10,
        per_node_beam_size: int | None = None,
        sampler: Sampler | None = None,
        min_steps: int | None = None,
        final_sequence_scorer: FinalSequenceScorer | None = None,
        constraints: list[Constraint] | None = None,
    ) -> None:
        check_int("max_steps", max_steps, 1)
        check_int("beam_size", beam_size, 1)
        if per_node_beam_size is not None:
            check_int("per_node_beam_size", per_node_beam_size, 1)
        if min_steps is not None:
            check_int("min_steps", min_steps, 0, max_steps)
        self._end_index = check_int("end_index", end_index, 0)
        self.max_steps = max_steps
        self.beam_size = beam_size
        self.per_node_beam_size = per_node_beam_size or beam_size
        self.sampler = sampler or DeterministicSampler()
        self.min_steps = min_steps or 0
        self.final_sequence_scorer = final_sequence_scorer or SequenceLogProbabilityScorer()
        self.constraints = constraints or []

    def search(self, start_predictions: Any, start_state: StateType, step: StepFunctionType) -> tuple[Any, Any]:
        """Decode every batch element of ``start_predictions`` ``[batch]`` (the start tokens) from
        ``start_state`` (a dict of ``[batch, ...]`` tensors) with ``step(last_predictions [rows], state[,
        timestep]) -> (log_probabilities [rows, V], state)``; see the class docstring."""
        beam, per_node = self._checked()
        if not ops.is_torch(start_predictions) or start_predictions.dim() != 1 or start_predictions.is_floating_point():
            shape = f" of shape {tuple(start_predictions.shape)}" if hasattr(start_predictions, "shape") else ""
            raise TypeError(
                "start_predictions must be a 1-D torch tensor of token ids [batch], "
                f"got {type(start_predictions).__name__}{shape}"
            )
        batch = int(start_predictions.shape[0])
        if batch == 0:
            raise ValueError("start_predictions is empty: give at least one start token")
        _check_state(start_state, "start_state")
        call = _Step(step, start_state, start_predictions.device, beam, per_node)
        processors = (_Constraints(list(self.constraints), batch),) if self.constraints else ()
        opts = SearchOptions(
            beam_size=beam,
            max_len=int(self.max_steps),
            policy="compete",
            length_penalty=LengthPenalty(0.0),
            min_len=int(self.min_steps),
            processors=processors,
            selector=_selector(self.sampler, beam, per_node),
            keep_state=isinstance(start_state, dict) and any(v is not None for v in start_state.values()),
        )
        result = EngineSearch(opts).search(call, start_state, start_predictions.tolist(), self._end_index, batch)
        BatchDecodeError.raise_if(result.errors, result.hypotheses)
        return self._finish(result.hypotheses, call, start_state)

    def _checked(self) -> tuple[int, int]:
        """The attributes as they are now, checked as OLMo checks them."""
        beam = check_int("beam_size", self.beam_size, 1)
        per_node = check_int("per_node_beam_size", self.per_node_beam_size, 1)
        max_steps = check_int("max_steps", self.max_steps, 1)
        check_int("min_steps", self.min_steps, 0, max_steps)
        for i, c in enumerate(self.constraints):
            if not isinstance(c, Constraint):
                raise TypeError(f"constraints[{i}] must be a Constraint, got {type(c).__name__}")
        if not isinstance(self.sampler, Sampler):
            raise TypeError(f"sampler must be a Sampler, got {type(self.sampler).__name__}")
        return beam, per_node

    def _finish(self, hypotheses: list[list[Hypothesis]], call: _Step, start_state: StateType) -> tuple[Any, Any]:
        """OLMo's outputs from the engine's hypotheses: padded, scored, sorted; the caller's state updated."""
        import torch

        beam, end = int(self.beam_size), self._end_index
        kept = [_padded(hyps[:beam], beam, end) for hyps in hypotheses]
        width = max(len(h.tokens) for hyps in kept for h in hyps)
        batch = len(kept)
        tokens = np.full((batch, beam, width), end, dtype=np.int64)  # shape: (batch, beam, steps)
        logp = np.empty((batch, beam))  # shape: (batch, beam)
        for b, hyps in enumerate(kept):
            for j, h in enumerate(hyps):
                tokens[b, j, : len(h.tokens)] = h.tokens
                logp[b, j] = h.logprob
        predictions = torch.as_tensor(tokens, device=call.device)
        log_probs = torch.as_tensor(logp, dtype=call.dtype, device=call.device)
        if beam == 1 and width == 1 and bool((predictions == end).all()):
            warnings.warn(EMPTY_WARNING, RuntimeWarning, stacklevel=3)
            order = torch.zeros((batch, 1), dtype=torch.int64, device=call.device)
            scores = log_probs
        else:
            if not self.constraints and (
                not bool(torch.isfinite(log_probs).all()) or bool((log_probs == torch.finfo(call.dtype).min).any())
            ):
                warnings.warn(NEGLIGIBLE_WARNING, RuntimeWarning, stacklevel=3)
            final = self.final_sequence_scorer.score(predictions, log_probs, end)
            scores, order = torch.sort(final, dim=1, descending=True, stable=True)
            predictions = predictions.gather(1, order.unsqueeze(-1).expand_as(predictions))
        if call.returned_given:
            _final_state(start_state, kept, order.cpu().numpy())
        return predictions, scores


def _check_state(state: Any, what: str) -> None:
    """Raise TypeError unless ``state`` is a dict whose values are torch tensors with a row per hypothesis on
    axis 0, or None (OLMo's state, which the search gathers by row), naming the first key that is not."""
    if not isinstance(state, dict):
        raise TypeError(f"{what} must be a dict of torch tensors (one row per hypothesis), got {type(state).__name__}")
    for name, value in state.items():
        if value is None:
            continue
        if not ops.is_torch(value) or value.dim() == 0:
            kind = "a 0-dimensional tensor" if ops.is_torch(value) else type(value).__name__
            raise TypeError(
                f"{what}[{name!r}] must be a torch tensor with one row per hypothesis on its first axis (or None), "
                f"got {kind}: the search gathers every state value by row"
            )


def _padded(hyps: list[Hypothesis], beam: int, end: int) -> list[Hypothesis]:
    """``hyps`` with places up to ``beam`` filled by end tokens at log-probability -inf (the best one's state)."""
    state = hyps[0].state if hyps else None
    return hyps + [
        Hypothesis(tokens=[end], logprob=-np.inf, score=-np.inf, finished=True, state=state)
        for _ in range(beam - len(hyps))
    ]


def _final_state(state: StateType, kept: list[list[Hypothesis]], order: np.ndarray) -> None:
    """Write each returned hypothesis's final state row into the caller's ``state`` dict, in the returned order."""
    import torch

    rows = [kept[b][int(j)].state for b in range(len(kept)) for j in order[b]]
    if any(r is None for r in rows):
        return
    for name, value in list(state.items()):
        if value is None or not all(name in r and r[name] is not None for r in rows):
            continue
        parts = [r[name] for r in rows]
        if len({tuple(p.shape[1:]) for p in parts}) > 1:
            warnings.warn(
                f"the final state rows of {name!r} differ in shape (the hypotheses ended at different steps), so "
                "they cannot be stacked; the caller's state keeps its value for it",
                RuntimeWarning,
                stacklevel=4,
            )
            continue
        state[name] = torch.cat(parts, dim=0)


class _Step:
    """The engine's ``step_fn(state, y_prev)`` over OLMo's ``step(last_predictions, state[, timestep])``: the
    log-probabilities as given (``{"log_softmax": False}``), the timestep counted, the first call checked."""

    def __init__(self, step: Callable[..., Any], start_state: Any, device: Any, beam: int, per_node: int):
        if not callable(step):
            raise TypeError(f"step must be callable as step(last_predictions, state[, timestep]), got {step!r}")
        self.step = step
        self.with_timestep = len(signature(step).parameters) >= 3
        self.start_state = start_state
        self.device = device
        self.beam, self.per_node = beam, per_node
        self.timestep = 0
        self.dtype: Any = None
        self.returned_given = False  # the first call returned the caller's own state dict

    def __call__(self, state: Any, y_prev: Any) -> tuple[Any, Any, dict[str, Any]]:
        import torch

        last = y_prev if ops.is_torch(y_prev) else torch.as_tensor(y_prev, device=self.device)
        if self.with_timestep:
            log_probs, new_state = self.step(last, state, self.timestep)
        else:
            log_probs, new_state = self.step(last, state)
        _check_state(new_state, "the state the step function returned")
        if self.timestep == 0:
            self._first(log_probs, new_state)
        self.timestep += 1
        return log_probs, new_state, {"log_softmax": False}

    def _first(self, log_probs: Any, new_state: Any) -> None:
        """Checks of the first call: the vocabulary is large enough for the beam; note the dtype."""
        num_classes = int(log_probs.shape[1])
        widest = max(self.beam, self.per_node)
        if widest > num_classes:
            raise ValueError(
                f"Vocab size ({num_classes}) too small relative to beam_size ({self.beam}) or per_node_beam_size "
                f"({self.per_node}). Please decrease beam_size or per_node_beam_size."
            )
        self.dtype = log_probs.dtype
        self.returned_given = new_state is self.start_state


def _selector(sampler: Sampler, beam: int, per_node: int) -> Any:
    """The engine's selector for an OLMo sampler: the first step picks ``beam`` of the start row with
    ``sample_beams``' rule, later steps ``per_node`` candidates per hypothesis with ``sample_nodes``."""
    custom_beams = type(sampler).sample_beams is not Sampler.sample_beams
    if isinstance(sampler, GumbelSampler):
        return _Gumbel(sampler, beam, per_node)
    if type(sampler).sample_nodes is DeterministicSampler.sample_nodes and not custom_beams:
        return Deterministic() if per_node == beam else _Top(beam, per_node)
    if isinstance(sampler, _Drawing) and type(sampler).sample_nodes is _Drawing.sample_nodes and not custom_beams:
        return _Native(sampler, beam, per_node)
    return _Protocol(sampler, beam, per_node)


@dataclass
class _Top:
    """Deterministic: the first step's ``beam`` best, then ``per_node`` best per hypothesis."""

    beam: int
    per_node: int
    ordered = True

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The top ``beam`` (first step) or ``per_node`` tokens of each row; key = running log-probability."""
        vals, idx = ops.top_candidates(scores, self.beam if ctx.step == 0 else self.per_node)  # shape: (rows, m)
        logp = vals + offset[:, None]
        return logp, idx, parent_key[:, None] + logp


@dataclass
class _Native:
    """A built-in drawing sampler: its beamkit selector draws ``per_node`` tokens per hypothesis after a
    deterministic first step (OLMo's first step keeps the ``beam`` most likely)."""

    sampler: _Drawing
    beam: int
    per_node: int
    first: _Top = field(init=False)

    def __post_init__(self) -> None:
        self.first = _Top(self.beam, self.beam)

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See the class docstring."""
        if ctx.step == 0:
            self.sampler.check(self.per_node, int(scores.shape[1]))
            return self.first.candidates(scores, offset, parent_key, m, ctx)
        return self.sampler.selector.candidates(scores, offset, parent_key, self.per_node, ctx)


@dataclass
class _Protocol:
    """Any other sampler, through its own methods: ``sample_beams`` on the start rows, then ``sample_nodes`` on
    the live hypotheses; a custom ``sample_beams`` picks which new candidates may run on."""

    sampler: Sampler
    beam: int
    per_node: int
    state: StateType = field(default_factory=dict)

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See the class docstring."""
        if ctx.step == 0:
            self.state = self.sampler.init_state(scores, int(scores.shape[0]), int(scores.shape[1]))
            lp, idx, self.state = self.sampler.sample_beams(scores, self.beam, self.state)
            logp = ops.to_numpy(lp).astype(np.float64) + offset[:, None]  # shape: (rows, beam)
            return logp, ops.to_numpy(idx).astype(np.int64), parent_key[:, None] + logp
        lp, idx, self.state = self.sampler.sample_nodes(scores, self.per_node, self.state)
        logp = ops.to_numpy(lp).astype(np.float64) + offset[:, None]  # shape: (rows, per_node)
        tok = ops.to_numpy(idx).astype(np.int64)
        key = parent_key[:, None] + logp
        if type(self.sampler).sample_beams is not Sampler.sample_beams:
            key = np.where(self._chosen(key, ctx), key, -np.inf)
        return logp, tok, key

    def _chosen(self, key: np.ndarray, ctx: StepContext) -> np.ndarray:
        """Which candidates ``[rows, per_node]`` the sampler's ``sample_beams`` keeps, asked per batch element
        (its live hypotheses' candidates side by side, padded with -inf)."""
        import torch

        rows, per_node = key.shape
        reqs, first = np.unique(ctx.request, return_index=True)
        counts = np.diff(np.append(first, rows))
        table = np.full((reqs.shape[0], int(counts.max()) * per_node), -np.inf)  # shape: (requests, k)
        for i, (lo, n) in enumerate(zip(first.tolist(), counts.tolist(), strict=True)):
            table[i, : n * per_node] = key[lo : lo + n].ravel()
        _, picked, self.state = self.sampler.sample_beams(torch.as_tensor(table), self.beam, self.state)
        out = np.zeros((rows, per_node), dtype=bool)
        for i, (lo, n) in enumerate(zip(first.tolist(), counts.tolist(), strict=True)):
            flat = ops.to_numpy(picked[i]).astype(np.int64)
            flat = flat[flat < n * per_node]
            out[lo + flat // per_node, flat % per_node] = True
        return out


@dataclass
class _Gumbel:
    """:class:`GumbelSampler` in the engine: keys are the perturbed values ``G_phi_S``; each hypothesis gives its
    own ``phi_S`` (running log-probability) and ``G_phi_S`` (its key) to ``sample_nodes``."""

    sampler: GumbelSampler
    beam: int
    per_node: int

    def candidates(
        self, scores: Any, offset: np.ndarray, parent_key: np.ndarray, m: int, ctx: StepContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See the class docstring."""
        import torch

        rows, vocab = int(scores.shape[0]), int(scores.shape[1])
        if ctx.step == 0:
            g = self.sampler.init_state(scores, rows, vocab)["G_phi_S"]  # shape: (rows, V)
            top_g, idx = torch.topk(g, self.beam, dim=-1)
            lp = scores.gather(1, idx)
        else:
            running = ctx.logprob if ctx.logprob is not None else np.zeros(rows)
            state = {
                "phi_S": torch.as_tensor(running, dtype=scores.dtype, device=scores.device),
                "G_phi_S": torch.as_tensor(parent_key, dtype=scores.dtype, device=scores.device),
            }
            lp, idx, new = self.sampler.sample_nodes(scores, self.per_node, state)
            top_g = new["G_phi_S"]
        logp = ops.to_numpy(lp).astype(np.float64) + offset[:, None]
        key = ops.to_numpy(top_g).astype(np.float64)
        key[~np.isfinite(logp)] = -np.inf
        return logp, ops.to_numpy(idx).astype(np.int64), key


class _Constraints:
    """OLMo constraints as a beamkit processor: each hypothesis's constraint states, found by its request and
    token history (a state depends on nothing else), updated from its parent's when it first appears."""

    def __init__(self, constraints: list[Constraint], batch: int):
        self.constraints = constraints
        self.roots = [c.init_state(batch) for c in constraints]  # [constraint][request][0]
        self.known: dict[tuple[int, tuple[int, ...]], list[dict[str, Any]]] = {}  # the last step's states

    def __call__(self, scores: Any, ctx: StepContext) -> Any:
        import torch

        rows = int(scores.shape[0])
        hist = [tuple(r) for r in ctx.tokens.tolist()]
        reqs = ctx.request.tolist()
        now: dict[tuple[int, tuple[int, ...]], list[dict[str, Any]]] = {}
        for r, h in zip(reqs, hist, strict=True):
            if (r, h) not in now:
                now[(r, h)] = self._state_of(r, h)
        for c, constraint in enumerate(self.constraints):
            state = [[now[(r, h)][c]] for r, h in zip(reqs, hist, strict=True)]
            edited = constraint.apply(state, scores.view(rows, 1, -1) if ops.is_torch(scores) else scores[:, None])
            scores = edited.reshape(rows, -1) if isinstance(edited, torch.Tensor) else edited
        self.known = now
        return scores

    def _state_of(self, r: int, h: tuple[int, ...]) -> list[dict[str, Any]]:
        """The constraint states of request ``r``'s hypothesis with history ``h``."""
        import torch

        if not h:
            return [root[r][0] for root in self.roots]
        parent = self.known.get((r, h[:-1]))
        if parent is None:  # a parent the last step did not see (cannot happen in a closed batch)
            parent = self._state_of(r, h[:-1])
        token = torch.tensor([[h[-1]]])
        return [
            c.update_state([[s]], token, torch.zeros((1, 1), dtype=torch.int64))[0][0]
            for c, s in zip(self.constraints, parent, strict=True)
        ]
