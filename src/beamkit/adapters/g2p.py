"""The pretrained g2p-en GRU (:mod:`beamkit.models.g2p`, numpy): a lower-case word in, ARPAbet phonemes out,
decoded by :func:`decode_words` (at most 20 phonemes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from beamkit.adapters.base import Ask, ModelAdapter
from beamkit.adapters.driver import TextHypothesis, decode_texts
from beamkit.progress import Progress
from beamkit.search.options import RequestOptions

NAME = "g2p-en"


def check_max_len(max_len: int | None) -> None:
    """ValueError unless ``max_len`` is left out (None) or g2p-en's own limit: its decoder stops at 20 phonemes."""
    from beamkit.models.g2p import MAX_LEN

    if max_len not in (None, MAX_LEN):
        raise ValueError(f"--max-len does not apply to g2p-en (its decoder stops at {MAX_LEN} phonemes)")


class G2PAdapter(ModelAdapter):
    """The g2p-en model (loaded from the installed ``g2p-en`` package unless ``model`` is given)."""

    owned_by = "g2p-en"

    def __init__(self, model: Any = None):
        from beamkit.models.g2p import BOS, EOS, MAX_LEN, PHONEMES, G2PModel

        self.model = G2PModel.load() if model is None else model
        self.name = NAME
        self.vocab = list(PHONEMES)
        self.bos, self.eos = BOS, (EOS,)
        self.default_max_tokens = self.max_tokens_limit = MAX_LEN
        self.max_prompt_tokens = 64

    def step_fn(self, state: Any, y_prev: Any) -> Any:
        """The GRU decoder's step."""
        return self.model.step(state, y_prev)

    def encode(self, prompt: str) -> list[int]:
        """Grapheme ids plus ``</s>``; ValueError unless the word is non-empty lower-case a-z."""
        return list(self.model.encode_words([prompt])[0])

    def init_state(self, prompts: list[list[int]]) -> Any:
        """The encoder GRU's last state of each word (ids as :meth:`encode` gives them)."""
        from beamkit.models.g2p import GRAPHEMES

        return self.model.init_state(["".join(GRAPHEMES[t] for t in ids[:-1]) for ids in prompts])

    def request(self, ask: Ask) -> RequestOptions:
        """As :meth:`ModelAdapter.request`; g2p-en's decoder stops at 20 phonemes, so ``max_len`` must be left
        out (or be 20)."""
        if ask.max_len not in (None, self.max_tokens_limit):
            raise ValueError(
                f"--max-len does not apply to g2p-en (its decoder stops at {self.max_tokens_limit} phonemes)"
            )
        return super().request(dataclasses.replace(ask, max_len=None))

    def decode(self, tokens: Sequence[int]) -> str:
        """The phonemes up to ``</s>``, separated by spaces."""
        from beamkit.models.g2p import phonemes

        return " ".join(phonemes(tokens))

    def token_text(self, token: int) -> str:
        """One ARPAbet symbol (``</s>`` for the stop token)."""
        return str(self.vocab[int(token)])


def decode_words(
    model: Any,
    words: Sequence[str],
    beam_size: int = 1,
    length_penalty: float = 1.0,
    batch_size: int = 512,
    progress: Progress | None = None,
    **options: Any,
) -> list[list[TextHypothesis]]:
    """Each word's hypotheses (best first, ``beam_size`` of them) from a :class:`beamkit.models.g2p.G2PModel`,
    decoded through its :class:`G2PAdapter` by the batched driver :func:`beamkit.adapters.decode_texts`: one
    search per ``batch_size`` words. Each is a :class:`beamkit.adapters.TextHypothesis` (its text: the phonemes
    separated by spaces).

    ``progress`` (a bar from :func:`beamkit.progress.progress_bar`) advances by one per word. ``options``: more
    :class:`beamkit.SearchOptions` fields, as :func:`beamkit.search_batch` takes them.
    """
    if isinstance(words, str):
        raise TypeError("expected a sequence of words, got one string")
    return decode_texts(
        G2PAdapter(model), words, beam_size, length_penalty=length_penalty, batch_size=batch_size,
        progress=progress, **options,
    )  # fmt: skip


def predict_words(model: Any, words: Sequence[str], beam_size: int = 1, length_penalty: float = 1.0) -> list[list[str]]:
    """Best phoneme sequence of each word (beam 1 = greedy decoding, as g2p-en does)."""
    from beamkit.models.g2p import phonemes

    return [phonemes(r[0].tokens) for r in decode_words(model, words, beam_size, length_penalty)]
