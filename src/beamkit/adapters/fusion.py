"""Shallow fusion as an adapter wrapper: :class:`FusedAdapter` decodes any model adapter's model fused with a
language model over its output tokens (:func:`beamkit.fuse`), through the same driver as the model alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from beamkit.adapters.base import Ask, ModelAdapter
from beamkit.scoring import LengthPenalty
from beamkit.search.options import RequestOptions, SharedOptions


class FusedAdapter(ModelAdapter):
    """``inner``'s model fused with ``lm``: each step scores ``log_softmax(model) + weight * log_softmax(lm)``.

    ``lm`` is a step function over the model's output ids with ``init_state(n)`` (such as
    :class:`beamkit.NGramLM`); ``fusion`` takes :func:`beamkit.fuse`'s keywords (``lm_bos``, ``vocab_map``,
    ``floor``). Everything but the step function and the initial state is ``inner``'s: the same prompts,
    texts, defaults and limits. A hypothesis' ``logprob`` is the fused score.
    """

    def __init__(self, inner: ModelAdapter, lm: Any, weight: float, **fusion: Any):
        from beamkit.fusion import fuse

        if not isinstance(inner, ModelAdapter):
            raise TypeError(f"FusedAdapter wraps a ModelAdapter, got {type(inner).__name__}")
        if not callable(getattr(lm, "init_state", None)):
            raise TypeError("the LM must be a step function with init_state(n), such as beamkit.NGramLM")
        self.inner, self.lm = inner, lm
        self.fused = fuse(inner.step_fn, lm, weight, **fusion)
        self.name, self.bos, self.eos, self.vocab = inner.name, inner.bos, inner.eos, inner.vocab
        self.engine_options = inner.engine_options
        self.default_max_tokens, self.max_tokens_limit = inner.default_max_tokens, inner.max_tokens_limit
        self.max_prompt_tokens, self.prompt_limit = inner.max_prompt_tokens, inner.prompt_limit
        self.context = inner.context
        self.joins_mid_flight, self.owned_by = inner.joins_mid_flight, inner.owned_by

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The fused step: ``(fused scores [rows, V], new fused state, extras)``."""
        return self.fused(state, y_prev)

    def init_state(self, prompts: list[list[int]]) -> Any:
        """``inner``'s initial state and the LM's, one row per prompt, no row started yet."""
        return self.fused.init_state(self.inner.init_state(prompts), self.lm.init_state(len(prompts)))

    def encode(self, prompt: str) -> list[int]:
        """``inner``'s token ids of the prompt."""
        return self.inner.encode(prompt)

    def batch_key(self, ids: tuple[int, ...]) -> Any:
        """``inner``'s batching key."""
        return self.inner.batch_key(ids)

    def decode(self, tokens: Sequence[int]) -> str:
        """``inner``'s text of generated tokens."""
        return self.inner.decode(tokens)

    def token_text(self, token: int) -> str:
        """``inner``'s text of one token."""
        return self.inner.token_text(token)

    def length_penalty(self, alpha: float) -> LengthPenalty:
        """``inner``'s length penalty."""
        return self.inner.length_penalty(alpha)

    def request(self, ask: Ask) -> RequestOptions:
        """``inner``'s request options for ``ask``."""
        return self.inner.request(ask)

    def batch_options(self, prompts: Sequence[Sequence[int]], ask: Ask) -> SharedOptions:
        """``inner``'s search-wide options for the batch."""
        return self.inner.batch_options(prompts, ask)

    def continuous_refusal(self, ask: Ask) -> str | None:
        """``inner``'s refusal, if any."""
        return self.inner.continuous_refusal(ask)

    def continuous_options(self) -> SharedOptions:
        """``inner``'s options for a running engine."""
        return self.inner.continuous_options()

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """``inner``'s context (torch's inference mode for a torch model)."""
        with self.inner.step_context():
            yield
