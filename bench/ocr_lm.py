"""PP-OCRv4 on rendered English text lines: greedy vs beam vs beam + word LM, at several degradation levels.

Text: sentences from the docstrings of a fixed list of Python standard-library modules (offline, the same on
every machine with the same Python). A seeded shuffle splits them into test lines, a dev set (to pick the LM
weights on a small grid) and LM training text, to which the sentences of the language reference's help
topics (``pydoc_data.topics``) are added; no training sentence contains a test or dev line. Lines are
rendered with DejaVu fonts (Debian's ``fonts-dejavu-core``), degraded (blur, down/up-scaling, noise, JPEG), read
by the model one at a time, and decoded from the same posteriors by each method. CER = character edit distance
/ reference length over whitespace-normalised texts; line accuracy = exact match.

    .venv/bin/python bench/ocr_lm.py [--lines 200] [--beam 50] [--order 3]
"""

from __future__ import annotations

import argparse
import importlib
import io
import random
import re
import time
import tracemalloc
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from beamkit.ctc import CTCOptions, Decoder, fusion_of
from beamkit.ctc.ocr import LineRecognizer
from beamkit.lm import ArpaLM, build_arpa

FONTS = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansCondensed.ttf",
]
MODULES = (
    "argparse collections json logging os pathlib subprocess threading typing unittest email http.client "
    "urllib.request asyncio decimal fractions statistics random datetime calendar csv sqlite3 zipfile tarfile "
    "shutil tempfile glob fnmatch textwrap string re difflib pickle copy pprint inspect dataclasses functools "
    "itertools operator contextlib abc numbers enum heapq bisect array weakref queue socket ssl select "
    "selectors signal mmap codecs locale gettext hashlib hmac secrets base64 binascii struct io time sched "
    "multiprocessing concurrent.futures xml.dom.minidom xml.etree.ElementTree html.parser ftplib imaplib "
    "smtplib uuid socketserver wsgiref.simple_server configparser tomllib netrc plistlib gzip bz2 lzma "
    "zlib traceback warnings doctest pdb timeit trace tracemalloc ast dis tokenize keyword pkgutil "
    "importlib modulefinder runpy sysconfig site code codeop"
).split()


@dataclass(frozen=True)
class Level:
    """A degradation: Gaussian blur radius, scale factor (down then up), pixel noise sigma, JPEG quality."""

    name: str
    blur: float
    scale: float
    noise: float
    jpeg: int


LEVELS = [
    Level("clean", 0.0, 1.0, 0.0, 0),
    Level("mild", 1.0, 0.55, 18.0, 40),
    Level("hard", 1.4, 0.42, 30.0, 25),
]


def sentences() -> list[str]:
    """Distinct one-line English sentences (ASCII, 3+ words) from the modules' docstrings."""
    out: list[str] = []
    seen: set[str] = set()
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        docs = [mod.__doc__ or ""]
        warnings.simplefilter("ignore", DeprecationWarning)
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr, None)
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and getattr(obj, "__module__", None) == mod.__name__:
                docs.append(doc)
        for doc in docs:
            text = " ".join(doc.split())
            for s in re.split(r"(?<=[.!?])\s+", text):
                if s.isascii() and len(s.split()) >= 3 and re.fullmatch(r"[A-Za-z0-9 ,.;:'()\-!?\"/%&]+", s):
                    if s not in seen:
                        seen.add(s)
                        out.append(s)
    return out


def reference_sentences() -> list[str]:
    """Sentences of the Python language reference's help topics (``pydoc_data.topics``): more LM text."""
    from pydoc_data.topics import topics

    out = []
    for text in topics.values():
        flat = " ".join(text.split())
        out += [s for s in re.split(r"(?<=[.!?])\s+", flat) if s.isascii() and len(s.split()) >= 3]
    return out


def render(text: str, font_path: str, level: Level, rng: np.random.Generator) -> np.ndarray:
    """A BGR line image of ``text``, degraded as ``level`` says."""
    font = ImageFont.truetype(font_path, 30)
    width = int(font.getlength(text)) + 20
    img = Image.new("L", (width, 44), 255)
    ImageDraw.Draw(img).text((10, 5), text, font=font, fill=0)
    if level.blur:
        img = img.filter(ImageFilter.GaussianBlur(level.blur))
    if level.scale != 1.0:
        small = img.resize((max(1, int(width * level.scale)), max(1, int(44 * level.scale))), Image.BILINEAR)
        img = small.resize((width, 44), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.float64)
    if level.noise:
        arr = arr + rng.normal(0, level.noise, arr.shape)
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if level.jpeg:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=level.jpeg)
        img = Image.open(io.BytesIO(buf.getvalue()))
    rgb = np.asarray(img.convert("RGB"))
    return np.ascontiguousarray(rgb[:, :, ::-1])


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between two strings."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def scores(refs: list[str], hyps: list[str]) -> tuple[float, float]:
    """CER (%) and line accuracy (%) over whitespace-normalised texts."""
    norm = [(" ".join(r.split()), " ".join(h.split())) for r, h in zip(refs, hyps, strict=True)]
    errors = sum(edit_distance(r, h) for r, h in norm)
    chars = sum(len(r) for r, _ in norm)
    return 100.0 * errors / chars, 100.0 * sum(r == h for r, h in norm) / len(norm)


def main() -> None:
    """Render, read, decode and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200, help="test lines per level")
    parser.add_argument("--dev", type=int, default=60, help="dev lines (LM weight grid, mild level)")
    parser.add_argument("--beam", type=int, default=50)
    parser.add_argument("--order", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    pool = [s for s in sentences() if 20 <= len(s) <= 60]
    every = sentences()
    random.Random(args.seed).shuffle(pool)
    test, dev = pool[: args.lines], pool[args.lines : args.lines + args.dev]
    held = set(test) | set(dev)
    train = [s for s in every + reference_sentences() if not any(h in s for h in held)]
    print(f"{len(every)} sentences; LM on {len(train)} ({sum(len(s.split()) for s in train)} words), "
          f"{len(test)} test lines, {len(dev)} dev lines")  # fmt: skip
    lm = ArpaLM.from_lines(build_arpa(train, order=args.order).splitlines())
    rec = LineRecognizer()
    rng = np.random.default_rng(args.seed)
    fonts = [FONTS[i % len(FONTS)] for i in range(len(test) + len(dev))]

    def read(texts: list[str], offset: int, level: Level) -> tuple[list[np.ndarray], float]:
        t0 = time.perf_counter()
        probs = [rec.posteriors(render(t, fonts[offset + i], level, rng)) for i, t in enumerate(texts)]
        return probs, (time.perf_counter() - t0) / len(texts)

    def decoder(lm_fusion: Any = None, compat: bool = False) -> Decoder:
        """The native decoder over the recogniser's labels (blank 0, probabilities in), history pruning on and
        the best hypothesis only (as pyctcdecode's ``decode``)."""
        options = CTCOptions(beam_width=args.beam, prune_history=True, pyctcdecode_compat=compat, num_hypotheses=1)
        return Decoder(rec.labels, lm_fusion, options, blank=0, input_kind="probs")

    def texts(dec: Decoder, mats: list[np.ndarray]) -> list[str]:
        return [hyps[0].text if hyps else "" for hyps in dec.decode(mats)]

    greedy_dec = decoder()
    # LM weights: a small grid on the dev lines at the mild level
    dev_probs, _ = read(dev, len(test), LEVELS[1])
    best = None
    for alpha in (0.2, 0.4, 0.7):
        for beta in (0.5, 1.5, 3.0):
            for unk in (-10.0, -4.0):
                dec = decoder(fusion_of(lm, alpha=alpha, beta=beta, unk_score_offset=unk))
                cer = scores(dev, texts(dec, dev_probs))[0]
                if best is None or cer < best[0]:
                    best = (cer, alpha, beta, unk)
    assert best is not None
    _, alpha, beta, unk = best
    print(f"LM weights from the dev grid: alpha={alpha} beta={beta} unk_score_offset={unk} (dev CER {best[0]:.2f}%)")
    fusion = fusion_of(lm, alpha=alpha, beta=beta, unk_score_offset=unk)
    fused, compat = decoder(fusion), decoder(fusion, compat=True)
    print("| level | model ms/line | greedy CER / line acc | beam CER / acc | beam+LM CER / acc "
          "| beam+LM, pyctcdecode quirk CER / acc | decode ms/line greedy / beam / beam+LM |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for level in LEVELS:
        probs, model_s = read(test, 0, level)
        row = []
        times = []
        for name in ("greedy", "beam", "lm", "compat"):
            t0 = time.perf_counter()
            if name == "greedy":
                hyps = [rec.greedy(p)[0] for p in probs]
            elif name == "beam":
                hyps = texts(greedy_dec, probs)
            elif name == "lm":
                hyps = texts(fused, probs)
            else:
                hyps = texts(compat, probs)
            times.append(1000 * (time.perf_counter() - t0) / len(probs))
            cer, acc = scores(test, hyps)
            row.append(f"{cer:.2f}% / {acc:.0f}%")
        print(f"| {level.name} | {1000 * model_s:.0f} | {' | '.join(row)} | "
              f"{times[0]:.2f} / {times[1]:.1f} / {times[2]:.1f} |")  # fmt: skip
    # the last level's lines once more: all in one decode call against one line per call (both timed without
    # tracemalloc, which slows allocations), then the batch's peak memory (tracemalloc sees numpy's buffers)
    t0 = time.perf_counter()
    fused.decode(probs)
    t_batch = (time.perf_counter() - t0) / len(probs)
    t0 = time.perf_counter()
    for p in probs:
        fused.decode([p])
    t_one = (time.perf_counter() - t0) / len(probs)
    fused.release_cached_memory()  # the batch's peak counts its own storage
    tracemalloc.start()
    fused.decode(probs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        f"beam+LM over {len(probs)} {LEVELS[-1].name} lines (V={len(rec.labels)}): one decode call "
        f"{1000 * t_batch:.1f} ms/line, peak {peak / 2**20:.0f} MiB; one line per call {1000 * t_one:.1f} ms/line"
    )


if __name__ == "__main__":
    main()
