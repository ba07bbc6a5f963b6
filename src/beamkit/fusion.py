"""Shallow fusion: a sequence model and a language model decoded as one step function.

``fuse(step_fn, lm_step_fn, weight)`` returns a step function whose step score of token ``v`` is::

    log_softmax(model)[v] + weight * log_softmax(lm)[v]          # shape: (rows, V)

the weighted sum of Gulcehre et al. (2015), not renormalised: the step function tells the engine so with
``extras["log_softmax"] = False``. Its state is a :class:`FusedState` (the model's state, the LM's state and a
per-row flag), gathered row by row by :func:`beamkit.select_state` like any state, so every search of the engine
works with it. ``Hypothesis.logprob`` and ``token_logprobs`` hold the fused scores; :func:`rescore` gives the
model-only and LM-only log-probability of every token of finished searches (teacher forcing through the same
step function).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from beamkit import ops
from beamkit._checks import check_float
from beamkit.hypothesis import Hypothesis
from beamkit.search import StepFn, bos_array, unpack_step
from beamkit.state import first_array, select_state


class FusedState(NamedTuple):
    """The state of a fused step function: both states, and whether each row has fed the LM yet."""

    model: Any
    lm: Any
    started: np.ndarray  # shape: (rows,) bool; False until the row's first step (then the LM gets lm_bos)


@dataclass(frozen=True)
class Fused:
    """A step function fusing ``step_fn`` with ``lm_step_fn``; build it with :func:`fuse`."""

    step_fn: StepFn
    lm_step_fn: StepFn
    weight: float
    lm_bos: int | None = None
    vocab_map: np.ndarray | None = None  # shape: (V_model,) LM id of each model token, -1 when it has none
    floor: float | None = None

    def init_state(self, model_state: Any, lm_state: Any) -> FusedState:
        """The fused initial state: both initial states (one row per request) and every row not yet started."""
        rows = _rows_of(model_state, lm_state)
        return FusedState(model_state, lm_state, np.zeros(rows, dtype=bool))

    def __call__(self, state: Any, y_prev: Any) -> tuple[Any, FusedState, dict[str, Any]]:
        """One fused step: ``(weighted-sum scores [rows, V], new state, extras)``.

        ``extras`` holds ``"log_softmax": False`` (the scores are used as they are), the step's
        ``"model_logprobs"`` and ``"lm_logprobs"`` (both ``[rows, V]`` over the model's vocabulary) and whatever
        extras the model's step function returned (such as ``"attention"`` for the coverage penalty).
        """
        if isinstance(state, FusedState):
            model_state, lm_state, started = state
        elif isinstance(state, tuple) and len(state) == 2:  # (model_state, lm_state): every row starts now
            model_state, lm_state = state
            started = np.zeros(len(y_prev), dtype=bool)
        else:
            raise TypeError("a fused step function's state is fused.init_state(model_state, lm_state) or a tuple")
        y_host = ops.to_numpy(y_prev).astype(np.int64).reshape(-1)  # shape: (rows,)
        logits, model_state, extras = unpack_step(self.step_fn(model_state, y_prev))
        lm_y = self._lm_tokens(y_host, started)
        lm_ref = first_array(lm_state)
        lm_in = ops.like(lm_y, lm_ref) if lm_ref is not None else lm_y
        lm_logits, lm_state, _ = unpack_step(self.lm_step_fn(lm_state, lm_in))
        ops.check_logits(lm_logits, y_host.shape[0])
        model_lp = ops.log_softmax(logits)  # shape: (rows, V)
        lm_lp = self._on_model_vocab(ops.log_softmax(ops.to_library(lm_logits, logits)))  # shape: (rows, V)
        if tuple(lm_lp.shape) != tuple(model_lp.shape):
            raise ValueError(
                f"the LM scores {lm_lp.shape[1]} tokens but the model {model_lp.shape[1]}; pass vocab_map= "
                "(the LM id of each model token)"
            )
        fused = model_lp + self.weight * lm_lp  # shape: (rows, V)
        out = dict(extras)
        out.update({"log_softmax": False, "model_logprobs": model_lp, "lm_logprobs": lm_lp})
        return fused, FusedState(model_state, lm_state, np.ones(y_host.shape[0], dtype=bool)), out

    def _lm_tokens(self, y: np.ndarray, started: np.ndarray) -> np.ndarray:
        """What the LM is fed: ``lm_bos`` at a row's first step, else the model's token through ``vocab_map``."""
        out = y.copy()
        if self.vocab_map is not None:
            inside = (y >= 0) & (y < self.vocab_map.shape[0])
            out[inside] = self.vocab_map[y[inside]]
            unfed = inside & (out < 0) & started
            if unfed.any():
                tok = int(y[np.flatnonzero(unfed)[0]])
                raise ValueError(
                    f"model token {tok} has no LM entry in vocab_map, so the LM cannot be fed it; "
                    "map it to an LM id (for example the LM's unknown token)"
                )
        if self.lm_bos is not None:
            out[~started] = self.lm_bos
        return out

    def _on_model_vocab(self, lm_lp: Any) -> Any:
        """LM log-probs ``[rows, V_lm]`` as ``[rows, V_model]``: through ``vocab_map``, the floor where none."""
        if self.vocab_map is None:
            return lm_lp
        missing = self.vocab_map < 0
        if int(self.vocab_map.max(initial=-1)) >= lm_lp.shape[1]:
            raise ValueError(f"vocab_map names LM id {int(self.vocab_map.max())} but the LM has {lm_lp.shape[1]}")
        floor = ops.row_min(lm_lp) if self.floor is None else self.floor
        taken = ops.take_cols(lm_lp, np.where(missing, 0, self.vocab_map))  # shape: (rows, V_model)
        return ops.where_cols(taken, missing, floor) if missing.any() else taken


def _rows_of(*states: Any) -> int:
    for s in states:
        lead = first_array(s)
        if lead is not None:
            return int(lead.shape[0])
    raise ValueError("init_state: neither state has an array leaf to count its rows")


def fuse(
    step_fn: StepFn,
    lm_step_fn: StepFn,
    weight: float,
    *,
    lm_bos: int | None = None,
    vocab_map: Sequence[int] | np.ndarray | None = None,
    floor: float | None = None,
) -> Fused:
    """Shallow fusion: a step function scoring ``log_softmax(model) + weight * log_softmax(lm)`` per token.

    ``lm_step_fn(lm_state, y_prev) -> (lm_logits, lm_state)`` is any step function (a neural LM, or
    :class:`NGramLM`). ``weight`` >= 0 (0 gives the model's own log-probs). ``lm_bos``: the token the LM is fed
    at each row's first step (default: the same ``y_prev`` as the model). ``vocab_map``: when the vocabularies
    differ, the LM id of each model token (``-1``: the LM has no such token; it is scored ``floor`` and cannot
    be fed to the LM). ``floor``: the LM log-probability of unmapped tokens; ``None`` (the default) uses each
    row's lowest LM log-probability, so an unknown token never looks more likely to the LM than a known one.

    The initial state is ``fused.init_state(model_state, lm_state)`` (a plain tuple ``(model_state, lm_state)``
    works too when every request starts at the first step). Scores are in the model's library and device.
    """
    check_float("weight", weight, least=0.0)  # >= 0: the fused step scores must stay <= 0
    if not callable(step_fn) or not callable(lm_step_fn):
        raise TypeError("fuse needs two step functions: fuse(step_fn, lm_step_fn, weight)")
    vmap = None
    if vocab_map is not None:
        vmap = np.asarray(vocab_map)
        if vmap.ndim != 1 or vmap.size == 0 or vmap.dtype.kind not in "iu":
            raise ValueError("vocab_map must be a non-empty 1-D sequence of ints (the LM id of each model token)")
        vmap = vmap.astype(np.int64)
        if (vmap < -1).any():
            raise ValueError("vocab_map entries must be LM ids >= 0, or -1 for a token the LM lacks")
    if floor is not None:
        check_float("floor", floor, most=0.0, minus_inf=True)  # a log-probability
    return Fused(step_fn, lm_step_fn, float(weight), None if lm_bos is None else int(lm_bos), vmap, floor)


@dataclass
class TokenScores:
    """The parts of one hypothesis' fused score, per token: ``fused[i] = model[i] + weight * lm[i]``."""

    model: list[float]
    lm: list[float]
    fused: list[float]

    @property
    def model_logprob(self) -> float:
        """The model-only log-probability of the whole hypothesis."""
        return float(sum(self.model))

    @property
    def lm_logprob(self) -> float:
        """The LM-only log-probability of the whole hypothesis."""
        return float(sum(self.lm))


def rescore(
    fused: Fused, init_state: Any, bos: int | Sequence[int], hypotheses: Sequence[Sequence[Hypothesis]]
) -> list[list[TokenScores]]:
    """Model-only and LM-only log-probabilities of every token of searched hypotheses (teacher forcing).

    ``init_state`` (one row per request) and ``bos`` are what the search was given; ``hypotheses[r]`` are
    request r's results. All hypotheses are forced through ``fused`` together, one call per token position,
    rows leaving as their hypotheses end. Returns :class:`TokenScores` in the same nesting.
    """
    if not isinstance(fused, Fused):
        raise TypeError("rescore needs the step function made by beamkit.fuse")
    n_req = len(hypotheses)
    bos_arr = bos_array(bos, n_req)
    owner = np.array([r for r, hs in enumerate(hypotheses) for _ in hs], dtype=np.int64)
    paths = [list(h.tokens) for hs in hypotheses for h in hs]
    out = [TokenScores([], [], []) for _ in paths]
    if paths:
        state = select_state(init_state if isinstance(init_state, FusedState) else _start(fused, init_state), owner)
        live = np.arange(len(paths))
        y = bos_arr[owner]
        lead = first_array(state)
        for t in range(max(len(p) for p in paths)):
            scores, state, extras = fused(state, ops.like(y, lead) if lead is not None else y)
            tok = np.array([paths[i][t] for i in live], dtype=np.int64)
            rows = np.arange(live.shape[0])
            picks = [ops.pick(extras[k], rows, tok) for k in ("model_logprobs", "lm_logprobs")] + [
                ops.pick(scores, rows, tok)
            ]
            for j, i in enumerate(live.tolist()):
                out[i].model.append(float(picks[0][j]))
                out[i].lm.append(float(picks[1][j]))
                out[i].fused.append(float(picks[2][j]))
            keep = np.array([len(paths[i]) > t + 1 for i in live], dtype=bool)
            live, y = live[keep], tok[keep]
            if live.size == 0:
                break
            state = select_state(state, np.flatnonzero(keep))
            lead = first_array(state)
    nested, k = [], 0
    for hs in hypotheses:
        nested.append(out[k : k + len(hs)])
        k += len(hs)
    return nested


def _start(fused: Fused, state: Any) -> FusedState:
    if isinstance(state, tuple) and len(state) == 2:
        return fused.init_state(*state)
    raise TypeError("rescore: init_state must be fused.init_state(model_state, lm_state) or (model_state, lm_state)")
