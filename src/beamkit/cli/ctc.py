"""``beamkit ctc decode``, ``beamkit ctc explain`` and ``beamkit lm build`` subcommands::

beamkit ctc decode logprobs.npy --labels labels.txt [--lm lm.arpa --alpha 0.5 --beta 1.5] [--beam 100]
beamkit ctc explain logprobs.npy --labels labels.txt [--beam 10] [--format html|svg|dot|json] -o search.html
beamkit lm build corpus.txt --order 3 -o lm.arpa
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from beamkit.cli.args import (
    StoreGiven,
    add_force_arg,
    add_lm_args,
    check_output,
    lm_options_given,
    parse_blank,
    read_labels,
)
from beamkit.cli.format import json_text
from beamkit.cli.types import bounded_int, non_negative_int, non_positive_float, positive_int
from beamkit.ctc.options import MAX_BEAM_WIDTH
from beamkit.lm import KENLM_MAX_ORDER
from beamkit.lm.kneser_ney import MAX_ORDER
from beamkit.textfiles import check_text_file

if TYPE_CHECKING:
    from beamkit.ctc import CTCOptions, Decoder
    from beamkit.ctc.trace import CTCTrace

LABELS_FORMAT = """\
labels file: UTF-8 text, one label per line, line i naming column i of the matrix (as many lines as
columns). The CTC blank is the one line that is empty, <pad> or <blank>, or the label/index given by
--blank; a line "<space>" (or a single space) is the word delimiter, as is "|" when no space label exists.
Labels starting with "##" or "▁" make a BPE vocabulary. --alphabet "abc..." instead gives one label per
character of a string (then name the blank with --blank)."""

INPUT_FORMAT = """\
FILE: a .npy holding one (T, V) matrix or a batch (N, T, V) of real numbers: logits, log-probabilities or
probabilities (detected; --input-kind says which). Output: one line per utterance, its best text; --json
prints one JSON object per utterance with its top beams."""


def _check_lm_options(args: argparse.Namespace) -> None:
    """Refuse LM weights without an LM, and an LM or a beam width with greedy decoding (they would be ignored)."""
    given = lm_options_given(args)
    weights = sorted(given & {"--alpha", "--beta"})
    if args.lm is None and weights:
        raise ValueError(f"{weights[0]} is a language model weight: it needs --lm")
    if getattr(args, "greedy", False):
        if args.lm is not None:
            raise ValueError("--greedy decodes without a language model: drop --lm (or --greedy for beam search)")
        if "--beam" in given:
            raise ValueError("--greedy keeps one path: drop --beam (or --greedy for beam search)")
        if "--top" in given:
            raise ValueError("--greedy keeps one path: drop --top (or --greedy for the top beams of beam search)")
    if "--top" in given and not getattr(args, "json", True):
        raise ValueError("--top sets the beams printed by --json: add --json (without it, the best text is printed)")


def _load_matrices(path: str) -> list[np.ndarray]:
    """The ``(T, V)`` matrices of a .npy file holding one matrix or a batch ``(N, T, V)`` (checked)."""
    from beamkit.ctc.posteriors import as_real_array

    if not os.path.isfile(path):
        if os.path.exists(path) and not os.path.isdir(path):
            check_text_file(path, ".npy file")  # a named pipe, a device, a socket: named as such
        what = "is a folder, not a .npy file" if os.path.isdir(path) else "no such file"
        raise FileNotFoundError(f"{what}: {path}")
    with open(path, "rb") as fh:
        if fh.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path} is not a numpy array file (.npy, as numpy.save writes it)")
    try:
        raw = np.load(path, allow_pickle=False)
    except (EOFError, ValueError, OSError) as exc:  # empty, truncated, not an .npy, or pickled objects
        raise ValueError(f"cannot read {path} as a .npy array: {exc or type(exc).__name__}") from exc
    arr = as_real_array(raw, path, keep_dtype=True)
    if arr.ndim not in (2, 3):
        raise ValueError(f"{path} must hold a (T, V) or (N, T, V) array, got shape {arr.shape}")
    return [arr] if arr.ndim == 2 else list(arr)


def _build_decoder(args: argparse.Namespace, options: CTCOptions) -> Decoder:
    """The decoder the input arguments (labels, blank, input kind, LM) and ``options`` describe."""
    from beamkit.ctc import Decoder, fusion_of

    fusion = None
    if args.lm is not None:
        fusion = fusion_of(args.lm, alpha=args.alpha, beta=args.beta, backend=args.lm_backend)
    options = dataclasses.replace(options, pyctcdecode_compat=args.pyctcdecode_compat)
    return Decoder(
        read_labels(args.labels, args.alphabet),
        fusion,
        options,
        blank=parse_blank(args.blank),
        input_kind=args.input_kind,
    )


@contextlib.contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """Show the library's warnings on standard error as one line each, ``prog: warning: message`` (Python's own
    format adds the source file and line of the library code that warned)."""

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        print(f"{prog}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _cmd_ctc_decode(args: argparse.Namespace) -> int:
    with one_line_warnings("beamkit ctc decode"):
        return _ctc_decode(args)


def _lexicon_decoder(args: argparse.Namespace, labels: list[str]) -> Any:
    """The lexicon decoder ``--lexicon`` asks for: the labels are its tokens, the blank found as ``Decoder`` finds
    it, the silence token ``|`` (else the space label); ``--alpha`` weighs the LM, ``--beta`` scores each word."""
    from beamkit.ctc import LexiconDecoder, LexiconOptions
    from beamkit.ctc.vocab import Vocabulary

    blank = labels[Vocabulary.from_labels(labels, parse_blank(args.blank)).blank]
    sil = "|" if "|" in labels else " " if " " in labels else None
    if sil is None:
        raise ValueError("--lexicon needs a word delimiter among the labels: '|' or '<space>'")
    options = LexiconOptions(beam_size=args.beam, nbest=args.top)
    if args.lm is not None:
        options = dataclasses.replace(options, lm_weight=args.alpha, word_score=args.beta)
    return LexiconDecoder(labels, args.lexicon, args.lm, options, blank=blank, sil=sil)


def _lexicon_decode(args: argparse.Namespace, mats: list[np.ndarray]) -> list[list[dict[str, Any]]]:
    """Each matrix decoded by the lexicon search (log-probabilities, as float32): its beams as dictionaries."""
    from beamkit.ctc.posteriors import normalize_posteriors

    if args.greedy or args.pyctcdecode_compat:
        raise ValueError(f"{'--greedy' if args.greedy else '--pyctcdecode-compat'} does not apply to --lexicon")
    decoder = _lexicon_decoder(args, read_labels(args.labels, args.alphabet))
    results = []
    for m in mats:
        lp = normalize_posteriors(m, args.input_kind, name=args.file)  # shape: (T, V) log-probabilities
        [hyps] = decoder.decode(lp.astype(np.float32))
        results.append(
            [
                {
                    "text": " ".join(h.words),
                    "words": h.words,
                    "tokens": decoder.idxs_to_tokens(h.tokens),
                    "timesteps": h.timesteps.tolist(),
                    "score": h.score,
                }
                for h in hyps
            ]
        )
    return results


def _ctc_decode(args: argparse.Namespace) -> int:
    from beamkit.ctc import CTCOptions

    _check_lm_options(args)
    mats = _load_matrices(args.file)
    if args.lexicon is not None:
        return _print_results(args, _lexicon_decode(args, mats))
    decoder = _build_decoder(args, CTCOptions(beam_width=args.beam, num_hypotheses=args.top))
    if args.greedy:
        results: list[list[dict[str, Any]]] = [
            [{"text": t, "word_frames": [], "logit_score": None, "score": None}] for t in decoder.greedy(mats)
        ]
    else:
        results = [
            [
                {"text": h.text, "word_frames": h.word_frames, "logit_score": h.logit_score, "score": h.score}
                for h in hyps
            ]
            for hyps in decoder.decode(mats)
        ]
    return _print_results(args, results)


def _print_results(args: argparse.Namespace, results: list[list[dict[str, Any]]]) -> int:
    """One line per utterance: its best text, or (``--json``) a JSON object with its top beams."""
    for i, hyps in enumerate(results):
        if args.json:
            print(json_text({"utterance": i, "beams": hyps[: args.top]}))
        else:
            print(hyps[0]["text"] if hyps else "")
    return 0


EXPLAIN_FORMATS = ("html", "svg", "dot", "json")


def _cmd_ctc_explain(args: argparse.Namespace) -> int:
    with one_line_warnings("beamkit ctc explain"):
        return _ctc_explain(args)


def _ctc_explain(args: argparse.Namespace) -> int:
    from beamkit.ctc import CTCOptions
    from beamkit.viz import to_dot, to_html, to_svg

    _check_lm_options(args)
    if args.output is not None:
        check_output(args.output, "-o", args.force, inputs=[args.file])
    mats = _load_matrices(args.file)
    if not 0 <= args.utterance < len(mats):
        raise ValueError(f"--utterance must lie in [0, {len(mats) - 1}] for {args.file}, got {args.utterance}")
    frames = len(mats[args.utterance])
    if frames > args.max_frames:
        raise ValueError(
            f"{args.file} has {frames} frames, more than --max-frames {args.max_frames}: the recorded search "
            "grows with every frame; explain a shorter cut of the matrix, or raise --max-frames"
        )
    options = CTCOptions(
        beam_width=args.beam,
        beam_prune_logp=args.beam_prune_logp,
        token_min_logp=args.token_min_logp,
        prune_history=args.prune_history,
    )
    trace = _build_decoder(args, options).trace([mats[args.utterance]])[0]
    trace.source = os.path.basename(args.file) + (f" [{args.utterance}]" if len(mats) > 1 else "")
    draw: dict[str, Callable[[CTCTrace], str]] = {"html": to_html, "svg": to_svg, "dot": to_dot}
    page = trace.to_json(indent=1) + "\n" if args.format == "json" else draw[args.format](trace)
    if args.output is None:
        sys.stdout.write(page)
        return 0
    with open(args.output, "w", encoding="utf-8") as fh:
        fh.write(page)
    best = trace.hypotheses[0].text if trace.hypotheses else ""
    print(
        f"wrote {args.output}: {trace.n_entries} entries over {len(trace.frames)} frames; best: {best!r}, "
        f"greedy: {trace.greedy!r}"
    )
    return 0


def _cmd_lm_build(args: argparse.Namespace) -> int:
    from beamkit.lm import write_arpa

    check_output(args.output, "-o", args.force, inputs=[args.corpus], input_name="corpus")
    if args.order > KENLM_MAX_ORDER:
        print(
            f"beamkit lm build: warning: kenlm reads orders up to {KENLM_MAX_ORDER}; this order-{args.order} "
            "model is read by beamkit's own ARPA reader (--lm-backend auto picks it for such files)",
            file=sys.stderr,
        )
    show = not args.quiet and sys.stderr.isatty()
    n = write_arpa(args.corpus, args.output, order=args.order, progress=show)
    print(f"wrote {args.output}: {n} n-grams, order {args.order}")
    return 0


def _cmd_ocr(args: argparse.Namespace) -> int:
    from beamkit.ctc.ocr import read_lines

    _check_lm_options(args)
    try:
        readings = read_lines(args.images, beam=args.beam, lm=args.lm, alpha=args.alpha, beta=args.beta)
    except ImportError as exc:  # the ocr extra is missing: a failure, not a usage error
        print(f"beamkit ocr: error: {exc}", file=sys.stderr)
        return 1
    for r in readings:
        if r.warning is not None:
            print(f"beamkit ocr: warning: {r.image}: {r.warning}", file=sys.stderr)
    if args.json:
        rows = [{"image": r.image, "text": r.text, "score": r.score, "warning": r.warning} for r in readings]
        print(json_text(rows))
    else:
        for r in readings:
            print(r.text)
    return 0


def _add_input_arguments(p: argparse.ArgumentParser, beam: int) -> None:
    """The arguments ``ctc decode`` and ``ctc explain`` share: the .npy file, labels, blank, input kind, LM,
    beam width (default ``beam``) and scoring mode."""
    p.add_argument("file", help=".npy file of logits, log-probabilities or probabilities")
    labels = p.add_mutually_exclusive_group(required=True)
    labels.add_argument("--labels", metavar="FILE", help="labels file, one label per line (format above)")
    labels.add_argument("--alphabet", metavar="STRING", help="one label per character of STRING")
    p.add_argument(
        "--blank",
        default=None,
        help="the CTC blank: a column index (integer) or a label; default: the one label that is empty, "
        "<pad> or <blank> (none or several is an error)",
    )
    p.add_argument(
        "--input-kind",
        choices=["auto", "logits", "log_probs", "probs"],
        default="auto",
        help="what the matrix holds; auto reads rows in [0, 1] summing to 1 (within the dtype's rounding) as "
        "probabilities, anything else as logits",
    )
    add_lm_args(p)
    p.add_argument(
        "--beam",
        type=bounded_int(1, MAX_BEAM_WIDTH),
        default=beam,
        action=StoreGiven,
        help=f"beam width, 1 to {MAX_BEAM_WIDTH:,} (the search allocates its rows for the whole beam)",
    )
    p.add_argument(
        "--pyctcdecode-compat",
        action="store_true",
        help="reproduce pyctcdecode 0.5.0's end-of-utterance scoring quirk (off: the correct score; the Python "
        "Decoder has the same default)",
    )


def _command_group(subparsers: Any, name: str, help: str, description: str) -> Any:
    """Add the command ``name``, whose sub-command must be given; return what its sub-commands are added to
    (the chosen one lands in ``args.<name>_command``)."""
    group = subparsers.add_parser(name, help=help, description=description)
    sub = group.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")
    sub.required = True
    return sub


def register(subparsers: Any) -> None:
    """Add the ``ctc`` (``decode``, ``explain``), ``lm`` (``build``) and ``ocr`` subcommands to an argparse subparsers
    object."""
    register_ocr(subparsers)
    ctc_sub = _command_group(
        subparsers,
        "ctc",
        help="CTC decoding (greedy / prefix beam search with an n-gram LM)",
        description="CTC decoding of posterior matrices saved as .npy: greedy or prefix beam search, "
        "optionally fused with a word n-gram language model.",
    )
    register_ctc_decode(ctc_sub)
    register_ctc_explain(ctc_sub)
    lm_sub = _command_group(
        subparsers, "lm", help="n-gram language models", description="Word n-gram language models for CTC decoding."
    )
    register_lm_build(lm_sub)


def register_ocr(subparsers: Any) -> None:
    """Add ``beamkit ocr``: read text-line images with PP-OCRv4 and CTC beam search."""
    ocr = subparsers.add_parser(
        "ocr",
        help="read text-line images with PP-OCRv4 and CTC beam search",
        description="Read single text-line images with the PP-OCRv4 recognition model shipped in "
        "rapidocr-onnxruntime (the ocr extra), decoded greedily (--beam 1: rapidocr's own "
        "text) or by prefix beam search with an optional word n-gram LM. Prints one text per image, or with "
        "--json a list of {image, text, score, warning} (score: log-probability of the best path, or the beam's "
        "combined score). An image that cannot be one horizontal line (taller than wide by 1.5 or more, or two "
        "text lines) is refused before any is read; one that reads far better turned upside down is read as "
        "given, with a warning on standard error.",
    )
    ocr.add_argument("images", nargs="+", metavar="IMAGE", help="image files, one text line each")
    ocr.add_argument("--beam", type=positive_int, default=1, help="beam width (1: greedy)")
    add_lm_args(ocr, backend=False)
    ocr.add_argument("--json", action="store_true", help="print a JSON list of {image, text, score, warning}")
    ocr.set_defaults(func=_cmd_ocr)


def register_ctc_decode(ctc_sub: Any) -> None:
    """Add ``beamkit ctc decode``: decode a .npy of CTC posteriors."""
    dec = ctc_sub.add_parser(
        "decode",
        help="decode a .npy of (T, V) or (N, T, V) CTC posteriors",
        description="Decode CTC posteriors with prefix beam search (or greedy best path).\n\n"
        + INPUT_FORMAT
        + "\n\n"
        + LABELS_FORMAT,
    )
    _add_input_arguments(dec, beam=100)
    dec.add_argument("--greedy", action="store_true", help="best-path decoding instead of beam search (no --lm)")
    dec.add_argument("--json", action="store_true", help="print JSON lines with the top beams")
    dec.add_argument(
        "--top",
        type=positive_int,
        default=1,
        action=StoreGiven,
        help="beams per utterance in --json output (>= 1; needs --json, not --greedy)",
    )
    dec.add_argument(
        "--lexicon",
        metavar="FILE",
        help="decode with a lexicon (flashlight's search, torchaudio's ctc_decoder): each line a word and its "
        "spelling in labels separated by spaces (several lines: several spellings); the silence token is '|' "
        "(else the space label); with --lm (a KenLM file, needs kenlm) --alpha weighs the LM's log10 scores "
        "and --beta is added per word (default: no lexicon, any label sequence)",
    )
    dec.set_defaults(func=_cmd_ctc_decode)


def register_ctc_explain(ctc_sub: Any) -> None:
    """Add ``beamkit ctc explain``: draw the prefix search of one utterance."""
    exp = ctc_sub.add_parser(
        "explain",
        help="draw the prefix search of one utterance (HTML, SVG, DOT or JSON)",
        description="Decode one utterance with prefix beam search, recording every frame, and draw the search: "
        "one column per frame, a node per prefix entry (kept, or pruned by the threshold, the beam width or the "
        "history rule) with its p_b / p_nb / LM score / total / merged count on hover, edges to the beam it "
        "extends, the returned hypotheses and the greedy (best-path) prefixes highlighted. Runs of blank-only "
        "frames are compressed (a checkbox in the page). The HTML is one self-contained file that opens offline."
        "\n\n" + INPUT_FORMAT.split("Output:")[0].rstrip() + " --utterance picks one of a batch.\n\n" + LABELS_FORMAT,
    )
    _add_input_arguments(exp, beam=10)
    exp.add_argument("--utterance", type=non_negative_int, default=0, help="which utterance of an (N, T, V) file")
    exp.add_argument(
        "--beam-prune-logp", type=non_positive_float, default=-10.0, help="prune beams scoring below best + this (<= 0)"
    )
    exp.add_argument(
        "--token-min-logp",
        type=non_positive_float,
        default=-5.0,
        help="a frame's candidates: labels with lp >= this (<= 0)",
    )
    exp.add_argument(
        "--prune-history", action="store_true", help="keep one beam per LM history (as the decoder's decode does)"
    )
    exp.add_argument(
        "--max-frames",
        type=positive_int,
        default=5000,
        help="refuse an utterance longer than this many frames (the recorded search grows with every frame)",
    )
    exp.add_argument("--format", choices=EXPLAIN_FORMATS, default="html", help="output format")
    exp.add_argument("-o", "--output", default=None, help="output file (default: stdout)")
    add_force_arg(exp, "-o")
    exp.set_defaults(func=_cmd_ctc_explain)


def register_lm_build(lm_sub: Any) -> None:
    """Add ``beamkit lm build``: build a Kneser-Ney ARPA model from a corpus."""
    build = lm_sub.add_parser(
        "build",
        help="build an interpolated modified Kneser-Ney ARPA from a corpus",
        description="Build an interpolated modified Kneser-Ney word n-gram model from a text corpus and write it "
        f"as ARPA. kenlm reads orders up to {KENLM_MAX_ORDER}; higher orders are read by beamkit's ARPA reader. "
        "A progress bar goes to stderr when it is a terminal.",
    )
    build.add_argument("corpus", help="UTF-8 text file, one sentence per line, words separated by whitespace")
    build.add_argument("--order", type=bounded_int(1, MAX_ORDER), default=3, help=f"n-gram order, 1 to {MAX_ORDER}")
    build.add_argument("-o", "--output", required=True, help="output ARPA file path")
    add_force_arg(build, "-o")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.set_defaults(func=_cmd_lm_build)
