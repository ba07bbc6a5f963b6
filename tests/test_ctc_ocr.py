"""``beamkit ocr``: PP-OCRv4 (from the rapidocr-onnxruntime wheel) read through beamkit's CTC decoding.

Oracle: rapidocr's own recogniser (its preprocessing, model run and greedy CTC decoding) on the same images."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
rapidocr = pytest.importorskip("rapidocr_onnxruntime")
PIL_Image = pytest.importorskip("PIL.Image")
cv2 = pytest.importorskip("cv2")

from PIL import ImageDraw, ImageFont  # noqa: E402

from beamkit.cli import entry as cli  # noqa: E402
from beamkit.ctc import ocr  # noqa: E402

DEJAVU = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
LINES = ["The quick brown fox jumps over 13 lazy dogs.", "Beam search, in one line_of text!", "a_b|c 42%"]


def render(text: str, path: str, blur: float = 0.0) -> None:
    """A text line in black on white, 32 px DejaVu Sans (Pillow's own font when DejaVu is absent)."""
    font = ImageFont.truetype(DEJAVU, 32) if os.path.exists(DEJAVU) else ImageFont.load_default(size=32)
    width = int(font.getlength(text)) + 24
    img = PIL_Image.new("RGB", (width, 48), "white")
    ImageDraw.Draw(img).text((12, 6), text, font=font, fill="black")
    if blur:
        from PIL import ImageFilter

        img = img.filter(ImageFilter.GaussianBlur(blur))
    img.save(path)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("lines")
    paths = []
    for i, text in enumerate(LINES):
        paths.append(str(d / f"line{i}.png"))
        render(text, paths[-1], blur=0.8 * i)
    return paths


@pytest.fixture(scope="module")
def recognizer() -> ocr.LineRecognizer:
    return ocr.LineRecognizer()


def rapidocr_texts(paths: list[str]) -> list[str]:
    """rapidocr's recogniser on each image alone (its batching pads images to one width)."""
    from rapidocr_onnxruntime.ch_ppocr_rec import TextRecognizer
    from rapidocr_onnxruntime.utils import read_yaml

    root = os.path.dirname(rapidocr.__file__)
    config = read_yaml(os.path.join(root, "config.yaml"))["Rec"]
    config["model_path"] = os.path.join(root, config["model_path"])
    rec = TextRecognizer(config)
    return [rec([cv2.imread(p)])[0][0][0] for p in paths]


def test_greedy_reading_equals_rapidocr_and_the_labels_are_rapidocrs(images, recognizer) -> None:
    got = ocr.read_lines(images, beam=1, recognizer=recognizer)
    assert [r.text for r in got] == rapidocr_texts(images)
    assert got[0].text.strip() == LINES[0]  # the left margin reads as a space
    assert len(recognizer.labels) == 6625 and recognizer.labels[0] == "blank" and recognizer.labels[-1] == " "
    assert "_" in recognizer.labels and "|" in recognizer.labels  # real characters, not the blank or a delimiter
    probs = recognizer.posteriors(ocr.load_line_image(images[0]))
    assert probs.dtype == np.float32 and probs.shape[1] == 6625
    # float32 softmax rows: never exactly 1 in float64, still read as probabilities (no second softmax)
    from beamkit.ctc.posteriors import reads_as_probabilities

    assert reads_as_probabilities(probs)
    # the beam search reads the same clean lines (its text is whitespace-normalised)
    beam = ocr.read_lines(images[:2], beam=8, recognizer=recognizer)
    assert [r.text for r in beam] == [" ".join(r.text.split()) for r in got[:2]]
    assert all(b.score <= 0 for b in beam)


def test_ocr_cli_json_and_errors(images, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))
    assert cli.main(["ocr", images[0], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["image"] == images[0] and out[0]["text"].strip() == LINES[0] and out[0]["score"] < 0
    assert cli.main(["ocr", images[0], str(tmp_path / "missing.png")]) == 2
    assert "image not found" in capsys.readouterr().err
    (tmp_path / "x.arpa").write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0\ta\n\n\\end\\\n")
    assert cli.main(["ocr", images[0], "--lm", str(tmp_path / "x.arpa")]) == 2
    assert "needs beam search" in capsys.readouterr().err
    (tmp_path / "not.png").write_text("not an image")
    assert cli.main(["ocr", str(tmp_path / "not.png")]) == 2
    assert "cannot read image" in capsys.readouterr().err


def render_lines(lines: list[str], path: str, turn: int = 0) -> None:
    """Text lines one under the other (48 px apart, black on white), turned by ``turn`` degrees."""
    font = ImageFont.truetype(DEJAVU, 32) if os.path.exists(DEJAVU) else ImageFont.load_default(size=32)
    width = int(max(font.getlength(t) for t in lines)) + 24
    img = PIL_Image.new("RGB", (width, 48 * len(lines)), "white")
    draw = ImageDraw.Draw(img)
    for i, text in enumerate(lines):
        draw.text((12, 6 + 48 * i), text, font=font, fill="black")
    img.rotate(turn, expand=True).save(path)


def test_images_that_cannot_be_one_line_are_refused_before_the_model_runs(tmp_path, monkeypatch, capsys) -> None:
    two, turned = str(tmp_path / "two.png"), str(tmp_path / "turned.png")
    render_lines(["The first line of text", "and the second one"], two)
    render_lines(["A line turned on its side"], turned, turn=90)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))
    for path, says in ((two, "2 text lines"), (turned, "taller than wide")):
        assert cli.main(["ocr", path]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and path in err[0] and says in err[0], err
    with pytest.raises(ValueError, match="2 text lines"):
        ocr.read_lines([two], recognizer=object())  # refused before any model call
    # the oracle of the profile: the bands are where the lines were drawn (48 px apart)
    bands = ocr.ink_bands(ocr.load_line_image(two))
    assert len(bands) == 2 and bands[0][1] <= 48 <= bands[1][0]


def test_one_line_images_pass_the_geometry_check(images) -> None:
    assert [ocr.line_problem(ocr.load_line_image(p)) for p in images] == [None] * len(images)


def test_an_upside_down_line_is_read_with_a_warning(tmp_path, recognizer, monkeypatch, capsys) -> None:
    up, down, same = (str(tmp_path / f"{n}.png") for n in ("up", "down", "same"))
    render_lines([LINES[0]], up)
    render_lines([LINES[0]], down, turn=180)
    render_lines(["NOON SWIMS"], same, turn=180)  # reads the same both ways: nothing to tell
    got = ocr.read_lines([up, down, same], recognizer=recognizer)
    assert got[0].warning is None and got[0].text.strip() == LINES[0]
    assert got[1].warning is not None and "upside down" in got[1].warning and LINES[0] in got[1].warning
    assert got[2].warning is None
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("beamkit.cli.ctc",))
    assert cli.main(["ocr", up, down, "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out[0]["warning"] is None and "upside down" in out[1]["warning"]
    warned = captured.err.strip().splitlines()
    assert len(warned) == 1 and warned[0].startswith(f"beamkit ocr: warning: {down}: the image looks upside down")
