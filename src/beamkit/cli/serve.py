"""The ``beamkit serve`` subcommand: an OpenAI-compatible completions server on the continuous engine.

``register(subparsers)`` adds it to the top-level parser (see :mod:`beamkit.cli`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
from typing import Any

from beamkit._checks import check_int
from beamkit.extras import install_hint
from beamkit.serve.protocol import MAX_BODY_BYTES, MAX_REQUEST_COST

API_KEY_ENV = "BEAMKIT_API_KEY"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port). ValueError for an address that does not
    resolve, OSError (naming the address) when it cannot be bound, e.g. a port in use."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r} is not an address this machine can listen on ({exc.strerror})") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket, with the port it really got."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def needs_key_warning(host: str, key: str | None) -> bool:
    """Whether serving on ``host`` without ``key`` deserves a warning: an address other machines may reach
    (anything but loopback: ``0.0.0.0``, ``::``, a LAN address, a host name other than ``localhost``)."""
    if key is not None or host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to an address others reach
        return True


def run_server(app: Any, host: str, port: int, log_level: str = "warning", sock: socket.socket | None = None) -> int:
    """Serve ``app`` with uvicorn until SIGTERM / SIGINT: stop accepting, finish the running requests, return 0.

    ``sock``: an already bound socket (:func:`bind`) to serve on instead of binding ``host``:``port``."""
    import uvicorn

    # uvicorn re-raises the signal it caught once it has shut down; a handler here makes that a no-op, so the
    # process exits 0 after a graceful shutdown instead of dying of the re-raised SIGTERM
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=None)
    server = uvicorn.Server(config)
    server.run(sockets=None if sock is None else [sock])
    return 0 if server.started else 1


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the model, build the app, serve it."""
    if args.threads is not None:
        check_int("--threads", args.threads, 1)
    if args.log_level not in LOG_LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {args.log_level!r}")
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"--api-key (or {API_KEY_ENV}) must not be empty")
    if args.max_request_rows is not None:
        check_int("--max-request-rows", args.max_request_rows, 1)
    for name in ("port", "max_queue", "max_rows", "max_body_bytes", "max_request_cost"):
        value = getattr(args, name)
        low = 0 if name == "port" else 1
        if value < low or (name == "port" and value > 65535):
            raise ValueError(
                f"--{name.replace('_', '-')} must be {'0..65535' if name == 'port' else '>= 1'}, got {value}"
            )
    try:
        from beamkit.serve.adapters import load_adapter
        from beamkit.serve.app import create_app

        adapter = load_adapter(args.model, allow_pickle=args.allow_pickle)
    except ImportError as exc:
        print(f"beamkit serve: error: {exc} ({install_hint('serve')})", file=sys.stderr)
        return 2
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    sock = bind(args.host, args.port)
    app = create_app(
        adapter,
        max_queue=args.max_queue,
        max_rows=args.max_rows,
        api_key=key,
        max_body_bytes=args.max_body_bytes,
        max_request_cost=args.max_request_cost,
        max_request_rows=args.max_request_rows,
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
    about = "OpenAI-compatible completions server (continuous batching, beams)"
    p = subparsers.add_parser(
        "serve",
        help=about,
        description=f"{about}: one step-wise engine per process, requests join it as they arrive.",
    )
    p.add_argument(
        "--model", default=None, help="shipped model name, checkpoint folder, or hf:DIR (default dates-seq2seq)"
    )
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="let hf:DIR load pickled weights (pytorch_model.bin), which can run code: only for a trusted folder",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: ${API_KEY_ENV}, "
        "which keeps the key out of the process list; without either, no key is required)",
    )
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port; the one taken is printed)")
    p.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting to join the engine at most; more get 503"
    )
    p.add_argument("--max-rows", type=int, default=256, help="beam rows in the engine at most")
    p.add_argument(
        "--max-request-rows",
        type=int,
        default=None,
        help="beam rows one request holds at most, leaving room for requests that arrive behind it "
        "(default: half of --max-rows)",
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="request body size at most; larger gets 413"
    )
    p.add_argument(
        "--max-request-cost",
        type=int,
        default=MAX_REQUEST_COST,
        help="prompts x beam width x max_tokens of one request at most; more gets 400",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads, >= 1 (default: torch's)")
    p.add_argument("--log-level", default="warning", help=f"uvicorn log level: {', '.join(LOG_LEVELS)}")
    p.set_defaults(func=cmd_serve)
