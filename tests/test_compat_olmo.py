"""``beamkit.compat.olmo`` against OLMo's own ``olmo/beam_search.py`` (AllenNLP's beam search), program by program.

The oracle is OLMo's module itself, fetched from the ``ai2-olmo`` wheel by ``bench/olmo_source.py`` (``make
pytest`` fetches it first) and loaded here with importlib. Without it the comparisons skip, except under
``BEAMKIT_CI``, where they fail: CI must not pass by skipping them.

Each comparison runs one program with each module (``MODULES``: ``"olmo"`` and ``"beamkit"``) and compares what
they return, modulo the documented differences of the drop-in:

- predictions are compared cut after their first end token, shapes as ``[batch, beam, <= OLMo's width]`` (OLMo may
  carry trailing columns of end tokens);
- where a request has fewer finite hypotheses than beams, only the finite ones are compared;
- the final state rows are compared in order only where the final scorer does not reorder, else as multisets;
- samplers are compared with the exact tempered distributions, never draw by draw.

The step functions return float64 log-probabilities and compute each row with elementwise operations only (no
BLAS, whose kernels and rounding depend on the row count), so a row's numbers are the same bits whichever rows a
search sends with it, and both searches rank the same float64 sums: a float64 running sum of at most 12 terms
below 100 in magnitude carries at most 12 half-ulps of 100 (12 * 7.1e-15) of rounding, hence ``ATOL``.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import random
import warnings
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
OLMO_SOURCE = ROOT / "bench" / ".cache" / "ai2_olmo-0.6.0" / "olmo" / "beam_search.py"


def _load_oracle() -> ModuleType | None:
    if not OLMO_SOURCE.exists():
        return None
    spec = importlib.util.spec_from_file_location("olmo_beam_search_oracle", OLMO_SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORACLE = _load_oracle()

# ---- the module under test ---------------------------------------------------------------------------------------
# beamkit's drop-in. Until beamkit.compat.olmo exists in this tree, OLMo's module stands in for it (STAND_IN: every
# comparison then runs OLMo against itself, and the checks of beamkit's own promises skip).
try:
    import beamkit.compat.olmo as BEAMKIT_COMPAT  # noqa: N812
except ModuleNotFoundError as exc:  # only a missing compat package; any other import error fails the module
    if exc.name not in ("beamkit.compat", "beamkit.compat.olmo"):
        raise
    BEAMKIT_COMPAT = None
STAND_IN = BEAMKIT_COMPAT is None
# -----------------------------------------------------------------------------------------------------------------

ATOL = 1e-12  # see the module docstring: 12 * 7.1e-15 of float64 rounding, with room
DIM = 5


def oracle() -> ModuleType:
    """OLMo's module, or a skip (a failure under BEAMKIT_CI) when it has not been fetched."""
    if ORACLE is None:
        why = f"OLMo's beam_search.py is missing ({OLMO_SOURCE}); `make pytest` or bench/olmo_source.py fetches it"
        if os.environ.get("BEAMKIT_CI"):
            pytest.fail(why)
        pytest.skip(why)
    return ORACLE


@pytest.fixture
def mods() -> dict[str, ModuleType]:
    """``{"olmo": OLMo's module, "beamkit": the drop-in}`` (the oracle twice while the drop-in stands in)."""
    olmo = oracle()
    return {"olmo": olmo, "beamkit": BEAMKIT_COMPAT or olmo}


@pytest.fixture
def compat() -> ModuleType:
    """The module under test alone."""
    return BEAMKIT_COMPAT or oracle()


@pytest.fixture(autouse=True)
def _torch_thread(one_torch_thread):
    yield


# ---- the step function -------------------------------------------------------------------------------------------


class Model:
    """A seeded recurrence: state ``h`` ``[rows, DIM]`` and step counter ``t`` ``[rows]``; ``h' = tanh(E[y] + h U)``,
    logits ``h' W`` plus an end-token bias ``bias0 + slope * t`` that grows with the steps; float64 throughout.

    ``step`` takes (predictions, state), ``step_t`` also the timestep (and records it, and whether every row's
    counter equals it). Both update the state dict in place and return it, as AllenNLP's step functions do.
    """

    def __init__(self, vocab: int, end: int, seed: int, bias0: float = -3.0, slope: float = 0.6, mask=None):
        g = torch.Generator().manual_seed(seed)
        f64 = torch.float64
        self.vocab, self.end, self.bias0, self.slope = vocab, end, bias0, slope
        self.E = torch.randn(vocab, DIM, generator=g, dtype=f64)
        self.U = torch.randn(DIM, DIM, generator=g, dtype=f64) * 0.8
        self.W = torch.randn(DIM, vocab, generator=g, dtype=f64) * 1.5
        self.mask = mask  # token ids allowed (None: all); the others get -inf
        self.timesteps: list[int] = []
        self.counters_agree: list[bool] = []

    def _mix(self, h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        # h @ m as a sum of scaled rows, in a fixed order: a row's bits do not depend on the call's row count
        out = h[:, :1] * m[0]
        for j in range(1, DIM):
            out = out + h[:, j : j + 1] * m[j]
        return out

    def log_probs(self, last: torch.Tensor, h: torch.Tensor, t: torch.Tensor):
        h2 = torch.tanh(self.E[last] + self._mix(h, self.U))
        # shape: (rows, V)
        logits = self._mix(h2, self.W)
        logits[:, self.end] += self.bias0 + self.slope * t.to(torch.float64)
        if self.mask is not None:
            banned = torch.ones(self.vocab, dtype=torch.bool)
            banned[list(self.mask)] = False
            logits[:, banned] = -math.inf
        return torch.log_softmax(logits, dim=-1), h2

    def step(self, last_predictions: torch.Tensor, state: dict[str, torch.Tensor]):
        lp, h2 = self.log_probs(last_predictions, state["h"], state["t"])
        state["h"] = h2
        state["t"] = state["t"] + 1
        return lp, state

    def step_t(self, last_predictions: torch.Tensor, state: dict[str, torch.Tensor], timestep: int):
        self.timesteps.append(timestep)
        self.counters_agree.append(bool((state["t"] == timestep).all()))
        return self.step(last_predictions, state)


def start(batch: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed + 7919)
    tokens = torch.randint(vocab, (batch,), generator=g)
    state = {"h": torch.randn(batch, DIM, generator=g, dtype=torch.float64), "t": torch.zeros(batch, dtype=torch.long)}
    return tokens, state


def cut(predictions: torch.Tensor, end: int) -> list[list[list[int]]]:
    """Each hypothesis's tokens up to and including its first end token."""
    out = []
    for beams in predictions.tolist():
        rows = []
        for row in beams:
            rows.append(row[: row.index(end) + 1] if end in row else row)
        out.append(rows)
    return out


def same_results(got, want, end: int, atol: float = ATOL) -> None:
    """``got`` (beamkit) and ``want`` (OLMo) are the same results, modulo OLMo's trailing end columns."""
    (pg, lg), (pw, lw) = got, want
    assert pg.dtype == pw.dtype and lg.dtype == lw.dtype
    assert pg.shape[:2] == pw.shape[:2] and pg.shape[2] <= pw.shape[2], (pg.shape, pw.shape)
    assert lg.shape == lw.shape
    assert cut(pg, end) == cut(pw, end)
    torch.testing.assert_close(lg, lw, rtol=0, atol=atol)


def run(mod: ModuleType, model: Model, batch: int, seed: int, with_timestep: bool = True, **kwargs):
    """One search of ``model`` with ``mod.BeamSearch(model.end, **kwargs)``: (predictions, log-probs, final state)."""
    tokens, state = start(batch, model.vocab, seed)
    search = mod.BeamSearch(model.end, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither warning is expected here: every request has enough hypotheses
        preds, lps = search.search(tokens, state, model.step_t if with_timestep else model.step)
    return preds, lps, state


def random_case(seed: int) -> dict[str, Any]:
    r = random.Random(seed)
    vocab = r.randint(8, 40)
    beam = r.randint(1, 6)
    max_steps = r.randint(1, 12)
    return dict(
        vocab=vocab,
        end=r.randrange(vocab),
        batch=r.randint(1, 6),
        beam_size=beam,
        per_node_beam_size=r.choice([None, r.randint(1, beam)]),
        max_steps=max_steps,
        min_steps=r.choice([None, 0, r.randint(0, max_steps), r.randint(0, min(3, max_steps))]),
        bias0=r.uniform(-5.0, 0.0),
        slope=r.uniform(0.1, 1.2),
    )


def case_for(seed: int, **overrides: Any) -> dict[str, Any]:
    """``random_case(seed)`` with ``overrides``, min_steps and per_node_beam_size kept within their bounds."""
    case = random_case(seed) | overrides
    if case["min_steps"] is not None:
        case["min_steps"] = min(case["min_steps"], case["max_steps"])
    if case["per_node_beam_size"] is not None:
        case["per_node_beam_size"] = min(case["per_node_beam_size"], case["beam_size"])
    return case


def search_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    return {k: case[k] for k in ("beam_size", "per_node_beam_size", "max_steps", "min_steps")}


# ---- searches ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(48))
def test_random_recurrent_searches_agree(mods, seed):
    case = random_case(seed)
    out, models = {}, {}
    for name, mod in mods.items():
        models[name] = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
        out[name] = run(mod, models[name], case["batch"], seed, **search_kwargs(case))
    same_results(out["beamkit"][:2], out["olmo"][:2], case["end"])
    # the step receives 0, 1, 2, ... (one call per step the search takes), and every row it gets has taken that
    # many steps before
    for name in mods:
        assert models[name].timesteps == list(range(len(models[name].timesteps)))
        assert all(models[name].counters_agree)
    assert models["beamkit"].timesteps == models["olmo"].timesteps


def test_random_cases_cover_the_ranges():
    """The random programs above end at varied lengths, with several beams and both step styles' ranges."""
    olmo = oracle()
    lengths, beams_seen, pn_below = Counter(), set(), 0
    for seed in range(48):
        case = random_case(seed)
        model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
        preds, _, _ = run(olmo, model, case["batch"], seed, **search_kwargs(case))
        beams_seen.add(preds.shape[1])
        pn_below += (case["per_node_beam_size"] or case["beam_size"]) < case["beam_size"]
        for beams in cut(preds, case["end"]):
            for row in beams:
                lengths[(len(row), row[-1] == case["end"])] += 1
    assert len({n for n, _ in lengths}) >= 10  # hypotheses of many lengths
    assert sum(v for (_, ended), v in lengths.items() if ended) > 50  # many end on their end token
    assert sum(v for (_, ended), v in lengths.items() if not ended) > 20  # and many at max_steps
    assert beams_seen == set(range(1, 7)) and pn_below >= 8


@pytest.mark.parametrize("seed", range(6))
def test_step_without_timestep_agrees_with_the_timestep_step(mods, seed):
    case = random_case(100 + seed)
    results = {}
    for name, mod in mods.items():
        for with_t in (False, True):
            model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
            results[name, with_t] = run(mod, model, case["batch"], seed, with_timestep=with_t, **search_kwargs(case))
    for with_t in (False, True):
        same_results(results["beamkit", with_t][:2], results["olmo", with_t][:2], case["end"])
    same_results(results["beamkit", False][:2], results["beamkit", True][:2], case["end"])


def test_attributes_changed_between_searches(mods):
    """beam_size, max_steps, min_steps, per_node_beam_size, final_sequence_scorer and constraints are read at each
    search (per_node_beam_size keeps the value it got at construction when beam_size changes)."""
    vocab, end, batch = 24, 3, 3
    programs: dict[str, list] = {}
    for name, mod in mods.items():
        search = mod.BeamSearch(end, max_steps=5, beam_size=2)
        tokens, _ = start(batch, vocab, 0)
        results = []
        changes: list[tuple[str, Any]] = [
            ("beam_size", 5),
            ("max_steps", 9),
            ("min_steps", 4),
            ("final_sequence_scorer", mod.LengthNormalizedSequenceLogProbabilityScorer(2.0)),
            ("constraints", [mod.RepeatedNGramBlockingConstraint(1)]),
            ("per_node_beam_size", 3),
            ("min_steps", 0),
            ("final_sequence_scorer", mod.SequenceLogProbabilityScorer()),
            ("constraints", []),
            ("max_steps", 2),
            ("beam_size", 1),
        ]
        for attr, value in [(None, None), *changes]:
            if attr is not None:
                setattr(search, attr, value)
            model = Model(vocab, end, 5, bias0=-1.5, slope=0.8)
            _, state = start(batch, vocab, 0)
            preds, lps = search.search(tokens.clone(), state, model.step_t)
            results.append((attr, preds, lps))
        programs[name] = results
    for (_attr, *got), (_, *want) in zip(programs["beamkit"], programs["olmo"], strict=True):
        same_results(tuple(got), tuple(want), end)
    # each change took effect (read from OLMo's results)
    shapes = [(preds.shape[1], preds.shape[2]) for _, preds, _ in programs["olmo"]]
    assert shapes[0][0] == 2 and shapes[1][0] == 5 and shapes[-1] == (1, 2)
    lengths_after_min4 = [len(row) for beams in cut(programs["olmo"][3][1], end) for row in beams]
    assert min(lengths_after_min4) >= 5  # min_steps 4: at least 4 tokens before the end token


@pytest.mark.parametrize("penalty", [0.0, 1.0, 2.0, -2.0])
def test_length_normalized_scorer(mods, penalty):
    reordered = 0
    for seed in range(4):
        case = case_for(200 + seed, beam_size=5, per_node_beam_size=None, max_steps=10, batch=4)
        out = {}
        for name, mod in mods.items():
            model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
            scorer = mod.LengthNormalizedSequenceLogProbabilityScorer(penalty)
            out[name] = run(mod, model, case["batch"], seed, final_sequence_scorer=scorer, **search_kwargs(case))
        same_results(out["beamkit"][:2], out["olmo"][:2], case["end"])
        model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
        plain = run(mods["olmo"], model, case["batch"], seed, **search_kwargs(case))
        reordered += cut(plain[0], case["end"]) != cut(out["olmo"][0], case["end"])
    if penalty != 0.0:
        assert reordered  # the scorer changed some order: the comparison above can see a scorer ignored


@pytest.mark.parametrize("ngram", [1, 2, 3])
def test_repeated_ngram_blocking(mods, ngram):
    blocked_something = False
    for seed in range(4):
        case = dict(vocab=30, end=seed, batch=3, beam_size=4, max_steps=10, bias0=-4.0, slope=0.3)
        out = {}
        for name, mod in mods.items():
            model = Model(case["vocab"], case["end"], 300 + seed, case["bias0"], case["slope"])
            constraint = mod.RepeatedNGramBlockingConstraint(ngram)
            out[name] = run(
                mod, model, case["batch"], seed, beam_size=4, max_steps=10, min_steps=2, constraints=[constraint]
            )
        same_results(out["beamkit"][:2], out["olmo"][:2], case["end"])
        for beams in cut(out["beamkit"][0], case["end"]):
            for row in beams:
                grams = [tuple(row[i : i + ngram]) for i in range(len(row) - ngram + 1)]
                assert len(grams) == len(set(grams)), row  # no n-gram repeats
        model = Model(case["vocab"], case["end"], 300 + seed, case["bias0"], case["slope"])
        free = run(mods["olmo"], model, case["batch"], seed, beam_size=4, max_steps=10, min_steps=2)
        blocked_something |= cut(free[0], case["end"]) != cut(out["olmo"][0], case["end"])
    assert blocked_something


# ---- user subclasses ---------------------------------------------------------------------------------------------


def prefer_odd_sampler(mod: ModuleType, end: int):
    """A Sampler subclass: the per-node candidates are the best by log-probability minus 4 for even tokens (the end
    token exempt); what it returns are their true log-probabilities."""

    class PreferOdd(mod.Sampler):
        def sample_nodes(self, log_probs, per_node_beam_size, state):
            ids = torch.arange(log_probs.shape[1])
            penalty = 4.0 * ((ids % 2 == 0) & (ids != end)).to(log_probs.dtype)
            _, indices = torch.topk(log_probs - penalty, per_node_beam_size, dim=-1)
            return log_probs.gather(1, indices), indices, state

    return PreferOdd()


def ban_after_constraint(mod: ModuleType, first: int, then: int):
    """A Constraint subclass: token ``then`` is banned right after token ``first`` (first -1: as the first token)."""

    class BanAfter(mod.Constraint):
        def init_state(self, batch_size):
            return [[{"last": -1}] for _ in range(batch_size)]

        def apply(self, state, class_log_probabilities):
            for i, beams in enumerate(state):
                for j, beam in enumerate(beams):
                    if beam["last"] == first:
                        class_log_probabilities[i, j, then] = torch.finfo(class_log_probabilities.dtype).min
            return class_log_probabilities

        def _update_state(self, state, last_prediction):
            for i, beams in enumerate(state):
                for j, beam in enumerate(beams):
                    beam["last"] = last_prediction[i, j].item()
            return state

    return BanAfter()


def token_penalty_scorer(mod: ModuleType, token: int, weight: float):
    """A FinalSequenceScorer subclass: the log-probability minus ``weight`` per ``token`` before the end token."""

    class TokenPenalty(mod.FinalSequenceScorer):
        def score(self, predictions, log_probabilities, end_index):
            before_end = (predictions == end_index).cumsum(dim=-1) == 0
            return log_probabilities - weight * ((predictions == token) & before_end).sum(dim=-1)

    return TokenPenalty()


def common_tokens(preds: torch.Tensor, end: int) -> list[int]:
    counts = Counter(tok for beams in cut(preds, end) for row in beams for tok in row if tok != end)
    return [tok for tok, _ in counts.most_common()]


@pytest.mark.parametrize("seed", range(4))
def test_sampler_subclass(mods, seed):
    case = case_for(400 + seed, beam_size=4, per_node_beam_size=2, max_steps=8)
    out = {}
    for name, mod in mods.items():
        model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
        sampler = prefer_odd_sampler(mod, case["end"])
        out[name] = run(mod, model, case["batch"], seed, sampler=sampler, **search_kwargs(case))
    same_results(out["beamkit"][:2], out["olmo"][:2], case["end"])
    model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
    plain = run(mods["olmo"], model, case["batch"], seed, **search_kwargs(case))
    assert cut(plain[0], case["end"]) != cut(out["olmo"][0], case["end"])  # the sampler was used


@pytest.mark.parametrize("at_start", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_constraint_subclass(mods, seed, at_start):
    case = case_for(500 + seed, beam_size=4, per_node_beam_size=None, max_steps=8, min_steps=1)
    model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
    plain = run(mods["olmo"], model, case["batch"], seed, **search_kwargs(case))
    # ban the most common bigram of the unconstrained results (or their most common first token)
    bigrams = Counter(
        (a, b)
        for beams in cut(plain[0], case["end"])
        for row in beams
        for a, b in itertools.pairwise([-1, *row] if at_start else row)
        if (a == -1) == at_start
    )
    (first, then), _ = bigrams.most_common(1)[0]
    out = {}
    for name, mod in mods.items():
        model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
        out[name] = run(
            mod, model, case["batch"], seed, constraints=[ban_after_constraint(mod, first, then)], **search_kwargs(case)
        )
    same_results(out["beamkit"][:2], out["olmo"][:2], case["end"])
    for beams in cut(out["beamkit"][0], case["end"]):
        for row in beams:
            assert (first, then) not in set(itertools.pairwise([-1, *row]))


@pytest.mark.parametrize("seed", range(4))
def test_final_sequence_scorer_subclass(mods, seed):
    case = case_for(600 + seed, beam_size=5, per_node_beam_size=None, max_steps=9)
    model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
    plain = run(mods["olmo"], model, case["batch"], seed, **search_kwargs(case))
    token = common_tokens(plain[0], case["end"])[0]
    out = {}
    for name, mod in mods.items():
        model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
        scorer = token_penalty_scorer(mod, token, 2.5)
        out[name] = run(mod, model, case["batch"], seed, final_sequence_scorer=scorer, **search_kwargs(case))
    same_results(out["beamkit"][:2], out["olmo"][:2], case["end"])
    assert not torch.equal(out["olmo"][1], plain[1])  # the scorer's scores are what came back


# ---- the final state ---------------------------------------------------------------------------------------------


def replayed_state(model: Model, start_tokens, start_state, tokens: list[int], b: int):
    """The state of request ``b`` after the step consumed the start token and then ``tokens``, one by one."""
    h, t = start_state["h"][b : b + 1].clone(), start_state["t"][b : b + 1].clone()
    for tok in [int(start_tokens[b]), *tokens]:
        _, h = model.log_probs(torch.tensor([tok]), h, t)
        t = t + 1
    return h[0], int(t[0])


@pytest.mark.parametrize("seed", range(6))
def test_final_state_olmo_semantics(seed):
    """OLMo's final state holds, for each final beam (pre-sort order), the state after the step consumed all of its
    row's columns but the last one (end tokens included: a finished beam is stepped on end tokens until the search
    stops). Checked by replaying the step function; this pins down what the comparison below compares."""
    olmo = oracle()
    case = case_for(700 + seed, batch=3, beam_size=4, max_steps=9, min_steps=0)
    model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
    tokens, state0 = start(case["batch"], case["vocab"], seed)
    preds, _, state = run(olmo, model, case["batch"], seed, **search_kwargs(case))
    width = preds.shape[2]
    beam = case["beam_size"]
    assert state["h"].shape == (case["batch"] * beam, DIM) and state["t"].shape == (case["batch"] * beam,)
    for b in range(case["batch"]):
        for k in range(beam):
            h, t = replayed_state(model, tokens, state0, preds[b, k, : width - 1].tolist(), b)
            assert int(state["t"][b * beam + k]) == t == width
            torch.testing.assert_close(state["h"][b * beam + k], h, rtol=0, atol=0)


def _state_rows(state, batch: int, beam: int):
    return [
        sorted((int(state["t"][b * beam + k]), tuple(state["h"][b * beam + k].tolist())) for k in range(beam))
        for b in range(batch)
    ]


def _replayed_row(model: Model, h0: torch.Tensor, first: int, tokens: list[int]) -> tuple[torch.Tensor, int]:
    """The state row of the call that chose the last of ``tokens``: the recurrence run on the hypothesis's own
    path alone (start token, then every token but the last)."""
    h, last = h0[None], torch.tensor([first])
    for i, tok in enumerate(tokens):
        _, h = model.log_probs(last, h, torch.tensor([i]))
        last = torch.tensor([tok])
    return h[0], len(tokens)


@pytest.mark.parametrize("reorder", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_final_state(mods, seed, reorder):
    """The caller's state dict after the search holds one row per returned hypothesis, ``[batch * beam, ...]`` in
    the returned order: the row of the call that chose its last token, replayed here on the hypothesis's path
    alone. OLMo's rows agree for the hypotheses that run to its last column (it keeps stepping finished beams on
    end tokens, so their rows move on; beamkit never evaluates a finished hypothesis)."""
    case = case_for(700 + seed, batch=3, beam_size=4, max_steps=9, min_steps=0)
    kwargs = search_kwargs(case)
    out = {}
    for name, mod in mods.items():
        model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
        if reorder:
            kwargs["final_sequence_scorer"] = mod.LengthNormalizedSequenceLogProbabilityScorer(-2.0)
        out[name] = run(mod, model, case["batch"], seed, **kwargs)
    same_results(out["beamkit"][:2], out["olmo"][:2], case["end"])
    got, want = out["beamkit"][2], out["olmo"][2]
    assert set(got) == set(want) == {"h", "t"}
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
    if STAND_IN:
        return
    first, start_state = start(case["batch"], case["vocab"], seed)
    model = Model(case["vocab"], case["end"], seed, case["bias0"], case["slope"])
    width = out["olmo"][0].shape[2]
    olmo_rows = {}
    for b, beams in enumerate(cut(out["olmo"][0], case["end"])):
        for k, toks in enumerate(beams):
            olmo_rows[b, tuple(toks)] = (want["h"][b * 4 + k], int(want["t"][b * 4 + k]))
    full = 0
    for b, beams in enumerate(cut(out["beamkit"][0], case["end"])):
        for k, toks in enumerate(beams):
            h, t = _replayed_row(model, start_state["h"][b], int(first[b]), toks)
            assert int(got["t"][b * 4 + k]) == t
            torch.testing.assert_close(got["h"][b * 4 + k], h, rtol=0, atol=0)
            if len(toks) == width:
                full += 1
                olmo_h, olmo_t = olmo_rows[b, tuple(toks)]
                assert olmo_t == t
                torch.testing.assert_close(got["h"][b * 4 + k], olmo_h, rtol=0, atol=0)
    assert full  # some hypotheses reach OLMo's last column: the comparison with OLMo is not empty


def test_final_state_rows_follow_the_returned_order(compat):
    """beamkit's promise where the final scorer reorders: row ``b * beam + k`` is the state of ``predictions[b, k]``
    (OLMo keeps its pre-sort order there)."""
    if STAND_IN:
        pytest.skip("beamkit.compat.olmo is not in this tree")
    case = case_for(703, batch=3, beam_size=4, max_steps=9, min_steps=0)
    model = Model(case["vocab"], case["end"], 3, case["bias0"], case["slope"])
    scorer = compat.LengthNormalizedSequenceLogProbabilityScorer(-2.0)
    preds, _, state = run(compat, model, case["batch"], 3, final_sequence_scorer=scorer, **search_kwargs(case))
    plain_model = Model(case["vocab"], case["end"], 3, case["bias0"], case["slope"])
    plain, _, plain_state = run(compat, plain_model, case["batch"], 3, **search_kwargs(case))
    rows = {}
    for b in range(case["batch"]):
        for k in range(4):
            rows[b, tuple(cut(plain[b : b + 1, k : k + 1], case["end"])[0][0])] = plain_state["h"][b * 4 + k]
    for b in range(case["batch"]):
        for k in range(4):
            key = (b, tuple(cut(preds[b : b + 1, k : k + 1], case["end"])[0][0]))
            torch.testing.assert_close(state["h"][b * 4 + k], rows[key], rtol=0, atol=0)


# ---- errors and warnings -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"max_steps": 0}, "max_steps"),
        ({"max_steps": -3}, "max_steps"),
        ({"beam_size": 0}, "beam_size"),
        ({"beam_size": -1}, "beam_size"),
        ({"per_node_beam_size": 0}, "per_node_beam_size"),
        ({"per_node_beam_size": -2}, "per_node_beam_size"),
        ({"min_steps": -1}, "min_steps"),
        ({"max_steps": 4, "min_steps": 5}, "min_steps"),
    ],
)
def test_bad_arguments_raise_at_construction(mods, kwargs, word):
    for mod in mods.values():
        with pytest.raises(ValueError, match=word):
            mod.BeamSearch(2, **kwargs)


@pytest.mark.parametrize("kwargs", [{"beam_size": 9}, {"beam_size": 3, "per_node_beam_size": 9}])
def test_beams_wider_than_the_vocabulary_raise_at_search(mods, kwargs):
    for mod in mods.values():
        model = Model(8, 1, 0)
        search = mod.BeamSearch(1, max_steps=4, **kwargs)  # valid until the vocabulary is known
        tokens, state = start(2, 8, 0)
        with pytest.raises(ValueError, match="per_node_beam_size|beam_size"):
            search.search(tokens, state, model.step)


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_top_p_outside_the_unit_interval(mods, p):
    for mod in mods.values():
        with pytest.raises(ValueError, match=r"\bp\b"):
            mod.TopPSampler(p=p)
        mod.TopPSampler(p=0.0), mod.TopPSampler(p=1.0)  # the ends are allowed


@pytest.mark.parametrize("k, per_node", [(0, 1), (2, 3), (9, 1)])
def test_top_k_bad_k_raises_at_search(mods, k, per_node):
    """k < 1, k < per_node_beam_size or k > V: a ValueError by the time the sampler is used (k < 1 may be refused
    at construction already)."""
    for mod in mods.values():
        model = Model(8, 1, 0)
        tokens, state = start(2, 8, 0)
        with pytest.raises(ValueError, match=r"\bk\b"):
            sampler = mod.TopKSampler(k=k)
            search = mod.BeamSearch(1, max_steps=4, beam_size=3, per_node_beam_size=per_node, sampler=sampler)
            search.search(tokens, state, model.step)


def test_empty_sequences_warning(mods):
    """Beam 1 and every first prediction the end token: a warning, and one-column results."""
    out = {}
    for name, mod in mods.items():
        model = Model(10, 4, 0, bias0=40.0, slope=0.0)
        tokens, state = start(3, 10, 0)
        with pytest.warns(RuntimeWarning, match="Empty sequences predicted"):
            preds, lps = mod.BeamSearch(4, max_steps=5, beam_size=1).search(tokens, state, model.step)
        out[name] = preds, lps
    same_results(out["beamkit"], out["olmo"], 4)
    assert out["olmo"][0].tolist() == [[[4]]] * 3


def _finite(preds, lps, end):
    """Per request, the (log-probability, tokens) of its real hypotheses: OLMo's junk beams score -inf or about
    finfo.min (a finished beam's masked continuations score its log-probability plus finfo.min)."""
    return [
        sorted(
            (round(float(lp), 9), tuple(row))
            for row, lp in zip(rows, lp_row.tolist(), strict=True)
            if lp > torch.finfo(torch.float64).min / 2
        )
        for rows, lp_row in zip(cut(preds, end), lps, strict=True)
    ]


def test_negligible_log_probabilities_warning(mods):
    """Only two tokens possible (one the end token): fewer real hypotheses than beams, a warning from both, the
    same real hypotheses."""
    end, vocab, beam = 2, 8, 6
    out = {}
    for name, mod in mods.items():
        model = Model(vocab, end, 0, bias0=0.0, slope=0.0, mask={end, 5})
        tokens, state = start(3, vocab, 0)
        with pytest.warns(RuntimeWarning, match="Negligible log probabilities"):
            out[name] = mod.BeamSearch(end, max_steps=3, beam_size=beam).search(tokens, state, model.step)
    assert _finite(*out["beamkit"], end) == _finite(*out["olmo"], end)
    assert [len(rows) for rows in _finite(*out["olmo"], end)] == [4, 4, 4]  # end, 5 end, 5 5 end, 5 5 5
    assert out["beamkit"][0].shape[:2] == out["olmo"][0].shape[:2] == (3, beam)
    if not STAND_IN:  # beamkit's promise: the missing hypotheses are end tokens at log-probability -inf
        preds, lps = out["beamkit"]
        junk = lps < torch.finfo(torch.float64).min / 2
        assert junk.sum() == 3 * 2 and bool((lps[junk] == -math.inf).all())
        assert bool((preds[junk] == end).all())


# ---- samplers: distributions of direct sample_nodes calls --------------------------------------------------------

ROWS = 20000
SIGMAS = 5.0


def tempered(log_probs: list[float], temperature: float) -> list[float]:
    m = max(x / temperature for x in log_probs)
    w = [math.exp(x / temperature - m) for x in log_probs]
    return [x / sum(w) for x in w]


def inclusion(probs: list[float], draws: int) -> list[float]:
    """P(token i among ``draws`` draws without replacement, each draw proportional to the remaining mass)."""
    out = [0.0] * len(probs)
    support = [i for i, p in enumerate(probs) if p > 0]
    for seq in itertools.permutations(support, draws):
        pr, left = 1.0, 1.0
        for i in seq:
            pr *= probs[i] / left
            left -= probs[i]
        for i in seq:
            out[i] += pr
    return out


def check_counts(counts: list[int], expected: list[float], n: int) -> None:
    for i, (c, p) in enumerate(zip(counts, expected, strict=True)):
        if p <= 0.0:
            assert c == 0, (i, counts, expected)
        elif p >= 1.0:
            assert c == n, (i, counts, expected)
        else:
            sd = math.sqrt(n * p * (1 - p))
            assert abs(c - n * p) <= SIGMAS * sd, (i, c, n * p, sd)


LOG_PROBS = [math.log(p) for p in (0.4, 0.25, 0.15, 0.1, 0.06, 0.04)]


def draw(sampler, per_node: int, log_probs=LOG_PROBS, seed: int = 1234):
    rows = torch.tensor([log_probs], dtype=torch.float64).expand(ROWS, -1).contiguous()
    torch.manual_seed(seed)
    lp, idx, _ = sampler.sample_nodes(rows, per_node, {})
    assert idx.shape == lp.shape == (ROWS, per_node) and idx.dtype == torch.long
    assert torch.equal(lp, rows.gather(1, idx))  # the true log-probabilities of what was drawn
    return idx


def column_counts(idx, vocab: int, column: int) -> list[int]:
    return torch.bincount(idx[:, column], minlength=vocab).tolist()


def inclusion_counts(idx, vocab: int) -> list[int]:
    counts = [0] * vocab
    for tok in range(vocab):
        counts[tok] = int((idx == tok).any(dim=1).sum())
    return counts


def check_sampler(sampler, probs: list[float], per_node: int, with_replacement: bool) -> None:
    """Draws of ``sampler`` follow ``probs`` (the restricted, tempered distribution, worked out by hand)."""
    vocab = len(probs)
    idx = draw(sampler, per_node)
    if with_replacement:
        for column in range(per_node):  # every draw is one from probs
            check_counts(column_counts(idx, vocab, column), probs, ROWS)
        if per_node == 2:  # and the two are independent: the same token twice with probability sum p^2
            same = int((idx[:, 0] == idx[:, 1]).sum())
            check_counts([same], [sum(p * p for p in probs)], ROWS)
    else:
        assert all(len(set(row)) == per_node for row in idx.tolist()[:2000])
        check_counts(inclusion_counts(idx, vocab), inclusion(probs, per_node), ROWS)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.5])
@pytest.mark.parametrize("per_node, with_replacement", [(1, False), (2, False), (3, False), (2, True)])
def test_multinomial_sampler_distribution(compat, temperature, per_node, with_replacement):
    sampler = compat.MultinomialSampler(temperature=temperature, with_replacement=with_replacement)
    check_sampler(sampler, tempered(LOG_PROBS, temperature), per_node, with_replacement)


# k at least per_node_beam_size (a smaller k is refused: tested above)
TOP_K_CASES = [
    (k, temperature, per_node, with_replacement)
    for k, temperature in [(1, 1.0), (3, 1.0), (3, 0.5), (4, 3.0), (6, 2.0)]
    for per_node, with_replacement in [(1, False), (2, False), (2, True)]
    if k >= per_node
]


@pytest.mark.parametrize("k, temperature, per_node, with_replacement", TOP_K_CASES)
def test_top_k_sampler_distribution(compat, k, temperature, per_node, with_replacement):
    sampler = compat.TopKSampler(k=k, temperature=temperature, with_replacement=with_replacement)
    top = sorted(range(len(LOG_PROBS)), key=lambda i: -LOG_PROBS[i])[:k]
    restricted = tempered([LOG_PROBS[i] for i in top], temperature)
    probs = [0.0] * len(LOG_PROBS)
    for i, p in zip(top, restricted, strict=True):
        probs[i] = p
    check_sampler(sampler, probs, per_node, with_replacement)


def nucleus(log_probs: list[float], p: float, temperature: float, at_least: int) -> list[float]:
    """Top-p by hand: temper, keep the most likely tokens up to and including the first whose cumulative mass
    reaches p (and at least ``at_least``), renormalise the tempered masses."""
    probs = tempered(log_probs, temperature)
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = [], 0.0
    for i in order:
        if mass >= p and len(kept) >= at_least:
            break
        kept.append(i)
        mass += probs[i]
    out = [0.0] * len(probs)
    for i in kept:
        out[i] = probs[i] / sum(probs[j] for j in kept)
    return out


@pytest.mark.parametrize(
    "p, temperature",
    # p away from the cumulative masses 0.4, 0.65, 0.8, 0.9, 0.96 at temperature 1: a p equal to one of them puts
    # the nucleus boundary on a rounding error of the sum
    [(0.88, 1.0), (0.6, 1.0), (0.3, 1.0), (0.0, 1.0), (1.0, 1.0), (0.6, 0.5), (0.9, 2.0), (0.8, 3.0)],
)
@pytest.mark.parametrize("per_node, with_replacement", [(1, False), (2, False), (3, False), (2, True)])
def test_top_p_sampler_distribution(compat, p, temperature, per_node, with_replacement):
    sampler = compat.TopPSampler(p=p, temperature=temperature, with_replacement=with_replacement)
    probs = nucleus(LOG_PROBS, p, temperature, 1 if with_replacement else per_node)
    check_sampler(sampler, probs, per_node, with_replacement)


def test_top_p_keeps_the_token_that_reaches_p(compat):
    """Masses 0.4, 0.25, ... and p = 0.6: 0.4 < 0.6 <= 0.65, so the nucleus is the first two tokens (a rule that
    kept tokens only while the cumulative mass stays below p would keep one, one that kept the next token too would
    keep three)."""
    idx = draw(compat.TopPSampler(p=0.6), 1)
    counts = column_counts(idx, len(LOG_PROBS), 0)
    assert counts[2:] == [0, 0, 0, 0] and counts[0] > 0 and counts[1] > 0
    check_counts(counts, [0.4 / 0.65, 0.25 / 0.65, 0, 0, 0, 0], ROWS)


def test_the_hand_distributions_are_what_olmo_samples():
    """The hand-worked distributions above are checked against OLMo's samplers too (so a test that passes the
    drop-in passes OLMo: the oracle and the hand computation agree)."""
    olmo = oracle()
    check_sampler(olmo.TopPSampler(p=0.8, temperature=3.0), nucleus(LOG_PROBS, 0.8, 3.0, 2), 2, False)
    check_sampler(olmo.MultinomialSampler(temperature=0.5, with_replacement=True), tempered(LOG_PROBS, 0.5), 2, True)


def test_deterministic_sampler(compat):
    rows = torch.tensor([LOG_PROBS, LOG_PROBS[::-1]], dtype=torch.float64)
    lp, idx, _ = compat.DeterministicSampler().sample_nodes(rows, 3, {})
    assert idx.tolist() == [[0, 1, 2], [5, 4, 3]]
    assert torch.equal(lp, rows.gather(1, idx))
    lp, idx, _ = compat.DeterministicSampler().sample_beams(rows, 2, {})
    assert idx.tolist() == [[0, 1], [5, 4]]


def test_allennlp_name_is_the_same_module():
    if STAND_IN:
        pytest.skip("beamkit.compat.olmo is not in this tree")
    import beamkit.compat.allennlp as allennlp

    for name in (
        "BeamSearch",
        "Sampler",
        "DeterministicSampler",
        "MultinomialSampler",
        "TopKSampler",
        "TopPSampler",
        "GumbelSampler",
        "FinalSequenceScorer",
        "SequenceLogProbabilityScorer",
        "LengthNormalizedSequenceLogProbabilityScorer",
        "Constraint",
        "RepeatedNGramBlockingConstraint",
        "StepFunctionTypeNoTimestep",
        "StepFunctionTypeWithTimestep",
        "StateType",
        "ConstraintStateType",
    ):
        assert getattr(allennlp, name) is getattr(BEAMKIT_COMPAT, name), name


# ---- beamkit's own refusals of bad input (OLMo fails later, with torch's errors) ---------------------------------


@pytest.mark.parametrize(
    "start, error",
    [([0, 0], TypeError), (torch.zeros(2), TypeError), (torch.zeros((2, 1), dtype=torch.long), TypeError)],
)
def test_bad_start_predictions_are_refused(compat, start, error):
    if STAND_IN:
        pytest.skip("beamkit.compat.olmo is not in this tree")
    model = Model(10, 3, 0)
    with pytest.raises(error, match="start_predictions"):
        compat.BeamSearch(3, max_steps=4, beam_size=2).search(start, start_state(len(start), 0), model.step)


def start_state(batch: int, seed: int) -> dict[str, torch.Tensor]:
    return start(batch, 10, seed)[1]


def test_empty_batch_and_bad_plugins_are_refused(compat):
    if STAND_IN:
        pytest.skip("beamkit.compat.olmo is not in this tree")
    model = Model(10, 3, 0)
    tokens, state = start(2, 10, 0)
    with pytest.raises(ValueError, match="empty"):
        compat.BeamSearch(3, max_steps=4, beam_size=2).search(tokens[:0], {}, model.step)
    with pytest.raises(TypeError, match="step must be callable"):
        compat.BeamSearch(3, max_steps=4, beam_size=2).search(tokens, state, None)
    search = compat.BeamSearch(3, max_steps=4, beam_size=2)
    search.sampler = "top-k"
    with pytest.raises(TypeError, match="sampler must be a Sampler"):
        search.search(tokens, state, model.step)


def test_a_failing_batch_element_keeps_the_others(compat):
    """NaN log-probabilities in one batch element: BatchDecodeError (a ValueError) names it and carries the other
    elements' hypotheses."""
    if STAND_IN:
        pytest.skip("beamkit.compat.olmo is not in this tree")
    import beamkit

    model = Model(10, 3, 0)
    tokens, state = start(3, 10, 0)
    state["poison"] = torch.tensor([False, True, False])

    def step(last_predictions, state):
        lp, new = model.step(last_predictions, state)
        return torch.where(state["poison"][:, None], torch.nan, lp), new

    with pytest.raises(beamkit.BatchDecodeError, match="request 1") as info:
        compat.BeamSearch(3, max_steps=4, beam_size=2).search(tokens, state, step)
    assert set(info.value.errors) == {1}
    assert info.value.results[1] == [] and info.value.results[0] and info.value.results[2]


@pytest.mark.parametrize("value", [[1, 2], 3.0, "abc", (torch.zeros((2, 1)),), torch.tensor(1.0)])
def test_a_state_value_that_is_not_a_tensor_is_refused_by_name(compat, value):
    """OLMo's state is a dict of tensors gathered by row: any other value is a TypeError naming its key (it used
    to fail after the search with an AttributeError about ``.shape``)."""
    if STAND_IN:
        pytest.skip("beamkit.compat.olmo is not in this tree")
    model = Model(10, 3, 0)
    tokens, state = start(2, 10, 0)
    state["extra"] = value
    with pytest.raises(TypeError, match=r"start_state\['extra'\] must be a torch tensor"):
        compat.BeamSearch(3, max_steps=4, beam_size=2).search(tokens, state, model.step)

    def step(last_predictions, state):
        lp, new = model.step(last_predictions, {k: v for k, v in state.items() if k != "bad"})
        return lp, {**new, "bad": value}

    with pytest.raises(TypeError, match=r"the state the step function returned\['bad'\] must be a torch tensor"):
        compat.BeamSearch(3, max_steps=4, beam_size=2).search(*start(2, 10, 0), step)
