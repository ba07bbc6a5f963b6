"""``beamkit ocr`` refuses an image past its documented size (``beamkit.ctc.ocr.MAX_IMAGE_PIXELS``) in one line,
before any pixel is decoded: no Pillow decompression-bomb warning, no gigabytes.

Oracle: the image's own header (its width and height as written in a hand-made PNG whose pixel data is never
reached), and the limit read from the module against the product of the two.
"""

from __future__ import annotations

import struct
import warnings
import zlib

import pytest

PIL_Image = pytest.importorskip("PIL.Image")

from beamkit.cli import entry as cli  # noqa: E402
from beamkit.ctc import ocr  # noqa: E402


def png_header_only(path, width: int, height: int) -> None:
    """A PNG declaring ``width`` x ``height`` RGB pixels with a token of pixel data: opening it reads the header
    only; decoding it would allocate width x height x 3 bytes (and fail on the missing data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(("width", "height"), [(15_000, 10_000), (200_000, 200), (30_000, 30_000)])
def test_an_image_past_the_limit_is_refused_before_decoding(tmp_path, width, height, monkeypatch, capsys):
    assert width * height > ocr.MAX_IMAGE_PIXELS
    path = tmp_path / "big.png"
    png_header_only(path, width, height)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's DecompressionBombWarning would fail here
        with pytest.raises(ValueError) as err:
            ocr.load_line_image(path)
    message = str(err.value)
    assert f"{ocr.MAX_IMAGE_PIXELS:,}" in message and str(path) in message
    # the size is named where Pillow lets the header be read (up to twice its own limit, 178,956,970 pixels)
    named = width * height <= 2 * 89_478_485
    assert (f"{width} x {height}" in message) is named
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main(["ocr", str(path)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "beamkit ocr: error:" in err_lines[0] and f"{ocr.MAX_IMAGE_PIXELS:,}" in err_lines[0]


def test_an_image_at_the_limit_is_read(tmp_path):
    side = int(ocr.MAX_IMAGE_PIXELS**0.5) // 4
    path = tmp_path / "line.png"
    PIL_Image.new("RGB", (side * 8, side // 2), "white").save(path)  # 2 x (side^2) pixels: under the limit
    assert ocr.load_line_image(path).shape == (side // 2, side * 8, 3)
