"""The worker side: load a model once, decode batches of :class:`~beamkit.corpus.inputs.Item` into records.

Every back-end (local processes, Ray actors, Ray Data pipelines) calls :meth:`CorpusDecoder.decode_items`, so
all of them produce the same records. Each batch of valid inputs is one batched search
(:func:`beamkit.adapters.decode_texts` for every ``--model``, or :meth:`beamkit.ctc.Decoder.decode`).
Inputs a model cannot take are found one by one first and reported as errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from beamkit import ops
from beamkit.adapters.driver import TextHypothesis
from beamkit.corpus.inputs import Item
from beamkit.corpus.options import DecodeOptions
from beamkit.models import torch_available


def record(item: Item, hyps: Sequence[TextHypothesis] = (), error: str | None = None) -> dict[str, Any]:
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

    def decode(self, batch: list[Any]) -> list[list[TextHypothesis]]: ...


class _Adapted:
    """A model of :mod:`beamkit.adapters` (a beamkit checkpoint, g2p-en or ``hf:DIR``) decoded by the batched
    driver :func:`beamkit.adapters.decode_texts`."""

    def __init__(self, options: DecodeOptions) -> None:
        from beamkit.adapters import Ask, load

        self.options = options
        self.adapter = load(options.model)
        self.adapter.request(Ask(options.beam, options.n_best, options.max_len, options.length_penalty))  # settings

    def prepare(self, item: Item) -> Any:
        from beamkit.adapters.driver import check_prompt_length

        ids = self.adapter.encode(item.text)  # raises on an input the model cannot take
        check_prompt_length(self.adapter, ids, "the input")
        return item.text

    def decode(self, texts: list[Any]) -> list[list[TextHypothesis]]:
        from beamkit.adapters import decode_texts

        o = self.options
        return decode_texts(self.adapter, texts, o.beam, o.n_best, o.max_len, o.length_penalty, batch_size=len(texts))


class _CTC:
    """CTC posteriors: one ``(T, V)`` ``.npy`` matrix per input, decoded by :mod:`beamkit.ctc`."""

    def __init__(self, options: DecodeOptions) -> None:
        from beamkit.ctc import CTCOptions, Decoder, fusion_of

        self.options = options
        lm = None
        if options.lm is not None:
            lm = fusion_of(options.lm, alpha=options.alpha, beta=options.beta, backend=options.lm_backend)
        search = CTCOptions(beam_width=options.beam, pyctcdecode_compat=options.pyctcdecode_compat)
        self.decoder = Decoder(list(options.labels or ()), lm, search, blank=options.blank)

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

    def decode(self, mats: list[Any]) -> list[list[TextHypothesis]]:
        n_best = self.options.n_best
        return [  # a CTC hypothesis is text with its scores: no token ids, always finished
            [TextHypothesis(h.text, [], float(h.logit_score), float(h.score), True) for h in hyps[:n_best]]
            for hyps in self.decoder.decode(mats)
        ]


def _model(options: DecodeOptions) -> _Model:
    """The model ``options`` names: CTC posteriors' decoder, or the adapter of ``--model``."""
    return _CTC(options) if options.kind == "ctc" else _Adapted(options)


def uses_torch(options: DecodeOptions) -> bool:
    """True when the model ``options`` names runs on torch: Hugging Face models, and the dates models where torch
    is installed (without it they run on numpy)."""
    return options.kind == "hf" or (options.kind == "checkpoint" and torch_available())


class CorpusDecoder:
    """A model loaded once (per process or Ray actor) and the batched decoding of corpus items."""

    def __init__(self, options: DecodeOptions) -> None:
        """Load the model ``options`` names; torch (when installed: the dates models otherwise run on numpy) runs
        ``options.threads`` threads."""
        options.check()
        if uses_torch(options):
            ops.set_torch_threads(options.threads)
        self.options = options
        self.model = _model(options)

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
