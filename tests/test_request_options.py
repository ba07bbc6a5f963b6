"""``beamkit.RequestOptions``: the one per-request record, checked on construction field by field, and carried
unchanged from a completions body (or a command's options) through the model's adapter to the engine."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from beamkit import Engine, LengthPenalty, RequestOptions, search_batch
from beamkit.adapters import Ask
from tests.serve_toy import BOS, EOS, ToyAdapter

BAD = [
    ("beam_size", 0, ValueError, "beam_size must be an integer between 1 and 2**31 - 1, got 0"),
    ("beam_size", 2.5, ValueError, "beam_size must be an integer"),
    ("beam_size", True, ValueError, "beam_size must be an integer"),
    ("max_len", 0, ValueError, "max_len must be an integer between 1 and 2**31 - 1, got 0"),
    ("max_len", "9", ValueError, "max_len must be an integer"),
    ("min_len", -1, ValueError, "min_len must be >= 0, got -1"),
    ("min_len", 1.0, ValueError, "min_len must be >= 0"),
    ("num_return", 0, ValueError, "num_return must be >= 1, got 0"),
    ("num_return", "2", TypeError, "num_return must be an integer, got '2'"),
    ("length_penalty", "long", TypeError, "length_penalty"),
    ("length_penalty", math.nan, ValueError, "length_penalty"),
    ("early_stopping", "sometimes", ValueError, "early_stopping must be True, False or 'never'"),
    ("patience", 0, ValueError, "patience must be > 0, got 0"),
    ("patience", math.inf, ValueError, "patience must be a finite number"),
    ("patience", "1", ValueError, "patience must be > 0"),
    ("temperature", 0, ValueError, "temperature must be > 0"),
    ("temperature", math.nan, ValueError, "temperature must be a finite number"),
    ("temperature", "hot", TypeError, "temperature"),
]


@pytest.mark.parametrize(("field", "value", "kind", "match"), BAD)
def test_each_bad_field_is_named(field, value, kind, match):
    with pytest.raises(kind, match=match.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        RequestOptions(**{field: value})


def test_fields_given_together_are_checked_together():
    with pytest.raises(ValueError, match="num_return must be between 1 and beam_size=2, got 3"):
        RequestOptions(beam_size=2, num_return=3)
    with pytest.raises(ValueError, match="min_len=5 must be <= max_len=3"):
        RequestOptions(max_len=3, min_len=5)
    with pytest.raises(ValueError, match="length_penalty alpha=100.0 is too large for max_len=1073741824"):
        RequestOptions(max_len=2**30, length_penalty=100.0)
    assert RequestOptions(num_return=3).num_return == 3  # the beam width comes from the engine: checked there


def test_a_request_is_frozen_and_normalised():
    r = RequestOptions(beam_size=np.int64(3), length_penalty=0.5, temperature=2)
    assert r.length_penalty == LengthPenalty.power(0.5) and r.temperature == 2.0
    assert isinstance(r.temperature, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.beam_size = 4  # type: ignore[misc]
    assert RequestOptions().given() == {} and r.given() == {
        "beam_size": 3,
        "length_penalty": LengthPenalty.power(0.5),
        "temperature": 2.0,
    }


def test_options_by_name_refuse_shared_and_unknown_fields():
    with pytest.raises(TypeError, match="policy are shared by every request: give them to Engine"):
        RequestOptions.of({"policy": "pool"})
    with pytest.raises(TypeError, match=r"unknown request options \['beams'\]"):
        RequestOptions.of({"beams": 3})
    assert RequestOptions.of({"beam_size": 3}) == RequestOptions(beam_size=3)


def test_the_engine_takes_only_the_record():
    toy = ToyAdapter()
    engine = Engine(toy.step_fn, beam_size=2, max_len=5)
    state = toy.init_state([toy.encode("abc")])
    with pytest.raises(TypeError, match="request must be a beamkit.RequestOptions, got dict"):
        engine.add_batch(state, BOS, EOS, request={"beam_size": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="either request= or the request's options as keywords"):
        engine.add(state, BOS, EOS, RequestOptions(beam_size=3), max_len=4)
    with pytest.raises(ValueError, match="num_return must be between 1 and beam_size=2, got 3"):
        engine.add_batch(state, BOS, EOS, request=RequestOptions(num_return=3))  # against the engine's beam


def test_the_request_record_round_trip_http_body_to_engine():
    """An HTTP body -> the checked Completion -> the adapter's RequestOptions (every field as the body set it)
    -> a shared engine beside other requests: the same hypotheses as the request decoded alone with the plain
    keyword search (search_batch)."""
    pytest.importorskip("fastapi")
    from beamkit.serve.protocol import parse_completion

    toy = ToyAdapter()
    body = {
        "model": "toy",
        "prompt": ["bad", "cab"],
        "best_of": 3,
        "n": 2,
        "max_tokens": 9,
        "length_penalty": 0.5,
        "early_stopping": "never",
        "min_tokens": 2,
    }
    c = parse_completion(body, toy)
    assert c.ask() == Ask(3, 2, 9, 0.5, "never", 2, prompt_len=3)
    request = toy.request(c.ask())
    assert request == RequestOptions(
        beam_size=3, num_return=2, max_len=9, length_penalty=LengthPenalty.power(0.5), early_stopping="never", min_len=2
    )
    engine = Engine(toy.step_fn, **toy.continuous_options().given(), policy="pool")
    other = engine.add_batch(
        toy.init_state([toy.encode("hhh")]), BOS, EOS, request=RequestOptions(beam_size=5, max_len=4)
    )
    ids = engine.add_batch(toy.init_state([list(p) for p in c.prompt_ids]), BOS, EOS, request=request)
    done = {}
    while not engine.idle:
        for d in engine.step():
            done[d.request_id] = d
    assert set(done) == {*other, *ids}
    for prompt, rid in zip(c.prompts, ids, strict=True):
        alone = search_batch(
            toy.step_fn, toy.init_state([toy.encode(prompt)]), BOS, EOS, 3, 9, policy="pool", num_return=2,
            length_penalty=0.5, early_stopping="never", min_len=2,
        )[0]  # fmt: skip
        got = done[rid].hypotheses
        assert [h.tokens for h in got] == [h.tokens for h in alone]
        assert [h.score for h in got] == [h.score for h in alone]  # the same float64 sums, in the same order
        assert all(len(h.tokens) >= 2 for h in got)


def test_a_served_request_carries_every_field_to_the_engine():
    """The same body over HTTP to ``beamkit serve``'s app: each prompt's n-best is the request decoded alone
    (text and log-probability, best first)."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.test_serve import post, serving

    body = {
        "model": "toy",
        "prompt": ["bad", "cab"],
        "best_of": 3,
        "n": 2,
        "max_tokens": 9,
        "length_penalty": 0.5,
        "early_stopping": "never",
        "min_tokens": 2,
    }
    toy = ToyAdapter()
    with serving(ToyAdapter()) as (url, _):
        choices = post(url, body).json()["choices"]
    for i, prompt in enumerate(body["prompt"]):
        alone = search_batch(
            toy.step_fn, toy.init_state([toy.encode(prompt)]), BOS, EOS, 3, 9, policy="narrow", num_return=2,
            length_penalty=0.5, early_stopping="never", min_len=2,
        )[0]  # fmt: skip
        got = choices[2 * i : 2 * i + 2]
        assert [c["text"] for c in got] == [toy.decode(h.tokens) for h in alone]
        assert [c["logprob"] for c in got] == pytest.approx([h.logprob for h in alone], abs=1e-12)


def test_a_closed_batchs_options_come_from_the_record_and_the_shared_fields():
    """``search_options(**shared)``: the shared fields under the record's own, the same options as
    ``make_options`` given both by hand; ``beam_size`` and ``max_len`` must be on the record (named when not)."""
    from beamkit.search.options import make_options

    def fields(options):  # every field; the selector (an object without equality) by its type
        return {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name != "selector"} | {
            "selector": type(options.selector)
        }

    record = RequestOptions(beam_size=3, max_len=7, num_return=2, length_penalty=0.5, min_len=2)
    got = record.search_options(record_trace=True, length_penalty=2.0)
    assert fields(got) == fields(make_options(3, 7, num_return=2, length_penalty=0.5, min_len=2, record_trace=True))
    assert fields(RequestOptions(beam_size=1, max_len=1).search_options()) == fields(make_options(1, 1))
    for missing, given in (("beam_size", dict(max_len=4)), ("max_len", dict(beam_size=2))):
        with pytest.raises(ValueError, match=f"^{missing} is needed: set it on the RequestOptions$"):
            RequestOptions(**given).search_options()


def test_every_search_option_is_either_a_requests_or_shared_by_the_search_once():
    """The two records split :class:`SearchOptions`' fields between them, each field in one of them: read from
    the declarations (the oracle is ``SearchOptions`` itself)."""
    from beamkit import SearchOptions
    from beamkit.search.options import SharedOptions

    request = {f.name for f in dataclasses.fields(RequestOptions)}
    shared = {f.name for f in dataclasses.fields(SharedOptions)}
    assert not request & shared
    assert request | shared == {f.name for f in dataclasses.fields(SearchOptions)}


def test_shared_options_are_typed_checked_and_merged_by_name():
    """``SharedOptions``: per-request or unknown names refused by ``of``, a bad policy named, lists of processors
    kept as tuples, ``updated`` puts the other record's set fields in place, ``conflicts`` names the fields set
    to another value; an engine built from ``given()`` has the options given by hand (oracle: ``make_options``)."""
    from beamkit.processors import Temperature
    from beamkit.search.options import SharedOptions, make_options

    with pytest.raises(TypeError, match="^beam_size are set per request"):
        SharedOptions.of({"beam_size": 3})
    with pytest.raises(TypeError, match="unknown search-wide options"):
        SharedOptions.of({"beams": 3})
    with pytest.raises(ValueError, match="policy"):
        SharedOptions(policy="wide")  # type: ignore[arg-type]
    hot = Temperature(2.0)
    model = SharedOptions(policy="pool")
    batch = SharedOptions(processors=[hot], process_logits=True)  # type: ignore[arg-type]
    assert batch.processors == (hot,) and SharedOptions().given() == {}
    merged = model.updated(batch)
    assert merged.given() == {"policy": "pool", "processors": (hot,), "process_logits": True}
    assert model.updated(SharedOptions(policy="narrow")).policy == "narrow"
    assert merged.conflicts({"policy": "narrow", "process_logits": True, "record_trace": True}) == ["policy"]
    engine = Engine(lambda s, y: None, beam_size=2, max_len=3, **merged.given())
    want = make_options(2, 3, policy="pool", processors=[hot], process_logits=True)
    assert (engine.options.policy, engine.options.processors, engine.options.process_logits) == (
        want.policy, want.processors, want.process_logits,
    )  # fmt: skip


# one valid value per per-request field and the value the engine's options hold after it, chosen by hand (not read
# from the declaration): a field marked per request on SearchOptions without a row here fails the test below
OVERRIDES = {
    "beam_size": (4, 4),
    "max_len": (7, 7),
    "length_penalty": (0.5, LengthPenalty.power(0.5)),
    "early_stopping": ("never", "never"),
    "patience": (2, 2.0),
    "num_return": (2, 2),
    "min_len": (1, 1),
    "temperature": (0.7, 0.7),
}


def test_the_fields_a_request_may_set_are_declared_once_and_both_records_agree():
    """``RequestOptions``' fields are ``SearchOptions``' fields marked per request (at the place each marks), each
    None by default; each, set on a request, lands on the engine's options with the value worked by hand above
    and leaves every other field as the engine had it."""
    from beamkit import SearchOptions
    from beamkit.search.options import PER_REQUEST

    marked = [f.name for f in dataclasses.fields(SearchOptions) if "per_request" in f.metadata]
    assert marked == list(PER_REQUEST)  # checked in SearchOptions' order
    assert [f.name for f in dataclasses.fields(RequestOptions)] == sorted(
        marked, key=lambda name: SearchOptions.__dataclass_fields__[name].metadata["place"]
    )
    assert sorted(OVERRIDES) == sorted(marked), "a per-request field needs its row in OVERRIDES"
    assert all(f.default is None for f in dataclasses.fields(RequestOptions))
    for doc in (SearchOptions.__doc__, RequestOptions.__doc__):  # the reference lists them: the same names
        assert all(f"``{name}``" in (doc or "") for name in marked)
    engine = SearchOptions(beam_size=3, max_len=9)
    for name, (given, held) in OVERRIDES.items():
        got = RequestOptions(**{name: given}).over(engine)
        assert getattr(got, name) == held, name
        assert dataclasses.replace(got, **{name: getattr(engine, name)}) == engine, name


def test_a_field_marked_per_request_is_a_field_of_the_derived_record():
    """The derivation itself, on a planted declaration: adding a marked field adds the override at its place, an
    unmarked field stays out."""
    from beamkit.search.options import _overriding, per_request

    @dataclasses.dataclass(frozen=True)
    class Planted:
        width: int = dataclasses.field(metadata=per_request(1, int))
        shared: str = "x"
        heat: float | None = dataclasses.field(default=None, metadata=per_request(0, float))

    @_overriding(Planted)
    class PlantedRequest:
        pass

    assert [(f.name, f.type, f.default) for f in dataclasses.fields(PlantedRequest)] == [
        ("heat", "float | None", None),
        ("width", "int | None", None),
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PlantedRequest(width=2).width = 3  # type: ignore[misc]
