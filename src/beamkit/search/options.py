"""What configures a search: :class:`SearchOptions` (everything) and :class:`RequestOptions` (what one request
of an :class:`beamkit.Engine` may set for itself)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import IntEnum
from typing import Any, Literal

import numpy as np

from beamkit._checks import check_bool, check_choice, check_float, check_int
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
        check_request_fields(self)  # length_penalty a LengthPenalty from here on
        self.length_penalty.check_max_len(int(self.max_len))
        check_choice("policy", self.policy, POLICIES)
        check_bool("keep_state", self.keep_state)
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


class EarlyMode(IntEnum):
    """A pool request's stopping rule, the ``early_stopping`` option as the small int the engine keeps per
    request (``Book.es``)."""

    HEURISTIC = 0  # early_stopping=False: the best running beam, scored at the current length, cannot beat the worst
    FULL = 1  # early_stopping=True: the pool is full
    NEVER = 2  # early_stopping="never": the exact bound, the best running beam scored at max_len when alpha > 0


EARLY_MODES = {False: EarlyMode.HEURISTIC, True: EarlyMode.FULL, "never": EarlyMode.NEVER}


def check_request_fields(options: SearchOptions | RequestOptions) -> None:
    """Check the per-request fields of ``options`` (those of :class:`RequestOptions`), each on its own and
    against the others given with it, normalising ``length_penalty`` to a :class:`LengthPenalty` and
    ``temperature`` to a float; None (a :class:`RequestOptions` field left to the engine's default) is skipped.
    ValueError / TypeError naming the field."""
    o = options
    request = isinstance(o, RequestOptions)
    for name in ("beam_size", "max_len"):
        value = getattr(o, name)
        if request and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value < 2**31:
            raise ValueError(f"{name} must be an integer between 1 and 2**31 - 1, got {value!r}")
    if o.length_penalty is not None or not request:
        penalty = as_length_penalty(o.length_penalty)  # type: ignore[arg-type]  # a plain alpha too; None refused
        object.__setattr__(o, "length_penalty", penalty)
        if request and o.max_len is not None:
            penalty.check_max_len(int(o.max_len))
    if o.early_stopping is not None or not request:
        if not (isinstance(o.early_stopping, bool) or o.early_stopping == "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {o.early_stopping!r}")
    if o.patience is not None or not request:
        if isinstance(o.patience, bool) or not isinstance(o.patience, (int, float)) or not o.patience > 0:
            raise ValueError(f"patience must be > 0, got {o.patience}")
        check_float("patience", o.patience)  # inf: no pool size; a large finite patience never fills the pool
    if o.num_return is not None:
        if o.beam_size is None:  # a request leaving the beam width to the engine: checked again there
            check_int("num_return", o.num_return, 1)
        elif not 1 <= o.num_return <= o.beam_size:
            raise ValueError(f"num_return must be between 1 and beam_size={o.beam_size}, got {o.num_return}")
    if o.min_len is not None or not request:
        if isinstance(o.min_len, bool) or not isinstance(o.min_len, (int, np.integer)) or o.min_len < 0:
            raise ValueError(f"min_len must be >= 0, got {o.min_len}")
        if o.max_len is not None and o.min_len > o.max_len:
            raise ValueError(f"min_len={o.min_len} must be <= max_len={o.max_len}")
    if o.temperature is not None:
        object.__setattr__(o, "temperature", check_float("temperature", o.temperature, above=0))


@dataclass(frozen=True)
class RequestOptions:
    """What one request of an :class:`beamkit.Engine` may set for itself: the per-request fields of
    :class:`SearchOptions`, the one record a request's options travel in, from an HTTP body or a command line
    (through :meth:`beamkit.adapters.ModelAdapter.request`) to :meth:`beamkit.Engine.add_batch`.

    Each field means what the :class:`SearchOptions` field of that name means; None (the default) leaves it to
    the engine's own options. Checked on construction, each field by name (ValueError / TypeError), and the
    fields given together against each other (``num_return <= beam_size``, ``min_len <= max_len``, the length
    penalty within the float range at ``max_len``); the engine checks the whole request again against its shared
    options when it is added (:meth:`over`).
    """

    beam_size: int | None = None
    max_len: int | None = None
    min_len: int | None = None
    num_return: int | None = None
    length_penalty: LengthPenalty | float | None = None
    early_stopping: EarlyStopping | None = None
    patience: float | None = None
    temperature: float | None = None  # a sampling selector's temperature; None: the engine's (the selector's own)

    def __post_init__(self) -> None:
        check_request_fields(self)

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> RequestOptions:
        """The record of per-request options given by name (``Engine.add(..., beam_size=3)``): TypeError for a
        field shared by every request of an engine (give it to ``Engine()``) or one that is no option at all."""
        shared = sorted(set(given) & set(SearchOptions.__dataclass_fields__) - set(_NAMES))
        if shared:
            raise TypeError(f"{', '.join(shared)} are shared by every request: give them to Engine(), not add()")
        unknown = sorted(set(given) - set(_NAMES))
        if unknown:
            raise TypeError(f"unknown request options {unknown}; per-request options are {list(_NAMES)}")
        return cls(**given)

    def given(self) -> dict[str, Any]:
        """The fields set (not None), by name."""
        return {name: getattr(self, name) for name in _NAMES if getattr(self, name) is not None}

    def over(self, options: SearchOptions) -> SearchOptions:
        """``options`` with this request's fields in place of their defaults, every rule checked again on the
        whole (the shared fields constrain some: a selector may refuse a temperature, ``exact_exit`` needs
        ``alpha == 0``)."""
        given = self.given()
        return replace(options, **given) if given else options

    def search_options(self, **shared: Any) -> SearchOptions:
        """The :class:`SearchOptions` of a closed batch of requests with these options: ``shared`` (the
        search-wide fields, as :func:`make_options` takes them) under this request's fields; ``beam_size`` and
        ``max_len`` must be set here."""
        for name in ("beam_size", "max_len"):
            if getattr(self, name) is None:
                raise ValueError(f"{name} is needed: set it on the RequestOptions")
        return self.over(make_options(int(self.beam_size or 1), int(self.max_len or 1), **shared))


_NAMES = tuple(f.name for f in fields(RequestOptions))  # the per-request fields, in declaration order


def make_options(beam_size: int, max_len: int, **options: Any) -> SearchOptions:
    """Build :class:`SearchOptions`, accepting a plain float for ``length_penalty`` and lists for processors."""
    if "length_penalty" in options:
        options["length_penalty"] = as_length_penalty(options["length_penalty"])
    if "processors" in options:
        options["processors"] = tuple(options["processors"])
    return SearchOptions(beam_size=beam_size, max_len=max_len, **options)
