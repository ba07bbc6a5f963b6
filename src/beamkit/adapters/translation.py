"""Batched decoding of texts with a beamkit checkpoint (Seq2Seq or Transformer, torch or numpy), fused with an LM
when one is given: the checkpoint's front door to the one batched text driver,
:func:`beamkit.adapters.decode_texts`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from beamkit._checks import check_int
from beamkit.adapters.base import ModelAdapter
from beamkit.adapters.checkpoint import CheckpointAdapter
from beamkit.adapters.driver import TextHypothesis, decode_texts
from beamkit.adapters.fusion import FusedAdapter
from beamkit.progress import Progress


def translate(
    model: Any,
    texts: Sequence[str],
    beam_size: int = 5,
    num_return: int | None = None,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
    lm: Any = None,
    lm_weight: float = 0.0,
    **options: Any,
) -> list[list[TextHypothesis]]:
    """Decode ``texts`` with ``model`` (Seq2Seq or Transformer, torch or numpy) by beam search; return each
    one's n-best (``num_return`` of them, default ``beam_size``) as :class:`beamkit.adapters.TextHypothesis`
    records (text, tokens, logprob, score, finished).

    The model is decoded through its :class:`beamkit.adapters.CheckpointAdapter` by
    :func:`beamkit.adapters.decode_texts`: sources in batches of ``batch_size``, each batch one search.
    ``beam_size=1`` is greedy decoding. Empty strings, unknown characters and sources longer than the model
    takes raise ValueError. ``progress`` (a bar from :func:`beamkit.progress.progress_bar`) advances by one per
    input, in steps as each batch's search runs.
    With an ``lm`` (a step function over the target ids with ``init_state(n)``, such as
    :class:`beamkit.NGramLM`), the model is fused with it (:class:`beamkit.adapters.FusedAdapter`,
    ``lm_weight``); ``logprob`` is then the fused score. Other ``options`` are :class:`beamkit.SearchOptions`
    fields, as :func:`beamkit.search_batch` takes them.
    """
    check_int("beam_size", beam_size, 1)
    if num_return is not None:
        check_int("num_return", num_return, 1, beam_size)
    adapter: ModelAdapter = CheckpointAdapter(model, type(model).__name__)
    if lm is not None:
        adapter = FusedAdapter(adapter, lm, lm_weight)
    return decode_texts(
        adapter, texts, beam_size, num_return, max_len, length_penalty, batch_size=batch_size, progress=progress,
        **options,
    )  # fmt: skip
