"""What configures a search: :class:`SearchOptions` (everything) and :class:`RequestOptions` (what one request
of an :class:`beamkit.Engine` may set for itself)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np

from beamkit._checks import check_bool, check_choice, check_float, check_int
from beamkit.processors import LogitsProcessor
from beamkit.scoring import CoveragePenalty, FinalScorer, LengthPenalty, as_length_penalty
from beamkit.search.selectors import Deterministic, Selector

_Record = TypeVar("_Record")
POOL_NEVER_FULL = 2**53  # a finished pool of this size is never full (the largest float that counts exactly)

EarlyStopping = bool | Literal["never"]
PolicyName = Literal["narrow", "pool", "compete"]
POLICIES: tuple[PolicyName, ...] = ("narrow", "pool", "compete")


def _whole(name: str) -> Callable[[Any], Any]:
    """The check of ``beam_size`` / ``max_len``: an integer in [1, 2**31)."""

    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value < 2**31:
            raise ValueError(f"{name} must be an integer between 1 and 2**31 - 1, got {value!r}")
        return value

    return check


def _early_stopping(value: Any) -> Any:
    if not (isinstance(value, bool) or value == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {value!r}")
    return value


def _patience(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"patience must be > 0, got {value}")
    return check_float("patience", value)  # inf: no pool size; a large finite patience never fills the pool


def _min_len(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"min_len must be >= 0, got {value}")
    return value


def _temperature(value: Any) -> Any:
    return check_float("temperature", value, above=0)


def _checked_with_beam_size(value: Any) -> Any:
    return value  # num_return: checked against beam_size by check_request_fields


def per_request(place: int, check: Callable[[Any], Any]) -> dict[str, Any]:
    """The metadata of a :class:`SearchOptions` field that a request may set for itself (a field of
    :class:`RequestOptions` too, at ``place`` in its order): ``check`` returns a value of the field normalised (a
    plain alpha as a :class:`LengthPenalty`, a temperature as a float) or raises ValueError / TypeError naming
    the field."""
    return {"per_request": check, "place": place}


@dataclass(frozen=True)
class SearchOptions:
    """Everything that configures a search (frozen, like whisper's ``DecodingOptions``).

    The fields a request may set for itself are marked per request here, the one declaration of them (listed in
    :data:`PER_REQUEST`, with their checks): ``beam_size``, ``max_len``, ``length_penalty``, ``early_stopping``,
    ``patience``, ``num_return``, ``min_len`` and ``temperature``; :class:`RequestOptions` is made from them. The
    others are shared by every request of a search (:class:`SharedOptions`).

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

    # the fields marked per_request are those a request may set for itself: the one declaration of
    # RequestOptions' fields (each an optional override there) and of their checks
    beam_size: int = field(metadata=per_request(0, _whole("beam_size")))
    max_len: int = field(metadata=per_request(1, _whole("max_len")))
    length_penalty: LengthPenalty = field(default_factory=LengthPenalty, metadata=per_request(4, as_length_penalty))
    policy: PolicyName = "narrow"
    early_stopping: EarlyStopping = field(default=False, metadata=per_request(5, _early_stopping))
    patience: float = field(default=1.0, metadata=per_request(6, _patience))
    exact_exit: bool = False
    num_return: int | None = field(default=None, metadata=per_request(3, _checked_with_beam_size))
    min_len: int = field(default=0, metadata=per_request(2, _min_len))
    processors: tuple[LogitsProcessor, ...] = ()
    process_logits: bool = False
    coverage_penalty: CoveragePenalty | None = None
    final_scorer: FinalScorer | None = None
    selector: Selector = field(default_factory=Deterministic)
    beam_threshold: float | None = None
    record_trace: bool = False
    keep_state: bool = False
    temperature: float | None = field(default=None, metadata=per_request(7, _temperature))

    def __post_init__(self) -> None:
        # the per-request fields, checked as a request's are; num_return and temperature may be None here
        given = {
            name: getattr(self, name)
            for name in PER_REQUEST
            if name not in _NONE_BY_DEFAULT or getattr(self, name) is not None
        }
        for name, value in check_request_fields(given).items():
            object.__setattr__(self, name, value)  # length_penalty a LengthPenalty from here on
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

#: the fields a request may set for itself (those :class:`SearchOptions` marks :func:`per_request`), in its
#: order, each with its check
PER_REQUEST: dict[str, Callable[[Any], Any]] = {
    f.name: f.metadata["per_request"] for f in fields(SearchOptions) if "per_request" in f.metadata
}
_NONE_BY_DEFAULT = frozenset(f.name for f in fields(SearchOptions) if f.default is None)  # None: unset


def check_request_fields(given: Mapping[str, Any]) -> dict[str, Any]:
    """The per-request fields ``given`` (those of :class:`RequestOptions`, by name) checked, each on its own and
    against the others given with it, and normalised (``length_penalty`` a :class:`LengthPenalty`,
    ``temperature`` a float), in :class:`SearchOptions`' order (the first bad field is the one named).
    ValueError / TypeError naming the field."""
    out = {name: check(given[name]) for name, check in PER_REQUEST.items() if name in given}
    beam, most, fewest, n = (out.get(k) for k in ("beam_size", "max_len", "min_len", "num_return"))
    if "length_penalty" in out and most is not None:
        out["length_penalty"].check_max_len(int(most))
    if n is not None:
        if beam is None:  # a request leaving the beam width to the engine: checked again there
            check_int("num_return", n, 1)
        elif not 1 <= n <= beam:
            raise ValueError(f"num_return must be between 1 and beam_size={beam}, got {n}")
    if fewest is not None and most is not None and fewest > most:
        raise ValueError(f"min_len={fewest} must be <= max_len={most}")
    return {name: out[name] for name in given}


def _or_none(kind: Any) -> Any:
    """A field's type, or None: a string where the declaration's annotations are strings."""
    if isinstance(kind, str):
        return kind if kind.endswith("| None") else f"{kind} | None"
    return kind | None


def _overriding(source: type[Any]) -> Callable[[type[_Record]], type[_Record]]:
    """Make a class the frozen dataclass of the overrides of ``source``'s per-request fields: one field per field
    ``source`` marks :func:`per_request`, at the place marked, of its type or None, None by default."""

    def build(cls: type[_Record]) -> type[_Record]:
        marked = sorted((f for f in fields(source) if "per_request" in f.metadata), key=lambda f: f.metadata["place"])
        cls.__annotations__ = {f.name: _or_none(f.type) for f in marked}
        for f in marked:
            setattr(cls, f.name, None)
        return dataclass(frozen=True)(cls)

    return build


@_overriding(SearchOptions)
class RequestOptions:
    """What one request of an :class:`beamkit.Engine` may set for itself: the per-request fields of
    :class:`SearchOptions`, the one record a request's options travel in, from an HTTP body or a command line
    (through :meth:`beamkit.adapters.ModelAdapter.request`) to :meth:`beamkit.Engine.add_batch`.

    Its fields are declared once, on :class:`SearchOptions` (those marked per request, listed in
    :data:`PER_REQUEST`): ``beam_size``, ``max_len``, ``length_penalty`` (a plain alpha too), ``early_stopping``,
    ``patience``, ``num_return``, ``min_len`` and ``temperature`` (a sampling selector's temperature), each
    meaning what the :class:`SearchOptions` field of that name means; None (the default) leaves it to the
    engine's own options. Checked on construction, each field by name (ValueError / TypeError), and the fields
    given together against each other (``num_return <= beam_size``, ``min_len <= max_len``, the length penalty
    within the float range at ``max_len``); the engine checks the whole request again against its shared options
    when it is added (:meth:`over`).
    """

    if TYPE_CHECKING:  # the fields are added from SearchOptions' declaration: callers see them as Any
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

        def __init__(self, **overrides: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        for name, value in check_request_fields(self.given()).items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> RequestOptions:
        """The record of per-request options given by name (``Engine.add(..., beam_size=3)``): TypeError for a
        field shared by every request of an engine (give it to ``Engine()``) or one that is no option at all."""
        _refuse_names(given, _NAMES, "are shared by every request: give them to Engine(), not add()", "request")
        return cls(**given)

    def given(self) -> dict[str, Any]:
        """The fields set (not None), by name."""
        return _set_fields(self, _NAMES)

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


_NAMES = tuple(f.name for f in fields(RequestOptions))  # the per-request fields, in the request record's order


@dataclass(frozen=True)
class SharedOptions:
    """The search-wide options one layer sets for every request of a search or of a running engine (a model's
    offline decoder, a batch of prompts, a server): the :class:`SearchOptions` fields that are not per request
    (those are :class:`RequestOptions`'), each meaning what the field of that name means; None where this layer
    leaves it (to the next one, finally to :class:`SearchOptions`' default).

    Between them, :class:`RequestOptions` and :class:`SharedOptions` hold every field of :class:`SearchOptions`
    once: a field is either a request's own or shared by the whole search. ``processors`` may be given as a list.
    """

    policy: PolicyName | None = None
    exact_exit: bool | None = None
    processors: tuple[LogitsProcessor, ...] | None = None
    process_logits: bool | None = None
    coverage_penalty: CoveragePenalty | None = None
    final_scorer: FinalScorer | None = None
    selector: Selector | None = None
    beam_threshold: float | None = None
    record_trace: bool | None = None
    keep_state: bool | None = None

    def __post_init__(self) -> None:
        if self.processors is not None:
            object.__setattr__(self, "processors", tuple(self.processors))
        if self.policy is not None:
            check_choice("policy", self.policy, POLICIES)

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> SharedOptions:
        """The record of search-wide options given by name: TypeError for a per-request field (a
        :class:`RequestOptions` one) or a name that is no option at all."""
        _refuse_names(given, _SHARED, "are set per request (RequestOptions), not for the whole search", "search-wide")
        return cls(**given)

    def given(self) -> dict[str, Any]:
        """The fields set (not None), by name."""
        return _set_fields(self, _SHARED)

    def updated(self, other: SharedOptions) -> SharedOptions:
        """These options with ``other``'s set fields in their place."""
        more = other.given()
        return replace(self, **more) if more else self

    def conflicts(self, given: Mapping[str, Any]) -> list[str]:
        """The names in ``given`` (:class:`SearchOptions` fields by name) that these options set to another
        value."""
        own = self.given()
        return sorted(name for name in set(own) & set(given) if given[name] != own[name])


_SHARED = tuple(f.name for f in fields(SharedOptions))  # the search-wide fields, in declaration order


def _set_fields(record: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """A record's fields among ``names`` that are set (not None), by name."""
    return {name: getattr(record, name) for name in names if getattr(record, name) is not None}


def _refuse_names(given: Mapping[str, Any], own: tuple[str, ...], elsewhere: str, kind: str) -> None:
    """TypeError for the names in ``given`` that are :class:`SearchOptions` fields of the other record
    (``elsewhere`` says where they go) or no option at all (``kind``: ``"request"`` or ``"search-wide"``, whose
    options ``own`` are)."""
    other = sorted(set(given) & set(SearchOptions.__dataclass_fields__) - set(own))
    if other:
        raise TypeError(f"{', '.join(other)} {elsewhere}")
    unknown = sorted(set(given) - set(own))
    if unknown:
        listed = "per-request" if kind == "request" else kind
        raise TypeError(f"unknown {kind} options {unknown}; {listed} options are {list(own)}")


def make_options(beam_size: int, max_len: int, **options: Any) -> SearchOptions:
    """Build :class:`SearchOptions`, accepting a plain float for ``length_penalty`` and lists for processors."""
    if "length_penalty" in options:
        options["length_penalty"] = as_length_penalty(options["length_penalty"])
    if "processors" in options:
        options["processors"] = tuple(options["processors"])
    return SearchOptions(beam_size=beam_size, max_len=max_len, **options)
