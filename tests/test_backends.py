"""Torch inputs, state handling, backend ops, and the brute-force property test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beamkit import Shared, beam_search, concat_state, greedy_decode, ops, search_batch, select_state
from beamkit.state import is_identity
from tests.toy import BOS, MultiToy, ToyModel, all_outputs

torch = pytest.importorskip("torch")
EOS = 0
# (library, device) of a table: numpy, torch on the CPU, torch on cuda (skipped without a CUDA device)
LIBS = [pytest.param(b, d, id=f"{b}-{d}") for b, d in (("numpy", "cpu"), ("torch", "cpu"), ("torch", "cuda"))]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    v=st.integers(2, 4),
    max_len=st.integers(1, 3),
    alpha=st.sampled_from([0, 0.5, 1]),
)
def test_exhaustive_beam_equals_brute_force_property(seed, v, max_len, alpha):
    m = ToyModel(v, seed=seed, scale=1.0)
    outs = all_outputs(m, EOS, max_len)
    want = sorted(((lp / len(s) ** alpha, s) for s, lp, _ in outs), key=lambda x: -x[0])
    got = beam_search(m.step, m.init(), BOS, EOS, v**max_len, max_len, length_penalty=alpha)
    assert [h.tokens for h in got] == [s for _, s in want]
    np.testing.assert_allclose([h.score for h in got], [sc for sc, _ in want], atol=1e-9)


def torch_model(m: ToyModel, dtype=torch.float64, device=None):
    """The same toy model with torch logits (on ``device``, default the CPU) and a torch tensor leaf in the
    state."""

    def step(state, y):
        prefixes, marker = state
        assert isinstance(marker, torch.Tensor) and marker.shape[0] == len(prefixes)
        logits, new = m.step(prefixes, np.asarray(y.cpu() if hasattr(y, "cpu") else y))
        return torch.tensor(logits, dtype=dtype, device=device), (new, marker)

    return step


@pytest.mark.parametrize("policy", ["narrow", "pool"])
def test_torch_logits_give_the_numpy_results(policy, device):
    for seed in range(3):
        m = ToyModel(6, seed=seed)
        init = (m.init(), torch.zeros(1, 4, device=device))
        got = search_batch(torch_model(m, device=device), init, BOS, EOS, 3, 5, policy=policy)[0]
        want = search_batch(m.step, m.init(), BOS, EOS, 3, 5, policy=policy)[0]
        assert [h.tokens for h in got] == [h.tokens for h in want]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-12)


def test_torch_y_prev_and_float32():
    m = ToyModel(5, seed=1)
    seen = []

    def step(state, y):
        seen.append(type(y).__module__.split(".")[0])
        return torch_model(m, torch.float32)(state, y)

    h = greedy_decode(step, (m.init(), torch.zeros(1)), BOS, EOS, 4)
    # first call: the library of the state's first array leaf (numpy here); then the logits' library
    assert seen[0] == "numpy" and set(seen[1:]) == {"torch"}
    assert h.tokens == greedy_decode(m.step, m.init(), BOS, EOS, 4).tokens


def test_torch_state_is_gathered_by_parent(device):
    h = torch.arange(12.0, device=device).reshape(4, 3)
    out = select_state({"h": h, "n": [torch.tensor(1.0)]}, np.array([3, 3, 1]))
    assert out["h"].device == device and torch.equal(out["h"], h[[3, 3, 1]])
    assert out["n"][0].dim() == 0  # 0-d tensor passed through


def test_shared_custom_and_concat():
    class Cache:
        def __init__(self, rows):
            self.rows = rows

        def beamkit_select(self, idx):
            return Cache([self.rows[i] for i in idx])

    mem = Shared(np.ones((2, 5)))
    state = {"mem": mem, "cache": Cache(["a", "b", "c"]), "req": np.array([0, 0, 1])}
    out = select_state(state, np.array([2, 0]))
    assert out["mem"] is mem
    assert out["cache"].rows == ["c", "a"]
    np.testing.assert_array_equal(out["req"], [1, 0])
    a = {"x": np.zeros((1, 2)), "m": Shared(np.zeros((1, 3))), "k": 5}
    b = {"x": np.ones((2, 2)), "m": Shared(np.ones((1, 3))), "k": 5}
    c = concat_state([a, b])
    assert c["x"].shape == (3, 2) and c["m"].value.shape == (2, 3) and c["k"] == 5
    t = concat_state([(torch.zeros(1, 2),), (torch.ones(2, 2),)])
    assert t[0].shape == (3, 2)
    with pytest.raises(ValueError):
        concat_state([])


def test_identity_parents_skip_the_gather():
    calls = []

    class Spy:
        def beamkit_select(self, idx):
            calls.append(idx.tolist())
            return self

    # a model whose beams keep their order: every step's parents are the identity after step one
    m = ToyModel(3, table={(): [0.0, 5.0, -9.0]}, scale=0.0)

    def step(state, y):
        logits, new = m.step(state[0], y)
        logits = np.tile([-9.0, 5.0, -9.0], (len(new), 1))
        return logits, (new, state[1])

    greedy_decode(step, (m.init(), Spy()), BOS, EOS, 5)
    assert calls == []
    assert is_identity(np.arange(4), 4) and not is_identity(np.array([0, 0, 1, 2]), 4)


@pytest.mark.parametrize("backend,device", LIBS, indirect=["device"])
def test_top_candidates_tie_rule(backend, device):
    x = np.array([[1.0, 3.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0], [0.0, -np.inf, 5.0, -np.inf, 1.0]])
    xx = torch.tensor(x, device=device) if backend == "torch" else x
    vals, idx = ops.top_candidates(xx, 2)
    assert idx.tolist() == [[1, 2], [0, 1], [2, 4]]
    np.testing.assert_array_equal(vals, [[3.0, 3.0], [2.0, 2.0], [5.0, 1.0]])
    vals, idx = ops.top_candidates(xx, 9)  # more than V: every column, ordered
    assert idx[0].tolist() == [1, 2, 3, 0, 4]
    rng = np.random.default_rng(0)
    big = rng.integers(0, 4, size=(50, 40)).astype(np.float64)  # many ties
    bb = torch.tensor(big, device=device) if backend == "torch" else big
    _, idx = ops.top_candidates(bb, 7)
    want = np.array([np.lexsort((np.arange(40), -row))[:7] for row in big])
    np.testing.assert_array_equal(idx, want)


@pytest.mark.parametrize("backend,device", LIBS, indirect=["device"])
def test_logsumexp_and_log_softmax(backend, device):
    x = np.array([[0.0, 1.0, 2.0], [-np.inf, -np.inf, -np.inf], [np.nan, 0, 0], [np.inf, 0, 0], [1000.0, 1000.0, 0]])
    xx = torch.tensor(x, device=device) if backend == "torch" else x
    lse = ops.logsumexp(xx)
    assert lse[0] == pytest.approx(np.log(np.exp([0, 1, 2]).sum()))
    assert lse[1] == -np.inf and np.isnan(lse[2]) and lse[3] == np.inf
    assert lse[4] == pytest.approx(1000 + np.log(2 + np.exp(-1000)))
    ls = ops.to_numpy(ops.log_softmax(xx))
    np.testing.assert_allclose(np.exp(ls[0]).sum(), 1.0)


def _fsum_logsumexp(row: np.ndarray) -> float:
    """Oracle: max-shifted log-sum-exp of one finite row, summed exactly (math.fsum) in float64."""
    x = row.astype(np.float64)
    m = float(x.max())
    return m + math.log(math.fsum(math.exp(v - m) for v in x))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "torch-strided", "torch-kernels"])
@pytest.mark.parametrize("scale", [1.0, 30.0, 200.0])
@pytest.mark.parametrize("shift", [0.0, 85.0, -95.0, 720.0, -760.0])
def test_logsumexp_over_magnitudes_against_fsum(dtype, scale, shift):
    # shifts cross float32's exp overflow (~88.7) and underflow (~-103), and float64's (~709, ~-745)
    rng = np.random.default_rng(int(scale) + int(abs(shift)))
    x = rng.standard_normal((7, 300)) * scale + shift
    x[3, :] = shift  # a flat row
    x[5, :299] = -np.inf  # one finite entry
    if dtype == "bfloat16":
        xx = torch.tensor(x).to(torch.bfloat16)
        ref = xx.double().numpy()
    elif dtype == "torch-strided":
        xx = torch.tensor(np.repeat(x, 2, axis=1)).float()[:, ::2]
        ref = xx.double().numpy()
    elif dtype == "torch-kernels":  # no numpy view of a tensor that needs grad: the accelerator path, on the CPU
        xx = torch.tensor(x, dtype=torch.float32, requires_grad=True)
        ref = xx.detach().double().numpy()
    else:
        xx = x.astype(dtype)
        ref = xx.astype(np.float64)
    want = np.array([_fsum_logsumexp(r[np.isfinite(r)]) for r in ref])
    got = ops.logsumexp(xx)
    assert got.dtype == np.float64
    rtol = 1e-12 if dtype == "float64" else 1e-6
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 10)


def test_rows_are_compact_and_batch_of_one_is_the_single_search():
    multi = MultiToy(6, [3, 4, 5, 6])
    res = search_batch(multi.step, multi.init(), BOS, EOS, 4, 5)
    assert multi.calls[0] == 4
    for r in range(4):
        single = multi.single(r)
        one = beam_search(single.step, single.init(), BOS, EOS, 4, 5)
        assert [h.tokens for h in one] == [h.tokens for h in res[r]]


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 5),
    v=st.integers(2, 300),
    m=st.integers(1, 12),
    ties=st.booleans(),
    strided=st.booleans(),
)
def test_top_candidates_equals_a_full_sort(seed, rows, v, m, ties, strided):
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=(rows, 2 * v)) if ties else rng.standard_normal((rows, 2 * v))
    x = x.astype(np.float32)[:, ::2] if strided else x.astype(np.float64)[:, :v]
    vals, idx = ops.top_candidates(x, m)
    want = np.array([np.lexsort((np.arange(v), -r))[: min(m, v)] for r in x])
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want, axis=1))


@pytest.mark.parametrize("backend,device", LIBS, indirect=["device"])
@pytest.mark.parametrize("ties", [False, True])
def test_top_candidates_on_large_tables(backend, ties, device):
    # big enough for the group-maximum threshold path (rows * V >= 2**20)
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=(40, 30000)) if ties else rng.standard_normal((40, 30000)) * 3
    x = x.astype(np.float32)
    x[5] = np.nan  # a NaN row falls back to the exact row sort, the others are unaffected
    x[6] = -np.inf
    xx = torch.from_numpy(x).to(device) if backend == "torch" else x
    vals, idx = ops.top_candidates(xx, 10)
    ok = [r for r in range(40) if r != 5]
    want = np.array([np.lexsort((np.arange(30000), -x[r]))[:10] for r in ok])
    np.testing.assert_array_equal(idx[ok], want)


def test_bfloat16_logits_are_searched(device):
    m = ToyModel(5, seed=3)

    def step(state, y):
        logits, new = m.step(state, np.asarray(y.cpu() if hasattr(y, "cpu") else y))
        return torch.tensor(logits, dtype=torch.bfloat16, device=device), new

    got = search_batch(step, m.init(), BOS, EOS, 2, 3)[0]
    assert got and all(np.isfinite(h.logprob) for h in got)


def test_concat_state_keeps_one_shared_object():
    mem = Shared(np.ones((1, 4)))
    out = concat_state([{"m": mem, "x": np.zeros((1, 2))}, {"m": mem, "x": np.ones((2, 2))}])
    assert out["m"] is mem and out["x"].shape == (3, 2)
