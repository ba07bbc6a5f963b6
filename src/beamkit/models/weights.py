"""Read ``.safetensors`` files into numpy arrays, without the safetensors package or torch.

The format (https://huggingface.co/docs/safetensors): 8 bytes, a little-endian unsigned header length ``N``;
``N`` bytes of UTF-8 JSON mapping each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets into the data that follows the header), plus an optional ``"__metadata__"`` object of strings; then
the raw little-endian tensor bytes. Every check failure raises ValueError naming the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

# safetensors dtype name -> numpy little-endian dtype (BF16 is widened to float32 on reading: numpy has none)
DTYPES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
MAX_HEADER = 100 * 1024 * 1024  # the reference implementation refuses larger headers too


def _fail(file: Path, why: str) -> ValueError:
    return ValueError(f"corrupt safetensors file {file}: {why}")


def read_header(file: str | Path) -> tuple[dict[str, Any], dict[str, str], int]:
    """Parse and check the header of ``file``; return (tensor entries, metadata, offset of the data bytes).

    Raises FileNotFoundError when the file is missing and ValueError naming the file when the header length,
    the JSON, an entry's dtype, shape or offsets are invalid, or the data is truncated.
    """
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"safetensors file missing: {path}")
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _fail(path, f"{size} bytes is shorter than the 8-byte header length")
        n = int.from_bytes(head, "little")
        if n < 2 or n > MAX_HEADER or 8 + n > size:
            raise _fail(path, f"header length {n} does not fit a file of {size} bytes")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _fail(path, "the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _fail(path, "__metadata__ must map names to strings")
    data_size = size - 8 - n
    for name, entry in header.items():
        _check_entry(path, name, entry, data_size)
    return header, metadata, 8 + n


def _check_entry(path: Path, name: str, entry: Any, data_size: int) -> None:
    """Raise ValueError unless ``entry`` is a valid tensor entry lying inside ``data_size`` bytes of data."""
    if not isinstance(entry, dict):
        raise _fail(path, f"tensor {name!r} is not an object")
    dtype = entry.get("dtype")
    if dtype not in DTYPES:
        raise _fail(path, f"tensor {name!r} has unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _fail(path, f"tensor {name!r} has a bad shape {shape!r}")
    offsets: Any = entry.get("data_offsets")
    ok = isinstance(offsets, list) and len(offsets) == 2
    ok = ok and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    if not ok or not 0 <= offsets[0] <= offsets[1] <= data_size:
        raise _fail(path, f"tensor {name!r} has data_offsets {offsets!r} outside the {data_size} data bytes")
    need = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if offsets[1] - offsets[0] != need:
        raise _fail(path, f"tensor {name!r} of shape {shape} and dtype {dtype} needs {need} bytes, has {offsets}")


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values (bfloat16 is the top half of a float32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def load_file(file: str | Path) -> dict[str, np.ndarray]:
    """Read every tensor of the safetensors ``file`` into a native-endian numpy array, by name.

    Values and shapes are those :func:`safetensors.numpy.load_file` returns; BF16 tensors come back as float32.
    Raises ValueError naming the file when it is corrupt or truncated (see :func:`read_header`).
    """
    path = Path(file)
    header, _, start = read_header(path)
    data = path.read_bytes()[start:]
    out: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        kind = np.dtype(DTYPES[entry["dtype"]])
        flat = np.frombuffer(data, dtype=kind, count=(end - begin) // kind.itemsize, offset=begin)
        arr = flat.reshape(entry["shape"]).astype(kind.newbyteorder("="))  # a copy: aligned, writable, native
        out[name] = _bf16_to_f32(arr) if entry["dtype"] == "BF16" else arr
    return out


def metadata(file: str | Path) -> dict[str, str]:
    """The ``__metadata__`` strings of the safetensors ``file`` (empty when it has none)."""
    return read_header(file)[1]
