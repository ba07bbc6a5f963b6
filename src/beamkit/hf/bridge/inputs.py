"""Checks of what :func:`beamkit.hf.generate` is given: the model, the token ids, the attention mask."""

from __future__ import annotations

from typing import Any

import torch


def check_model(model: Any) -> None:
    """TypeError unless ``model`` looks like a ``transformers`` model (a config and a callable forward)."""
    if model is None or not callable(model) or getattr(model, "config", None) is None:
        raise TypeError(
            "model must be a transformers model (a PreTrainedModel with .config), got "
            f"{'None' if model is None else type(model).__name__}"
        )


def vocabulary_size(model: Any) -> int | None:
    """Rows of the model's input embedding table (else its config's ``vocab_size``; None when neither is known)."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    rows = getattr(emb, "num_embeddings", None)
    if rows is not None:
        return int(rows)
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    size = getattr(text, "vocab_size", None)
    return None if size is None else int(size)


def output_size(model: Any) -> int | None:
    """Columns of the model's output: its output layer's ``out_features`` (a ``torch.nn.Linear`` or an int8
    quantised one, whose ``weight`` is a method), else its output embedding's rows (None when it has none to
    read)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    width = getattr(head, "out_features", None)
    if isinstance(width, int):
        return width
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else None


def check_input_ids(input_ids: Any, model: Any) -> torch.Tensor:
    """``input_ids`` as given, after checking it is a 2-D integer tensor of ids inside the vocabulary."""
    if input_ids is None:
        raise TypeError("generate() needs input_ids (a 2-D torch tensor [batch, sequence]); got None")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise TypeError("input_ids must be a 2-D torch tensor [batch, sequence]")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise TypeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have at least one row and one column, got shape {tuple(input_ids.shape)}")
    vocab = vocabulary_size(model)
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or vocab is not None and high >= vocab:
        bad = low if low < 0 else high
        size = f"the model's vocabulary of {vocab} ids (0..{vocab - 1})" if vocab is not None else "the vocabulary"
        raise ValueError(f"input_ids holds token id {bad}, outside {size}")
    return input_ids


def attention_mask_for(
    input_ids: torch.Tensor, attention_mask: Any, pad: int | None, eos: tuple[int, ...]
) -> torch.Tensor:
    """The attention mask given (checked against ``input_ids``' shape), else inferred as Hugging Face does:
    0 on ``pad`` when the prompt holds pad tokens and pad is not an eos id, else all ones."""
    batch, width = input_ids.shape
    if attention_mask is None:
        if pad is not None and bool((input_ids == pad).any()) and pad not in eos:
            return (input_ids != pad).long()
        return torch.ones_like(input_ids, dtype=torch.long)
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch tensor, got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != (batch, width):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {(batch, width)}")
    return attention_mask.to(input_ids.device)


def prompt_batch(prompts: list[list[int]], device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of one length (token ids) as ``input_ids`` and an all-ones ``attention_mask`` (no padding), on
    ``device`` (default: the CPU)."""
    input_ids = torch.as_tensor(prompts, dtype=torch.long, device=device)  # shape: (B, P)
    return input_ids, torch.ones_like(input_ids)
