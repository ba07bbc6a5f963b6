"""Teacher-forced scoring: the log-probability a model gives a target, independent of any search."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from beamkit.models.common import encode_sources, model_inputs, pad_batch


def _target_ids(model: Any, tgt: str | Sequence[int]) -> list[int]:
    vocab = model.tgt_vocab
    if isinstance(tgt, str):
        return vocab.encode(tgt) + [vocab.eos]
    ids = [int(t) for t in tgt]
    if any(t < 0 or t >= len(vocab) for t in ids):
        raise ValueError(f"target ids out of range [0, {len(vocab)}): {ids}")
    return ids


def score(model: Any, src: str | Sequence[str], tgt: str | Sequence[int] | Sequence[Any]) -> Any:
    """Teacher-forced log-probability (float64) of target ``tgt`` given source ``src``.

    ``tgt`` is a target string (``<eos>`` is appended) or a list of target ids after ``<bos>`` exactly as in a
    :class:`beamkit.Hypothesis` (``<eos>`` included only when finished). With a list of sources and a list of
    targets, returns a float64 array with one log-probability per pair. Log-softmax is taken in float64.
    """
    import torch

    single = isinstance(src, str)
    srcs: list[str] = [src] if isinstance(src, str) else list(src)
    tgts: list[Any] = [tgt] if single else list(tgt)
    if len(srcs) != len(tgts):
        raise ValueError(f"{len(srcs)} sources but {len(tgts)} targets")
    src_ids, lengths = pad_batch(encode_sources(model.src_vocab, srcs), model.src_vocab.pad)
    tgt_ids = [_target_ids(model, t) for t in tgts]
    width = max(1, max(len(t) for t in tgt_ids))
    gold = np.full((len(tgt_ids), width), -1, dtype=np.int64)  # shape: (B, T), -1 = no token
    tgt_in = np.full((len(tgt_ids), width), model.tgt_vocab.pad, dtype=np.int64)  # shape: (B, T)
    for i, t in enumerate(tgt_ids):
        gold[i, : len(t)] = t
        tgt_in[i, 0] = model.tgt_vocab.bos
        tgt_in[i, 1 : len(t)] = t[:-1]
    with torch.inference_mode():
        logits = model(*model_inputs(model, src_ids, lengths, tgt_in))  # on the model's device
        logp = torch.log_softmax(logits.double(), dim=-1).cpu().numpy()  # shape: (B, T, V)
    valid = gold >= 0
    picked = np.take_along_axis(logp, np.where(valid, gold, 0)[..., None], axis=-1)[..., 0]
    totals = np.where(valid, picked, 0.0).sum(axis=1)  # shape: (B,)
    return float(totals[0]) if single else totals
