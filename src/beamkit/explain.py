"""``beamkit explain``: decode one input with tracing on and draw the search it ran.

    beamkit explain "3rd of March 1999" [--model dates-seq2seq] [--beam 5] [--length-penalty 1] -o search.html
    beamkit explain "Hello" --model hf:DIR -o search.html          # a Hugging Face model folder with its tokenizer
    beamkit explain "3rd of March 1999" --format svg|dot|json -o tree.svg

The trace is the beam search's own record (``record_trace=True``), not a re-run; the greedy decode of the same
input (a beam of one) is drawn along it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from beamkit.extras import install_hint
from beamkit.trace import Trace

FORMATS = ("html", "svg", "dot", "json")


def explain_dates(
    text: str,
    model: Any = None,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    policy: str = "narrow",
) -> Trace:
    """The trace of a dates model (a shipped name, a checkpoint path or a loaded model) decoding ``text``, with
    the greedy decode's tokens and the target vocabulary set."""
    from beamkit.models import load_model
    from beamkit.models.common import encode_sources, inference, model_inputs, pad_batch
    from beamkit.search import BeamSearch, make_options

    net = model if model is not None and not isinstance(model, (str, Path)) else load_model(model)
    limit = int(max_len if max_len is not None else getattr(net, "meta", {}).get("max_len", 12))
    src, lengths = pad_batch(encode_sources(net.src_vocab, [text]), net.src_vocab.pad)
    tv = net.tgt_vocab
    runs = []
    with inference(net):
        for beam, trace in ((beam_size, True), (1, False)):
            state = net.init_state(*model_inputs(net, src, lengths))
            opts = make_options(beam, limit, length_penalty=length_penalty, policy=policy, record_trace=trace)
            result = BeamSearch(opts).search(net.step, state, tv.bos, tv.eos)
            if result.errors:
                raise ValueError(result.errors[0])
            runs.append(result)
    beam_run, greedy_run = runs
    assert beam_run.trace is not None and beam_run.trace[0] is not None
    out = beam_run.trace[0].with_vocab(tv)
    out.greedy = list(greedy_run.hypotheses[0][0].tokens)
    out.source = text
    return out


def explain_hf(
    text: str, folder: str, beam_size: int = 5, length_penalty: float = 1.0, max_new_tokens: int | None = None
) -> Trace:
    """The trace of a Hugging Face model folder (model and tokenizer, loaded offline) generating from ``text``
    with :func:`beamkit.hf.generate`, with its greedy decode set."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"no Hugging Face model folder at {folder!r}")
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"explain --model hf:DIR needs transformers: {install_hint('hf')} ({exc})") from exc
    from beamkit.hf import generate

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(folder, local_files_only=True).eval()
    enc = tokenizer([text], return_tensors="pt")
    common: dict[str, Any] = {"max_new_tokens": max_new_tokens, "length_penalty": length_penalty}
    ids, mask = enc["input_ids"], enc.get("attention_mask")
    beam = generate(model, ids, mask, num_beams=beam_size, record_trace=True, return_dict_in_generate=True, **common)
    greedy = generate(model, ids, mask, num_beams=1, return_dict_in_generate=True, **common)
    if not beam.trace or beam.trace[0] is None:
        raise ValueError("this search kept no trace (diverse and constrained searches are not traced)")
    out = beam.trace[0].with_vocab(tokenizer)
    out.greedy = list(greedy.hypotheses[0][0].tokens)
    out.source = text
    return out


def render(trace: Trace, fmt: str) -> str:
    """``trace`` in one of :data:`FORMATS`."""
    from beamkit.viz import to_dot, to_html, to_svg

    if fmt == "html":
        return to_html(trace)
    if fmt == "svg":
        return to_svg(trace)
    if fmt == "dot":
        return to_dot(trace)
    if fmt == "json":
        return trace.to_json(indent=1) + "\n"
    raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def run(args: argparse.Namespace) -> int:
    """``beamkit explain``: trace one search, write the drawing to ``-o`` (or stdout)."""
    if args.beam < 1:
        raise ValueError(f"--beam must be >= 1, got {args.beam}")
    if args.max_len is not None and args.max_len < 1:
        raise ValueError(f"--max-len must be >= 1, got {args.max_len}")
    hf = args.model is not None and args.model.startswith("hf:")
    if hf and args.policy is not None:
        raise ValueError("--policy applies to dates models only; leave it out with --model hf:DIR")
    try:
        if hf:
            trace = explain_hf(args.text, args.model[3:], args.beam, args.length_penalty, args.max_len)
        else:
            policy = args.policy or "narrow"
            trace = explain_dates(args.text, args.model, args.beam, args.length_penalty, args.max_len, policy)
    except ImportError as exc:
        print(f"beamkit explain: error: {exc}", file=sys.stderr)
        return 2
    page = render(trace, args.format)
    if args.output is None:
        sys.stdout.write(page)
        return 0
    Path(args.output).write_text(page, encoding="utf-8")
    best = " ".join(trace.text(t) for t in trace.tokens(trace.result[0])) if trace.result else "-"
    print(f"wrote {args.output}: {len(trace.nodes)} nodes over {len(trace.steps)} steps; best: {best}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``explain`` subcommand."""
    from beamkit.cli import HelpFormatter

    about = "draw the search tree of one decode (HTML, SVG, DOT or JSON)"
    p = subparsers.add_parser(
        "explain",
        help=about,
        description="Draw the search tree of one decode: every candidate considered, which ran on, which were "
        "pruned, which finished, and the greedy path (HTML opens offline in a browser).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("text", help="the input, e.g. '3rd of March 1999'")
    p.add_argument(
        "--model", default=None, help="dates model name or checkpoint path (default dates-seq2seq), or hf:DIR"
    )
    p.add_argument("--beam", type=int, default=5, help="beam width")
    p.add_argument("--length-penalty", type=float, default=1.0, help="alpha in logprob / len**alpha")
    p.add_argument("--max-len", type=int, default=None, help="most output tokens (default: the model's; hf: 20)")
    p.add_argument(
        "--policy",
        choices=["narrow", "pool", "compete"],
        default=None,
        help="search policy (dates models only; default: narrow)",
    )
    p.add_argument("--format", choices=FORMATS, default="html", help="output format")
    p.add_argument("-o", "--output", default=None, help="output file (default: stdout)")
    p.set_defaults(func=run)
