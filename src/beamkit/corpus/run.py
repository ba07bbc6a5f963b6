"""``decode_corpus``: read a corpus, decode the shards not yet finished on a back-end, assemble the output."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beamkit._checks import check_int
from beamkit.corpus.inputs import Item, input_digest, read_inputs
from beamkit.corpus.options import DecodeOptions
from beamkit.corpus.shards import ShardPlan, ShardStore, path_sha256

_CLEAN_END = b'"error": null}\n'


@dataclass(frozen=True)
class CorpusResult:
    """What a run did: inputs in the output, how many are errors, shards decoded now / kept from before."""

    output: str
    inputs: int
    errors: int
    shards_decoded: int
    shards_reused: int
    seconds: float


def _progress(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience; decoding does not need it
        return None
    return tqdm(total=total, initial=initial, unit="input", desc="decode", file=sys.stderr, smoothing=0.1)


def _batches(items: list[Item], plan: ShardPlan, shards: list[int], batch_size: int) -> list[tuple[int, list[Item]]]:
    """Each pending shard cut into batches of ``batch_size``, keyed by their first input's position."""
    out = []
    for shard in shards:
        span = plan.span(shard)
        for start in range(span.start, span.stop, batch_size):
            out.append((start, items[start : min(start + batch_size, span.stop)]))
    return out


def decode_corpus(
    input: str | Path,
    output: str | Path,
    options: DecodeOptions,
    *,
    workers: int = 1,
    ray: str | None = None,
    batch_size: int = 32,
    shard_size: int = 1000,
    progress: bool = False,
    on_batch: Callable[[int], None] | None = None,
) -> CorpusResult:
    """Decode every input of ``input`` into the JSONL file ``output`` (one object per input, input order).

    ``workers`` processes (or, with ``ray`` set, Ray actors: ``""`` for ``ray.init()``'s default, else a cluster
    address) each load the model once. Shards of ``shard_size`` inputs are written to ``OUTPUT.parts/`` as they
    finish; rerunning the same call decodes only the missing ones (and any whose SHA-256 no longer matches the
    manifest's); a changed input, model file, LM or option is refused as a different run. Every argument is
    checked (TypeError / ValueError naming it) before anything is written. Bad inputs become records with
    ``error``.
    ``progress`` shows a tqdm bar on stderr; ``on_batch(n)`` is called as each batch of ``n`` inputs arrives.
    """
    _check_call(input, output, options, workers, ray, batch_size, shard_size)
    began = time.perf_counter()
    items = read_inputs(input)
    plan = ShardPlan(len(items), shard_size)
    files = {name: None if path is None else path_sha256(path) for name, path in options.files().items()}
    run = {
        "input": input_digest(input), **files, "options": options.fingerprint_fields(), "batch_size": batch_size,
    }  # fmt: skip
    store = ShardStore(output, plan, run)
    done = store.open()
    pending = [s for s in range(plan.shards) if s not in set(done)]
    reused = len(done)
    if pending:
        results = _backend_results(options, _batches(items, plan, pending, batch_size), workers, ray)
        bar = _progress(plan.count, sum(len(plan.span(s)) for s in done), progress)
        try:
            _write_shards(results, plan, store, done, bar, on_batch)
        finally:
            if bar is not None:
                bar.close()
    if len(done) != plan.shards:
        raise RuntimeError(f"{plan.shards - len(done)} shards were not decoded")
    store.assemble()
    with Path(output).open("rb") as fh:
        errors = sum(1 for line in fh if not line.endswith(_CLEAN_END))
    return CorpusResult(str(output), plan.count, errors, len(pending), reused, time.perf_counter() - began)


def _check_call(
    input: Any, output: Any, options: Any, workers: Any, ray: Any, batch_size: Any, shard_size: Any
) -> None:
    """Refuse a bad argument of :func:`decode_corpus` (TypeError / ValueError naming it) before anything runs."""
    for role, path in (("input", input), ("output", output)):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{role} must be a path (a str or os.PathLike), got {path!r}")
    if not isinstance(options, DecodeOptions):
        raise TypeError(f"options must be a DecodeOptions, got {options!r}")
    options.check()
    for name, value in (("workers", workers), ("batch_size", batch_size), ("shard_size", shard_size)):
        check_int(f"{name} (--{name.replace('_', '-')})", value, 1)
    if ray is not None and not isinstance(ray, str):
        raise TypeError(f"ray must be a cluster address (a string) or None, got {ray!r}")


def _backend_results(
    options: DecodeOptions, batches: list[tuple[int, list[Item]]], workers: int, ray: str | None
) -> Iterable[tuple[int, list[dict[str, Any]]]]:
    """The decoded batches ``(first position, records)`` as they finish, from Ray actors (``ray`` set) or local
    worker processes."""
    if ray is not None:
        from beamkit.corpus.ray_backend import ray_results

        return ray_results(options, batches, workers, ray or None)
    from beamkit.corpus.local import local_results

    return local_results(options, batches, workers)


def _write_shards(
    results: Iterable[tuple[int, list[dict[str, Any]]]],
    plan: ShardPlan,
    store: ShardStore,
    done: list[int],
    bar: Any,
    on_batch: Callable[[int], None] | None,
) -> None:
    """Gather the batches of each shard; write a shard (and add it to ``done``) as soon as all its inputs came."""
    partial: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for start, records in results:
        shard = start // plan.size
        got = partial.setdefault(shard, {})
        got[start] = records
        if bar is not None:
            bar.update(len(records))
        if on_batch is not None:
            on_batch(len(records))
        if sum(len(r) for r in got.values()) == len(plan.span(shard)):
            store.finish_shard(shard, [r for s in sorted(got) for r in got[s]])
            done.append(shard)
            del partial[shard]
