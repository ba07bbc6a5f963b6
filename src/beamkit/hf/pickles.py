"""What a pickled weights file (``pytorch_model.bin``, ``*.pt``, ...) would run when it is loaded, read without
loading it.

A pickle rebuilds its objects by calling the functions it names (its ``GLOBAL`` / ``STACK_GLOBAL`` / ``INST``
opcodes); a file of weights names only the functions and classes that rebuild tensors and their containers.
:func:`code_in_pickle` reads the opcodes (``pickletools``, nothing is executed) of every pickle in the file
(the ``*.pkl`` members of ``torch.save``'s zip archive, or the pickles at the start of its legacy format) and
returns the first named callable that is none of those, such as ``posix.system``: a file that names one holds
code, and :func:`check_weights_pickle` refuses it before anything unpickles it.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

# the callables a file of tensors names: containers, tensor and storage rebuilders, dtypes and their kin
_CONTAINERS = {
    ("collections", "OrderedDict"),
    ("collections", "Counter"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("builtins", "bytearray"),
    ("_codecs", "encode"),  # how protocol 2 writes bytes
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.serialization", "_get_layout"),
    ("torch.nn.parameter", "Parameter"),
    ("torch.storage", "TypedStorage"),
    ("torch.storage", "UntypedStorage"),
    ("torch", "Size"),
    ("torch", "Tensor"),
    ("torch", "device"),
}
_TORCH_MODULES = ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse")
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_LEGACY_PICKLES = 5  # torch's legacy format: magic number, protocol, system info, the object, storage keys


def allowed(module: str, name: str) -> bool:
    """Whether a weights file may name ``module.name``: a container, a tensor or storage rebuilder, a tensor or
    storage class, a dtype, a layout or a quantisation scheme."""
    if (module, name) in _CONTAINERS:
        return True
    if module == "torch._utils":
        return name.startswith("_rebuild_") and name != "_rebuild_xla_tensor"
    if module in _TORCH_MODULES and (name.endswith("Storage") or name.endswith("Tensor")):
        return name.isidentifier()
    if module == "torch" and name.isidentifier():
        import torch

        kinds = (torch.dtype, torch.layout, torch.qscheme)
        return isinstance(getattr(torch, name, None), kinds)
    return False


def named_callables(data: bytes) -> Iterator[tuple[str, str] | None]:
    """Every ``(module, name)`` one pickle stream names, in order; None for one whose name the stream computes
    (a ``STACK_GLOBAL`` not fed by two strings, an extension code). ValueError when the bytes are not a pickle."""
    memo: dict[int, object] = {}
    pushed: deque[object] = deque(maxlen=2)  # the last two values pushed: a STACK_GLOBAL's module and name
    for op, arg, _ in pickletools.genops(data):
        kind = op.name
        if kind in ("GLOBAL", "INST"):
            module, _, name = str(arg).partition(" ")
            yield module, name
            pushed.append(None)
        elif kind == "STACK_GLOBAL":
            top = tuple(pushed) if len(pushed) == 2 else (None, None)
            yield (top[0], top[1]) if isinstance(top[0], str) and isinstance(top[1], str) else None
            pushed.append(None)
        elif kind in ("EXT1", "EXT2", "EXT4"):
            yield None
        elif kind in _STRINGS:
            pushed.append(arg if isinstance(arg, str) else None)
        elif kind in _GETS:
            pushed.append(memo.get(int(arg)))  # type: ignore[arg-type]
        elif kind in _PUTS:
            memo[int(arg)] = pushed[-1] if pushed else None  # type: ignore[arg-type]
        elif kind == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif kind not in ("PROTO", "FRAME"):
            pushed.append(None)


def _pickles(path: Path) -> Iterator[tuple[str, bytes]]:
    """(where, bytes) of each pickle stream of a weights file: the zip archive's ``*.pkl`` members, or the file
    itself (the legacy format and plain pickles: its first streams are read from the returned bytes)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if member.endswith(".pkl"):
                    yield member, archive.read(member)
    else:
        yield "", path.read_bytes()


def _streams(data: bytes) -> Iterator[bytes]:
    """The consecutive pickle streams at the start of ``data``: at most the legacy format's five, and no more
    once the bytes stop reading as a pickle (what follows them is raw tensor data). ValueError when the first
    stream is not a pickle."""
    rest = io.BytesIO(data)
    for i in range(_LEGACY_PICKLES):
        start = rest.tell()
        if start >= len(data):
            return
        try:
            for op, _, _ in pickletools.genops(rest):
                if op.name == "STOP":
                    break
        except ValueError:
            if i == 0:
                raise
            return
        yield data[start : rest.tell()]


def code_in_pickle(path: str | Path) -> str | None:
    """The first callable that a pickled weights file names beyond what rebuilding tensors needs
    (``"posix.system"``), ``"a callable whose name it computes"`` when the file hides the name, or None for a file
    of weights. Nothing in the file is run. ValueError when the file is not a pickle."""
    path = Path(path)
    for member, data in _pickles(path):
        try:
            for stream in _streams(data):
                for named in named_callables(stream):
                    if named is None:
                        return "a callable whose name it computes"
                    if not allowed(*named):
                        return ".".join(named)
        except ValueError as exc:
            where = f"{path.name}:{member}" if member else path.name
            raise ValueError(f"{where} is not a pickle this loader can read ({exc})") from exc
    return None
