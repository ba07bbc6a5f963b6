"""The search package: its layout (one home, no cycle), its survivor rules against brute force, and its
decisions as records (stop reasons on hand-worked examples)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import beamkit
import beamkit.search
from beamkit.search import StopReason
from beamkit.search.policies import compete_take, survivor_mask

SRC = Path(__file__).resolve().parent.parent / "src" / "beamkit"


def test_the_engine_has_one_import_path():
    assert beamkit.Engine is beamkit.search.Engine
    assert not (SRC / "engine.py").exists()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("beamkit.engine")


def _imports(path: Path, top_level_only: bool = False) -> list[tuple[str, str]]:
    """(module, name) of every ``from beamkit... import name`` in a file (module level only, if asked)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    return [
        (n.module, a.name)
        for n in nodes
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("beamkit")
        for a in n.names
    ]


def test_no_private_names_cross_into_trace_or_variants():
    for path in [SRC / "trace.py", *(SRC / "variants").glob("*.py")]:
        for module, name in _imports(path):
            assert module != "beamkit.engine", path
            assert not name.startswith("_"), (path, module, name)
    trace = (SRC / "trace.py").read_text()
    for private in ("_Candidates", "_Finished", "_Rows", "_penalised", "engine.book"):
        assert private not in trace
    for path in (SRC / "search").glob("*.py"):
        assert all(module != "beamkit.engine" for module, _ in _imports(path)), path


def test_no_import_cycle_between_trace_and_the_search():
    """The search imports the trace's data classes; the trace module imports nothing of the search at load."""
    assert not [m for m, _ in _imports(SRC / "trace.py", top_level_only=True) if m.startswith("beamkit.search")]
    assert ("beamkit.trace", "Trace") in _imports(SRC / "search" / "recorder.py", top_level_only=True)


def test_the_trace_module_is_a_leaf_of_plain_data():
    """trace.py holds the trace records only: it imports no beamkit module at load, and none of the search even
    lazily (its driver is beamkit.search.traced_search); drawing a trace imports beamkit.viz on use."""
    assert not [m for m, _ in _imports(SRC / "trace.py", top_level_only=True) if m.startswith("beamkit")]
    assert {m for m, _ in _imports(SRC / "trace.py")} <= {"beamkit.viz", "beamkit.viz.page"}
    tree = ast.parse((SRC / "trace.py").read_text())
    assert "traced_search" not in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert beamkit.search.traced_search.__module__ == "beamkit.search.drivers"


def test_the_book_columns_are_declared_once_with_their_dtypes():
    from beamkit.search.book import BOOK_COLUMNS, Book

    ints = ["rid", "t", "beam", "max_len", "min_len", "m", "pool", "es", "lp", "eos", "nret", "count"]
    floats = ["alpha", "patience", "worst", "nth", "temp"]
    assert BOOK_COLUMNS == {**dict.fromkeys(ints, np.int64), **dict.fromkeys(floats, np.float64)}
    book = Book()
    book.grow(3)
    for name, dtype in BOOK_COLUMNS.items():
        column = getattr(book, name)
        assert column.dtype == dtype and column.shape[0] >= 3, name
        assert (column == (0 if dtype is np.int64 else -np.inf)).all(), name  # a new slot's starting values
    book.compact(np.array([0, 2]))
    assert all(getattr(book, name).shape == (2,) for name in BOOK_COLUMNS)


@pytest.mark.parametrize(
    ("early_stopping", "mode"),
    [(False, "HEURISTIC"), (True, "FULL"), ("never", "NEVER")],
)
def test_each_request_keeps_its_early_stopping_rule_as_an_enum(early_stopping, mode):
    from beamkit.search.options import EarlyMode

    engine = beamkit.Engine(lambda state, y: (np.zeros((len(y), 3)), state), beam_size=2, max_len=3, policy="pool")
    rid = engine.add(np.zeros((1, 1)), bos=0, eos=1, early_stopping=early_stopping)
    slot = int(np.flatnonzero(engine.book.rid[: engine.book.size] == rid)[0])
    assert engine.book.es[slot] == EarlyMode[mode] and int(EarlyMode[mode]) == [False, True, "never"].index(
        early_stopping
    )


# ------------------------------------------------------------------------------------------------ survivor rules
def _brute_compete(req, key, beam, pool_req, pool_key):
    """Per request: sort (key desc, pool entries before candidates, each side in its order), take beam places."""
    take, stay = np.zeros(len(req), bool), np.zeros(len(pool_req), bool)
    for r in set(req.tolist()) | set(pool_req.tolist()):
        items = [(-pool_key[i], 0, i) for i in np.flatnonzero(pool_req == r)]
        items += [(-key[i], 1, i) for i in np.flatnonzero(req == r)]
        for _, side, i in sorted(items)[: beam[r]]:
            (stay if side == 0 else take)[i] = True
    return take, stay


@st.composite
def _compete_case(draw):
    n_req = draw(st.integers(1, 4))
    beam = np.array(draw(st.lists(st.integers(1, 4), min_size=n_req, max_size=n_req)))
    levels = st.sampled_from([-0.5, -1.0, -1.5, -2.0, -3.0])  # few values: many ties across and within sides
    cand, pool = [], []
    for r in range(n_req):
        cand += [(r, k) for k in sorted(draw(st.lists(levels, max_size=6)), reverse=True)]
        pool += [(r, k) for k in sorted(draw(st.lists(levels, max_size=int(beam[r]))), reverse=True)]
    req = np.array([r for r, _ in cand], np.int64)
    key = np.array([k for _, k in cand], float)
    pool_req = np.array([r for r, _ in pool], np.int64)
    pool_key = np.array([k for _, k in pool], float)
    return req, key, beam, pool_req, pool_key


@given(_compete_case())
def test_compete_take_matches_brute_force(case):
    req, key, beam, pool_req, pool_key = case
    take, stay = compete_take(req, key, beam, pool_req, pool_key)
    want_take, want_stay = _brute_compete(req, key, beam, pool_req, pool_key)
    assert take.tolist() == want_take.tolist()
    assert stay.tolist() == want_stay.tolist()


def test_compete_take_by_hand():
    # pool -1.0, -3.0; candidates -0.5, -2.0, -3.0; 3 places: -0.5 (candidate), -1.0 (entry), -2.0 (candidate)
    take, stay = compete_take(
        np.zeros(3, np.int64),
        np.array([-0.5, -2.0, -3.0]),
        np.array([3]),
        np.zeros(2, np.int64),
        np.array([-1.0, -3.0]),
    )
    assert take.tolist() == [True, True, False] and stay.tolist() == [True, False]
    # a finished hypothesis wins a tie
    take, stay = compete_take(
        np.zeros(1, np.int64), np.array([-1.0]), np.array([1]), np.zeros(1, np.int64), np.array([-1.0])
    )
    assert take.tolist() == [False] and stay.tolist() == [True]


@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), max_size=12), st.integers(1, 3), st.integers(0, 2))
def test_narrow_and_pool_survivors_match_brute_force(cands, beam_size, finished_count):
    cands = sorted(cands, key=lambda c: c[0])  # grouped by request, in rank order within each
    req = np.array([r for r, _ in cands], np.int64)
    ends = np.array([e for _, e in cands], bool)
    rank = np.array([sum(1 for q, _ in cands[:i] if q == r) for i, (r, _) in enumerate(cands)], np.int64)
    beam = np.full(3, beam_size)
    finished = np.full(3, finished_count)
    narrow = survivor_mask("narrow", req, np.zeros(len(req)), rank, ends, beam, finished)
    pool = survivor_mask("pool", req, np.zeros(len(req)), rank, ends, beam)
    for i, (r, e) in enumerate(cands):
        assert narrow[i] == (rank[i] < beam_size - finished_count and not e)
        earlier = sum(1 for q, f in cands[:i] if q == r and not f)
        assert pool[i] == (not e and earlier < beam_size)


# ------------------------------------------------------------------------------------------------ decisions
class Keep:
    """A recorder that keeps every decision."""

    def __init__(self):
        self.decisions = []

    def considered(self, view):
        pass

    def decided(self, view, decision):
        self.decisions.append(decision)

    def closed(self, slot, done, stop):
        self.stop = stop


def fixed(table):
    """A step function whose log-probabilities depend only on the step (state: the step count per row)."""
    logp = np.log(np.asarray(table, float))

    def step(state, y_prev):
        return logp[state], state + 1

    return step


def run(step, **options):
    engine = beamkit.Engine(step, **options)
    engine.recorder = keep = Keep()
    engine.add(np.zeros(1, np.int64), 1, 0)
    done = [c for _ in range(10) for c in engine.step()]
    return keep, done[0]


def test_narrow_stops_when_every_slot_holds_a_finished_hypothesis():
    # step 0: eos 0.5 finishes, token 1 (0.3) runs on; step 1: its best is eos: the last slot finishes
    keep, done = run(fixed([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]]), beam_size=2, max_len=5)
    first, second = keep.decisions
    assert first.admitted.size == 1 and first.survivors.size == 1 and not first.stops
    assert second.stops[0].reason is StopReason.BEAM_FULL and keep.stop.reason is StopReason.BEAM_FULL
    assert [h.tokens for h in done.hypotheses] == [[0], [1, 0]]


def test_max_len_is_a_stop_reason():
    keep, _ = run(fixed([[0.2, 0.5, 0.3]]), beam_size=2, max_len=1)
    assert keep.decisions[-1].stops[0].reason is StopReason.MAX_LEN
    assert keep.decisions[-1].stops[0].detail == "max_len (1 tokens)"


def test_pool_full_with_early_stopping():
    # beam 1, pool of 1: eos ranked first at step 0 fills the pool; early_stopping=True ends the request
    table = [[0.4, 0.35, 0.25], [0.4, 0.35, 0.25]]
    keep, _ = run(fixed(table), beam_size=1, max_len=5, policy="pool", early_stopping=True)
    (decision,) = keep.decisions
    assert decision.stops[0].reason is StopReason.POOL_FULL
    assert decision.halted.size == 1  # the best non-ending candidate would have run on


def test_compete_stops_when_the_finished_ones_hold_every_slot():
    # beam 1: eos (0.6) takes the only place at step 0
    keep, done = run(fixed([[0.6, 0.3, 0.1]]), beam_size=1, max_len=5, policy="compete")
    assert keep.decisions[0].stops[0].reason is StopReason.POOL_HOLDS
    assert [h.tokens for h in done.hypotheses] == [[0]]


def test_cancel_is_a_stop_reason():
    engine = beamkit.Engine(fixed([[0.1, 0.5, 0.4]] * 5), beam_size=2, max_len=5)
    engine.recorder = keep = Keep()
    rid = engine.add(np.zeros(1, np.int64), 1, 0)
    engine.step()
    engine.cancel(rid)
    engine.step()
    assert keep.stop.reason is StopReason.CANCELLED


def test_error_and_no_candidate_are_stop_reasons():
    def nan_step(state, y_prev):
        return np.full((state.shape[0], 3), np.nan), state

    keep, done = run(nan_step, beam_size=2, max_len=5)
    assert keep.stop.reason is StopReason.ERROR and keep.stop.detail == f"error: {done.error}"
    assert "NaN" in done.error
    masked = beamkit.BeamSearch(beamkit.SearchOptions(2, 4, record_trace=True))
    result = masked.search(lambda s, y: (np.full((s.shape[0], 3), -np.inf), s), np.zeros(2, np.int64), 1, 0)
    assert [t.stop_reason.startswith("error: no finite candidate") for t in result.trace] == [True, True]
    assert [len(t.nodes) for t in result.trace] == [1, 1]  # the root alone: nothing was considered


def test_an_unknown_request_id_is_named():
    engine = beamkit.Engine(fixed([[0.5, 0.5]]), beam_size=1, max_len=1)
    try:
        engine.cancel("x")
    except TypeError as exc:
        assert "request_id" in str(exc)
    else:
        raise AssertionError("cancel('x') must raise TypeError")


def test_survivor_mask_defaults_and_errors():
    req, rank = np.zeros(3, np.int64), np.arange(3)
    ends = np.array([False, True, False])
    key = np.array([-1.0, -2.0, -3.0])
    assert survivor_mask("narrow", req, key, rank, ends, np.array([2])).tolist() == [True, False, False]
    assert survivor_mask("compete", req, key, rank, ends, np.array([2])).tolist() == [True, False, False]
    pool = survivor_mask("compete", req, key, rank, ends, np.array([2]), None, np.zeros(1, np.int64), np.array([-0.5]))
    assert pool.tolist() == [True, False, False]  # the finished one (-0.5) takes the first place
    try:
        survivor_mask("wide", req, key, rank, ends, np.array([2]))
    except ValueError as exc:
        assert "'narrow', 'pool' or 'compete'" in str(exc) and "wide" in str(exc)
    else:
        raise AssertionError("an unknown policy must raise ValueError")


# The pool policy by hand: vocabulary eos=0, 1, 2, 3; log-probabilities depend only on the step.
# Step 0 from the root: eos .4 finishes (rank 0 < k=2), tokens 1 (.3) and 2 (.2) run on.
# Step 1: rows 1 (.3) and 2 (.2) end with eos at .3*.5=.15 (rank 0) and .2*.5=.1 (rank 1); the pool keeps the best
# `size` of (.4, .15, .1); the next candidates 1-1 (.075) and 2-1 (.05) would run on.
POOL_TABLE = [[0.4, 0.3, 0.2, 0.1], [0.5, 0.25, 0.15, 0.1]]


def pool_run(table=POOL_TABLE, **options):
    opts = dict(beam_size=2, max_len=5, policy="pool", length_penalty=0.0, record_trace=True)
    result = beamkit.BeamSearch(beamkit.SearchOptions(**{**opts, **options})).search(
        fixed(table), np.zeros(1, np.int64), 1, 0
    )
    trace = result.trace[0]
    by_tokens = {tuple(trace.tokens(n.id)): n for n in trace.nodes[1:]}
    return result, trace, by_tokens


def test_pool_refuses_stops_and_halts_by_hand():
    result, trace, node = pool_run(early_stopping=True)
    assert trace.stop_reason == "pool 2/2 full (early_stopping=True)"
    assert node[(2, 0)].status == "pruned" and node[(2, 0)].reason == "pool"  # .1 ranked in, the pool kept .4, .15
    assert node[(1, 0)].status == "finished" and node[(0,)].status == "finished"
    assert node[(1, 1)].reason == "stopped" and node[(2, 1)].reason == "stopped"  # would have run on
    assert node[(1, 2)].reason == "beam"  # ranked out
    assert [h.tokens for h in result.hypotheses[0]] == [[0], [1, 0]]


def test_pool_stop_texts_by_hand():
    _, trace, _ = pool_run(early_stopping=True, patience=1.5)
    assert trace.stop_reason == "pool 3/3 (patience 1.5) full (early_stopping=True)"
    bound = "pool 2/2 full and bound: the best running beam scored at {} cannot beat the pool's worst"
    for es in (False, "never"):  # alpha 0: the bound is the same at any length
        assert pool_run(early_stopping=es)[1].stop_reason == bound.format("its current length")
    # alpha 1, max_len 3: pool (.45 at length 1, .24 at 2); the best running, .3 * .1 = .03, scored at max_len:
    # log(.03) / 3 = -1.169 <= log(.45) = -0.799, the pool's worst
    table = [[0.45, 0.3, 0.15, 0.1], [0.8, 0.1, 0.06, 0.04]]
    _, trace, node = pool_run(table, early_stopping="never", length_penalty=1.0, max_len=3)
    assert trace.stop_reason == bound.format("max_len")
    assert node[(2, 0)].reason == "pool"  # log(.12) / 2 = -1.060: below both entries


def test_exact_exit_text_by_hand():
    import math

    # pool of 3 (patience 1.5): .4, .15, .1; the 2nd best (beam_size) finished .15 >= the best running .075
    _, trace, _ = pool_run(early_stopping="never", patience=1.5, exact_exit=True)
    want = f"exact exit: the n-th best finished score {math.log(0.15):.4f} >= best running {math.log(0.075):.4f}"
    assert trace.stop_reason == want
    _, trace, _ = pool_run(early_stopping="never", patience=1.5, exact_exit=True, num_return=1)
    assert f"finished score {math.log(0.4):.4f} >=" in trace.stop_reason


def test_decisions_name_what_entered_the_pools():
    engine = beamkit.Engine(fixed(POOL_TABLE), beam_size=2, max_len=5, policy="pool", length_penalty=0.0)
    engine.recorder = keep = Keep()
    engine.add(np.zeros(1, np.int64), 1, 0)
    while not engine.idle:
        engine.step()
    first, second = keep.decisions
    assert first.admitted.tolist() == [0] and first.refused.size == 0  # the eos candidate, ranked first
    assert second.admitted.tolist() == [0] and second.refused.tolist() == [1]  # .15 in, .1 refused
    assert second.halted.tolist() == [2, 3]
    compete = beamkit.Engine(fixed(POOL_TABLE), beam_size=2, max_len=5, policy="compete", length_penalty=0.0)
    compete.recorder = keep = Keep()
    compete.add(np.zeros(1, np.int64), 1, 0)
    while not compete.idle:
        compete.step()
    # step 0: eos .4 and token 1 (.3) take the two places; step 1: .4 stays, 1-eos .15 beats 1-1 .075
    assert keep.decisions[0].admitted.tolist() == [0] and keep.decisions[0].survivors.tolist() == [1]
    assert keep.decisions[1].admitted.tolist() == [0] and keep.decisions[1].evicted.size == 0
    assert keep.decisions[1].stops[0].reason is StopReason.POOL_HOLDS


BAD_OPTIONS = [
    ({"beam_size": 0}, ValueError, r"beam_size must be an integer between 1 and 2\*\*31 - 1, got 0"),
    ({"beam_size": True}, ValueError, r"beam_size must be an integer between 1 and 2\*\*31 - 1, got True"),
    ({"beam_size": 2.0}, ValueError, r"beam_size must be an integer"),
    ({"max_len": 2**31}, ValueError, r"max_len must be an integer between 1 and 2\*\*31 - 1, got 2147483648"),
    ({"policy": "wide"}, ValueError, r"policy must be 'narrow', 'pool' or 'compete', got 'wide'"),
    ({"early_stopping": "soon"}, ValueError, r"early_stopping must be True, False or 'never', got 'soon'"),
    ({"patience": 0}, ValueError, r"patience must be > 0, got 0"),
    ({"patience": True}, ValueError, r"patience must be > 0, got True"),
    ({"patience": float("inf")}, ValueError, r"^patience must be a finite number, got inf$"),  # was OverflowError
    ({"num_return": 3}, ValueError, r"num_return must be between 1 and beam_size=2, got 3"),
    ({"num_return": 0}, ValueError, r"num_return must be between 1 and beam_size=2, got 0"),
    ({"min_len": -1}, ValueError, r"min_len must be >= 0, got -1"),
    ({"min_len": False}, ValueError, r"min_len must be >= 0, got False"),
    ({"min_len": 6}, ValueError, r"min_len=6 must be <= max_len=5"),
    ({"exact_exit": True}, ValueError, r"exact_exit needs policy='pool' and length penalty alpha == 0"),
    ({"exact_exit": True, "policy": "pool", "length_penalty": 1.0}, ValueError, r"exact_exit needs policy='pool'"),
    ({"beam_threshold": -1.0}, ValueError, r"beam_threshold must be a finite number >= 0 or None, got -1.0"),
    ({"beam_threshold": float("inf")}, ValueError, r"beam_threshold must be a finite number >= 0 or None, got inf"),
    ({"beam_threshold": True}, ValueError, r"beam_threshold must be a finite number >= 0 or None, got True"),
    ({"processors": (1,)}, TypeError, r"processors\[0\] must be callable as processor\(scores, ctx\) -> scores"),
    ({"selector": object()}, TypeError, r"selector must be a Selector object \(one with a candidates method\)"),
]


@pytest.mark.parametrize(("fields", "error", "message"), BAD_OPTIONS)
def test_bad_search_options_are_named(fields, error, message):
    with pytest.raises(error, match=message):
        beamkit.SearchOptions(**{"beam_size": 2, "max_len": 5, **fields})


def test_good_edge_options_are_accepted():
    opts = beamkit.SearchOptions(beam_size=1, max_len=2**31 - 1, min_len=2**31 - 1, patience=0.5, beam_threshold=0)
    assert opts.pool_size == 1  # round(0.5) == 0, at least one
    assert beamkit.SearchOptions(beam_size=4, max_len=3, patience=1.5).pool_size == 6
    assert beamkit.SearchOptions(beam_size=4, max_len=3, num_return=4, early_stopping="never").num_return == 4
    pool = beamkit.SearchOptions(beam_size=2, max_len=3, policy="pool", exact_exit=True, length_penalty=0.0)
    assert pool.exact_exit


def test_request_options_are_checked_per_request():
    engine = beamkit.Engine(fixed([[0.5, 0.5]] * 3), beam_size=2, max_len=3, policy="pool")
    with pytest.raises(TypeError, match="policy are shared by every request: give them to Engine"):
        engine.add(np.zeros(1, np.int64), 1, 0, policy="narrow")
    with pytest.raises(TypeError, match=r"unknown request options \['width'\]; per-request options are"):
        engine.add(np.zeros(1, np.int64), 1, 0, width=3)
    with pytest.raises(ValueError, match="num_return must be between 1 and beam_size=1"):
        engine.add(np.zeros(1, np.int64), 1, 0, beam_size=1, num_return=2)
    without = beamkit.Engine(fixed([[0.5, 0.5]]), beam_size=2)
    with pytest.raises(ValueError, match="max_len is needed: give it to Engine"):
        without.add(np.zeros(1, np.int64), 1, 0)
    rid = engine.add(np.zeros(1, np.int64), 1, 0, beam_size=3, length_penalty=1.0, patience=2.0)
    b = engine.book
    assert (b.beam[rid], b.m[rid], b.pool[rid], b.patience[rid], b.alpha[rid]) == (3, 6, 6, 2.0, 1.0)


def test_a_narrow_trace_by_hand():
    """beam 2, alpha 1, eos = 0. Step 0 from the root: eos .5 (rank 0) finishes, token 1 (.3) runs on. Step 1 from
    1: 1-eos .3 * .6 = .18 (rank 0) takes the last slot; 1-1 (.09) is ranked out; every slot holds a finished one."""
    from math import log

    opts = beamkit.SearchOptions(2, 3, length_penalty=1.0, record_trace=True)
    result = beamkit.BeamSearch(opts).search(fixed([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]]), np.zeros(1, np.int64), 1, 0)
    trace = result.trace[0].to_dict()
    node = ("id", "parent", "step", "token", "logprob", "token_logprob", "key", "score", "rank", "status", "reason")
    want = [
        (0, None, -1, None, 0.0, 0.0, 0.0, 0.0, 0, "root", None),
        (1, 0, 0, 0, log(0.5), log(0.5), log(0.5), log(0.5), 0, "finished", None),
        (2, 0, 0, 1, log(0.3), log(0.3), log(0.3), log(0.3), 1, "running", None),
        (3, 2, 1, 0, log(0.18), log(0.6), log(0.18), log(0.18) / 2, 0, "finished", None),
        (4, 2, 1, 1, log(0.09), log(0.3), log(0.09), log(0.09) / 2, 1, "pruned", "beam"),
    ]
    got = [tuple(n[k] for k in node) for n in trace["nodes"]]
    assert [g[:4] + g[8:] for g in got] == [w[:4] + w[8:] for w in want]
    for g, w in zip(got, want, strict=True):  # float64 sums of a few logs: rounding far below 1e-12
        assert g[4:8] == pytest.approx(w[4:8], abs=1e-12)
    assert all(n["evicted"] is None for n in trace["nodes"])
    assert trace["steps"] == [
        {"step": 0, "rows": [0], "candidates": 2, "pool": [1]},
        {"step": 1, "rows": [2], "candidates": 2, "pool": [1, 3]},
    ]
    assert (trace["beam_size"], trace["max_len"], trace["policy"], trace["alpha"], trace["eos"]) == (
        2,
        3,
        "narrow",
        1.0,
        [0],
    )
    assert trace["stop_reason"] == "every beam slot holds a finished hypothesis"
    assert trace["result"] == [1, 3]


def test_a_compete_trace_records_evictions():
    """Compete: a finished hypothesis is displaced when a candidate's key beats it. The selector's key here is the
    log-probability plus a bonus per token 1, so a longer prefix can outrank a finished one."""
    from beamkit.search import Deterministic

    class Bonus(Deterministic):
        ordered = False

        def candidates(self, scores, offset, parent_key, m, ctx):
            logp, tok, key = super().candidates(scores, offset, parent_key, m, ctx)
            return logp, tok, key + 2.0 * (tok == 1)  # token 1 earns 2 in key per step

    # beam 2. Step 0: 1 (key log .4 + 2 = 1.08) and eos (log .6 = -0.51) take the places. Step 1 from 1: 1-1 (key
    # 1.08 + log .3 + 2 = 1.88) and 1-eos (1.08 + log .7 = 0.73) beat eos: it is evicted. Step 2 (max_len): 1-1-eos
    # (1.88 + log .9 = 1.78) and 1-1-1 (1.88 + log .1 + 2 = 1.58, unfinished) evict 1-eos.
    opts = beamkit.SearchOptions(2, 3, policy="compete", selector=Bonus(), length_penalty=0.0, record_trace=True)
    table = [[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]]
    result = beamkit.BeamSearch(opts).search(fixed(table), np.zeros(1, np.int64), 1, 0)
    trace = result.trace[0]
    node = {tuple(trace.tokens(n.id)): n for n in trace.nodes[1:]}
    assert (node[(0,)].status, node[(0,)].evicted) == ("finished", 1)
    assert (node[(1, 0)].status, node[(1, 0)].evicted) == ("finished", 2)
    assert (node[(1, 1, 0)].status, node[(1, 1, 1)].status) == ("finished", "unfinished")
    assert trace.steps[1].pool == [node[(1, 0)].id] and trace.steps[2].pool == [node[(1, 1, 0)].id, node[(1, 1, 1)].id]
    assert trace.result == [node[(1, 1, 0)].id, node[(1, 1, 1)].id]
    assert [h.tokens for h in result.hypotheses[0]] == [[1, 1, 0], [1, 1, 1]]


def test_a_patience_no_search_can_fill_runs_as_a_pool_that_never_fills() -> None:
    # patience=1e300 overflowed the pool size (an OverflowError that did not name patience)
    from tests.toy import BOS, ToyModel

    model = ToyModel(5, seed=4)
    kw = dict(policy="pool", early_stopping=True)
    never = beamkit.search_batch(model.step, model.init(), BOS, 0, 3, 6, patience=1e300, **kw)
    # 3 beams over 6 steps finish at most 18 hypotheses: a pool of 3e6 never fills either
    assert never == beamkit.search_batch(model.step, model.init(), BOS, 0, 3, 6, patience=1e6, **kw)


def test_a_dictionary_holding_fewer_sequences_than_asked_warns_once_naming_the_short_requests():
    """A dictionary of two sequences, beams asking for three: one warning, raised at the caller's code, whose
    text (written out here) names the count asked and the first five short requests with what each got; a
    request that failed is not named (its error says what happened); no warning where the dictionary holds
    enough, or where no processor bounds the outputs."""
    import warnings

    from beamkit.search.options import make_options
    from tests.toy import BOS, MultiToy

    eos, bad = 0, 3  # request 3's logits are NaN: it fails
    model = MultiToy(6, seeds=list(range(8)))

    def step(state, y_prev):
        logits, new = model.step(state, y_prev)
        logits[[s == bad for s, _ in new]] = np.nan
        return logits, new

    def run(entries, beam_size, processors=True, **kw):
        trie = beamkit.Trie(entries)
        opts = make_options(beam_size, 4, processors=[trie.mask()] if processors else [], **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = beamkit.BeamSearch(opts).search(step, model.init(), BOS, eos)
        # raised at the caller's line (here; under a mutation tester, the wrapper between), not in beamkit's driver
        return result, [(str(w.message), w.filename.endswith("drivers.py")) for w in caught]

    result, caught = run([(1, eos), (2, eos)], 3)
    assert sorted(result.errors) == [bad]
    assert caught == [
        (
            "the dictionary allows fewer sequences than the 3 asked (request 0: 2, request 1: 2, request 2: 2, "
            "request 4: 2, request 5: 2, ...): those requests return fewer hypotheses",
            False,
        )
    ]
    result, caught = run([(1, eos), (2, eos)], 5, num_return=2)  # asks for 2: enough
    assert caught == []
    result, caught = run([(1, eos), (2, eos)], 3, processors=False)  # nothing bounds the outputs
    assert caught == []
    model.seeds = [0, 1]
    result, caught = run([(1, eos), (2, eos), (1, 2, eos)], 5, num_return=4)
    assert [m for m, *_ in caught] == [
        "the dictionary allows fewer sequences than the 4 asked (request 0: 3, request 1: 3): those requests "
        "return fewer hypotheses"
    ]
