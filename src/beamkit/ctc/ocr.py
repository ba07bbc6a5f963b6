"""Text-line recognition with PP-OCRv4 (the ONNX model inside the ``rapidocr-onnxruntime`` wheel) and CTC decoding.

The model reads one text-line image (height 48 after resizing, width ``48 * max(w / h, 320 / 48)``, pixels
scaled to ``[-1, 1]``, BGR channel order: rapidocr's own preprocessing) and outputs ``(T, V)`` softmax
probabilities, ``T = width / 8``, over ``V = 6,625`` labels: rapidocr's blank first, the 6,623 characters of the
model's ``character`` metadata, then a space. Images are run one at a time (rapidocr's batching pads them
to a common width, which changes the outputs).

The recogniser reads one horizontal line. An image that cannot be one is refused before the model runs
(:func:`line_problem`: taller than wide by :data:`TALL_RATIO` or more, a line rotated by 90 degrees; or two text
lines, found as ink bands of the horizontal projection profile with a clear gap between them). An image that reads
far more confidently turned by 180 degrees is read as given, with a warning (:data:`UPSIDE_DOWN_MARGIN`); text that
reads the same both ways (``NOON``) cannot be told apart and gets none.

An image larger than :data:`MAX_IMAGE_PIXELS` (20 million pixels, e.g. 40,000 x 500) is refused before its pixels
are decoded: a text line is far smaller, and decoding such an image takes gigabytes.

Needs the ``ocr`` extra, ``pip install ".[ocr]"`` (onnxruntime, rapidocr-onnxruntime for its model file, pillow;
rapidocr brings opencv for the resize). Nothing is downloaded: the model ships in the wheel.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamkit._checks import check_int
from beamkit.extras import install_hint
from beamkit.textfiles import check_text_file

REC_HEIGHT = 48
REC_MIN_WIDTH = 320
TALL_RATIO = 1.5  # height / width from which a crop is a rotated line (rapidocr's own pipeline turns such crops)
INK_CONTRAST = 64  # a pixel this far (0-255 grey levels) from the background's level is ink
LINE_SHARE = 0.3  # an ink band at least this share of the tallest band's height is a text line (not a dot or rule)
# mean greedy log-probability per frame: the image turned by 180 degrees reading better by this much is upside down
UPSIDE_DOWN_MARGIN = 0.05
MAX_IMAGE_PIXELS = 20_000_000  # the largest image read (width x height): a text line is far smaller
_EXTRA = install_hint("ocr")


def _require(module: str) -> Any:
    """Import an optional module of the ``ocr`` extra, naming the extra when it is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"beamkit ocr needs {module.split('.')[0]} ({_EXTRA})") from exc


def default_model_path() -> str:
    """The PP-OCRv4 recognition model inside the installed ``rapidocr-onnxruntime`` wheel."""
    pkg = _require("rapidocr_onnxruntime")
    path = os.path.join(os.path.dirname(pkg.__file__), "models", "ch_PP-OCRv4_rec_infer.onnx")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the PP-OCRv4 recognition model is missing from rapidocr-onnxruntime: {path}")
    return path


def load_line_image(path: str | os.PathLike[str]) -> np.ndarray:
    """A text-line image file as a ``(H, W, 3)`` uint8 BGR array (the channel order the model was trained on)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder: give the image files, one text line each")
    if not os.path.isfile(path):
        if os.path.exists(path):
            check_text_file(path, "image")  # a named pipe, a device, a socket: named as such
        raise FileNotFoundError(f"image not found: {path}")
    image_mod = _require("PIL.Image")
    try:
        with warnings.catch_warnings():  # the size is checked here, before any pixel is decoded
            warnings.simplefilter("ignore", image_mod.DecompressionBombWarning)
            with image_mod.open(path) as im:
                width, height = im.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise ValueError(
                        f"image {path} is {width} x {height} pixels; a text line is read up to "
                        f"{MAX_IMAGE_PIXELS:,} pixels (crop it to the line, or scale it down)"
                    )
                rgb = np.asarray(im.convert("RGB"))  # shape: (H, W, 3)
    except image_mod.DecompressionBombError:  # past twice Pillow's own limit: refused by Pillow when opened
        raise ValueError(
            f"image {path} holds more than {MAX_IMAGE_PIXELS:,} pixels, the most a text line is read up to (crop it "
            "to the line, or scale it down)"
        ) from None
    except OSError as exc:
        raise ValueError(f"cannot read image {path}: {exc}") from None
    return np.ascontiguousarray(rgb[:, :, ::-1])


def ink_bands(image: np.ndarray) -> list[tuple[int, int]]:
    """The ``(first, last + 1)`` rows of each run of rows holding ink (pixels :data:`INK_CONTRAST` or more grey
    levels from the image's median, its background), top to bottom: the horizontal projection profile's bands."""
    grey = image.astype(np.float32).mean(axis=2)  # shape: (H, W)
    ink = np.abs(grey - np.median(grey)) >= INK_CONTRAST  # shape: (H, W)
    rows = ink.any(axis=1)  # shape: (H,)
    bands: list[tuple[int, int]] = []
    start = None
    for y, has_ink in enumerate(rows.tolist() + [False]):
        if has_ink and start is None:
            start = y
        elif not has_ink and start is not None:
            bands.append((start, y))
            start = None
    return bands


def line_problem(image: np.ndarray) -> str | None:
    """Why a BGR image cannot be one horizontal text line, or None: it is :data:`TALL_RATIO` times taller than
    wide or more (a line turned by 90 degrees), or it holds two or more text lines (ink bands of at least
    :data:`LINE_SHARE` of the tallest one's height, separated by rows without ink)."""
    h, w = image.shape[:2]
    if h >= TALL_RATIO * w:
        return (
            f"it is taller than wide ({w}x{h} pixels): the recogniser reads one horizontal line; "
            "turn the image so that the text runs left to right"
        )
    bands = ink_bands(image)
    if bands:
        tallest = max(b - a for a, b in bands)
        lines = [band for band in bands if band[1] - band[0] >= LINE_SHARE * tallest]
        if len(lines) > 1:
            return (
                f"it holds {len(lines)} text lines (rows {', '.join(f'{a}-{b - 1}' for a, b in lines)}): the "
                "recogniser reads one line; crop each line to its own image"
            )
    return None


def preprocess(image: np.ndarray) -> np.ndarray:
    """rapidocr's recogniser input for one BGR line image: ``(1, 3, 48, W)`` float32 in ``[-1, 1]``."""
    cv2 = _require("cv2")
    if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
        raise ValueError(f"a line image must be (H, W, 3) with H, W >= 1, got shape {image.shape}")
    h, w = image.shape[:2]
    ratio = w / float(h)
    width = int(REC_HEIGHT * max(REC_MIN_WIDTH / REC_HEIGHT, ratio))
    resized_w = min(width, int(math.ceil(REC_HEIGHT * ratio)))
    resized = cv2.resize(image, (resized_w, REC_HEIGHT)).astype(np.float32)  # shape: (48, w', 3)
    out = np.zeros((1, 3, REC_HEIGHT, width), dtype=np.float32)  # shape: (1, 3, 48, W)
    out[0, :, :, :resized_w] = (resized.transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return out


@dataclass(frozen=True)
class LineReading:
    """One image read: ``text`` and ``score`` (log-probability of the best path for greedy decoding, the
    decoder's combined score for beam search); ``warning`` says why the reading is doubtful (the image reads far
    better turned by 180 degrees), else None."""

    image: str
    text: str
    score: float
    warning: str | None = None


class LineRecognizer:
    """The PP-OCRv4 recogniser: ``posteriors(image)`` gives ``(T, V)`` probabilities over :attr:`labels`."""

    def __init__(self, model_path: str | os.PathLike[str] | None = None, threads: int | None = None) -> None:
        """Load the ONNX model (default: the one in rapidocr-onnxruntime) with onnxruntime on the CPU."""
        ort = _require("onnxruntime")
        path = os.fspath(model_path) if model_path is not None else default_model_path()
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = int(threads)
        options.log_severity_level = 3
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        if "character" not in meta:
            raise ValueError(f"{path} has no 'character' metadata: not a PP-OCR recognition model")
        self.labels: list[str] = ["blank", *meta["character"].splitlines(), " "]
        self.blank = 0
        self._input = self.session.get_inputs()[0].name

    def posteriors(self, image: np.ndarray) -> np.ndarray:
        """``(T, V)`` float32 softmax probabilities of one BGR line image."""
        out = self.session.run(None, {self._input: preprocess(image)})[0]  # shape: (1, T, V)
        if out.ndim != 3 or out.shape[0] != 1 or out.shape[2] != len(self.labels):
            raise ValueError(f"unexpected model output shape {out.shape} for {len(self.labels)} labels")
        return np.asarray(out[0])

    def greedy(self, probs: np.ndarray) -> tuple[str, float]:
        """Best-path text exactly as rapidocr writes it (labels joined, spaces kept) and its log-probability."""
        best = probs.argmax(axis=1)  # shape: (T,)
        keep = np.ones(len(best), dtype=bool)
        keep[1:] = best[1:] != best[:-1]
        keep &= best != self.blank
        text = "".join(self.labels[i] for i in best[keep].tolist())
        with np.errstate(divide="ignore"):
            score = float(np.log(probs[np.arange(len(best)), best].astype(np.float64)).sum())
        return text, score

    def upside_down(self, image: np.ndarray, probs: np.ndarray) -> str | None:
        """A warning when ``image`` (whose posteriors are ``probs``) reads far more confidently turned by 180
        degrees: its greedy path's mean log-probability per frame is higher by :data:`UPSIDE_DOWN_MARGIN` or
        more. None otherwise (text that reads alike both ways, ``NOON``, cannot be told apart)."""
        turned = self.posteriors(np.ascontiguousarray(image[::-1, ::-1]))  # shape: (T, V)
        as_given = self.greedy(probs)[1] / max(1, len(probs))
        text, score = self.greedy(turned)
        if score / max(1, len(turned)) - as_given < UPSIDE_DOWN_MARGIN:
            return None
        return f"the image looks upside down: turned by 180 degrees it reads {text.strip()!r} far more confidently"


def read_lines(
    paths: list[str],
    beam: int = 1,
    lm: str | None = None,
    alpha: float = 0.5,
    beta: float = 1.5,
    recognizer: LineRecognizer | None = None,
) -> list[LineReading]:
    """Read each text-line image: greedy (``beam=1``, rapidocr's text) or prefix beam search of width ``beam``
    with an optional word n-gram ``lm`` (ARPA or KenLM binary).

    Every image is checked before the model loads: a missing or unreadable file, or an image that cannot be one
    horizontal line (:func:`line_problem`), is a ValueError naming it. A reading of an image that looks upside
    down carries a ``warning`` (each image is also run turned by 180 degrees to tell)."""
    check_int("beam", beam, least=1)
    if lm is not None and beam == 1:
        raise ValueError("an LM needs beam search: give --beam N with N > 1")
    images = [load_line_image(p) for p in paths]  # every path checked before the model loads
    for path, image in zip(paths, images, strict=True):
        problem = line_problem(image)
        if problem is not None:
            raise ValueError(f"{path}: {problem}")
    rec = recognizer if recognizer is not None else LineRecognizer()
    probs = [rec.posteriors(im) for im in images]
    warnings = [rec.upside_down(im, x) for im, x in zip(images, probs, strict=True)]
    if beam == 1:
        return [LineReading(p, *rec.greedy(x), w) for p, x, w in zip(paths, probs, warnings, strict=True)]
    from .decoder import Decoder
    from .lm import fusion_of
    from .options import CTCOptions

    fusion = None if lm is None else fusion_of(lm, alpha=alpha, beta=beta)
    decoder = Decoder(rec.labels, fusion, CTCOptions(beam_width=beam), blank=rec.blank, input_kind="probs")
    results = decoder.decode(probs)  # one search over all lines
    return [
        LineReading(p, hyps[0].text, hyps[0].score, w) if hyps else LineReading(p, "", -math.inf, w)
        for p, hyps, w in zip(paths, results, warnings, strict=True)
    ]
