"""``beamkit ctc decode`` and ``beamkit lm build`` subcommands.

    beamkit ctc decode logprobs.npy --labels labels.txt [--lm lm.arpa --alpha 0.5 --beta 1.5] [--beam 100]
    beamkit lm build corpus.txt --order 3 -o lm.arpa

``logprobs.npy`` holds one ``(T, V)`` matrix or a batch ``(N, T, V)`` (log-probabilities, probabilities or
logits: normalised as pyctcdecode does). ``--labels`` is a file with one label per line (an empty line is
the blank; ``<space>`` or ``|`` is the word delimiter) or a comma-free string of single characters.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np


def _read_labels(spec: str) -> list[str]:
    if os.path.exists(spec):
        with open(spec, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        if lines and lines[-1] == "":
            lines = lines[:-1]
        return [" " if lab in ("<space>", " ") else lab for lab in lines]
    if not spec:
        raise ValueError("--labels is empty")
    return list(spec)


def _cmd_ctc_decode(args: argparse.Namespace) -> int:
    from .decoder import build_ctcdecoder

    if not os.path.exists(args.file):
        raise FileNotFoundError(f"no such file: {args.file}")
    arr = np.load(args.file, allow_pickle=False)
    if arr.ndim not in (2, 3):
        raise ValueError(f"{args.file} must hold a (T, V) or (N, T, V) array, got shape {arr.shape}")
    labels = _read_labels(args.labels)
    decoder = build_ctcdecoder(
        labels,
        kenlm_model_path=args.lm,
        alpha=args.alpha,
        beta=args.beta,
        lm_backend=args.lm_backend,
        pyctcdecode_compat=args.pyctcdecode_compat,
    )
    mats = [arr] if arr.ndim == 2 else list(arr)
    if args.greedy:
        from .decoder import normalize_logits
        from .prefix_search import greedy_decode

        texts = [str(greedy_decode(normalize_logits(m), decoder.vocab)) for m in mats]
        beams: list[Any] = [[(t, [], None, None)] for t in texts]
    else:
        beams = decoder.decode_beams_batch(None, mats, beam_width=args.beam, prune_history=False)
    for i, utt_beams in enumerate(beams):
        if args.json:
            top = [
                {"text": b[0], "word_frames": b[1], "logit_score": b[2], "score": b[3]} for b in utt_beams[: args.top]
            ]
            print(json.dumps({"utterance": i, "beams": top}))
        else:
            print(utt_beams[0][0] if utt_beams else "")
    return 0


def _cmd_lm_build(args: argparse.Namespace) -> int:
    from .kneser_ney import write_arpa

    n = write_arpa(args.corpus, args.output, order=args.order)
    print(f"wrote {args.output}: {n} n-grams, order {args.order}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``ctc`` (``decode``) and ``lm`` (``build``) subcommands to an argparse subparsers object."""
    ctc = subparsers.add_parser("ctc", help="CTC decoding (greedy / prefix beam search with an n-gram LM)")
    ctc_sub = ctc.add_subparsers(dest="ctc_command", metavar="SUBCOMMAND")
    ctc_sub.required = True
    dec = ctc_sub.add_parser("decode", help="decode a .npy of (T, V) or (N, T, V) CTC log-probabilities")
    dec.add_argument("file", help=".npy file of log-probabilities (or logits / probabilities)")
    dec.add_argument("--labels", required=True, help="labels file (one per line) or a string of characters")
    dec.add_argument("--lm", default=None, help="ARPA or KenLM binary n-gram model")
    dec.add_argument("--lm-backend", choices=["auto", "arpa", "kenlm"], default="auto")
    dec.add_argument("--alpha", type=float, default=0.5, help="LM weight (default 0.5)")
    dec.add_argument("--beta", type=float, default=1.5, help="word insertion bonus (default 1.5)")
    dec.add_argument("--beam", type=int, default=100, help="beam width (default 100)")
    dec.add_argument(
        "--pyctcdecode-compat",
        action="store_true",
        help="reproduce pyctcdecode's end-of-utterance scoring quirk (for identical results)",
    )
    dec.add_argument("--greedy", action="store_true", help="best-path decoding instead of beam search")
    dec.add_argument("--json", action="store_true", help="print JSON lines with the top beams")
    dec.add_argument("--top", type=int, default=1, help="beams per utterance in --json output")
    dec.set_defaults(func=_cmd_ctc_decode)

    lm = subparsers.add_parser("lm", help="n-gram language models")
    lm_sub = lm.add_subparsers(dest="lm_command", metavar="SUBCOMMAND")
    lm_sub.required = True
    build = lm_sub.add_parser("build", help="build an interpolated modified Kneser-Ney ARPA from a corpus")
    build.add_argument("corpus", help="text file, one sentence per line")
    build.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    build.add_argument("-o", "--output", required=True, help="output ARPA path")
    build.set_defaults(func=_cmd_lm_build)
