"""Text-line recognition with PP-OCRv4 (the ONNX model inside the ``rapidocr-onnxruntime`` wheel) and CTC decoding.

The model reads one text-line image (height 48 after resizing, width ``48 * max(w / h, 320 / 48)``, pixels
scaled to ``[-1, 1]``, BGR channel order: rapidocr's own preprocessing) and outputs ``(T, V)`` softmax
probabilities, ``T = width / 8``, over ``V = 6,625`` labels: rapidocr's blank first, the 6,623 characters of the
model's ``character`` metadata, then a space. Images are run one at a time (rapidocr's batching pads them
to a common width, which changes the outputs).

Needs the ``ocr`` extra, ``pip install ".[ocr]"`` (onnxruntime, rapidocr-onnxruntime for its model file, pillow;
rapidocr brings opencv for the resize). Nothing is downloaded: the model ships in the wheel.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamkit._checks import check_int
from beamkit.extras import install_hint

REC_HEIGHT = 48
REC_MIN_WIDTH = 320
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
        raise FileNotFoundError(f"image not found: {path}")
    image_mod = _require("PIL.Image")
    try:
        with image_mod.open(path) as im:
            rgb = np.asarray(im.convert("RGB"))  # shape: (H, W, 3)
    except OSError as exc:
        raise ValueError(f"cannot read image {path}: {exc}") from None
    return np.ascontiguousarray(rgb[:, :, ::-1])


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
    decoder's combined score for beam search)."""

    image: str
    text: str
    score: float


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


def read_lines(
    paths: list[str],
    beam: int = 1,
    lm: str | None = None,
    alpha: float = 0.5,
    beta: float = 1.5,
    recognizer: LineRecognizer | None = None,
) -> list[LineReading]:
    """Read each text-line image: greedy (``beam=1``, rapidocr's text) or prefix beam search of width ``beam``
    with an optional word n-gram ``lm`` (ARPA or KenLM binary)."""
    check_int("beam", beam, least=1)
    if lm is not None and beam == 1:
        raise ValueError("an LM needs beam search: give --beam N with N > 1")
    images = [load_line_image(p) for p in paths]  # every path checked before the model loads
    rec = recognizer if recognizer is not None else LineRecognizer()
    probs = [rec.posteriors(im) for im in images]
    if beam == 1:
        return [LineReading(p, *rec.greedy(x)) for p, x in zip(paths, probs, strict=True)]
    from .decoder import Decoder
    from .lm import fusion_of
    from .options import CTCOptions

    fusion = None if lm is None else fusion_of(lm, alpha=alpha, beta=beta)
    decoder = Decoder(rec.labels, fusion, CTCOptions(beam_width=beam), blank=rec.blank, input_kind="probs")
    results = decoder.decode(probs)  # one search over all lines
    return [
        LineReading(p, hyps[0].text, hyps[0].score) if hyps else LineReading(p, "", -math.inf)
        for p, hyps in zip(paths, results, strict=True)
    ]
