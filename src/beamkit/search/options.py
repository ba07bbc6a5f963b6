"""What configures a search: :class:`SearchOptions` (everything) and :class:`RequestOptions` (what one request
of an :class:`beamkit.Engine` may set for itself)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any, Literal

import numpy as np

from beamkit._checks import check_bool, check_choice, check_float
from beamkit.processors import LogitsProcessor
from beamkit.scoring import CoveragePenalty, FinalScorer, LengthPenalty, as_length_penalty
from beamkit.search.selectors import Deterministic, Selector

POOL_NEVER_FULL = 2**53  # a finished pool of this size is never full (the largest float that counts exactly)

EarlyStopping = bool | Literal["never"]
PolicyName = Literal["narrow", "pool", "compete"]
POLICIES: tuple[PolicyName, ...] = ("narrow", "pool", "compete")


@dataclass(frozen=True)
class SearchOptions:
    """Everything that configures a search (frozen, like whisper's ``DecodingOptions``).

    policy:
        ``"narrow"`` (the exact beam-search contract): a finished hypothesis keeps its slot, the beam narrows;
        live hypotheses at ``max_len`` are returned unfinished. ``"pool"`` (fairseq / Hugging Face): ``beam_size``
        running beams are kept from the top ``2 * beam_size`` candidates; eos candidates ranked within the top
        ``beam_size`` go to a finished pool of ``round(beam_size * patience)``; at ``max_len`` the top
        candidates are added to the pool unfinished. ``"compete"`` (Kool et al.'s stochastic beam search): the
        finished hypotheses and the new candidates of a request compete by key for its ``beam_size`` slots
        every step, so a finished hypothesis can be displaced (it never rides along as a row).
    early_stopping (pool):
        ``True``: stop a request once its pool is full. ``False``: Hugging Face's heuristic (stop when the best
        running beam, scored at the current length, cannot beat the pool's worst). ``"never"``: the exact
        bound, the best running beam scored at ``max_len`` when ``alpha > 0``.
    patience (pool):
        Kasai et al.'s factor: a request's pool is full at ``round(beam_size * patience)`` finished hypotheses.
        A finite number > 0 (``inf`` is refused); a patience too large for any search to fill the pool
        (such as ``1e9``) means the pool never fills, so the request stops at ``max_len`` or by its
        ``early_stopping`` rule.
    process_logits:
        processors edit the raw logits, which are normalised afterwards (Hugging Face's greedy search), instead
        of the log-probabilities (its beam search); the two differ for processors that are not shifts or masks,
        such as the repetition penalty.
    exact_exit (pool, ``alpha == 0`` only):
        also stop once the ``num_return``-th best finished score is at least the best running log-probability:
        with raw log-probabilities nothing later can overtake it (CTranslate2's early exit).
    record_trace:
        keep each request's search tree (:class:`beamkit.trace.Trace`) on ``Completed.trace`` /
        ``SearchResult.trace``; off, it costs one attribute check per step.
    keep_state:
        each returned hypothesis keeps its final state row on ``Hypothesis.state``: the row of the state
        ``step_fn`` returned at the call that chose its last token (one row, gathered like any other state); off,
        nothing is kept.
    temperature (per request):
        the temperature a sampling selector draws with (a finite number > 0), instead of its own; ``None``
        (the default): the selector's own. It changes only which tokens are drawn, never the accumulated
        log-probabilities; the deterministic selector ignores it, and the Hugging Face selectors
        (:class:`beamkit.samplers.BeamSample`, :class:`beamkit.samplers.HuggingFaceSample`) refuse it (temper
        their scores with :class:`beamkit.processors.Temperature`).
    """

    beam_size: int
    max_len: int
    length_penalty: LengthPenalty = field(default_factory=LengthPenalty)
    policy: PolicyName = "narrow"
    early_stopping: EarlyStopping = False
    patience: float = 1.0
    exact_exit: bool = False
    num_return: int | None = None
    min_len: int = 0
    processors: tuple[LogitsProcessor, ...] = ()
    process_logits: bool = False
    coverage_penalty: CoveragePenalty | None = None
    final_scorer: FinalScorer | None = None
    selector: Selector = field(default_factory=Deterministic)
    beam_threshold: float | None = None
    record_trace: bool = False
    keep_state: bool = False
    temperature: float | None = None

    def __post_init__(self) -> None:
        for name in ("beam_size", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value < 2**31:
                raise ValueError(f"{name} must be an integer between 1 and 2**31 - 1, got {value!r}")
        object.__setattr__(self, "length_penalty", as_length_penalty(self.length_penalty))  # a plain alpha too
        self.length_penalty.check_max_len(int(self.max_len))
        check_choice("policy", self.policy, POLICIES)
        check_bool("keep_state", self.keep_state)
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, (int, float)) or not self.patience > 0:
            raise ValueError(f"patience must be > 0, got {self.patience}")
        check_float("patience", self.patience)  # inf: no pool size; a large finite patience never fills the pool
        if self.num_return is not None and not 1 <= self.num_return <= self.beam_size:
            raise ValueError(f"num_return must be between 1 and beam_size={self.beam_size}, got {self.num_return}")
        if isinstance(self.min_len, bool) or not isinstance(self.min_len, (int, np.integer)) or self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, got {self.min_len}")
        if self.min_len > self.max_len:
            raise ValueError(f"min_len={self.min_len} must be <= max_len={self.max_len}")
        if self.exact_exit and (self.policy != "pool" or self.length_penalty.alpha != 0):
            raise ValueError("exact_exit needs policy='pool' and length penalty alpha == 0")
        if self.beam_threshold is not None and (
            isinstance(self.beam_threshold, bool)
            or not isinstance(self.beam_threshold, (int, float))
            or not 0 <= self.beam_threshold < float("inf")
        ):
            raise ValueError(f"beam_threshold must be a finite number >= 0 or None, got {self.beam_threshold!r}")
        for i, proc in enumerate(self.processors):
            if not callable(proc):
                raise TypeError(f"processors[{i}] must be callable as processor(scores, ctx) -> scores, got {proc!r}")
        if not callable(getattr(self.selector, "candidates", None)):
            raise TypeError(
                "selector must be a Selector object (one with a candidates method), such as beamkit.Deterministic(), "
                "beamkit.TopK(k), beamkit.TopP(p), beamkit.Multinomial() or beamkit.GumbelTopK(); "
                f"got {self.selector!r}"
            )
        if self.temperature is not None:
            object.__setattr__(self, "temperature", check_float("temperature", self.temperature, above=0))
            refuse = getattr(self.selector, "check_temperature", None)  # a selector may refuse temperatures
            if callable(refuse):
                refuse(self.temperature)
        raising = [type(p).__name__ for p in self.processors if getattr(p, "raises_scores", False)]
        if self.exact_exit and raising:
            raise ValueError(f"exact_exit needs step scores <= 0, but {raising} may raise them")

    @property
    def pool_size(self) -> int:
        """How many finished hypotheses make a request's pool full (Kasai et al.'s patience); a pool larger than
        any search can fill (``POOL_NEVER_FULL``) is that size: such a request stops by its other rules."""
        return max(1, round(min(self.beam_size * self.patience, POOL_NEVER_FULL)))


# per-request options: they may differ between the requests of one Engine; the other SearchOptions fields are shared
REQUEST_FIELDS = (
    "beam_size",
    "max_len",
    "min_len",
    "num_return",
    "length_penalty",
    "early_stopping",
    "patience",
    "temperature",
)
SHARED_FIELDS = tuple(f for f in SearchOptions.__dataclass_fields__ if f not in REQUEST_FIELDS)


class EarlyMode(IntEnum):
    """A pool request's stopping rule, the ``early_stopping`` option as the small int the engine keeps per
    request (``Book.es``)."""

    HEURISTIC = 0  # early_stopping=False: the best running beam, scored at the current length, cannot beat the worst
    FULL = 1  # early_stopping=True: the pool is full
    NEVER = 2  # early_stopping="never": the exact bound, the best running beam scored at max_len when alpha > 0


EARLY_MODES = {False: EarlyMode.HEURISTIC, True: EarlyMode.FULL, "never": EarlyMode.NEVER}


@dataclass(frozen=True)
class RequestOptions:
    """The options of one request: the per-request fields of :class:`SearchOptions`, checked together with the
    shared ones (build it with :func:`request_options`)."""

    beam_size: int
    max_len: int
    min_len: int
    num_return: int | None
    length_penalty: LengthPenalty
    early_stopping: EarlyStopping
    patience: float
    pool_size: int  # finished hypotheses that make the pool full
    per_row: int  # candidates each row offers: 2 * beam_size for the pool policy, else beam_size
    temperature: float | None = None  # the sampling temperature; None: the selector's own


def request_options(options: SearchOptions, given: dict[str, Any], need_max_len: bool = False) -> RequestOptions:
    """One request's options: ``given`` over the defaults in ``options``, checked as a whole (TypeError for a
    shared or unknown field, ValueError for a bad value)."""
    shared = sorted(set(given) & set(SHARED_FIELDS))
    if shared:
        raise TypeError(f"{', '.join(shared)} are shared by every request: give them to Engine(), not add()")
    unknown = sorted(set(given) - set(REQUEST_FIELDS))
    if unknown:
        raise TypeError(f"unknown request options {unknown}; per-request options are {list(REQUEST_FIELDS)}")
    if need_max_len and "max_len" not in given:
        raise ValueError("max_len is needed: give it to Engine() or to add()")
    values = dict(given)
    if "length_penalty" in values:
        values["length_penalty"] = as_length_penalty(values["length_penalty"])
    full = replace(options, **values) if values else options  # replace re-runs every check
    return RequestOptions(
        beam_size=int(full.beam_size),
        max_len=int(full.max_len),
        min_len=int(full.min_len),
        num_return=full.num_return,
        length_penalty=full.length_penalty,
        early_stopping=full.early_stopping,
        patience=full.patience,
        pool_size=full.pool_size,
        per_row=2 * int(full.beam_size) if full.policy == "pool" else int(full.beam_size),
        temperature=full.temperature,
    )


def make_options(beam_size: int, max_len: int, **options: Any) -> SearchOptions:
    """Build :class:`SearchOptions`, accepting a plain float for ``length_penalty`` and lists for processors."""
    if "length_penalty" in options:
        options["length_penalty"] = as_length_penalty(options["length_penalty"])
    if "processors" in options:
        options["processors"] = tuple(options["processors"])
    return SearchOptions(beam_size=beam_size, max_len=max_len, **options)
