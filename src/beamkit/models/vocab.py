"""Character vocabularies for the shipped models: fixed symbol lists, saved with each checkpoint."""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)


@dataclass(frozen=True)
class Vocab:
    """An id <-> symbol table whose first three symbols are ``<pad>``, ``<bos>``, ``<eos>`` (ids 0, 1, 2)."""

    symbols: tuple[str, ...]
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if tuple(self.symbols[:3]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {tuple(self.symbols[:3])}")
        if len(set(self.symbols)) != len(self.symbols):
            raise ValueError("vocabulary symbols must be unique")
        object.__setattr__(self, "index", {s: i for i, s in enumerate(self.symbols)})

    @property
    def pad(self) -> int:
        """Id of the padding symbol (0)."""
        return 0

    @property
    def bos(self) -> int:
        """Id of the begin-of-sequence symbol (1)."""
        return 1

    @property
    def eos(self) -> int:
        """Id of the end-of-sequence symbol (2)."""
        return 2

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> list[int]:
        """Return the ids of the characters of ``text``; unknown characters raise ValueError naming them."""
        if not isinstance(text, str):
            raise TypeError(f"expected a string, got {type(text).__name__}")
        unknown = sorted({ch for ch in text if ch not in self.index or ch in SPECIALS})
        if unknown:
            raise ValueError(f"unknown characters {unknown!r} in {text!r}; the model knows printable ASCII only")
        return [self.index[ch] for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        """Return the text of ``ids``, stopping at ``<eos>`` and skipping ``<pad>``/``<bos>``."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos:
                break
            if i in (self.pad, self.bos):
                continue
            out.append(self.symbols[i])
        return "".join(out)

    def to_list(self) -> list[str]:
        """Return the symbols as a JSON-ready list."""
        return list(self.symbols)


def source_vocab() -> Vocab:
    """The source vocabulary of the dates models: the specials then printable ASCII without tabs/newlines."""
    chars = [ch for ch in string.printable if ch not in "\t\n\r\x0b\x0c"]
    return Vocab(SPECIALS + tuple(chars))


def target_vocab() -> Vocab:
    """The target vocabulary of the dates models: the specials, the ten digits and ``-``."""
    return Vocab(SPECIALS + tuple("0123456789-"))
