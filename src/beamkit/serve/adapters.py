"""Per model kind, what the server needs to run a model on the engine: its step function, bos / eos, how a
prompt becomes a request's ``init_state``, how tokens become text, and its limits.

Two kinds: the beamkit checkpoints (the shipped dates models or any checkpoint folder: the prompt is the source
sentence) and Hugging Face model directories with their tokenizer (``hf:DIR``). :func:`load_adapter` picks one
from the ``--model`` argument.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from beamkit.scoring import LengthPenalty, as_length_penalty

PICKLED = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")  # weight files that torch unpickles
SEQ2SEQ_MAX_SOURCE = 256  # an LSTM has no position table: the server's own bound on a source sentence


class ModelAdapter:
    """A model as the server drives it. Subclasses set the attributes and implement the methods.

    ``name``: the model id clients send; ``bos`` / ``eos``: the engine's start and stop tokens; ``engine_options``:
    the search-wide :class:`beamkit.SearchOptions` fields (the policy) matching the model's offline decoder;
    ``default_max_tokens`` / ``max_tokens_limit``: generated tokens by default / at most; ``max_prompt_tokens``:
    the longest prompt; ``joins_mid_flight``: requests may join a running engine (else only an idle one).
    """

    name: str
    bos: int
    eos: tuple[int, ...]
    engine_options: dict[str, Any]
    default_max_tokens: int
    max_tokens_limit: int
    max_prompt_tokens: int
    joins_mid_flight: bool = True
    context: int | None = None  # positions shared by the prompt and the generated tokens (decoder-only models)
    owned_by: str = "beamkit"

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The engine's step function: ``(logits [rows, V], new state)``."""
        raise NotImplementedError

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids; ValueError naming the problem (unknown characters, empty)."""
        raise NotImplementedError

    def init_state(self, prompts: list[list[int]]) -> Any:
        """The initial state of requests joining together: one row per prompt (token ids)."""
        raise NotImplementedError

    def batch_key(self, ids: tuple[int, ...]) -> Any:
        """Prompts with equal keys may share one :meth:`init_state` call (default: any prompts)."""
        return None

    def decode(self, tokens: list[int]) -> str:
        """The text of generated tokens (stop tokens dropped)."""
        raise NotImplementedError

    def token_text(self, token: int) -> str:
        """The text of one generated token (for ``logprobs``)."""
        raise NotImplementedError

    def length_penalty(self, alpha: float) -> LengthPenalty:
        """The length penalty the offline decoder uses for ``alpha``."""
        return as_length_penalty(alpha)

    def request_options(self, beam: int, early_stopping: bool | str) -> dict[str, Any]:
        """Per-request engine options that depend on the model kind (as its offline decoder sets them)."""
        return {"early_stopping": early_stopping}

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """What every model call runs under (torch's inference mode)."""
        import torch

        with torch.inference_mode():
            yield


class DatesAdapter(ModelAdapter):
    """A beamkit checkpoint (Seq2Seq or Transformer): the prompt is the source sentence, decoded as
    :func:`beamkit.models.translate` decodes it (policy ``"narrow"``, power length penalty)."""

    def __init__(self, model: Any, name: str):
        self.model = model
        self.name = name
        self.tv = model.tgt_vocab
        self.bos, self.eos = self.tv.bos, (self.tv.eos,)
        self.engine_options = {}
        self.default_max_tokens = int(getattr(model, "meta", {}).get("max_len", 12))
        limit = getattr(model, "max_len", None)  # the Transformer's position table
        self.max_prompt_tokens = int(limit) if limit is not None else SEQ2SEQ_MAX_SOURCE
        self.max_tokens_limit = int(limit) if limit is not None else SEQ2SEQ_MAX_SOURCE

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The model's own step function."""
        return self.model.step(state, y_prev)

    def encode(self, prompt: str) -> list[int]:
        """Characters to source ids (printable ASCII); a blank prompt is refused."""
        from beamkit.models.common import encode_sources

        return encode_sources(self.model.src_vocab, [prompt])[0]

    def init_state(self, prompts: list[list[int]]) -> Any:
        """Encode the source sentences as one padded batch, as ``translate`` encodes its texts."""
        from beamkit.models.common import model_inputs, pad_batch

        src, lengths = pad_batch(prompts, self.model.src_vocab.pad)  # shape: (B, S), (B,)
        return self.model.init_state(*model_inputs(self.model, src, lengths))

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """What every model call runs under: torch's inference mode for a torch model, nothing for numpy."""
        from beamkit.models.common import inference

        with inference(self.model):
            yield

    def decode(self, tokens: list[int]) -> str:
        """Target ids to text, stopping at eos."""
        return str(self.tv.decode(tokens))

    def token_text(self, token: int) -> str:
        """One target symbol (``<eos>`` for the stop token)."""
        return str(self.tv.symbols[int(token)])


class HFAdapter(ModelAdapter):
    """A Hugging Face causal LM directory with its tokenizer, decoded as :func:`beamkit.hf.generate` decodes it
    (policy ``"pool"``, the model's generation config for eos and the defaults)."""

    owned_by = "huggingface"

    def __init__(self, directory: str | Path, name: str, allow_pickle: bool = False):
        import torch
        import transformers

        from beamkit.hf import DecoderOnlyStep

        folder = Path(directory)
        if not folder.is_dir():
            raise FileNotFoundError(f"Hugging Face model directory not found: {folder}")
        safe = any(folder.glob("*.safetensors"))
        pickled = sorted(p.name for pattern in PICKLED for p in folder.glob(pattern))
        if not safe and pickled and not allow_pickle:
            raise ValueError(
                f"{folder}: the weights are pickled ({pickled[0]}), and loading a pickle can run code; convert them "
                "to safetensors, or pass --allow-pickle if you trust the folder"
            )
        # the folder's own Python code never runs: trust_remote_code=False, stated on every call
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        config = transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"{folder}: beamkit serve runs decoder-only Hugging Face models (hf:DIR)")
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), trust_remote_code=False, use_safetensors=True if safe else None
        )
        self.model.eval()
        self.name = name
        gc = self.model.generation_config
        for field, neutral in (("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0), ("bad_words_ids", None)):
            value = getattr(gc, field, neutral)
            if value not in (neutral, None):
                raise ValueError(f"{folder}: generation_config.{field}={value!r} is not supported by beamkit serve")
        eos = gc.eos_token_id if gc.eos_token_id is not None else self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"{folder}: no eos_token_id in the generation config or the tokenizer")
        self.eos = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
        self.bos = 0  # ignored: the first call runs the prompt
        self.gc = gc
        self.engine_options = {"policy": "pool"}
        found = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        positions = int(found) if found is not None else 1024
        self.max_prompt_tokens = positions - 1
        self.max_tokens_limit = positions - 1
        self.context = positions
        self.default_max_tokens = 16  # the OpenAI completions default
        self._step = DecoderOnlyStep(self.model)
        self._torch = torch

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The bridge's decoder-only step (the prompt runs once per request, then one token per row)."""
        return self._step(state, y_prev)

    def encode(self, prompt: str) -> list[int]:
        """The tokenizer's ids (with its special tokens, as ``tokenizer(prompt)`` gives them)."""
        ids = [int(i) for i in self.tokenizer(prompt)["input_ids"]]
        if not ids:
            raise ValueError("empty input: the prompt has no tokens")
        return ids

    def init_state(self, prompts: list[list[int]]) -> Any:
        """The bridge's initial state for prompts of one length (no padding)."""
        t = self._torch
        input_ids = t.as_tensor(prompts, dtype=t.long)  # shape: (B, P)
        return self._step.init_state(input_ids, t.ones_like(input_ids))

    def batch_key(self, ids: tuple[int, ...]) -> Any:
        """Prompts join in one call only when they have the same length (no padding, as alone)."""
        return len(ids)

    def decode(self, tokens: list[int]) -> str:
        """The tokenizer's text of the generated tokens, the trailing stop token dropped."""
        if tokens and tokens[-1] in self.eos:
            tokens = tokens[:-1]
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def token_text(self, token: int) -> str:
        """The tokenizer's text of one token."""
        return str(self.tokenizer.decode([int(token)]))

    def length_penalty(self, alpha: float) -> LengthPenalty:
        """Hugging Face's ``logprob / len ** alpha``."""
        return LengthPenalty.power(alpha)

    def request_options(self, beam: int, early_stopping: bool | str) -> dict[str, Any]:
        """As ``generate``: greedy search (one beam) stops at the first finished hypothesis."""
        return {"early_stopping": True if beam == 1 else early_stopping}


def load_adapter(spec: str | None, allow_pickle: bool = False) -> ModelAdapter:
    """The adapter for ``--model``: ``hf:DIR``, a shipped model's name or a beamkit checkpoint folder.

    ``allow_pickle``: load an ``hf:DIR`` whose weights are only pickled (``pytorch_model.bin``); refused otherwise.
    """
    if spec is not None and spec.startswith("hf:"):
        directory = spec[3:]
        if not directory:
            raise ValueError("--model hf:DIR needs a directory after 'hf:'")
        return HFAdapter(directory, Path(directory).name or directory, allow_pickle=allow_pickle)
    from beamkit.models import DEFAULT_MODEL, load_model

    return DatesAdapter(load_model(spec), Path(spec).name if spec else DEFAULT_MODEL)
