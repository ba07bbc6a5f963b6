"""What a corpus run decodes with: the model and search settings every worker receives (a frozen record)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from beamkit._checks import check_choice, check_float, check_int

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
        """``"ctc"``, or the kind of ``--model`` (:data:`beamkit.adapters.KINDS`: ``"checkpoint"``, ``"g2p"``,
        ``"hf"``); FileNotFoundError / ValueError for a ``--model`` that names no model."""
        if self.labels is not None:
            return "ctc"
        return self.spec().kind

    def spec(self) -> Any:
        """``--model`` read by the one grammar (:func:`beamkit.adapters.parse`)."""
        from beamkit.adapters import parse

        return parse(self.model)

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
        check_choice(_flag("lm_backend"), self.lm_backend, LM_BACKENDS)
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
        if kind == "g2p":
            from beamkit.adapters.g2p import check_max_len

            check_max_len(self.max_len)

    def files(self) -> dict[str, Path | None]:
        """The files whose contents, besides the input, determine the output: the model's checkpoint (a folder
        or file; None for CTC) and the CTC language model (None without one)."""
        if self.kind == "ctc":
            model = None
        elif self.kind == "g2p":
            from beamkit.models.g2p import checkpoint_path

            model = checkpoint_path()
        else:
            model = Path(self.spec().target)
        return {"model": model, "lm": Path(self.lm) if self.lm is not None else None}

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that change the output (everything but the thread count), for the run's manifest."""
        fields = asdict(self)
        del fields["threads"]
        if fields["labels"] is not None:
            fields["labels"] = list(fields["labels"])
        return fields
