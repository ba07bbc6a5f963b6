"""The knobs of one CTC prefix beam search, checked once, as a frozen record (:class:`CTCOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from beamkit._checks import check_bool, check_float, check_int

MAX_BEAM_WIDTH = 100_000  # the search holds beam_width * (candidates per frame + 1) rows a frame, allocated up front
MAX_HOTWORD_WEIGHT = 1000.0  # |hotword_weight| beyond this makes sums of bonuses leave the float range


@dataclass(frozen=True)
class CTCOptions:
    """How a CTC prefix beam search prunes, fuses hotwords and what it returns (pyctcdecode's knobs and
    defaults). A bad value is a TypeError / ValueError naming the field."""

    # hypotheses kept per utterance after each frame (1 to MAX_BEAM_WIDTH, 100,000)
    beam_width: int = 100
    # drop hypotheses scoring below best + beam_prune_logp (<= 0, or -inf: no threshold)
    beam_prune_logp: float = -10.0
    # a frame's candidate labels: those with log-probability >= token_min_logp, plus the frame's argmax
    token_min_logp: float = -5.0
    # keep only the best hypothesis among those sharing their last (LM order - 1) words and partial word
    prune_history: bool = False
    # pyctcdecode's beam unit: a prefix ending in blank and the same prefix ending in a label are two beams
    split_blank: bool = True
    # reproduce pyctcdecode 0.5.0's end-of-utterance scoring (see beamkit.ctc.compat); off: the correct score
    pyctcdecode_compat: bool = False
    # words earning a bonus (a partial word that starts one earns a share of it); phrases count word by word
    hotwords: tuple[str, ...] | None = None
    # the bonus per hotword (natural-log units; between -1000 and 1000, MAX_HOTWORD_WEIGHT)
    hotword_weight: float = 10.0
    # hypotheses returned per utterance (None: up to beam_width)
    num_hypotheses: int | None = None
    # build each hypothesis's word_frames (word start and end frames along its best alignment)
    word_frames: bool = True

    def __post_init__(self) -> None:
        """Check every field (see :mod:`beamkit._checks`); hotwords become a tuple of strings."""
        check_int("beam_width", self.beam_width, least=1, most=MAX_BEAM_WIDTH)
        check_float("beam_prune_logp", self.beam_prune_logp, most=0.0, minus_inf=True)
        check_float("token_min_logp", self.token_min_logp, most=0.0, minus_inf=True)
        for name in ("prune_history", "split_blank", "pyctcdecode_compat", "word_frames"):
            check_bool(name, getattr(self, name))
        check_float("hotword_weight", self.hotword_weight, least=-MAX_HOTWORD_WEIGHT, most=MAX_HOTWORD_WEIGHT)
        if self.num_hypotheses is not None:
            check_int("num_hypotheses", self.num_hypotheses, least=1)
        if self.hotwords is not None:
            object.__setattr__(self, "hotwords", word_tuple(self.hotwords))

    @property
    def out_k(self) -> int:
        """Hypotheses returned per utterance."""
        return self.beam_width if self.num_hypotheses is None else min(self.beam_width, int(self.num_hypotheses))


def word_tuple(words: Any) -> tuple[str, ...]:
    """Hotwords as a tuple of strings (one string is refused: it would be read as its characters)."""
    if isinstance(words, str):
        raise TypeError("hotwords must be a list of strings, not one string")
    try:
        out = tuple(words)
    except TypeError:
        raise TypeError(f"hotwords must be a list of strings, got {type(words).__name__}") from None
    if not set(map(type, out)) <= {str}:  # the check at C speed (10,000 hotwords: 0.1 ms); str subclasses pass below
        bad = [w for w in out if not isinstance(w, str)]
        if bad:
            raise TypeError(f"hotwords must be a list of strings, got {bad[0]!r} among them")
    return out
