"""The ``beamkit serve`` subcommand: an OpenAI-compatible completions server on the continuous engine.

``register(subparsers)`` adds it to the top-level parser (see :mod:`beamkit.cli`). The listening itself is
:mod:`beamkit.serve.listen` (``bind``, ``url_of``, ``needs_key_warning`` and ``run_server`` are re-exported here).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from beamkit.cli.args import add_command, add_model_arg
from beamkit.cli.types import non_negative_int, positive_int
from beamkit.extras import install_hint
from beamkit.serve.listen import bind, needs_key_warning, run_server, url_of
from beamkit.serve.protocol import Limits

__all__ = ["bind", "cmd_serve", "needs_key_warning", "register", "run_server", "url_of"]

API_KEY_ENV = "BEAMKIT_API_KEY"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def port_number(text: str) -> int:
    """A TCP port, 0..65535 (0: any free port)."""
    port = non_negative_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0..65535, got {text!r}")
    return port


def trie_spec(text: str) -> tuple[str, str]:
    """``NAME=FILE`` of ``--trie``."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, got {text!r}")
    return name.strip(), path.strip()


def load_tries(specs: list[tuple[str, str]]) -> dict[str, Any]:
    """The dictionaries of ``--trie NAME=FILE`` (a saved ``.npz`` trie, a ``.npy`` array or a text file), by
    name; ValueError naming the option and the file for a name given twice or a file that is not a dictionary."""
    from beamkit.constraints import Trie

    tries: dict[str, Any] = {}
    for name, path in specs:
        if name in tries:
            raise ValueError(f"--trie {name}= is given twice")
        try:
            tries[name] = Trie.load(path) if path.endswith(".npz") else Trie(path)
        except (ValueError, TypeError, OSError) as exc:  # every read error: the option, the file, one line
            raise ValueError(f"--trie {name}={path}: {one_line(exc)}") from None
    return tries


def check_tries(specs: list[tuple[str, str]], tries: dict[str, Any], vocab: int | None) -> None:
    """ValueError naming ``--trie NAME=FILE`` for a dictionary holding a token id past the model's vocabulary
    (``vocab`` ids; None: unknown until the first step, when such a dictionary fails only its own requests)."""
    if vocab is None:
        return
    paths = dict(specs)
    for name, trie in tries.items():
        if trie.max_id >= vocab:
            raise ValueError(
                f"--trie {name}={paths[name]}: the dictionary holds token id {trie.max_id} but the model's "
                f"vocabulary has {vocab} ids (0..{vocab - 1}): build it with this model's tokenizer"
            )


def one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the model, build the app, serve it."""
    from beamkit import ops

    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"--api-key (or {API_KEY_ENV}) must not be empty")
    if args.max_request_rows is not None and args.max_request_rows > args.max_rows:
        raise ValueError(
            f"--max-request-rows {args.max_request_rows} is above --max-rows {args.max_rows}: one request cannot "
            "hold more beam rows than the engine has; lower it or raise --max-rows"
        )
    if args.compile is not None and not args.compile.strip():
        raise ValueError("--compile was given an empty backend name: name one (inductor, max-autotune) or leave it off")
    tries = load_tries(args.trie or [])  # before the model: a bad dictionary fails fast
    try:
        from beamkit.adapters import load
        from beamkit.serve.app import create_app, model_vocab

        # --compile "" is refused as compile="" is (no backend named), not read as "off"
        compile_ = False if args.compile is None else args.compile
        adapter = load(args.model, allow_pickle=args.allow_pickle, compile=compile_)
    except ImportError as exc:
        print(f"beamkit serve: error: {exc} ({install_hint('serve')})", file=sys.stderr)
        return 2
    vocab = model_vocab(adapter) if tries else None
    check_tries(args.trie or [], tries, vocab)  # before listening: a dictionary that does not fit never serves
    ops.set_torch_threads(args.threads)
    sock = bind(args.host, args.port)
    app = create_app(
        adapter,
        max_queue=args.max_queue,
        max_rows=args.max_rows,
        api_key=key,
        max_body_bytes=args.max_body_bytes,
        max_request_cost=args.max_request_cost,
        max_request_rows=args.max_request_rows,
        api_docs=args.api_docs,
        tries=tries,
        vocab_size=vocab,
    )
    if needs_key_warning(args.host, key):
        print(
            f"beamkit serve: warning: {args.host} may be reachable from other machines and no --api-key is set: "
            "anyone who reaches it can use the server",
            file=sys.stderr,
        )
    print(f"beamkit serve: {adapter.name} listening on {url_of(sock)}", file=sys.stderr, flush=True)
    return run_server(app, args.host, args.port, args.log_level, sock=sock)


def register(subparsers: Any) -> None:
    """Add ``serve`` to the ``beamkit`` command line."""
    p = add_command(
        subparsers,
        "serve",
        "OpenAI-compatible completions server (continuous batching, beams)",
        "One step-wise engine per process; requests join it as they arrive.",
        run=cmd_serve,
    )
    add_model_arg(p)
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="let hf:DIR load pickled weights (pytorch_model.bin), which can run code: only for a trusted folder",
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="hf:DIR only: run the decoding steps of GPT-2, Llama-style, T5, BART and Marian models through "
        "torch.compile with BACKEND (default inductor; max-autotune: inductor with autotuned matrix products and "
        "the weights frozen into the graphs; compiled on first use of each batch size bucket, a long "
        "first compilation said on standard error; where the model or torch cannot, the steps run as without it, "
        "the reason logged once); on a CPU the server measured slower with it",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: ${API_KEY_ENV}, "
        "which keeps the key out of the process list; without either, no key is required)",
    )
    p.add_argument("--port", type=port_number, default=8000, help="port (0: any free port; the one taken is printed)")
    add_limit_args(p)
    p.add_argument(
        "--api-docs",
        action="store_true",
        help="serve the API description at /docs, /redoc and /openapi.json (off by default; behind --api-key when "
        "one is set)",
    )
    p.add_argument(
        "--trie",
        type=trie_spec,
        action="append",
        metavar="NAME=FILE",
        help="load a dictionary of valid outputs (one sequence of token ids a line, .npy or a saved .npz trie); "
        'a request\'s "trie": NAME constrains its outputs to it (repeatable; default: none, no request may name one)',
    )
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads, >= 1 (default: torch's)")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="warning", help="uvicorn log level")


#: the flag of each of the server's limits (a field of beamkit.serve.protocol.Limits, whose default it takes) and
#: its help (beyond the limit: 503, 413, 400)
LIMIT_FLAGS = (
    (
        "--max-queue",
        "max_queue",
        "requests waiting to join the engine at most, each counted once whatever its prompts; more get 503",
    ),
    ("--max-rows", "max_rows", "beam rows in the engine at most"),
    (
        "--max-request-rows",
        "request_rows",
        "beam rows one request holds at most, leaving room for requests that arrive behind it; at most --max-rows "
        "(default: half of --max-rows)",
    ),
    ("--max-body-bytes", "max_body_bytes", "request body size at most; larger gets 413"),
    (
        "--max-request-cost",
        "max_request_cost",
        "prompts x beam width x max_tokens of one request at most; more gets 400",
    ),
)


def add_limit_args(p: argparse.ArgumentParser) -> None:
    """The server's limits: queue, beam rows, body size and cost of one request (:data:`LIMIT_FLAGS`)."""
    defaults = Limits()
    for flag, name, about in LIMIT_FLAGS:
        p.add_argument(flag, type=positive_int, default=getattr(defaults, name), help=about)
