"""The one interface every model kind offers to beamkit's commands and server: :class:`ModelAdapter`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from beamkit.scoring import LengthPenalty, as_length_penalty
from beamkit.search.options import EarlyStopping, RequestOptions, SharedOptions


@dataclass(frozen=True)
class Ask:
    """What one request asks of a model, as a command's options or a server request give it; None: the model's
    own default (its generation config, its checkpoint's length)."""

    beam: int  # beams searched
    n_best: int  # hypotheses returned (<= beam)
    max_len: int | None = None  # most generated tokens
    length_penalty: float | None = None  # alpha of the model's length penalty
    early_stopping: EarlyStopping | None = None  # when a beam is done (see beamkit.SearchOptions)
    min_len: int | None = None  # fewest generated tokens before a stop token may end a hypothesis
    prompt_len: int = 1  # the prompt's tokens (a decoder-only model counts some limits from it)


class ModelAdapter:
    """A model as ``translate``, ``decode``, ``explain`` and ``serve`` drive it on beamkit's engine. Each kind
    (:mod:`beamkit.adapters.checkpoint`, :mod:`~beamkit.adapters.g2p`, :mod:`~beamkit.adapters.hf`) sets the
    attributes and implements the methods without a default here.

    ``name``: the model's name (the id a server's clients send); ``bos`` / ``eos``: the engine's start token and
    stop tokens (empty: none); ``engine_options``: the search-wide options
    (:class:`~beamkit.search.options.SharedOptions`: the policy) of the model's offline decoder, shared by every
    request of a running engine;
    ``default_max_tokens`` / ``max_tokens_limit``: generated tokens by default / at most; ``max_prompt_tokens``:
    the longest prompt (``prompt_limit``: what sets it, named in the refusal; empty: nothing to add);
    ``context``: positions shared by the prompt and the generated tokens (decoder-only models; None: no shared
    bound); ``joins_mid_flight``: requests may join a running engine (else only an idle
    one); ``vocab``: what labels a trace's tokens (see :meth:`beamkit.Trace.with_vocab`).
    """

    name: str
    bos: int
    eos: tuple[int, ...]
    engine_options: SharedOptions = SharedOptions()
    default_max_tokens: int
    max_tokens_limit: int
    max_prompt_tokens: int
    prompt_limit: str = ""
    joins_mid_flight: bool = True
    context: int | None = None
    owned_by: str = "beamkit"
    vocab: Any = None

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The engine's step function: ``(logits [rows, V], new state)``."""
        raise NotImplementedError

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids; ValueError naming the problem (unknown characters, empty)."""
        raise NotImplementedError

    def init_state(self, prompts: list[list[int]]) -> Any:
        """The initial state of requests decoded together: one row per prompt (token ids)."""
        raise NotImplementedError

    def batch_key(self, ids: tuple[int, ...]) -> Any:
        """Prompts with equal keys may share one :meth:`init_state` call (default: any prompts)."""
        return None

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of generated tokens (stop tokens dropped)."""
        raise NotImplementedError

    def token_text(self, token: int) -> str:
        """The text of one generated token (for ``logprobs``)."""
        raise NotImplementedError

    def length_penalty(self, alpha: float) -> LengthPenalty:
        """The length penalty the offline decoder uses for ``alpha``."""
        return as_length_penalty(alpha)

    def request(self, ask: Ask) -> RequestOptions:
        """The engine's :class:`beamkit.RequestOptions` for ``ask``, as the model's offline decoder sets them;
        None in ``ask`` means the model's default (``max_len``: :attr:`default_max_tokens`; ``length_penalty``:
        1; ``min_len`` and ``early_stopping``: the engine's own)."""
        return RequestOptions(
            beam_size=ask.beam,
            num_return=ask.n_best,
            max_len=self.default_max_tokens if ask.max_len is None else ask.max_len,
            length_penalty=self.length_penalty(1.0 if ask.length_penalty is None else ask.length_penalty),
            early_stopping=ask.early_stopping,
            min_len=ask.min_len,
        )

    def batch_options(self, prompts: Sequence[Sequence[int]], ask: Ask) -> SharedOptions:
        """The search-wide options beyond :attr:`engine_options` that decoding ``prompts`` together for ``ask``
        needs (e.g. a Hugging Face model's logits processors); a running engine shared by other requests can
        serve the request only when none is set (default: nothing more)."""
        return SharedOptions()

    def continuous_refusal(self, ask: Ask) -> str | None:
        """Why a running engine shared by other requests (a server's) cannot decode ``ask`` as the offline
        decoder would, naming the setting; None when it can (the default)."""
        return None

    def continuous_options(self) -> SharedOptions:
        """The search-wide options of a running engine shared by requests (a server's): :attr:`engine_options`
        by default; a model whose offline decoder applies processors per request adds them here."""
        return self.engine_options

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """What every model call runs under (torch's inference mode for torch models; default: nothing)."""
        yield
