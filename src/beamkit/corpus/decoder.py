"""The worker side: load a model once, decode batches of :class:`~beamkit.corpus.inputs.Item` into records.

Every back-end (local processes, Ray actors, Ray Data pipelines) calls :meth:`Decoder.decode_items`, so all of
them produce the same records. Each batch of valid inputs is one batched search (``search_batch`` through
``beamkit.models.translate`` / ``G2PModel.decode``, ``beamkit.hf.generate``, or the CTC decoder's
``decode_beams_batch``). Inputs a model cannot take are found one by one first and reported as errors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from beamkit.corpus.inputs import Item
from beamkit.corpus.options import HF_PREFIX, DecodeOptions
from beamkit.extras import install_hint
from beamkit.models import torch_available


class Scored(NamedTuple):
    """One output hypothesis: its text, log-probability and the score it is ranked by."""

    text: str
    logprob: float
    score: float


def record(item: Item, hyps: Sequence[Scored] = (), error: str | None = None) -> dict[str, Any]:
    """The output line of one input: ``id``, ``input``, ``n_best`` (text, logprob, score) and ``error``."""
    return {
        "id": item.id,
        "input": item.text,
        "n_best": [{"text": h.text, "logprob": h.logprob, "score": h.score} for h in hyps],
        "error": error,
    }


class _Model(Protocol):
    """What each kind of model offers: check one input (raise ValueError), decode a batch of checked ones."""

    def prepare(self, item: Item) -> Any: ...

    def decode(self, batch: list[Any]) -> list[list[Scored]]: ...


class _Dates:
    """beamkit's own checkpoints (the shipped dates models or a saved folder)."""

    def __init__(self, options: DecodeOptions) -> None:
        from beamkit.models import load_model

        self.options = options
        self.model = load_model(options.model)

    def prepare(self, item: Item) -> Any:
        from beamkit.models.common import encode_sources

        encode_sources(self.model.src_vocab, [item.text])  # raises on characters the model does not know
        return item.text

    def decode(self, texts: list[Any]) -> list[list[Scored]]:
        from beamkit.models import translate

        o = self.options
        outs = translate(
            self.model, texts, beam_size=o.beam, num_return=o.n_best, batch_size=len(texts), max_len=o.max_len,
            length_penalty=1.0 if o.length_penalty is None else o.length_penalty,
        )  # fmt: skip
        return [[Scored(t.text, t.logprob, t.score) for t in out[: o.n_best]] for out in outs]


class _G2P:
    """The pretrained g2p-en GRU (numpy); outputs are ARPAbet phonemes separated by spaces."""

    def __init__(self, options: DecodeOptions) -> None:
        from beamkit.models.g2p import G2PModel

        self.options = options
        self.model = G2PModel.load()

    def prepare(self, item: Item) -> Any:
        self.model.encode_words([item.text])  # raises unless the word is lower-case a-z
        return item.text

    def decode(self, words: list[Any]) -> list[list[Scored]]:
        from beamkit.models.g2p import phonemes

        o = self.options
        alpha = 1.0 if o.length_penalty is None else o.length_penalty
        outs = self.model.decode(words, beam_size=o.beam, length_penalty=alpha, batch_size=len(words))
        return [
            [Scored(" ".join(phonemes(h.tokens)), float(h.logprob), float(h.score)) for h in out[: o.n_best]]
            for out in outs
        ]


class _HF:
    """A Hugging Face model directory (``hf:DIR``) decoded by :func:`beamkit.hf.generate`."""

    def __init__(self, options: DecodeOptions) -> None:
        try:
            from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(f"hf: models need transformers: {install_hint('hf')} ({exc})") from exc
        folder = str(options.model)[len(HF_PREFIX) :]
        self.options = options
        config = AutoConfig.from_pretrained(folder)
        self.enc_dec = bool(getattr(config, "is_encoder_decoder", False))
        auto = AutoModelForSeq2SeqLM if self.enc_dec else AutoModelForCausalLM
        self.model = auto.from_pretrained(folder).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if not self.enc_dec:
            self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def prepare(self, item: Item) -> Any:
        if not self.tokenizer(item.text)["input_ids"]:
            raise ValueError("the tokenizer gives no tokens for this input")
        return item.text

    def decode(self, texts: list[Any]) -> list[list[Scored]]:
        import torch

        import beamkit.hf

        o = self.options
        enc = self.tokenizer(texts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = beamkit.hf.generate(
                self.model, enc["input_ids"], enc["attention_mask"], num_beams=o.beam, num_return_sequences=o.n_best,
                max_new_tokens=o.max_len, length_penalty=o.length_penalty, return_dict_in_generate=True,
            )  # fmt: skip
        decode = self.tokenizer.decode
        return [
            [Scored(str(decode(h.tokens, skip_special_tokens=True)), float(h.logprob), float(h.score)) for h in hyps]
            for hyps in (request[: o.n_best] for request in out.hypotheses)
        ]


class _CTC:
    """CTC posteriors: one ``(T, V)`` ``.npy`` matrix per input, decoded by :mod:`beamkit.ctc`."""

    def __init__(self, options: DecodeOptions) -> None:
        from beamkit.ctc import build_ctcdecoder

        self.options = options
        self.decoder = build_ctcdecoder(
            list(options.labels or ()), kenlm_model_path=options.lm, alpha=options.alpha, beta=options.beta,
            lm_backend=options.lm_backend, pyctcdecode_compat=options.pyctcdecode_compat, blank=options.blank,
        )  # fmt: skip

    def prepare(self, item: Item) -> Any:
        import numpy as np

        try:
            arr = np.load(str(item.path), allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise ValueError(f"cannot read {Path(str(item.path)).name}: {exc}") from exc
        if arr.ndim != 2 or arr.shape[1] != len(self.options.labels or ()):
            n = len(self.options.labels or ())
            raise ValueError(f"expected a (T, {n}) matrix for {n} labels, got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"expected floating-point posteriors, got dtype {arr.dtype}")
        return arr

    def decode(self, mats: list[Any]) -> list[list[Scored]]:
        o = self.options
        beams = self.decoder.decode_beams_batch(None, mats, beam_width=o.beam, prune_history=False)
        return [[Scored(b[0], float(b[2]), float(b[3])) for b in utt[: o.n_best]] for utt in beams]


_KINDS: dict[str, Callable[[DecodeOptions], _Model]] = {"dates": _Dates, "g2p": _G2P, "hf": _HF, "ctc": _CTC}


def uses_torch(options: DecodeOptions) -> bool:
    """True when the model ``options`` names runs on torch: Hugging Face models, and the dates models where torch
    is installed (without it they run on numpy)."""
    return options.kind == "hf" or (options.kind == "dates" and torch_available())


class Decoder:
    """A model loaded once (per process or Ray actor) and the batched decoding of corpus items."""

    def __init__(self, options: DecodeOptions) -> None:
        """Load the model ``options`` names; torch (when installed: the dates models otherwise run on numpy) runs
        ``options.threads`` threads."""
        options.check()
        if uses_torch(options):
            import torch

            torch.set_num_threads(options.threads)
        self.options = options
        self.model = _KINDS[options.kind](options)

    def decode_items(self, items: Sequence[Item]) -> list[dict[str, Any]]:
        """Records for ``items`` in their order: one batched search over the valid ones, errors for the rest.

        Should the batched search fail as a whole, each input is decoded alone so only the culprit is an error.
        """
        out: list[dict[str, Any] | None] = [None] * len(items)
        ready: list[tuple[int, Any]] = []
        for pos, item in enumerate(items):
            if item.error is not None:
                out[pos] = record(item, error=item.error)
                continue
            try:
                ready.append((pos, self.model.prepare(item)))
            except (ValueError, TypeError) as exc:
                out[pos] = record(item, error=str(exc))
        if ready:
            try:
                batch = self.model.decode([x for _, x in ready])
                for (pos, _), hyps in zip(ready, batch, strict=True):
                    out[pos] = record(items[pos], hyps)
            except (ValueError, TypeError, RuntimeError):
                for pos, x in ready:
                    out[pos] = self._alone(items[pos], x)
        return [r for r in out if r is not None]

    def _alone(self, item: Item, prepared: Any) -> dict[str, Any]:
        """The record of one input decoded by itself (its error, should the search fail)."""
        try:
            return record(item, self.model.decode([prepared])[0])
        except (ValueError, TypeError, RuntimeError) as exc:
            return record(item, error=str(exc))
