"""The Ray back-end: the same batches through Ray Data (``map_batches`` with an actor pool, one model per actor).

``decode_dataset`` is the pipeline API: it appends decoding to any ``ray.data.Dataset`` of ``text`` (or, for CTC,
``path``) rows. ``ray_results`` is what ``beamkit decode --ray`` runs: one dataset row per decoding batch, so
each search sees exactly the batch the local back-end would give it (same results, bit for bit).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from beamkit._checks import check_int
from beamkit.corpus.decoder import CorpusDecoder
from beamkit.corpus.inputs import Item
from beamkit.corpus.options import DecodeOptions
from beamkit.extras import install_hint


def import_ray() -> Any:
    """Import ray, or raise ImportError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the Ray back-end needs ray[data]: {install_hint('ray')} ({exc})") from exc
    return ray


_HOST_PORT = re.compile(r"^(?:ray://)?(\[[^\]]+\]|[^:/\[\]]+):(\d+)$")


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise RuntimeError naming ``address`` when it is a ``HOST:PORT`` (or ``ray://HOST:PORT``) that nothing
    accepts a connection at within ``timeout`` seconds; ``ray.init`` would wait there for minutes. Other forms
    (``auto``, ``local``) are left to Ray."""
    found = _HOST_PORT.match(address.strip())
    if found is None:
        return
    host, port = found.group(1).strip("[]"), int(found.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise RuntimeError(f"no Ray cluster answers at {address} ({exc.strerror or exc})") from None


def start_ray(address: str | None) -> bool:
    """Connect to Ray unless already connected: the cluster at ``address`` (shipping this beamkit to its workers)
    or, with None, ``ray.init()``'s default (RAY_ADDRESS, else a new local instance). Return whether we started it.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    import logging

    import beamkit

    if address:
        check_reachable(address)
        package = str(Path(beamkit.__file__).parent)
        ray.init(address=address, logging_level=logging.WARNING, runtime_env={"py_modules": [package]})
    else:
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
    return True


def _quiet_data_context() -> None:
    import logging

    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # beamkit's own bar counts inputs
    logging.getLogger("ray.data").setLevel(logging.ERROR)


def _bound(actor: type, options: DecodeOptions) -> type:
    """A subclass of ``actor`` carrying ``options`` as a class attribute: shipped with the class itself, so a
    restarted actor never depends on constructor arguments held in the object store."""
    return type(actor.__name__, (actor,), {"options": options})


def _actor_pool(ray: Any, workers: int) -> Any:
    return ray.data.ActorPoolStrategy(size=workers)


class BatchDecoder:
    """Ray Data actor of ``beamkit decode --ray``: each row holds one batch of items as JSON."""

    options: DecodeOptions

    def __init__(self) -> None:
        """Load the model once for this actor."""
        self.decoder = CorpusDecoder(self.options)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Decode each row's items; return the rows' keys and their records as JSON."""
        out = []
        for payload in batch["items"]:
            items = [Item(*fields) for fields in json.loads(str(payload))]
            out.append(json.dumps(self.decoder.decode_items(items)))
        return {"batch": np.asarray(batch["batch"]), "records": np.asarray(out, dtype=object)}


def ray_results(
    options: DecodeOptions, batches: Iterable[tuple[int, list[Item]]], workers: int, address: str | None = None
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Decode ``(key, items)`` batches on ``workers`` Ray actors; yield ``(key, records)`` as they arrive."""
    ray = import_ray()
    started = start_ray(address)
    try:
        _quiet_data_context()
        rows = [{"batch": key, "items": json.dumps([list(item) for item in items])} for key, items in batches]
        if not rows:
            return
        # one block per batch (up to 10,000): tasks are small, so results stream and the actors share the tail
        ds = ray.data.from_items(rows, override_num_blocks=min(len(rows), 10_000))
        decoded = ds.map_batches(
            _bound(BatchDecoder, options), compute=_actor_pool(ray, workers), batch_size=1, num_cpus=1,
            batch_format="numpy",
        )  # fmt: skip
        for row in decoded.iter_rows():
            yield int(row["batch"]), json.loads(row["records"])
    finally:
        if started:
            ray.shutdown()


class RowDecoder:
    """Ray Data actor of :func:`decode_dataset`: a batch of ``text`` (or ``path``) rows, optional ``id``."""

    options: DecodeOptions

    def __init__(self) -> None:
        """Load the model once for this actor."""
        self.decoder = CorpusDecoder(self.options)
        self.column = "path" if self.options.kind == "ctc" else "text"

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Decode the batch in one search; add ``input``, best ``text`` / ``logprob`` / ``score``, ``n_best``
        (JSON) and ``error`` ("" when none) columns to the input columns."""
        values = [str(v) for v in batch[self.column]]
        ids = [v.item() if isinstance(v, np.generic) else v for v in batch["id"]] if "id" in batch else values
        items = []
        for i, (value, item_id) in enumerate(zip(values, ids, strict=True)):
            if self.column == "path":
                items.append(Item(i, item_id, Path(value).name, path=value))
            else:
                items.append(Item(i, item_id, value, error=None if value.strip() else "empty input"))
        records = self.decoder.decode_items(items)
        best = [r["n_best"][0] if r["n_best"] else {"text": "", "logprob": np.nan, "score": np.nan} for r in records]
        return {
            **batch,
            "input": np.asarray([r["input"] for r in records], dtype=object),
            "text": np.asarray([b["text"] for b in best], dtype=object),
            "logprob": np.asarray([b["logprob"] for b in best], dtype=np.float64),
            "score": np.asarray([b["score"] for b in best], dtype=np.float64),
            "n_best": np.asarray([json.dumps(r["n_best"]) for r in records], dtype=object),
            "error": np.asarray([r["error"] or "" for r in records], dtype=object),
        }


def decode_dataset(
    ds: Any, model: str | None = None, *, concurrency: int = 1, batch_size: int = 32, **options: Any
) -> Any:
    """Append beam-search decoding to a ``ray.data.Dataset``; return the decoded dataset (lazy, like Ray Data).

    Rows need a ``text`` column (CTC: ``path`` of a ``.npy`` file readable by the workers, with ``labels=``) and
    may carry an ``id``. ``concurrency`` actors each load the model once; each Ray batch of ``batch_size`` rows is
    one batched search. ``**options`` are :class:`~beamkit.corpus.DecodeOptions` fields (``beam``, ``n_best``,
    ``length_penalty``, ``max_len``, ``labels``, ``lm``, ...). Output rows keep their columns and gain ``input``,
    ``text``, ``logprob``, ``score`` (the best hypothesis; NaN on error), ``n_best`` (JSON) and ``error``.
    """
    ray = import_ray()
    if "labels" in options and options["labels"] is not None:
        options["labels"] = tuple(options["labels"])
    opts = DecodeOptions(model=model, **options)
    opts.check()
    check_int("concurrency", concurrency, least=1)
    check_int("batch_size", batch_size, least=1)
    _quiet_data_context()
    return ds.map_batches(
        _bound(RowDecoder, opts), compute=_actor_pool(ray, concurrency), batch_size=batch_size, num_cpus=1,
        batch_format="numpy",
    )  # fmt: skip
