"""The backend helpers of ``beamkit.ops`` on numpy and torch, each against plain Python loops over the entries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beamkit import ops

torch = pytest.importorskip("torch")

# (library, device): numpy on the host, torch on the CPU and on cuda (skipped without a CUDA device)
BACKENDS = [pytest.param(b, d, id=f"{b}-{d}") for b, d in (("numpy", "cpu"), ("torch", "cpu"), ("torch", "cuda"))]
NEG_INF = float("-inf")


def table(rows: int = 3, v: int = 5, seed: int = 0) -> list[list[float]]:
    """A small ``[rows, v]`` table of mixed-sign values as nested Python lists (the oracles' input)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, v)).round(3).tolist()


def on(backend: str, values: list[list[float]], device=None):
    """``values`` as a float64 array of ``backend`` (torch: on ``device``, default the CPU)."""
    arr = np.array(values, dtype=np.float64)
    return torch.tensor(arr, device=device) if backend == "torch" else arr


def host(x) -> list:
    """Any array as nested Python lists."""
    return ops.to_numpy(x).tolist()


def check_library(x, backend: str, device) -> None:
    """The helper kept the input's library (and a torch input's device: nothing moved to the host)."""
    assert ops.is_torch(x) == (backend == "torch")
    if backend == "torch":
        assert x.device == device, x.device


@pytest.mark.parametrize("backend,device", BACKENDS, indirect=["device"])
def test_take_cols_and_where_cols(backend, device):
    t = table()
    cols = np.array([4, 0, 0, 2])
    got = ops.take_cols(on(backend, t, device), cols)
    check_library(got, backend, device)
    assert host(got) == [[row[c] for c in cols.tolist()] for row in t]
    missing = np.array([False, True, False, False, True])
    got = ops.where_cols(on(backend, t, device), missing, -7.0)
    check_library(got, backend, device)
    assert host(got) == [[-7.0 if missing[j] else row[j] for j in range(5)] for row in t]
    column = ops.row_min(on(backend, t, device))
    assert host(column) == [[min(row)] for row in t]
    got = ops.where_cols(on(backend, t, device), missing, column)
    assert host(got) == [[min(row) if missing[j] else row[j] for j in range(5)] for row in t]


@pytest.mark.parametrize("backend,device", BACKENDS, indirect=["device"])
def test_pick_and_gather_cols(backend, device):
    t = table(4, 6, seed=1)
    rows, cols = np.array([0, 3, 3, 1]), np.array([5, 0, 5, 2])
    got = ops.pick(on(backend, t, device), rows, cols)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    assert got.tolist() == [t[r][c] for r, c in zip(rows.tolist(), cols.tolist(), strict=True)]
    idx = np.array([[1, 1, 0], [5, 4, 3], [0, 2, 4], [2, 2, 2]])
    got = ops.gather_cols(on(backend, t, device), idx)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    assert got.tolist() == [[t[r][c] for c in idx[r].tolist()] for r in range(4)]


@pytest.mark.parametrize("backend,device", BACKENDS, indirect=["device"])
def test_keep_only_and_penalize_at(backend, device):
    t = table(3, 4, seed=2)
    rows, cols = np.array([0, 2]), np.array([3, 1])
    got = ops.keep_only(on(backend, t, device), rows, cols)
    want = [list(row) for row in t]
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        want[r] = [t[r][j] if j == c else NEG_INF for j in range(4)]
    assert host(got) == want
    x = on(backend, t, device)
    assert ops.keep_only(x, np.zeros(0, np.int64), np.zeros(0, np.int64)) is x
    rows, cols = np.array([0, 0, 1, 2]), np.array([0, 3, 2, 1])
    got = ops.penalize_at(on(backend, t, device), rows, cols, 1.5)
    want = [list(row) for row in t]
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        want[r][c] = t[r][c] * 1.5 if t[r][c] < 0 else t[r][c] / 1.5
    assert host(got) == want


@pytest.mark.parametrize("backend,device", BACKENDS, indirect=["device"])
def test_sort_cumsum_and_mask(backend, device):
    t = table(3, 5, seed=3)
    srt = ops.sort_desc(on(backend, t, device))
    check_library(srt, backend, device)
    assert host(srt) == [sorted(row, reverse=True) for row in t]
    cum = ops.cumsum_exp(on(backend, t, device))
    assert isinstance(cum, np.ndarray)
    want = [[math.fsum(math.exp(v) for v in row[: j + 1]) for j in range(5)] for row in t]
    np.testing.assert_allclose(cum, want, rtol=1e-12)
    thr = np.array([0.0, -0.5, 10.0])
    got = ops.mask_below(on(backend, t, device), thr)
    check_library(got, backend, device)
    assert host(got) == [[v if v >= thr[r] else NEG_INF for v in row] for r, row in enumerate(t)]


@pytest.mark.parametrize("backend,device", BACKENDS, indirect=["device"])
def test_plus_offset64_and_to_library(backend, device):
    t = table(2, 3, seed=4)
    x = on(backend, t, device)
    x = x.float() if backend == "torch" else x.astype(np.float32)
    got = ops.plus_offset64(x, np.array([1.0, -2.0]))
    check_library(got, backend, device)
    f32 = [[float(np.float32(v)) for v in row] for row in t]
    assert host(got) == [[v + off for v in row] for row, off in zip(f32, [1.0, -2.0], strict=True)]
    assert str(got.dtype).endswith("float64")
    moved = ops.to_library(np.array(t), on(backend, t, device))
    check_library(moved, backend, device)
    assert host(moved) == t
    back = ops.to_library(torch.tensor(t, dtype=torch.float64), np.zeros(1))
    assert isinstance(back, np.ndarray) and back.tolist() == t


def test_dtype_kind_reads_numpy_and_torch_alike():
    pairs = [
        (np.zeros(1, np.float32), torch.zeros(1, dtype=torch.float32), "f"),
        (np.zeros(1, np.int64), torch.zeros(1, dtype=torch.int64), "i"),
        (np.zeros(1, np.uint8), torch.zeros(1, dtype=torch.uint8), "i"),
        (np.zeros(1, bool), torch.zeros(1, dtype=torch.bool), "b"),
        (np.zeros(1, np.complex64), torch.zeros(1, dtype=torch.complex64), "c"),
    ]
    for a, b, kind in pairs:
        assert ops.dtype_kind(a) == ops.dtype_kind(b) == kind
    assert ops.dtype_kind(np.array([object()])) == "O"


def test_gumbel_from_numpy_and_torch_generators(device):
    assert ops.is_generator(np.random.default_rng(0)) and ops.is_generator(torch.Generator(device))
    assert not ops.is_generator(0) and not ops.is_generator(np.random.RandomState(0))
    want = np.random.default_rng(5).gumbel(size=(2, 3))
    got = ops.gumbel(np.random.default_rng(5), (2, 3), np.zeros(1))
    assert isinstance(got, np.ndarray) and got.tolist() == want.tolist()
    u = torch.rand((2, 3), generator=torch.Generator(device).manual_seed(7), dtype=torch.float64, device=device)
    want = [[-math.log(-math.log(v)) for v in row] for row in u.tolist()]
    got = ops.gumbel(torch.Generator(device).manual_seed(7), (2, 3), torch.zeros(1, device=device))
    assert ops.is_torch(got) and got.device == device  # drawn and kept on the generator's device
    np.testing.assert_allclose(host(got), want, rtol=1e-12)
    on_host = ops.gumbel(torch.Generator(device).manual_seed(7), (2, 3), np.zeros(1))
    assert isinstance(on_host, np.ndarray) and on_host.tolist() == host(got)
