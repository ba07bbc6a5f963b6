"""The numpy safetensors reader: the safetensors package (when installed) and bytes laid out by hand by the
documented format are the oracles; corrupt and truncated files fail with a ValueError naming the file."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from beamkit.models import shipped_models
from beamkit.models.weights import load_file, metadata


def _write(path, header: dict, data: bytes, pad_to: int = 8) -> None:
    """A safetensors file by the documented layout: u64 little-endian header length, JSON header, raw data."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % pad_to)  # the format allows trailing spaces in the header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("name", sorted(shipped_models()))
def test_shipped_weights_equal_the_safetensors_package(name):
    st = pytest.importorskip("safetensors.numpy")
    file = shipped_models()[name] / "model.safetensors"
    ours, ref = load_file(file), st.load_file(str(file))
    assert sorted(ours) == sorted(ref)
    for key, value in ref.items():
        assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
        np.testing.assert_array_equal(ours[key], value, err_msg=key)


def test_every_numpy_dtype_round_trips_through_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    arrays = {
        "f64": rng.normal(size=(3, 2)),
        "f32": rng.normal(size=(2, 3, 4)).astype(np.float32),
        "f16": rng.normal(size=(5,)).astype(np.float16),
        "i64": rng.integers(-(2**40), 2**40, size=(4,)),
        "i32": rng.integers(-1000, 1000, size=(2, 2)).astype(np.int32),
        "i16": np.array([-3, 7], dtype=np.int16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.array([0, 255, 3], dtype=np.uint8),
        "bool": np.array([[True, False], [False, True]]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    file = tmp_path / "t.safetensors"
    st.save_file(arrays, str(file), metadata={"who": "test"})
    ours = load_file(file)
    assert sorted(ours) == sorted(arrays)
    for key, value in arrays.items():
        assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    assert metadata(file) == {"who": "test"}


def test_bfloat16_is_widened_to_float32_like_torch(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    values = torch.tensor([[1.0, -2.5, 3.140625], [1e-3, 65280.0, -0.0]], dtype=torch.bfloat16)
    file = tmp_path / "bf16.safetensors"
    st.save_file({"w": values}, str(file))
    got = load_file(file)["w"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, values.float().numpy())


def test_a_file_laid_out_by_hand(tmp_path):
    # two tensors, the second first in the data, big values and a non-aligned offset
    a = np.array([[1.5, -2.0], [3.25, 1e30]], dtype="<f4")
    b = np.array([7, -9, 2**62], dtype="<i8")
    header = {
        "b": {"dtype": "I64", "shape": [3], "data_offsets": [0, 24]},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [25, 41]},
        "__metadata__": {"format": "np"},
    }
    file = tmp_path / "hand.safetensors"
    _write(file, header, b.tobytes() + b"\x00" + a.tobytes(), pad_to=1)
    got = load_file(file)
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)
    assert got["a"].flags.writeable and got["a"].flags.aligned
    assert metadata(file) == {"format": "np"}


GOOD = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"x": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\x00" * 2, "unknown dtype 'F8_E4M3'"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, b"\x00" * 8, "outside the 8 data bytes"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [4, 2]}}, b"\x00" * 8, "outside"),
        ({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\x00" * 8, "needs 12 bytes"),
        ({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\x00" * 8, "bad shape"),
        ({"x": {"dtype": "F32", "shape": [2]}}, b"\x00" * 8, "data_offsets None"),
        ({"x": [1, 2]}, b"", "is not an object"),
        ({**GOOD, "__metadata__": {"n": 3}}, b"\x00" * 8, "__metadata__ must map names to strings"),
        (GOOD, b"\x00" * 4, "outside the 4 data bytes"),  # truncated data
    ],
)
def test_corrupt_headers_name_the_file_and_the_problem(tmp_path, header, data, message):
    file = tmp_path / "bad.safetensors"
    _write(file, header, data)
    with pytest.raises(ValueError, match="corrupt safetensors file .*bad.safetensors") as info:
        load_file(file)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "shorter than the 8-byte header length"),
        (b"\x05\x00\x00", "shorter than the 8-byte header length"),
        (struct.pack("<Q", 10**6) + b"{}", "header length 1000000 does not fit"),
        (struct.pack("<Q", 2**63) + b"{}", "does not fit"),
        (struct.pack("<Q", 7) + b"{not js", "the header is not JSON"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "the header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (b"\x00garbage, not safetensors", "does not fit"),
    ],
)
def test_corrupt_framing_names_the_file(tmp_path, raw, message):
    file = tmp_path / "bad.safetensors"
    file.write_bytes(raw)
    with pytest.raises(ValueError, match="corrupt safetensors file .*bad.safetensors") as info:
        load_file(file)
    assert message in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        load_file(tmp_path / "nope.safetensors")
