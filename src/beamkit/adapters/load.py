"""The ``--model`` grammar, one for every command and the server, and :func:`load`.

``None`` is the default shipped model; ``hf:DIR`` a Hugging Face model folder with its tokenizer; ``ov:DIR`` an
OpenVINO IR folder with its tokenizer (:mod:`beamkit.openvino`); ``g2p-en`` the
pretrained English grapheme-to-phoneme GRU; a shipped model's name (``beamkit models`` lists them); anything else a
beamkit checkpoint folder's path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from beamkit.adapters.base import ModelAdapter
from beamkit.adapters.g2p import NAME as G2P_MODEL
from beamkit.extras import install_hint

HF_PREFIX = "hf:"
OV_PREFIX = "ov:"
KINDS = ("checkpoint", "g2p", "hf", "openvino")


class ModelSpec(NamedTuple):
    """A parsed ``--model``: its ``kind`` (one of :data:`KINDS`) and ``target`` (the folder of a checkpoint,
    ``hf:DIR`` or ``ov:DIR``, the model's name for g2p-en)."""

    kind: str
    target: Path | str


def parse(spec: str | None) -> ModelSpec:
    """Read ``spec`` by the ``--model`` grammar; a shipped name or checkpoint path is resolved to its folder.
    TypeError for a non-string, ValueError for an empty one or ``hf:`` without a folder, FileNotFoundError for a
    folder that is not there (naming every kind of model ``--model`` takes)."""
    from beamkit.models import resolve_model, shipped_models

    if spec is not None and not isinstance(spec, str):
        raise TypeError(f"--model must be a string, got {type(spec).__name__}")
    if spec is not None and not spec.strip():
        raise ValueError("--model must not be empty")
    if spec is not None and spec.startswith(HF_PREFIX):
        directory = spec[len(HF_PREFIX) :]
        if not directory:
            raise ValueError("--model hf:DIR needs a folder after 'hf:'")
        try:
            from beamkit.hf.loading import check_folder
        except ImportError as exc:
            raise ImportError(f"--model hf:DIR needs torch and transformers: {install_hint('hf')} ({exc})") from exc
        return ModelSpec("hf", check_folder(directory))
    if spec is not None and spec.startswith(OV_PREFIX):
        directory = spec[len(OV_PREFIX) :]
        if not directory:
            raise ValueError("--model ov:DIR needs a folder after 'ov:'")
        if not any((Path(directory) / f"openvino_{name}model.xml").is_file() for name in ("", "encoder_")):
            raise FileNotFoundError(
                f"ov:{directory}: not an OpenVINO IR folder (no openvino_model.xml or openvino_encoder_model.xml in it)"
            )
        return ModelSpec("openvino", Path(directory))
    if spec == G2P_MODEL:
        return ModelSpec("g2p", G2P_MODEL)
    try:
        folder = resolve_model(spec)
    except FileNotFoundError:
        names = ", ".join(shipped_models()) or "none"
        raise FileNotFoundError(
            f"checkpoint not found: --model {spec!r} is neither a shipped model ({names}), a checkpoint folder, "
            f"{G2P_MODEL} nor hf:DIR"
        ) from None
    if not (Path(folder) / "config.json").is_file():
        raise FileNotFoundError(
            f"checkpoint not found: --model {spec!r} is not a beamkit checkpoint folder (no config.json)"
        )
    return ModelSpec("checkpoint", Path(folder))


def load(
    spec: str | None = None, backend: str = "auto", allow_pickle: bool = False, compile: bool | str = False
) -> ModelAdapter:
    """The adapter of the model ``spec`` names (see :func:`parse`).

    ``backend``: how a beamkit checkpoint runs (``"auto"``, ``"numpy"`` or ``"torch"``, see
    :func:`beamkit.models.load_model`). ``allow_pickle``: load an ``hf:DIR`` whose weights are only pickled
    (``pytorch_model.bin``); refused otherwise. ``compile``: run an ``hf:DIR`` model's decoding steps through
    ``torch.compile`` (True: inductor; a string: that backend; see :class:`beamkit.hf.DecoderOnlyStep`);
    ValueError for any other kind of model (their steps are not compiled for requests that join a running
    search)."""
    from beamkit._checks import check_bool, check_choice
    from beamkit.models import BACKENDS, DEFAULT_MODEL, load_model

    check_choice("backend", backend, BACKENDS)
    check_bool("allow_pickle", allow_pickle)
    kind, target = parse(spec)
    if compile is not False and compile is not None and kind != "hf":  # (no torch import: numpy installs)
        raise ValueError(
            f"--compile runs Hugging Face models (--model hf:DIR) only; --model {spec or DEFAULT_MODEL!r} is "
            f"{ {'g2p': 'the g2p-en model', 'openvino': 'an OpenVINO IR'}.get(kind, 'a beamkit checkpoint') }: leave "
            "--compile off"
        )
    if kind == "hf":
        from beamkit.adapters.hf import HFAdapter
        from beamkit.models.compiled import compile_setting

        compile_setting(compile)  # a value that names no backend: TypeError before the model loads
        return HFAdapter(target, allow_pickle=allow_pickle, compile=compile)
    if kind == "openvino":
        try:
            from beamkit.adapters.openvino import OVAdapter
        except ImportError as exc:
            raise ImportError(f"--model ov:DIR needs openvino: {install_hint('openvino')} ({exc})") from exc
        return OVAdapter(target)
    if kind == "g2p":
        from beamkit.adapters.g2p import G2PAdapter

        return G2PAdapter()
    from beamkit.adapters.checkpoint import CheckpointAdapter

    model: Any = load_model(target, backend=backend)
    return CheckpointAdapter(model, Path(spec).name if spec else DEFAULT_MODEL)
