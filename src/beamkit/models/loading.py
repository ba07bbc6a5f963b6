"""Where the shipped dates checkpoints are and how a model name or checkpoint folder becomes a model: numpy or
torch, as installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beamkit.extras import install_hint

SHIPPED_DIR = Path(__file__).parent / "shipped"
DEFAULT_MODEL = "dates-seq2seq"


def shipped_models() -> dict[str, Path]:
    """Return the checkpoints shipped inside the package, by name (``dates-seq2seq``, ``dates-transformer``)."""
    if not SHIPPED_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(SHIPPED_DIR.iterdir()) if (p / "config.json").is_file()}


def resolve_model(name_or_path: str | Path | None) -> Path:
    """Return the checkpoint folder for a shipped model's name or a path (None: the default shipped model)."""
    key = DEFAULT_MODEL if name_or_path is None else str(name_or_path)
    shipped = shipped_models()
    if key in shipped:
        return shipped[key]
    path = Path(key)
    if not path.exists():
        names = ", ".join(shipped) or "none"
        raise FileNotFoundError(f"checkpoint not found: {key!r} is neither a path nor a shipped model ({names})")
    return path


BACKENDS = ("auto", "numpy", "torch")


def torch_available() -> bool:
    """True when torch and safetensors both import (the ``models`` extra is installed)."""
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def load_model(name_or_path: str | Path | None = None, backend: str = "auto") -> Any:
    """Load a shipped model by name or any saved checkpoint folder by path.

    ``backend``: "torch" (the ``torch.nn`` modules, for training, GPUs, the paged KV cache and speed; needs
    the ``models`` extra), "numpy" (inference-only numpy twins from the same weights; numpy is
    all they need), or "auto" (the default: torch when torch and safetensors are installed, else numpy).
    Both backends decode with the same interface and give the same outputs up to float32 rounding.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
    from beamkit.models.checkpoint import load_checkpoint

    path = resolve_model(name_or_path)
    if backend == "auto":
        backend = "torch" if torch_available() else "numpy"
    elif backend == "torch":
        try:
            import safetensors  # noqa: F401
            import torch  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                f"the torch backend needs torch and safetensors: {install_hint('models')} ({exc}); "
                "or use the numpy backend"
            ) from exc
    return load_checkpoint(path, backend=backend)
