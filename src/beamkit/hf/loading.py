"""Loading a Hugging Face model folder (``hf:DIR``): the one loader every command and the server use.

The folder is read from disk only (``local_files_only=True``: nothing is downloaded), its own Python code never
runs (``trust_remote_code=False``, stated on every call), and weights that are only pickled (``pytorch_model.bin``
and the like, which ``torch.load`` unpickles and so can run code) are refused unless ``allow_pickle``. With
``allow_pickle``, a pickle that holds code (it names a callable that rebuilding tensors never needs, see
:mod:`beamkit.hf.pickles`) is still refused, in one line, before anything unpickles it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beamkit.extras import install_hint
from beamkit.hf.pickles import code_in_pickle

PICKLED = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")  # weight files that torch unpickles
LOADED_PICKLES = "pytorch_model*.bin"  # the pickled weights that from_pretrained reads


@dataclass(frozen=True)
class Pretrained:
    """A loaded folder: the model (in eval mode), its tokenizer and config, and whether it is encoder-decoder."""

    folder: Path
    model: Any
    tokenizer: Any
    config: Any
    encoder_decoder: bool


def check_folder(folder: str | Path) -> Path:
    """``folder`` as a Path, or FileNotFoundError when it holds no Hugging Face model (no ``config.json``)."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"hf:{folder}: not a Hugging Face model directory (no config.json in {path})")
    return path


def check_pickles(path: Path) -> None:
    """Raise ValueError, in one line, when a pickled weights file of ``path`` that ``from_pretrained`` would read
    holds code (names a callable beyond those that rebuild tensors); the files are read, never unpickled."""
    for weights in sorted(path.glob(LOADED_PICKLES)):
        code = code_in_pickle(weights)
        if code is not None:
            raise ValueError(
                f"{path}: the pickle holds code: {weights.name} would call {code} when loaded, which a file of "
                "weights never needs; it was not loaded (get the weights as safetensors from a source you trust)"
            )


def load_pretrained(folder: str | Path, allow_pickle: bool = False) -> Pretrained:
    """Load the model, tokenizer and config saved in ``folder`` with ``save_pretrained``: decoder-only models with
    ``AutoModelForCausalLM``, encoder-decoder models with ``AutoModelForSeq2SeqLM``; safetensors weights are
    preferred. Raises FileNotFoundError for a folder without a model, ValueError for pickled-only weights
    without ``allow_pickle`` or for a pickle that holds code, ImportError (naming the extra) without
    transformers."""
    path = check_folder(folder)
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"hf:DIR models need transformers and torch: {install_hint('hf')} ({exc})") from exc
    safe = any(path.glob("*.safetensors"))
    pickled = sorted(p.name for pattern in PICKLED for p in path.glob(pattern))
    if not safe and pickled and not allow_pickle:
        raise ValueError(
            f"{path}: the weights are pickled ({pickled[0]}), and loading a pickle can run code; convert them "
            "to safetensors, or pass --allow-pickle if you trust the folder"
        )
    if not safe:
        check_pickles(path)
    local = {"trust_remote_code": False, "local_files_only": True}
    config = transformers.AutoConfig.from_pretrained(str(path), **local)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), **local)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    auto = transformers.AutoModelForSeq2SeqLM if encoder_decoder else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(str(path), use_safetensors=True if safe else None, **local)
    model.eval()
    return Pretrained(path, model, tokenizer, config, encoder_decoder)
