"""The vocabularies of the lexicon search (flashlight's, as torchaudio's ``ctc_decoder`` reads them): tokens and
words as :class:`Dictionary` objects (entries and their indices, from a file or a list), the word list of a
decoder (an LM dictionary, the lexicon's words, or the tokens themselves), and the language model the search asks
(a KenLM file's words, no LM, or the user's ``start`` / ``score`` / ``finish`` object)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .lm import KenLMWords, NGramWords, ZeroLM
from .trie import UNK_WORD, f32


class Dictionary:
    """Entries and their indices (flashlight's dictionary, as ``CTCDecoder.tokens_dict`` / ``word_dict``): from a
    file (one index a line; several entries on a line share it) or a list (one entry per index)."""

    def __init__(self, source: str | Path | Sequence[str], *, default: str | None = None) -> None:
        """Read ``source``; ``default``: the entry an unknown one maps to (none: unknown entries are refused)."""
        self._index: dict[str, int] = {}
        self._entries: list[str] = []
        if isinstance(source, (str, Path)):
            try:
                lines = Path(source).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ValueError(f"cannot read the dictionary file {str(source)!r}: {exc.strerror or exc}") from None
            for line in lines:
                entries = line.split()
                if entries:
                    self._add(entries)
        else:
            for entry in source:
                if not isinstance(entry, str):
                    raise TypeError(f"tokens must be strings, got {entry!r}")
                self._add([entry])
        self._default = -1 if default is None or default not in self._index else self._index[default]

    def _add(self, entries: list[str]) -> None:
        idx = len(self._entries)
        for entry in entries:
            if entry in self._index:
                raise ValueError(f"duplicate entry {entry!r} in the dictionary")
            self._index[entry] = idx
        self._entries.append(entries[0])

    def add_entry(self, entry: str) -> None:
        """Append ``entry`` at the next index."""
        self._add([entry])

    def get_index(self, entry: str) -> int:
        """The index of ``entry`` (an unknown entry: the default's index, or a ValueError without a default)."""
        idx = self._index.get(entry, self._default)
        if idx < 0:
            raise ValueError(f"unknown entry in the dictionary: {entry!r}")
        return idx

    def get_entry(self, idx: int) -> str:
        """The (first) entry at index ``idx``."""
        if not 0 <= idx < len(self._entries):
            raise ValueError(f"unknown index in the dictionary: {idx}")
        return self._entries[idx]

    def contains(self, entry: str) -> bool:
        """Whether ``entry`` is in the dictionary."""
        return entry in self._index

    def index_size(self) -> int:
        """The number of indices."""
        return len(self._entries)

    def entry_size(self) -> int:
        """The number of entries (several can share an index)."""
        return len(self._index)


class Float32LM:
    """A custom LM as the search calls it: its scores rounded to float32 (torchaudio passes them as float)."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm

    def start(self, start_with_nothing: bool) -> Any:
        return self.lm.start(start_with_nothing)

    def score(self, state: Any, usr_token_idx: int) -> tuple[Any, float]:
        out, s = self.lm.score(state, usr_token_idx)
        return out, f32(s)

    def finish(self, state: Any) -> tuple[Any, float]:
        out, s = self.lm.finish(state)
        return out, f32(s)


def word_dictionary(
    lexicon: dict[str, list[list[str]]] | None, lm: Any, lm_dict: str | None, tokens: Dictionary, unk_word: str
) -> Dictionary | None:
    """The word dictionary: ``lm_dict``'s, else the lexicon's words (in file order, ``<unk>`` included), else (a
    lexicon-free KenLM) the tokens themselves and ``unk_word``."""
    if lm_dict is not None:
        return Dictionary(lm_dict)
    if lexicon:
        return Dictionary(list(lexicon), default=UNK_WORD)
    if isinstance(lm, (str, Path)):
        names = [tokens.get_entry(i) for i in range(tokens.index_size())]
        if unk_word not in names:
            names.append(unk_word)
        return Dictionary(names, default=UNK_WORD)
    return None


def tokens_dictionary(tokens: str | list[str], blank_token: str, sil_token: str, unk_word: str) -> Dictionary:
    """The tokens' dictionary, the special tokens checked (a string each; the blank and silence among the
    tokens)."""
    for name, value in (("blank_token", blank_token), ("sil_token", sil_token), ("unk_word", unk_word)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {value!r}")
    if not isinstance(tokens, (str, Path, list, tuple)):
        raise TypeError(f"tokens must be a file path or a list of strings, got {type(tokens).__name__}")
    tokens_dict = Dictionary(tokens)
    for name, value in (("blank_token", blank_token), ("sil_token", sil_token)):
        if not tokens_dict.contains(value):
            raise ValueError(f"{name} {value!r} must be one of the tokens")
    return tokens_dict


def search_lm_of(lm: Any, word_dict: Dictionary | None) -> Any:
    """The LM the search asks: an ARPA file compiled into arrays (read inside the compiled loop, no ``kenlm``
    needed) or a KenLM binary file (through ``kenlm``), over ``word_dict``'s indices; no LM; or the user's LM (an
    object with ``start``, ``score`` and ``finish``, as torchaudio's ``CTCDecoderLM``)."""
    if isinstance(lm, (str, Path)):
        from beamkit.lm import KenLMModel
        from beamkit.textfiles import check_text_file

        from ..ngram import compiled_ngram, is_arpa_text

        assert word_dict is not None
        words = [word_dict.get_entry(i) for i in range(word_dict.index_size())]
        path = check_text_file(str(lm), "language model file")
        if is_arpa_text(path):
            return NGramWords(compiled_ngram(path), words)
        return KenLMWords(KenLMModel(path).model, words)
    if lm is None:
        return ZeroLM()
    if all(callable(getattr(lm, name, None)) for name in ("start", "score", "finish")):
        return lm
    raise TypeError(
        f"lm must be a KenLM file path, a CTCDecoderLM (start, score, finish) or None, got {type(lm).__name__}"
    )


def check_words(words: Any, word_dict: Dictionary | None, unk_word: str) -> None:
    """With a lexicon and an LM dictionary, the unknown word and every lexicon word must be in the dictionary
    (unless it has a default)."""
    if words is None or word_dict is None:
        return
    if not word_dict.contains(unk_word) and word_dict._default < 0:
        raise ValueError(f"unk_word {unk_word!r} must be in the LM dictionary")
    for word in words:
        if not word_dict.contains(word) and word_dict._default < 0:
            raise ValueError(f"the lexicon word {word!r} must be in the LM dictionary (lm_dict)")
