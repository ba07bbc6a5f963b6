"""Training the dates models on CPU: a plain teacher-forced cross-entropy loop (torch) with a progress bar."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from beamkit._checks import check_float, check_int
from beamkit.models.common import pad_batch
from beamkit.models.vocab import source_vocab, target_vocab
from beamkit.tasks import dates
from beamkit.tasks.train import MAX_LR, ProgressBar, TrainConfig, check_out


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


def train(config: TrainConfig, out: str | Path | None = None, progress: bool = True) -> Any:
    """Train a dates model with ``config``; save it to ``out`` when given; return the model (eval mode).

    Deterministic for a given seed and thread count. Prints a progress bar on stderr when ``progress``.
    ``out`` is checked before training: never inside the shipped models, never an existing file.
    """
    import torch

    from beamkit.models import checkpoint

    if out is not None:
        check_out(out, force=True)
    for name in ("epochs", "batch_size", "train_size"):
        check_int(name, getattr(config, name), 1)
    check_float("lr", config.lr, above=0.0, most=MAX_LR)
    torch.manual_seed(config.seed)
    sv, tv = source_vocab(), target_vocab()
    model = checkpoint.build_model(config.arch, sv.to_list(), tv.to_list(), config.hparams)
    pairs = [(sv.encode(s), tv.encode(t)) for s, t in dates.split("train", limit=config.train_size)]
    rng = random.Random(config.seed)
    steps_per_epoch = (len(pairs) + config.batch_size - 1) // config.batch_size
    total = steps_per_epoch * config.epochs
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=total, pct_start=0.1)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    bar = ProgressBar(total, enabled=progress)
    started = time.monotonic()
    model.train()
    avg = None
    for epoch in range(config.epochs):
        for idx in _batches(pairs, config.batch_size, rng):
            src, lengths, tgt_in, gold = _tensors(pairs, idx)
            logits = model(src, lengths, tgt_in)  # shape: (B, T, V)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), gold.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            value = loss.item()
            if not math.isfinite(value):
                bar.close()
                raise RuntimeError(
                    f"training diverged: the loss is {value} at step {bar.done + 1} of {total}; lower the "
                    f"learning rate (it was {config.lr:g})"
                )
            avg = value if avg is None else 0.98 * avg + 0.02 * value
            bar.update(1, f"epoch {epoch + 1}/{config.epochs} loss {avg:.4f}")
    bar.close()
    model.eval()
    meta = {
        "task": "dates",
        "train": {
            "epochs": config.epochs,
            "lr": config.lr,
            "batch_size": config.batch_size,
            "train_size": len(pairs),
            "seed": config.seed,
            "seconds": round(time.monotonic() - started, 1),
            "final_loss": round(float(avg or 0.0), 5),
        },
        "max_len": 12,
    }
    model.meta = meta
    if out is not None:
        checkpoint.save(model, out, meta)
    return model
