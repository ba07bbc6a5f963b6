"""Listening for ``beamkit serve``: bind the socket, say where it listens, serve an app with uvicorn until a
signal stops it."""

from __future__ import annotations

import ipaddress
import signal
import socket
from typing import Any


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
