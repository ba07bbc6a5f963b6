"""Batched decoding of texts with a beamkit checkpoint (Seq2Seq or Transformer, torch or numpy), fused with an LM
when one is given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from beamkit._checks import check_int
from beamkit.progress import Progress


@dataclass
class Translation:
    """One output of :func:`translate`: the decoded text and its hypothesis' numbers."""

    text: str
    logprob: float
    score: float
    finished: bool
    tokens: list[int]


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
) -> list[list[Translation]]:
    """Decode ``texts`` with ``model`` (Seq2Seq or Transformer, torch or numpy) by beam search; return each
    one's n-best.

    Sources are encoded in batches of ``batch_size`` and each batch is one :func:`beamkit.search_batch`
    call. ``beam_size=1`` is greedy decoding. Empty strings and unknown characters raise ValueError.
    ``progress`` (a bar from :func:`beamkit.progress.progress_bar`) advances by one per input, in steps as
    each batch's search runs.
    With an ``lm`` (a step function over the target ids with ``init_state(n)``, such as
    :class:`beamkit.NGramLM`), the model is fused with it (:func:`beamkit.fuse`, ``lm_weight``); ``logprob`` is
    then the fused score. Other ``options`` go to :func:`beamkit.search_batch`.
    """
    from beamkit import fuse, search_batch
    from beamkit.models.common import encode_sources, inference, model_inputs, pad_batch
    from beamkit.progress import BatchTicker, Silent

    check_int("batch_size", batch_size, 1)
    ids = encode_sources(model.src_vocab, texts)
    limit = int(max_len if max_len is not None else getattr(model, "meta", {}).get("max_len", 12))
    tv = model.tgt_vocab
    results: list[list[Translation]] = []
    with inference(model):
        for start in range(0, len(ids), batch_size):
            src, lengths = pad_batch(ids[start : start + batch_size], model.src_vocab.pad)
            state = model.init_state(*model_inputs(model, src, lengths))
            step = model.step
            if lm is not None:
                step = fuse(model.step, lm, lm_weight)
                state = step.init_state(state, lm.init_state(src.shape[0]))
            ticker = BatchTicker(progress or Silent(), src.shape[0], limit)
            hyps = search_batch(
                ticker.wrap(step),
                state,
                tv.bos,
                tv.eos,
                beam_size,
                limit,
                length_penalty=length_penalty,
                num_return=num_return,
                **options,
            )
            ticker.done()
            for request in hyps:
                results.append(
                    [
                        Translation(tv.decode(h.tokens), float(h.logprob), float(h.score), h.finished, list(h.tokens))
                        for h in request
                    ]
                )
    return results
