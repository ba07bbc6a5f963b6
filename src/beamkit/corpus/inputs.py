"""Reading a corpus: a text file (one source a line), a JSONL file, or a folder of ``.npy`` CTC posteriors.

Every input becomes an :class:`Item`; a line that cannot be decoded (bytes that are not UTF-8, an empty line,
bad JSON) becomes an Item with ``error`` set, reported in the output instead of stopping the run. A UTF-8
byte-order mark is dropped; a UTF-16 file, or a path that is not a regular file or folder (a named pipe, a
device), is refused as a whole (ValueError naming it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from beamkit.textfiles import check_text_file, not_text


class Item(NamedTuple):
    """One input: its position, its id, the source text (or the ``.npy`` path) and an error found on reading."""

    position: int
    id: Any
    text: str
    path: str | None = None
    error: str | None = None


def _text_item(index: int, line_no: int, raw: bytes, shown_id: Any, path: Path) -> Item:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        shown = raw.decode("utf-8", errors="replace")
        reason = f"{path}, line {line_no}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
        return Item(index, shown_id, shown, error=reason)
    if not text.strip():
        return Item(index, shown_id, text, error=f"line {line_no}: empty input")
    return Item(index, shown_id, text)


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # every line would be an error record of split UTF-16 bytes
        raise not_text(str(path), "input", 1, "a UTF-16 byte-order mark")
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark, as Windows editors write one
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line, it does not start another
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def read_text(path: Path) -> list[Item]:
    """One Item per line; its id is the line number (1-based)."""
    return [_text_item(i, i + 1, raw, i + 1, path) for i, raw in enumerate(_lines(path))]


def read_jsonl(path: Path) -> list[Item]:
    """One Item per line of ``{"id": ..., "text": ...}``; a missing id is the line number (1-based). An id that
    an earlier line has (compared as JSON: ``1`` and ``"1"`` differ) makes the later line an error record, so
    every id in the output names one input; the earlier line is decoded as usual."""
    return _unique_ids(_read_jsonl(path))


def _unique_ids(items: list[Item]) -> list[Item]:
    """``items`` with each one whose id an earlier item has turned into an error naming both lines."""
    first: dict[str, int] = {}
    out = []
    for item in items:
        key = json.dumps(item.id, sort_keys=True)
        if key in first and item.error is None:
            item = item._replace(
                error=f"line {item.position + 1}: id {key} repeats the id of line {first[key] + 1}; "
                "give each input its own id"
            )
        first.setdefault(key, item.position)
        out.append(item)
    return out


def _read_jsonl(path: Path) -> list[Item]:
    items = []
    for i, raw in enumerate(_lines(path)):
        line_no = i + 1
        first = _text_item(i, line_no, raw, line_no, path)
        if first.error is not None:
            items.append(first)
            continue
        try:
            obj = json.loads(first.text)
        except json.JSONDecodeError as exc:
            items.append(first._replace(error=f"line {line_no}: not JSON ({exc.msg})"))
            continue
        if not isinstance(obj, dict):
            items.append(first._replace(error=f"line {line_no}: expected a JSON object with 'text'"))
            continue
        item_id = obj.get("id", line_no)
        text = obj.get("text")
        if not isinstance(text, str):
            items.append(Item(i, item_id, first.text, error=f"line {line_no}: 'text' must be a string"))
        elif not text.strip():
            items.append(Item(i, item_id, text, error=f"line {line_no}: empty input"))
        else:
            items.append(Item(i, item_id, text))
    return items


def read_npy_folder(path: Path) -> list[Item]:
    """One Item per ``*.npy`` file in the folder, sorted by name; its id is the file's stem.

    The arrays are read by the workers (a corrupt file becomes that item's error there).
    """
    files = sorted(p for p in path.iterdir() if p.suffix == ".npy" and p.is_file())
    return [Item(i, p.stem, p.name, path=str(p.resolve())) for i, p in enumerate(files)]


def read_inputs(path: str | Path) -> list[Item]:
    """Read a corpus: a folder of ``.npy`` files, a ``.jsonl`` file, or any other file as plain text lines."""
    src = Path(path)
    if not src.exists():
        raise FileNotFoundError(f"no such input: {src}")
    if src.is_dir():
        items = read_npy_folder(src)
        if not items:
            raise ValueError(f"{src} holds no .npy files")
        return items
    check_text_file(src, "input")  # a named pipe is read twice (the inputs, then their digest): it would hang
    return read_jsonl(src) if src.suffix == ".jsonl" else read_text(src)


def input_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, or of a folder's ``.npy`` files (names and contents), read in chunks."""
    from beamkit.corpus.shards import path_sha256

    return path_sha256(path, "*.npy")
