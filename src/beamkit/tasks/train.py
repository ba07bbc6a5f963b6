"""Training the dates models: the shipped models' settings, the run's config, a progress bar, the check of the
output folder and :func:`train_dates` (the run). The training loop itself is torch code:
:func:`beamkit.models.training.fit`."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from beamkit._checks import check_float, check_int

MAX_LR = 1.0  # the highest peak learning rate taken: an Adam step above 1 diverges (1e308 overflows torch)

# The shipped models' settings: sized so that greedy decoding is good but imperfect on the test split.
DEFAULTS: dict[str, dict[str, Any]] = {
    "seq2seq": {
        "hparams": {"emb": 24, "hidden": 64, "layers": 1},
        "epochs": 3,
        "lr": 3e-3,
        "batch_size": 64,
        "train_size": 30_000,
    },
    "transformer": {
        "hparams": {
            "d_model": 64,
            "heads": 4,
            "ff": 128,
            "enc_layers": 2,
            "dec_layers": 2,
            "max_len": 64,
            "dropout": 0.1,
        },
        "epochs": 4,
        "lr": 1e-3,
        "batch_size": 64,
        "train_size": 30_000,
    },
}


@dataclass
class TrainConfig:
    """Settings of one training run (see :data:`DEFAULTS` for the shipped models)."""

    arch: str = "seq2seq"
    epochs: int = 3
    lr: float = 3e-3
    batch_size: int = 64
    train_size: int = 30_000
    seed: int = 0
    hparams: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def default(cls, arch: str, **overrides: Any) -> TrainConfig:
        """The shipped settings for ``arch``, with ``overrides`` (None values ignored) applied."""
        if arch not in DEFAULTS:
            raise ValueError(f"unknown architecture {arch!r}; expected one of {sorted(DEFAULTS)}")
        base = dict(DEFAULTS[arch])
        base["hparams"] = dict(base["hparams"])
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(arch=arch, **base)


class ProgressBar:
    """A minimal text progress bar on a stream (stderr by default); silent when ``enabled`` is False."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True, width: int = 30) -> None:
        self.total, self.done, self.width, self.enabled = max(1, total), 0, width, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()

    def update(self, n: int = 1, note: str = "") -> None:
        """Advance by ``n`` steps and redraw with ``note`` (loss, epoch) after the bar."""
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        frac = self.done / self.total
        filled = int(frac * self.width)
        elapsed = time.monotonic() - self.start
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.0f}s eta {eta:4.0f}s {note}")
        self.stream.flush()

    def close(self) -> None:
        """Finish the bar's line."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def check_out(out: str | Path, force: bool = False) -> None:
    """Refuse a checkpoint folder ``out`` that training must not write: one inside the package's shipped models,
    an existing file, or (unless ``force``) an existing non-empty folder. Raises ValueError naming ``out``."""
    from beamkit.models import SHIPPED_DIR

    path = Path(out).resolve()
    shipped = SHIPPED_DIR.resolve()
    if path == shipped or shipped in path.parents:
        raise ValueError(f"--out {out} is inside beamkit's shipped models; choose a folder of your own")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file; a checkpoint is a folder")
    if not force and path.is_dir() and any(path.iterdir()):
        raise ValueError(f"--out {out} is a folder that is not empty; add --force to write the checkpoint into it")


def train_dates(config: TrainConfig, out: str | Path | None = None, progress: bool = True) -> Any:
    """Train a dates model with ``config``; save it to ``out`` when given; return the model (eval mode).

    Deterministic for a given seed and thread count. Prints a progress bar on stderr when ``progress``.
    ``out`` is checked before training: never inside the shipped models, never an existing file.
    """
    from beamkit.models import checkpoint
    from beamkit.models.training import fit
    from beamkit.tasks import dates

    if out is not None:
        check_out(out, force=True)
    for name in ("epochs", "batch_size", "train_size"):
        check_int(name, getattr(config, name), 1)
    check_float("lr", config.lr, above=0.0, most=MAX_LR)
    pairs = dates.split("train", limit=config.train_size)
    steps = (len(pairs) + config.batch_size - 1) // config.batch_size * config.epochs
    started = time.monotonic()
    model, loss = fit(config, pairs, ProgressBar(steps, enabled=progress))
    model.meta = {
        "task": "dates",
        "train": {
            "epochs": config.epochs,
            "lr": config.lr,
            "batch_size": config.batch_size,
            "train_size": len(pairs),
            "seed": config.seed,
            "seconds": round(time.monotonic() - started, 1),
            "final_loss": round(loss, 5),
        },
        "max_len": 12,
    }
    if out is not None:
        checkpoint.save(model, out, model.meta)
    return model
