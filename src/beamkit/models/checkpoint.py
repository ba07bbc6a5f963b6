"""Save and load model checkpoints: a folder with ``model.safetensors``, ``config.json`` and ``vocab.json``.

``config.json`` names the architecture and its hyper-parameters (plus free-form metadata such as the task and
training figures); ``vocab.json`` holds the source and target symbol lists. Loading checks all three and fails
with a clear error naming the file when one is missing or corrupt.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Any

from beamkit._checks import is_int

CHECKPOINT_FORMAT = "beamkit-checkpoint"
VERSION = 1
WEIGHTS, CONFIG, VOCAB = "model.safetensors", "config.json", "vocab.json"


MODEL_BACKENDS = ("torch", "numpy")


def model_classes(backend: str = "torch") -> dict[str, type]:
    """The model class of each architecture for ``backend``: torch modules, or their numpy inference twins."""
    if backend == "numpy":
        from beamkit.models.numpy_seq2seq import NumpySeq2Seq
        from beamkit.models.numpy_transformer import NumpyTransformer

        return {"seq2seq": NumpySeq2Seq, "transformer": NumpyTransformer}
    if backend != "torch":
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(MODEL_BACKENDS)}")
    from beamkit.models.seq2seq import Seq2Seq
    from beamkit.models.transformer import Transformer

    return {"seq2seq": Seq2Seq, "transformer": Transformer}


def _model_class(arch: str, hparams: dict[str, Any], backend: str) -> type:
    """The class of ``arch`` for ``backend`` once ``hparams`` passed :func:`check_hparams` (same rules for both)."""
    classes = model_classes(backend)
    if arch not in classes:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {sorted(classes)}")
    cls = classes[arch]
    check_hparams(arch, cls, hparams)
    known = set(inspect.signature(cls).parameters) - {"src_vocab", "tgt_vocab", "params"}
    unknown = sorted(set(hparams) - known)
    if unknown:
        raise ValueError(f"bad hyper-parameters for {arch}: unknown {unknown}; expected some of {sorted(known)}")
    return cls


def build_model(arch: str, src_symbols: list[str], tgt_symbols: list[str], hparams: dict[str, Any]) -> Any:
    """Construct an untrained torch model of architecture ``arch`` ("seq2seq" or "transformer")."""
    from beamkit.models.vocab import Vocab

    cls = _model_class(arch, hparams, "torch")
    try:
        return cls(Vocab(tuple(src_symbols)), Vocab(tuple(tgt_symbols)), **hparams)
    except TypeError as exc:
        raise ValueError(f"bad hyper-parameters for {arch}: {exc}") from exc


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_hparams(arch: str, cls: type, hparams: dict[str, Any]) -> None:
    """Refuse hyper-parameters whose type does not fit ``cls``'s signature, naming the key and the value.

    Parameters annotated ``int`` (sizes, layer counts) must be integers >= 1, those annotated ``float`` finite
    numbers; unknown keys are left to the constructor (a TypeError naming them).
    """
    params = inspect.signature(cls).parameters
    for key, value in hparams.items():
        if key not in params:
            continue
        ann = params[key].annotation
        kind = ann if isinstance(ann, str) else getattr(ann, "__name__", "")
        if kind == "int" and not (is_int(value) and value >= 1):
            raise ValueError(f"bad hyper-parameter for {arch}: {key} must be an integer >= 1, got {value!r}")
        if kind == "float" and not _is_number(value):
            raise ValueError(f"bad hyper-parameter for {arch}: {key} must be a finite number, got {value!r}")


def check_meta(folder: Path, meta: Any) -> None:
    """Refuse ``config.json`` metadata that beamkit reads but that has the wrong type (``max_len``, ``test``)."""
    if not isinstance(meta, dict):
        raise ValueError(f"corrupt checkpoint {folder}: {CONFIG} 'meta' must be an object, got {meta!r}")
    max_len = meta.get("max_len", 12)
    if not (is_int(max_len) and max_len >= 1):
        raise ValueError(f"corrupt checkpoint {folder}: {CONFIG} meta.max_len must be an integer >= 1, got {max_len!r}")
    figures = meta.get("test", {})
    if not isinstance(figures, dict) or not all(_is_number(v) for v in figures.values()):
        raise ValueError(f"corrupt checkpoint {folder}: {CONFIG} meta.test must map beam widths to numbers")


def save(model: Any, path: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Save ``model`` (a Seq2Seq or Transformer) into folder ``path``; return the folder."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS))
    (folder / WEIGHTS).chmod(0o644)  # safetensors writes 0600; checkpoints are meant to be shared
    config = {"format": CHECKPOINT_FORMAT, "version": VERSION, "arch": model.arch, "hparams": model.config}
    config["meta"] = meta or {}
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    vocab = {"source": model.src_vocab.to_list(), "target": model.tgt_vocab.to_list()}
    (folder / VOCAB).write_text(json.dumps(vocab) + "\n")
    return folder


def read_config(path: str | Path) -> dict[str, Any]:
    """Read and validate ``config.json`` of the checkpoint folder ``path``."""
    folder = Path(path)
    if not folder.exists():
        raise FileNotFoundError(f"checkpoint not found: {folder}")
    if not folder.is_dir():
        raise ValueError(f"a checkpoint is a folder holding {WEIGHTS}, {CONFIG} and {VOCAB}; got the file {folder}")
    config = _read_json(folder / CONFIG)
    if not isinstance(config, dict) or config.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"corrupt checkpoint {folder}: {CONFIG} is not a {CHECKPOINT_FORMAT} config")
    if config.get("version") != VERSION:
        raise ValueError(f"checkpoint {folder} has version {config.get('version')!r}; this beamkit reads {VERSION}")
    if not isinstance(config.get("arch"), str) or not isinstance(config.get("hparams"), dict):
        raise ValueError(f"corrupt checkpoint {folder}: {CONFIG} lacks 'arch' or 'hparams'")
    check_meta(folder, config.get("meta", {}))
    return config


def _read_json(file: Path) -> Any:
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint file missing: {file}")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"corrupt checkpoint file {file}: {exc}") from exc


def _read_vocab(folder: Path) -> dict[str, Any]:
    vocab = _read_json(folder / VOCAB)
    if not isinstance(vocab, dict) or not all(isinstance(vocab.get(k), list) for k in ("source", "target")):
        raise ValueError(f"corrupt checkpoint file {folder / VOCAB}: expected 'source' and 'target' lists")
    return vocab


def load_checkpoint(path: str | Path, backend: str = "torch") -> Any:
    """Load the checkpoint folder ``path``; return the model (torch: in eval mode), with ``model.meta`` set.

    ``backend`` "torch" builds the torch module (needs torch and safetensors); "numpy" its numpy inference twin
    (:mod:`beamkit.models.numpy_seq2seq`, :mod:`beamkit.models.numpy_transformer`) from the same weights, read by
    :mod:`beamkit.models.weights`. Both check the config, the vocabulary and the weights the same way and fail
    with the same errors.
    """
    if backend not in MODEL_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(MODEL_BACKENDS)}")
    folder = Path(path)
    config = read_config(folder)
    vocab = _read_vocab(folder)
    if backend == "numpy":
        model = _load_numpy(folder, config, vocab)
    else:
        model = _load_torch(folder, config, vocab)
    model.meta = config.get("meta", {})
    return model


def _weights_file(folder: Path) -> Path:
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"checkpoint file missing: {weights}")
    return weights


def _load_torch(folder: Path, config: dict[str, Any], vocab: dict[str, Any]) -> Any:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    model = build_model(config["arch"], vocab["source"], vocab["target"], config["hparams"])
    weights = _weights_file(folder)
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"corrupt checkpoint file {weights}: {exc}") from exc
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"checkpoint {folder}: weights do not match its config: {exc}") from exc
    model.eval()
    return model


def _load_numpy(folder: Path, config: dict[str, Any], vocab: dict[str, Any]) -> Any:
    from beamkit.models import weights as safetensors_numpy
    from beamkit.models.numpy_nn import Params
    from beamkit.models.vocab import Vocab

    arch, hparams = config["arch"], config["hparams"]
    cls = _model_class(arch, hparams, "numpy")
    src_vocab, tgt_vocab = Vocab(tuple(vocab["source"])), Vocab(tuple(vocab["target"]))
    weights = _weights_file(folder)
    try:
        state = safetensors_numpy.load_file(weights)
    except (OSError, ValueError) as exc:
        raise ValueError(f"corrupt checkpoint file {weights}: {exc}") from exc
    try:
        return cls(src_vocab, tgt_vocab, Params(state, folder), **hparams)
    except TypeError as exc:
        raise ValueError(f"bad hyper-parameters for {arch}: {exc}") from exc
