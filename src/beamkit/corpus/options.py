"""What a corpus run decodes with: the model and search settings every worker receives (a frozen record)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

G2P_MODEL = "g2p-en"
HF_PREFIX = "hf:"


@dataclass(frozen=True)
class DecodeOptions:
    """Model and search settings for :func:`beamkit.corpus.decode_corpus` and the workers.

    ``model`` is a shipped dates model's name, a checkpoint folder, ``"g2p-en"`` (the pretrained g2p-en GRU) or
    ``"hf:DIR"`` (a Hugging Face model directory); ``labels`` set (and ``model`` None) means CTC posteriors.
    ``length_penalty`` None is the model's default (1.0; a Hugging Face model's generation config).
    ``threads`` is the torch thread count of each worker.
    """

    model: str | None = None
    beam: int = 5
    n_best: int = 1
    length_penalty: float | None = None
    max_len: int | None = None
    labels: tuple[str, ...] | None = None
    lm: str | None = None
    alpha: float = 0.5
    beta: float = 1.5
    lm_backend: str = "auto"
    pyctcdecode_compat: bool = False
    blank: int | str | None = None  # the CTC blank's column or label (None: the one empty / <pad> / <blank> label)
    threads: int = 1

    @property
    def kind(self) -> str:
        """``"ctc"``, ``"hf"``, ``"g2p"`` or ``"dates"`` (a beamkit Seq2Seq / Transformer checkpoint)."""
        if self.labels is not None:
            return "ctc"
        if self.model is not None and self.model.startswith(HF_PREFIX):
            return "hf"
        if self.model == G2P_MODEL:
            return "g2p"
        return "dates"

    def check(self) -> None:
        """Raise ValueError / FileNotFoundError for settings no worker could run (checked before any starts)."""
        if self.beam < 1:
            raise ValueError(f"--beam must be >= 1, got {self.beam}")
        if not 1 <= self.n_best <= self.beam:
            raise ValueError(f"--n-best must be between 1 and --beam ({self.beam}), got {self.n_best}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"--max-len must be >= 1, got {self.max_len}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        kind = self.kind
        if kind == "ctc":
            if self.model is not None:
                raise ValueError("CTC posteriors are decoded with --labels (and --lm), not --model")
            if not self.labels:
                raise ValueError("--labels is empty")
            if self.lm is not None and not os.path.exists(self.lm):
                raise FileNotFoundError(f"no such language model: {self.lm}")
            return
        if self.lm is not None:
            raise ValueError("--lm applies to CTC posteriors (a folder of .npy files with --labels)")
        if kind == "hf":
            folder = Path(str(self.model)[len(HF_PREFIX) :])
            if not (folder / "config.json").is_file():
                raise FileNotFoundError(f"{self.model!r}: {folder} is not a Hugging Face model directory")
        elif kind == "g2p":
            if self.max_len is not None:
                raise ValueError("--max-len does not apply to g2p-en (its decoder stops at 20 phonemes)")
        else:
            from beamkit.models import resolve_model

            resolve_model(self.model)

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that change the output (everything but the thread count), for the run's manifest."""
        fields = asdict(self)
        del fields["threads"]
        if fields["labels"] is not None:
            fields["labels"] = list(fields["labels"])
        return fields
