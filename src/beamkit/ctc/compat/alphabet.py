"""pyctcdecode's ``Alphabet``: labels normalised for decoding (blank ``""``, delimiter ``" "``, unknown token
``⁇`` / ``▁⁇▁``, ``##`` WordPiece converted to ``▁`` pieces), with pyctcdecode's JSON form."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Iterable

from ..vocab import BPE_TOKEN, Vocabulary

UNK_TOKEN = "⁇"
UNK_BPE_TOKEN = "▁⁇▁"

_SPECIAL = re.compile(r"^[<\[].+[>\]]$")
_PAD = re.compile(r"^[<\[]pad[>\]]$", flags=re.IGNORECASE)
_UNK = re.compile(r"^[<\[]unk[>\]]$", flags=re.IGNORECASE)

logger = logging.getLogger(__name__)

__all__ = ["BPE_TOKEN", "UNK_BPE_TOKEN", "UNK_TOKEN", "Alphabet", "verify_alphabet_coverage"]


def _wordpiece_to_bpe(token: str) -> str:
    """``##x`` continues a word (``x``); any other ordinary piece starts one (``▁x``)."""
    if token.startswith("##"):
        return token[2:]
    if token in ("", BPE_TOKEN, UNK_BPE_TOKEN) or _SPECIAL.match(token):
        return token
    return BPE_TOKEN + token


def _normalise(labels: list[str], is_bpe: bool) -> list[str]:
    """pyctcdecode's label rules: ``|`` becomes the delimiter when no space exists (characters),
    ``<pad>``/``[pad]`` (or, for characters, a lone ``_``) become the blank, a blank column is appended when
    there is none, ``<unk>``/``[unk]`` become the unknown token."""
    out = list(labels)
    if is_bpe:
        if any(s.startswith("##") for s in out):
            out = [_wordpiece_to_bpe(s) for s in out]
    elif "|" in out and " " not in out:
        out[out.index("|")] = " "
    out = ["" if _PAD.match(s) else s for s in out]
    if not is_bpe and "_" in out and "" not in out:
        out[out.index("_")] = ""
    if "" not in out:
        logger.info("CTC blank '' not found among the labels, appending it as the last column.")
        out.append("")
    unk = UNK_BPE_TOKEN if is_bpe else UNK_TOKEN
    out = [unk if _UNK.match(s) else s for s in out]
    if is_bpe and UNK_BPE_TOKEN not in out:
        logger.warning("UNK token %s not found, is this a mistake?", UNK_BPE_TOKEN)
    if not is_bpe and " " not in out:
        logger.warning("Space token ' ' missing from vocabulary.")
    return out


class Alphabet:
    """Decoding labels (one per logit column) and whether they are BPE pieces."""

    def __init__(self, labels: list[str], is_bpe: bool) -> None:
        """Hold already-normalised ``labels`` (see :meth:`build_alphabet` for raw ones)."""
        self._labels = list(labels)
        self._is_bpe = bool(is_bpe)

    @property
    def is_bpe(self) -> bool:
        """Whether the labels are BPE pieces."""
        return self._is_bpe

    @property
    def labels(self) -> list[str]:
        """A copy of the labels."""
        return self._labels[:]

    @classmethod
    def build_alphabet(cls, labels: list[str]) -> Alphabet:
        """Normalise raw model labels as pyctcdecode does (duplicates, or a space among BPE pieces: ValueError;
        not a list: TypeError)."""
        if not isinstance(labels, Iterable):
            raise TypeError(f"labels must be a list of strings, got {labels!r}")
        labels = list(labels)
        is_bpe = any(s.startswith("##") or s.startswith(BPE_TOKEN) for s in labels)
        if len(labels) != len(set(labels)):
            raise ValueError("Alphabet contains duplicate entries, this is not allowed.")
        if is_bpe and any(" " in s for s in labels):
            raise ValueError("Space token ' ' found in vocabulary even though it looks like BPE.")
        return cls(_normalise(labels, is_bpe), is_bpe)

    def dumps(self) -> str:
        """The alphabet as pyctcdecode's JSON string (``labels``, ``is_bpe``)."""
        return json.dumps({"labels": self.labels, "is_bpe": self.is_bpe})

    @classmethod
    def loads(cls, s: str) -> Alphabet:
        """Read :meth:`dumps`'s JSON (other keys: ValueError)."""
        data = json.loads(s)
        expected = {"is_bpe", "labels"}
        if set(data.keys()) != expected:
            raise ValueError(f"unexpected keys found. Expected {expected}, found {set(data.keys())}")
        return cls(data["labels"], data["is_bpe"])

    def vocabulary(self) -> Vocabulary:
        """beamkit's :class:`~beamkit.ctc.vocab.Vocabulary` of these labels (the blank is the ``""`` label)."""
        labels = self._labels
        if labels.count("") != 1:
            raise ValueError(f"the alphabet needs exactly one blank label '', found {labels.count('')}")
        if self._is_bpe and UNK_BPE_TOKEN in labels and BPE_TOKEN + UNK_TOKEN not in labels:
            # the search has no word-ending pieces: the unknown token is the word "⁇" (see the README)
            labels = [BPE_TOKEN + UNK_TOKEN if s == UNK_BPE_TOKEN else s for s in labels]
        return Vocabulary(labels, labels.index(""), self._is_bpe)


def verify_alphabet_coverage(alphabet: Alphabet, unigrams: Collection[str]) -> None:
    """Log a warning when over 20% of the unigrams' characters are not labels."""
    label_chars = set(alphabet.labels)
    chars = set("".join(unigrams))
    if chars and len(chars - label_chars) / len(chars) > 0.2:
        logger.warning("Unigrams and labels don't seem to agree.")
