"""The local back-end: N worker processes (spawned, one model each) fed batches by the driver; with one worker
the batches are decoded in the driver's own process (no start-up cost)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

from beamkit import ops
from beamkit.corpus.decoder import CorpusDecoder, uses_torch
from beamkit.corpus.inputs import Item
from beamkit.corpus.options import DecodeOptions

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

_decoder: CorpusDecoder | None = None
_load_error: str | None = None


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)  # the driver is gone (killed): stop instead of decoding for nobody


def _init_worker(options: DecodeOptions, parent: int) -> None:
    global _decoder, _load_error
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        _decoder = CorpusDecoder(options)
    except (ImportError, OSError, ValueError, TypeError, RuntimeError) as exc:
        _load_error = f"{type(exc).__name__}: {exc}"


def _decode(items: list[Item]) -> list[dict[str, Any]]:
    if _decoder is None:
        raise RuntimeError(f"a worker could not load the model: {_load_error}")
    return _decoder.decode_items(items)


@contextmanager
def thread_limit(threads: int) -> Iterator[None]:
    """Set the BLAS / OpenMP thread variables for the processes spawned inside the block (restored after)."""
    saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    os.environ.update({k: str(threads) for k in THREAD_VARIABLES})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _in_process(
    options: DecodeOptions, batches: Iterable[tuple[int, list[Item]]]
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """One worker: the driver decodes; torch's thread count is put back afterwards."""
    with ops.torch_threads_set(options.threads if uses_torch(options) else None):
        decoder = CorpusDecoder(options)
        for key, items in batches:
            yield key, decoder.decode_items(items)


def local_results(
    options: DecodeOptions, batches: Iterable[tuple[int, list[Item]]], workers: int
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Decode ``(key, items)`` batches on ``workers`` processes; yield ``(key, records)`` as each finishes.

    At most two batches per worker are in flight, so the driver never queues the whole corpus. One worker
    decodes in this process.
    """
    if workers == 1:
        yield from _in_process(options, batches)
        return
    todo = iter(batches)
    with thread_limit(options.threads):
        pool = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
            initargs=(options, os.getpid()),
        )  # fmt: skip
        running: dict[Future[list[dict[str, Any]]], int] = {}
        try:
            while True:
                while len(running) < 2 * workers:
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    running[pool.submit(_decode, nxt[1])] = nxt[0]
                if not running:
                    return
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    yield running.pop(fut), fut.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
