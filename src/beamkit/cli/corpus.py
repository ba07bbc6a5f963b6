"""``beamkit decode``: a corpus file (or a folder of CTC posteriors) in, JSONL out, on local processes or Ray."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from beamkit.cli.args import (
    add_command,
    add_lm_args,
    add_model_arg,
    add_search_args,
    check_output,
    parse_blank,
    read_labels,
)
from beamkit.cli.types import positive_int
from beamkit.corpus.options import DecodeOptions


def _options(args: argparse.Namespace) -> DecodeOptions:
    ctc = os.path.isdir(args.input)
    if ctc and args.labels is None:
        raise ValueError(f"{args.input} is a folder: CTC posteriors need --labels")
    if args.labels is not None and not ctc:
        raise ValueError("--labels applies to a folder of .npy CTC posteriors given as --input")
    labels = None
    if ctc:
        labels = tuple(read_labels(args.labels))
    beam = args.beam if args.beam is not None else (100 if ctc else 5)
    return DecodeOptions(
        model=args.model, beam=beam, n_best=args.n_best, length_penalty=args.length_penalty, max_len=args.max_len,
        labels=labels, lm=args.lm, alpha=args.alpha, beta=args.beta, lm_backend=args.lm_backend,
        pyctcdecode_compat=args.pyctcdecode_compat, blank=parse_blank(args.blank) if ctc else None,
    )  # fmt: skip


def _check_output(args: argparse.Namespace) -> None:
    """``--output`` by the rule of every command that writes (:func:`beamkit.cli.args.check_output`): an existing
    file is resumed when an earlier run of ``decode`` wrote it (``OUTPUT.parts/manifest.json`` beside it), else
    replaced only with ``--force``. ``OUTPUT.parts`` must be a folder (or not exist)."""
    output = args.output
    parts = f"{output}.parts"
    if os.path.exists(parts) and not os.path.isdir(parts):
        raise ValueError(
            f"--output {output}: {parts} is a file, where decode keeps its finished shards; move it away or "
            "choose another --output"
        )
    ours = os.path.isfile(os.path.join(parts, "manifest.json"))
    check_output(output, "--output", args.force, inputs=[args.input], resumable=ours, makes_folder=True)


def cmd_decode(args: argparse.Namespace) -> int:
    """Decode a corpus into a JSONL file; resumable (rerun the same command after an interruption)."""
    from beamkit.corpus.run import decode_corpus
    from beamkit.progress import progress_enabled

    _check_output(args)
    options = _options(args)
    try:
        result = decode_corpus(
            args.input, args.output, options, workers=args.workers, ray=args.ray, batch_size=args.batch_size,
            shard_size=args.shard_size, progress=progress_enabled(args.quiet),
        )  # fmt: skip
    except ImportError as exc:
        print(f"beamkit decode: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError:
        raise  # a usage error: beamkit.cli prints it and exits 2
    except KeyboardInterrupt:
        print("beamkit decode: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"beamkit decode: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a Ray task failure arrives as Ray's own exception types
        if type(exc).__module__.split(".")[0] != "ray":
            raise
        print(f"beamkit decode: error: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    reused = f", {result.shards_reused} reused" if result.shards_reused else ""
    print(
        f"wrote {result.output}: {result.inputs} inputs, {result.errors} errors, "
        f"{result.shards_decoded} shards decoded{reused} in {result.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


def register(subparsers: Any) -> None:
    """Add ``decode`` to the ``beamkit`` command line."""
    p = add_command(
        subparsers,
        "decode",
        "decode a corpus file (or a folder of CTC .npy posteriors) into JSONL; resumable, Ray-ready",
        "Local worker processes or Ray; the output is in input order.",
        run=cmd_decode,
    )
    add_model_arg(p)
    p.add_argument("--input", required=True, help="text file (a source a line), .jsonl ({id, text}) or .npy folder")
    p.add_argument("--output", required=True, help="output JSONL; shards and manifest go to OUTPUT.parts/")
    add_search_args(
        p, beam=None, beam_help="beam width (default 5; 100 for CTC)", n_best=1, n_best_help="hypotheses per input",
        length_penalty=None, length_penalty_help="alpha (default: the model's, 1)",
    )  # fmt: skip
    p.add_argument("--batch-size", type=positive_int, default=32, help="inputs per batched search")
    p.add_argument("--shard-size", type=positive_int, default=1000, help="inputs per output shard")
    p.add_argument("--workers", type=positive_int, default=1, help="worker processes or Ray actors")
    p.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="run on Ray: the cluster at ADDRESS, or without one ray.init()'s default (RAY_ADDRESS or a local Ray)",
    )  # fmt: skip
    p.add_argument(
        "--labels", default=None, help="CTC: labels file, one label per line, as `ctc decode` reads it (default: none)"
    )
    p.add_argument(
        "--blank", default=None, help="CTC: the blank's column index or label (default: the one empty/<pad>/<blank>)"
    )
    add_lm_args(p)  # CTC posteriors only
    p.add_argument("--pyctcdecode-compat", action="store_true", help="CTC: pyctcdecode's end-of-utterance scoring")
    p.add_argument(
        "--force", action="store_true", help="replace an existing --output file that beamkit decode did not write"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
