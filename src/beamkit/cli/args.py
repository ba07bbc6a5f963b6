"""The option groups several commands share, declared once: the model, the search, the n-gram LM and the
rendering of a drawing. Each command adds the groups it takes, so ``--beam`` means the same everywhere."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from beamkit.cli.types import MAX_SEARCH_BEAM, bounded_int, finite_float, lm_weight, positive_int
from beamkit.textfiles import read_text_file

MODEL_HELP = (
    "the model: a shipped model's name (default: {default}; `beamkit models` lists them), a beamkit checkpoint "
    "folder, g2p-en (the pretrained English grapheme-to-phoneme model), hf:DIR (a Hugging Face model folder "
    "with its tokenizer), or ov:DIR (an OpenVINO IR folder with its tokenizer)"
)


def add_command(
    subparsers: Any, name: str, summary: str, more: str = "", *, run: Callable[[argparse.Namespace], int] | None = None
) -> argparse.ArgumentParser:
    """Add the command ``name`` to ``subparsers``: ``summary`` is its line in ``beamkit --help`` and, with
    ``more``, the description its own ``--help`` starts with; ``run`` is what runs it (given its parsed
    arguments, returning the exit status; None for a command whose sub-commands run)."""
    description = summary[0].upper() + summary[1:] + "." + (f" {more}" if more else "")
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=summary, description=description)
    if run is not None:
        parser.set_defaults(func=run)
    return parser


def add_model_arg(parser: argparse.ArgumentParser, default_name: str = "dates-seq2seq") -> None:
    """Add ``--model SPEC`` (read by :func:`beamkit.adapters.load`); None means the default shipped model."""
    parser.add_argument("--model", default=None, metavar="SPEC", help=MODEL_HELP.format(default=default_name))


def add_search_args(
    parser: argparse.ArgumentParser,
    beam: int | None = 5,
    beam_help: str = "beam width (1 = greedy)",
    n_best: int | None = None,
    n_best_help: str = "hypotheses per input (default: --beam)",
    length_penalty: float | None = 1.0,
    length_penalty_help: str = "alpha in logprob / len**alpha",
    max_len_help: str = "most output tokens (default: the model's)",
    with_n_best: bool = True,
) -> None:
    """Add ``--beam``, ``--n-best`` (left out with ``with_n_best=False``), ``--length-penalty`` and
    ``--max-len``, each parsed by the shared types (a beam of 0 or an infinite alpha is a usage error naming the
    option; a beam wider than :data:`~beamkit.cli.types.MAX_SEARCH_BEAM` too)."""
    if "at most" not in beam_help:
        beam_help = f"{beam_help}; at most {MAX_SEARCH_BEAM:,}"
    parser.add_argument("--beam", type=bounded_int(1, MAX_SEARCH_BEAM), default=beam, help=beam_help)
    if with_n_best:
        parser.add_argument("--n-best", type=positive_int, default=n_best, help=n_best_help)
    parser.add_argument("--length-penalty", type=finite_float, default=length_penalty, help=length_penalty_help)
    parser.add_argument("--max-len", type=positive_int, default=None, help=max_len_help)


def add_render_args(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    """Add ``--format`` (one of ``formats``, the first the default), ``-o/--output`` (default: stdout) and
    ``--force`` (replace an existing ``-o`` file)."""
    parser.add_argument("--format", choices=formats, default=formats[0], help="output format")
    parser.add_argument("-o", "--output", default=None, help="output file (default: stdout)")
    add_force_arg(parser, "-o")


def add_force_arg(parser: argparse.ArgumentParser, option: str = "--output") -> None:
    """Add ``--force``: replace an existing ``option`` file (see :func:`check_output`)."""
    parser.add_argument("--force", action="store_true", help=f"replace an existing {option} file")


def check_output(
    path: str,
    option: str,
    force: bool,
    inputs: Iterable[str | None] = (),
    resumable: bool = False,
    makes_folder: bool = False,
    input_name: str = "input",
) -> None:
    """The one rule of every command that writes a file, checked before any work: refuse ``path`` (given as
    ``option``) when it is one of ``inputs``, a folder, in a folder that does not exist (unless ``makes_folder``:
    the command creates it) or cannot be written, or an existing file unless ``force`` (or ``resumable``: a file
    this command wrote in an earlier run, which a rerun resumes). A device or a pipe (``/dev/null``,
    ``/dev/stdout``) is written as it is. ValueError / FileNotFoundError for a usage error, PermissionError for
    a folder that cannot be written, each naming ``option`` and ``path`` as given.
    ``input_name`` is what the message calls the inputs.
    """
    out = Path(path)
    for source in inputs:
        if source is None:
            continue
        same = out.absolute() == Path(source).absolute()
        if not same and out.exists() and Path(source).exists():
            same = os.path.samefile(out, source)
        if same:
            raise ValueError(f"{option} {path} is the {input_name} {source}; choose another output file")
    if out.is_dir() or path.endswith(("/", os.sep)):
        raise ValueError(f"{option} {path} is a folder, not a file; give the file to write")
    if out.exists() and not out.is_file():
        return  # a device or a pipe: nothing is replaced
    folder = out.parent
    if not folder.is_dir():
        if not makes_folder or folder.exists():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise FileNotFoundError(f"{option} {path}: the output folder {folder} {what}")
        while not folder.is_dir() and folder != folder.parent:  # the nearest folder above that exists
            folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise PermissionError(f"{option} {path}: cannot write in the folder {folder} ({exc.strerror})") from None
    if out.exists() and not (force or resumable):
        raise ValueError(f"{option} {path} exists; add --force to replace it")


def add_lm_args(parser: argparse.ArgumentParser, backend: bool = True) -> None:
    """Add ``--lm PATH`` (a word n-gram model; default none), ``--lm-backend`` (how to read it; left out with
    ``backend=False``), ``--alpha`` and ``--beta`` (its fusion weights). Giving a weight without ``--lm`` is
    the command's error to raise: ``namespace.given`` names the options given (see :func:`lm_options_given`)."""
    from beamkit.lm import KENLM_MAX_ORDER

    parser.add_argument(
        "--lm", metavar="PATH", default=None, help="ARPA or KenLM binary word n-gram model (default: none, no LM)"
    )
    if backend:
        parser.add_argument(
            "--lm-backend",
            choices=["auto", "arpa", "kenlm"],
            default="auto",
            help="how to read --lm: kenlm (the kenlm module; ARPA or binary), arpa (beamkit's pure-Python ARPA "
            f"reader, any order), auto (kenlm when installed and the order is <= {KENLM_MAX_ORDER}, else arpa)",
        )
    parser.add_argument(
        "--alpha", type=lm_weight, default=0.5, action=StoreGiven, help="LM weight, -1000 to 1000 (needs --lm)"
    )
    parser.add_argument(
        "--beta",
        type=lm_weight,
        default=1.5,
        action=StoreGiven,
        help="word insertion bonus, -1000 to 1000 (needs --lm)",
    )


class StoreGiven(argparse.Action):
    """Store the option's value and note in ``namespace.given`` that it was given (its default is not)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:  # fmt: skip
        """Store ``values`` and add the option to ``namespace.given``."""
        setattr(namespace, self.dest, values)
        namespace.given = frozenset(getattr(namespace, "given", frozenset())) | {self.option_strings[0]}


def lm_options_given(namespace: argparse.Namespace) -> frozenset[str]:
    """The options of :func:`add_lm_args` (and any other using its recording action) given on the command line."""
    return frozenset(getattr(namespace, "given", frozenset()))


def read_labels(path: str | None, alphabet: str | None = None) -> list[str]:
    """The CTC labels of ``--labels FILE`` (UTF-8, one label a line, ``<space>`` or a single space for the word
    delimiter; the file must exist) or, when given, of ``--alphabet STRING`` (one label per character)."""
    if alphabet is not None:
        if not alphabet:
            raise ValueError("--alphabet is empty")
        return list(alphabet)
    if path is None or not os.path.exists(path) or os.path.isdir(path):
        what = "is a directory" if path is not None and os.path.isdir(path) else "not found"
        raise FileNotFoundError(f"labels file {what}: {path} (use --alphabet for a string of characters)")
    lines = read_text_file(path, "labels file").split("\n")  # UTF-8; a byte-order mark is dropped
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return [" " if lab in ("<space>", " ") else lab for lab in lines]


def parse_blank(spec: str | None) -> int | str | None:
    """``--blank``: an integer is a column index, anything else a label (None: the decoder finds it)."""
    if spec is None:
        return None
    try:
        return int(spec)
    except ValueError:
        return spec
