"""The search package: its layout (one home, no cycle), its survivor rules against brute force, and its
decisions as records (stop reasons on hand-worked examples)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import beamkit
import beamkit.engine
import beamkit.search
from beamkit.search import StopReason
from beamkit.search.policies import compete_take, survivor_mask

SRC = Path(__file__).resolve().parent.parent / "src" / "beamkit"


def test_engine_module_is_a_re_export():
    assert beamkit.engine.Engine is beamkit.search.Engine
    assert beamkit.engine.SearchOptions is beamkit.search.SearchOptions
    assert beamkit.Engine is beamkit.search.Engine
    assert len((SRC / "engine.py").read_text().splitlines()) < 60


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
