"""CTC output vocabularies: characters with a word delimiter, or BPE/sentencepiece pieces.

A :class:`Vocabulary` maps the ``V`` columns of a CTC posterior matrix to strings and tells the prefix
search which column is the blank, which one (if any) is the word delimiter, and which pieces start a word.

* Character vocabularies: one label per column, the blank is named (``blank=``) or is the one label spelled
  ``""``, ``<pad>`` or ``<blank>`` (anything else is refused, never guessed), the word delimiter is
  ``" "`` (``"|"`` is mapped to ``" "`` when no space exists, the wav2vec2 convention).
* BPE vocabularies (detected when any label starts with ``▁`` or ``##``): a piece starting with ``▁`` starts
  a new word; ``##x`` pieces are converted to the ``▁`` convention (``##x`` continues, ``x`` starts a word).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

BPE_TOKEN = "▁"
_BLANK_PATTERN = re.compile(r"^[<\[](pad|blank)[>\]]$", flags=re.IGNORECASE)
_SPECIAL_PATTERN = re.compile(r"^[<\[].+[>\]]$")


class Vocabulary:
    """Labels of the CTC output columns, with blank, delimiter and word-start information.

    Build one with :meth:`from_labels`; the constructor takes already-normalised labels.
    """

    def __init__(self, labels: Sequence[str], blank: int, is_bpe: bool) -> None:
        """Store normalised ``labels`` (blank included at index ``blank``); ``is_bpe`` picks the word rule."""
        labels = list(labels)
        if not labels:
            raise ValueError("vocabulary is empty")
        if not 0 <= blank < len(labels):
            raise ValueError(f"blank index {blank} out of range for {len(labels)} labels")
        if len(set(labels)) != len(labels):
            raise ValueError("vocabulary contains duplicate labels")
        if is_bpe and any(" " in lab for lab in labels):
            raise ValueError("BPE vocabulary must not contain a space label")
        self.labels: list[str] = labels
        self.blank: int = blank
        self.is_bpe: bool = is_bpe
        self.size: int = len(labels)
        self.space: int = -1 if is_bpe or " " not in labels else labels.index(" ")
        # shape: (V,) per-column flags used by the search
        self.is_blank = np.zeros(self.size, dtype=bool)
        self.is_blank[blank] = True
        self.starts_word = np.zeros(self.size, dtype=bool)
        if is_bpe:
            for i, lab in enumerate(labels):
                if i != blank and lab.startswith(BPE_TOKEN):
                    self.starts_word[i] = True
        elif self.space >= 0:
            self.starts_word[self.space] = True

    @classmethod
    def from_labels(cls, labels: Sequence[str], blank: int | str | None = None) -> Vocabulary:
        """Normalise ``labels`` (one per column of the posterior matrix) and return a vocabulary.

        ``blank`` names the CTC blank: its column index, or its label (which must occur once). When None
        it is found: the one label spelled ``""``, ``<pad>``/``[pad]`` or ``<blank>``/``[blank]``. No such
        label, or more than one, is refused with a ValueError (name the blank with ``blank=``): guessing
        (pyctcdecode appends a blank column, or takes ``_``) silently decodes garbage when the guess is
        wrong. BPE style is detected from ``▁``/``##`` pieces; ``|`` is the word delimiter when no ``" "``
        label exists.
        """
        if isinstance(labels, str):
            raise TypeError("labels must be a list of strings, not one string")
        if not isinstance(labels, Iterable):
            raise TypeError(f"labels must be a list of strings, got {labels!r}")
        labels = list(labels)
        if not all(isinstance(x, str) for x in labels):
            raise TypeError("labels must be a list of strings; not all of them are strings")
        labs = list(labels)
        if not labs:
            raise ValueError("vocabulary is empty")
        index = _blank_index(labs, blank)
        others = [i for i, lab in enumerate(labs) if lab == "" and i != index]
        if others:
            raise ValueError(
                f"the blank is given as column {index} ({labs[index]!r}), but label {others[0]} is empty, which "
                "also spells the blank: give that column with blank= (--blank), or fix the labels"
            )
        labs[index] = ""
        is_bpe = any(s.startswith("##") for s in labs) or any(s.startswith(BPE_TOKEN) for s in labs)
        if is_bpe:
            if any(s.startswith("##") for s in labs):
                labs = [_convert_wordpiece(s) for s in labs]
        elif "|" in labs and " " not in labs:
            labs[labs.index("|")] = " "
        return cls(labs, index, is_bpe)

    def __len__(self) -> int:
        """Number of columns (blank included)."""
        return self.size

    def __repr__(self) -> str:
        kind = "bpe" if self.is_bpe else "char"
        return f"Vocabulary({kind}, size={self.size}, blank={self.blank})"


def _blank_index(labels: list[str], blank: int | str | None) -> int:
    """The blank's column: ``blank`` checked (an index or a label occurring once), or the single label
    spelled as a blank (see :meth:`Vocabulary.from_labels`)."""
    if blank is None:
        found = [i for i, lab in enumerate(labels) if lab == "" or _BLANK_PATTERN.match(lab)]
        if len(found) == 1:
            return found[0]
        if not found:
            raise ValueError(
                f"no blank among the {len(labels)} labels (none is '', '<pad>' or '<blank>'): name it with "
                "blank= (--blank on the command line): its index or label; the matrix needs a column for it"
            )
        shown = ", ".join(f"{i}: {labels[i]!r}" for i in found[:5])
        raise ValueError(f"more than one label looks like the blank ({shown}): name it with blank= (--blank)")
    if isinstance(blank, bool) or not isinstance(blank, (int, str, np.integer)):
        raise TypeError(f"blank must be a column index or a label, got {blank!r}")
    if isinstance(blank, str):
        hits = [i for i, lab in enumerate(labels) if lab == blank]
        if len(hits) != 1:
            raise ValueError(f"blank label {blank!r} occurs {len(hits)} times in the labels; it must occur once")
        return hits[0]
    if not 0 <= int(blank) < len(labels):
        raise ValueError(f"blank index {blank} out of range for {len(labels)} labels")
    return int(blank)


def _convert_wordpiece(token: str) -> str:
    """Convert a ``##``-style WordPiece label to the ``▁`` convention."""
    if token.startswith("##"):
        return token[2:]
    if token == "" or _SPECIAL_PATTERN.match(token) or token.startswith(BPE_TOKEN):
        return token
    return BPE_TOKEN + token
