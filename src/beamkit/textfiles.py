"""Reading the text files users give (language models, corpora, label lists): one place that says which file is
wrong and how.

:func:`text_lines` and :func:`read_text_file` read UTF-8 (a leading byte-order mark is dropped, as Windows editors
write one; ``.gz`` files are decompressed). A path that is missing, a folder, or not a regular file (a named
pipe, a device, a socket) is refused before reading; bytes that are not UTF-8 text (a binary file, UTF-16) are a
ValueError naming the file and the line.
"""

from __future__ import annotations

import errno
import gzip
import os
import stat
from collections.abc import Iterator
from typing import IO

_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_text_file(path: str | os.PathLike[str], what: str = "file") -> str:
    """``path`` as a string, when it names a regular file; else FileNotFoundError (missing), IsADirectoryError
    (a folder) or ValueError (a named pipe, a device, a socket), each naming ``what`` and the path."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise FileNotFoundError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, f"{what} is a folder, not a file", path)
    for test, kind in _KINDS:
        if test(mode):
            raise ValueError(f"{what} is {kind}, not a regular file: {path} (save its content to a file first)")
    return path


def not_text(path: str, what: str, lineno: int, detail: str) -> ValueError:
    """The error of a file that is not UTF-8 text (``detail``: where and why)."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        guess = "it is UTF-16 text: save it as UTF-8"
    elif head[:2] == b"\x1f\x8b":
        guess = "it is gzip-compressed: name it with a .gz ending"
    else:
        guess = "a binary file, or text in another encoding: save it as UTF-8"
    return ValueError(f"{what} {path} is not UTF-8 text (line {lineno}: {detail}); {guess}")


def _open(path: str) -> IO[str]:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def _lines(path: str, what: str) -> Iterator[str]:
    lineno = 0
    with _open(path) as fh:
        try:
            for lineno, line in enumerate(fh, 1):  # noqa: B007 (lineno names the failing line below)
                if "\x00" in line:
                    raise not_text(path, what, lineno, "a NUL character")
                yield line
        except UnicodeDecodeError as exc:
            raise not_text(path, what, lineno + 1, f"byte 0x{exc.object[exc.start]:02x}") from None
        except (EOFError, gzip.BadGzipFile) as exc:
            raise ValueError(f"{what} {path} is not a readable gzip file: {exc}") from None


def text_lines(path: str | os.PathLike[str], what: str = "file") -> Iterator[str]:
    """The lines of the UTF-8 text file ``path`` (with their line ends; a leading byte-order mark dropped), read
    as they are iterated. The path is checked now (:func:`check_text_file`); bytes that are not UTF-8, or a NUL
    character, raise ValueError naming ``what``, the file and the line when reached."""
    return _lines(check_text_file(path, what), what)


def read_text_file(path: str | os.PathLike[str], what: str = "file") -> str:
    """The whole UTF-8 text file ``path`` (see :func:`text_lines`)."""
    return "".join(text_lines(path, what))
