"""Training a beamkit checkpoint on CPU: a plain teacher-forced cross-entropy loop (torch) over (source, target)
pairs. The dates run that uses it (its data, settings, checks and saved metadata) is
:func:`beamkit.tasks.train.train_dates`."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from beamkit.models.common import pad_batch
from beamkit.models.vocab import source_vocab, target_vocab


def _batches(pairs: Sequence[tuple[list[int], list[int]]], size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(len(pairs)))
    rng.shuffle(order)
    return [order[i : i + size] for i in range(0, len(order), size)]


def _tensors(pairs: Sequence[tuple[list[int], list[int]]], idx: Sequence[int]) -> tuple[Any, ...]:
    import torch

    tv = target_vocab()
    src, lengths = pad_batch([pairs[i][0] for i in idx], source_vocab().pad)
    tgts = [pairs[i][1] + [tv.eos] for i in idx]
    width = max(len(t) for t in tgts)
    gold = np.full((len(idx), width), -100, dtype=np.int64)  # shape: (B, T); -100 = ignored by the loss
    tgt_in = np.full((len(idx), width), tv.pad, dtype=np.int64)  # shape: (B, T)
    for j, t in enumerate(tgts):
        gold[j, : len(t)] = t
        tgt_in[j, 0] = tv.bos
        tgt_in[j, 1 : len(t)] = t[:-1]
    return torch.as_tensor(src), torch.as_tensor(lengths), torch.as_tensor(tgt_in), torch.as_tensor(gold)


def fit(config: Any, pairs: Sequence[tuple[str, str]], bar: Any) -> tuple[Any, float]:
    """Train a new model on ``pairs`` (source, target strings); return it (eval mode) and its final smoothed loss.

    ``config`` gives the model (``arch``, ``hparams``) and the run (``epochs``, ``lr``, ``batch_size``, ``seed``):
    a :class:`beamkit.tasks.train.TrainConfig`. A teacher-forced cross-entropy loop (Adam, one-cycle schedule,
    gradients clipped at 1), deterministic for a given seed and thread count. ``bar`` is told of each step
    (``update(1, note)``) and closed at the end. RuntimeError when the loss stops being finite (the run diverged).
    """
    import torch

    from beamkit.models import checkpoint

    torch.manual_seed(config.seed)
    sv, tv = source_vocab(), target_vocab()
    model = checkpoint.build_model(config.arch, sv.to_list(), tv.to_list(), config.hparams)
    ids = [(sv.encode(s), tv.encode(t)) for s, t in pairs]
    rng = random.Random(config.seed)
    total = (len(ids) + config.batch_size - 1) // config.batch_size * config.epochs
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=total, pct_start=0.1)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    model.train()
    avg, done = None, 0
    for epoch in range(config.epochs):
        for idx in _batches(ids, config.batch_size, rng):
            src, lengths, tgt_in, gold = _tensors(ids, idx)
            logits = model(src, lengths, tgt_in)  # shape: (B, T, V)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), gold.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            value = loss.item()
            done += 1
            if not math.isfinite(value):
                bar.close()
                raise RuntimeError(
                    f"training diverged: the loss is {value} at step {done} of {total}; lower the "
                    f"learning rate (it was {config.lr:g})"
                )
            avg = value if avg is None else 0.98 * avg + 0.02 * value
            bar.update(1, f"epoch {epoch + 1}/{config.epochs} loss {avg:.4f}")
    bar.close()
    model.eval()
    return model, float(avg or 0.0)
