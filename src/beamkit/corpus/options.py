"""What a corpus run decodes with: the model and search settings every worker receives (a frozen record)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from beamkit._checks import check_float, check_int

G2P_MODEL = "g2p-en"
HF_PREFIX = "hf:"
LM_BACKENDS = ("auto", "arpa", "kenlm")


def _flag(field: str) -> str:
    """A field as users see it on both sides: ``n_best (--n-best)``."""
    return f"{field} (--{field.replace('_', '-')})"


def check_finite(field: str, value: object) -> float:
    """``value`` as a float, or a TypeError / ValueError naming ``field`` (a finite number is expected)."""
    return check_float(_flag(field), value)


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
        """Raise TypeError / ValueError / FileNotFoundError, naming the field, for settings no worker could run
        (checked before any starts)."""
        if self.model is not None and not isinstance(self.model, str):
            raise TypeError(f"{_flag('model')} must be a string, got {self.model!r}")
        check_int(_flag("beam"), self.beam, 1)
        check_int(_flag("n_best"), self.n_best, 1)
        if self.n_best > self.beam:
            raise ValueError(f"{_flag('n_best')} must be between 1 and --beam ({self.beam}), got {self.n_best}")
        if self.max_len is not None:
            check_int(_flag("max_len"), self.max_len, 1)
        check_int("threads", self.threads, 1)
        if self.length_penalty is not None:
            check_finite("length_penalty", self.length_penalty)
        check_finite("alpha", self.alpha)
        check_finite("beta", self.beta)
        if self.lm_backend not in LM_BACKENDS:
            raise ValueError(f"{_flag('lm_backend')} must be one of {', '.join(LM_BACKENDS)}, got {self.lm_backend!r}")
        if self.labels is not None and not all(isinstance(lab, str) for lab in self.labels):
            raise TypeError(f"{_flag('labels')} must be strings, got {self.labels!r}")
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

    def files(self) -> dict[str, Path | None]:
        """The files whose contents, besides the input, determine the output: the model's checkpoint (a folder
        or file; None for CTC) and the CTC language model (None without one)."""
        kind = self.kind
        if kind == "ctc":
            model = None
        elif kind == "hf":
            model = Path(str(self.model)[len(HF_PREFIX) :])
        elif kind == "g2p":
            from beamkit.models.g2p import checkpoint_path

            model = checkpoint_path()
        else:
            from beamkit.models import resolve_model

            model = resolve_model(self.model)
        return {"model": model, "lm": Path(self.lm) if self.lm is not None else None}

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that change the output (everything but the thread count), for the run's manifest."""
        fields = asdict(self)
        del fields["threads"]
        if fields["labels"] is not None:
            fields["labels"] = list(fields["labels"])
        return fields
