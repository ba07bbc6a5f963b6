"""Real models for the engine: a Seq2Seq with Luong attention and a small Transformer (torch, with numpy twins
for inference), and a numpy loader for the pretrained g2p-en GRU. The trained dates checkpoints ship inside the
package (``shipped/``); :func:`load_model` runs them with torch when it is installed, else with numpy.

Everything here decodes through :func:`beamkit.search_batch`: one call per batch of sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beamkit._checks import check_int
from beamkit.extras import install_hint
from beamkit.progress import Progress

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


@dataclass
class Translation:
    """One output of :func:`translate`: the decoded text and its hypothesis' numbers."""

    text: str
    logprob: float
    score: float
    finished: bool
    tokens: list[int]


def translate(
    model: Any,
    texts: Sequence[str],
    beam_size: int = 5,
    num_return: int | None = None,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
    lm: Any = None,
    lm_weight: float = 0.0,
    **options: Any,
) -> list[list[Translation]]:
    """Decode ``texts`` with ``model`` (Seq2Seq or Transformer, torch or numpy) by beam search; return each
    one's n-best.

    Sources are encoded in batches of ``batch_size`` and each batch is one :func:`beamkit.search_batch`
    call. ``beam_size=1`` is greedy decoding. Empty strings and unknown characters raise ValueError.
    ``progress`` (a bar from :func:`beamkit.progress.progress_bar`) advances by one per input, in steps as
    each batch's search runs.
    With an ``lm`` (a step function over the target ids with ``init_state(n)``, such as
    :class:`beamkit.NGramLM`), the model is fused with it (:func:`beamkit.fuse`, ``lm_weight``); ``logprob`` is
    then the fused score. Other ``options`` go to :func:`beamkit.search_batch`.
    """
    from beamkit import fuse, search_batch
    from beamkit.models.common import encode_sources, inference, model_inputs, pad_batch
    from beamkit.progress import BatchTicker, Silent

    check_int("batch_size", batch_size, 1)
    ids = encode_sources(model.src_vocab, texts)
    limit = int(max_len if max_len is not None else getattr(model, "meta", {}).get("max_len", 12))
    tv = model.tgt_vocab
    results: list[list[Translation]] = []
    with inference(model):
        for start in range(0, len(ids), batch_size):
            src, lengths = pad_batch(ids[start : start + batch_size], model.src_vocab.pad)
            state = model.init_state(*model_inputs(model, src, lengths))
            step = model.step
            if lm is not None:
                step = fuse(model.step, lm, lm_weight)
                state = step.init_state(state, lm.init_state(src.shape[0]))
            ticker = BatchTicker(progress or Silent(), src.shape[0], limit)
            hyps = search_batch(
                ticker.wrap(step),
                state,
                tv.bos,
                tv.eos,
                beam_size,
                limit,
                length_penalty=length_penalty,
                num_return=num_return,
                **options,
            )
            ticker.done()
            for request in hyps:
                results.append(
                    [
                        Translation(tv.decode(h.tokens), float(h.logprob), float(h.score), h.finished, list(h.tokens))
                        for h in request
                    ]
                )
    return results
