"""torchaudio's CTC decoder API over beamkit's token-level lexicon search:
``from beamkit.ctc.compat.torchaudio import ctc_decoder`` in place of ``from torchaudio.models.decoder import
ctc_decoder``.

The names, arguments, defaults and results are torchaudio's (``ctc_decoder``, ``CTCDecoder``, ``CTCHypothesis``,
``CTCDecoderLM``, ``CTCDecoderLMState``); the search is :mod:`beamkit.ctc.lexicon.search` (flashlight's algorithm,
no flashlight-text needed). Two differences: ``download_pretrained_files`` downloads nothing (it says where the
files are), and a lexicon-free decoder with a KenLM file and no ``lm_dict`` scores each token as itself
(torchaudio scores token ``i`` as the ``i``-th entry of a hash-ordered word list, i.e. as another token).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from beamkit._checks import check_bool, check_float, check_int
from beamkit.ctc.lexicon.decoder import LexiconDecoder, LexiconHypothesis
from beamkit.ctc.lexicon.lm import LMState
from beamkit.ctc.lexicon.options import LexiconOptions
from beamkit.ctc.lexicon.trie import read_lexicon
from beamkit.ctc.lexicon.words import Dictionary, check_words, search_lm_of, tokens_dictionary, word_dictionary
from beamkit.extras import install_hint

try:
    import torch
except ImportError as exc:  # pragma: no cover - the torch extra is missing
    raise ImportError(f"beamkit.ctc.compat.torchaudio needs torch ({install_hint('torch')})") from exc

__all__ = [
    "CTCDecoder",
    "CTCDecoderLM",
    "CTCDecoderLMState",
    "CTCHypothesis",
    "Dictionary",
    "EmissionsError",
    "ctc_decoder",
    "download_pretrained_files",
]

PRETRAINED = ("librispeech", "librispeech-3-gram", "librispeech-4-gram")


class EmissionsError(ValueError, RuntimeError):
    """Emissions (or lengths) the decoder cannot read: a ValueError, and a RuntimeError where torchaudio raises
    one, so code catching either keeps working."""


class CTCHypothesis(NamedTuple):
    """One hypothesis of :class:`CTCDecoder` (torchaudio's record)."""

    tokens: torch.Tensor  # shape: (L,) int64 token ids, repeats collapsed and blanks removed
    words: list[str]  # the words (with a lexicon; empty without one)
    score: float  # the total score
    timesteps: torch.Tensor  # shape: (L,) int32, the step of each token (0: the start, frame t: t + 1)


class CTCDecoderLMState(LMState):
    """A language model state (torchaudio's): ``children`` and ``child(index)`` (the state after one more word,
    created once); the search merges hypotheses whose states are the same object."""


class CTCDecoderLM:
    """Base class of a custom language model: override ``start``, ``score`` and ``finish``. Indices are word
    indices of the decoder's ``word_dict`` (with a lexicon) or token indices (without one)."""

    def start(self, start_with_nothing: bool) -> CTCDecoderLMState:
        """The starting state (``start_with_nothing``: without the sentence-start context)."""
        raise NotImplementedError(f"{type(self).__name__} must define start(start_with_nothing)")

    def score(self, state: CTCDecoderLMState, usr_token_idx: int) -> tuple[CTCDecoderLMState, float]:
        """The state after ``usr_token_idx`` and its score."""
        raise NotImplementedError(f"{type(self).__name__} must define score(state, usr_token_idx)")

    def finish(self, state: CTCDecoderLMState) -> tuple[CTCDecoderLMState, float]:
        """The state after the end of the sentence and its score."""
        raise NotImplementedError(f"{type(self).__name__} must define finish(state)")


class CTCDecoder:
    """The CTC beam search decoder (build it with :func:`ctc_decoder`): ``decoder(emissions, lengths)`` decodes a
    batch; ``decode_begin`` / ``decode_step`` / ``decode_end`` / ``get_final_hypothesis`` decode incrementally.
    A shell over :class:`beamkit.ctc.LexiconDecoder` (torch tensors in and out, torchaudio's checks)."""

    def __init__(
        self,
        nbest: int,
        lexicon: dict[str, list[list[str]]] | None,
        word_dict: Dictionary | None,
        tokens_dict: Dictionary,
        lm: Any,
        decoder_options: LexiconOptions,
        blank_token: str,
        sil_token: str,
        unk_word: str,
    ) -> None:
        """Assemble the decoder (:func:`ctc_decoder` reads the files and checks the arguments)."""
        self.nbest = nbest
        options = dataclasses.replace(decoder_options, nbest=nbest)
        specials = (blank_token, sil_token, unk_word)
        self.native = LexiconDecoder.from_parts(lexicon, word_dict, tokens_dict, lm, options, specials)
        self.word_dict = word_dict
        self.tokens_dict = tokens_dict
        self.blank = self.native.blank
        self.lm = lm
        self.decoder = self.native.search

    def decode_begin(self) -> None:
        """Start an utterance for incremental decoding (not needed for ``decoder(emissions)``)."""
        self.native.begin()

    def decode_step(self, emissions: Any) -> None:
        """Decode more frames of the current utterance: a float32 CPU tensor (or numpy array) of shape
        ``(frames, tokens)``."""
        array = _emissions(emissions, 2)
        with _as_emissions_error():
            self.native.check_width(array.shape[-1])
            self.native.check_values(array)
            self.native.search.step(array)

    def decode_end(self) -> None:
        """Finish the current utterance (the LM's end-of-sentence score)."""
        self.native.end()

    def get_final_hypothesis(self) -> list[CTCHypothesis]:
        """The ``nbest`` best hypotheses of the finished utterance, best first."""
        return [_to_torch(h) for h in self.native.hypotheses()]

    def __call__(self, emissions: Any, lengths: Any = None) -> list[list[CTCHypothesis]]:
        """Decode a batch: float32 CPU emissions of shape ``(batch, frames, tokens)`` and optional valid lengths
        of shape ``(batch,)``; the ``nbest`` best hypotheses of each utterance, best first."""
        array = _emissions(emissions, 3)
        if isinstance(lengths, torch.Tensor) and not lengths.is_cpu:
            raise EmissionsError("lengths must be a CPU tensor.")
        with _as_emissions_error():
            self.native.check_width(array.shape[-1])
            return [[_to_torch(h) for h in hyps] for hyps in self.native.decode(array, lengths)]

    def idxs_to_tokens(self, idxs: Any) -> list[str]:
        """The tokens of token ids."""
        return self.native.idxs_to_tokens(idxs)

    def _get_tokens(self, idxs: Any) -> torch.Tensor:
        """The tokens a frame-by-frame path of token ids emits: each run of one id read once, blanks dropped
        (int64)."""
        ids, starts = self._runs(idxs)
        return torch.from_numpy(ids[starts])

    def _get_timesteps(self, idxs: Any) -> torch.Tensor:
        """The frame where each token of :meth:`_get_tokens` starts (int32)."""
        _, starts = self._runs(idxs)
        return torch.from_numpy(np.flatnonzero(starts).astype(np.int32))

    def _runs(self, idxs: Any) -> tuple[np.ndarray, np.ndarray]:
        """A path's ids (int64) and where a run of a non-blank id starts (bool)."""
        if isinstance(idxs, torch.Tensor):
            idxs = idxs.detach().cpu().numpy()
        ids = np.asarray(idxs)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise TypeError(f"idxs must be a 1D sequence of token ids, got shape {ids.shape} of {ids.dtype}")
        ids = ids.astype(np.int64)  # shape: (frames,)
        starts = np.ones(ids.shape[0], dtype=bool)
        starts[1:] = ids[1:] != ids[:-1]
        return ids, starts & (ids != self.blank)


@contextlib.contextmanager
def _as_emissions_error() -> Iterator[None]:
    """The native decoder's errors about the emissions and lengths as :class:`EmissionsError` (also a
    RuntimeError, where torchaudio raises one)."""
    try:
        yield
    except EmissionsError:
        raise
    except (ValueError, TypeError) as exc:
        raise EmissionsError(str(exc)) from None


def _to_torch(h: LexiconHypothesis) -> CTCHypothesis:
    """A native hypothesis as torchaudio's record (torch tensors)."""
    return CTCHypothesis(torch.from_numpy(h.tokens), h.words, h.score, torch.from_numpy(h.timesteps))


def _emissions(emissions: Any, ndim: int) -> np.ndarray:
    """Emissions as a float32 numpy array of ``ndim`` dimensions (torchaudio's checks and messages)."""
    if isinstance(emissions, torch.Tensor):
        if emissions.dtype != torch.float32:
            raise EmissionsError("emissions must be float32.")
        if not emissions.is_cpu:
            raise EmissionsError("emissions must be a CPU tensor.")
        if not emissions.is_contiguous():
            raise EmissionsError("emissions must be contiguous.")
        array = emissions.detach().numpy()
    elif isinstance(emissions, np.ndarray):
        if emissions.dtype != np.float32:
            raise EmissionsError("emissions must be float32.")
        array = emissions
    else:
        raise TypeError(f"emissions must be a float32 torch tensor or numpy array, got {type(emissions).__name__}")
    if array.ndim != ndim:
        raise EmissionsError(f"emissions must be {ndim}D. Found {tuple(array.shape)}")
    return array


def ctc_decoder(
    lexicon: str | None,
    tokens: str | list[str],
    lm: str | CTCDecoderLM | None = None,
    lm_dict: str | None = None,
    nbest: int = 1,
    beam_size: int = 50,
    beam_size_token: int | None = None,
    beam_threshold: float = 50,
    lm_weight: float = 2,
    word_score: float = 0,
    unk_score: float = float("-inf"),
    sil_score: float = 0,
    log_add: bool = False,
    blank_token: str = "-",
    sil_token: str = "|",
    unk_word: str = "<unk>",
) -> CTCDecoder:
    """A CTC beam search decoder (torchaudio's ``ctc_decoder``).

    ``lexicon``: a lexicon file (each line a word and its space-separated spelling) or None for lexicon-free
    decoding. ``tokens``: a tokens file (one token a line; entries on one line share an index) or a list.
    ``lm``: a KenLM file (ARPA or binary; needs the ``kenlm`` module), a :class:`CTCDecoderLM`, or None.
    ``lm_dict``: the LM's word list (one a line, in LM index order). ``nbest``: hypotheses returned.
    ``beam_size``: hypotheses kept per frame. ``beam_size_token``: tokens tried per frame (None: all).
    ``beam_threshold``: candidates this far below the best are dropped. ``lm_weight``, ``word_score``,
    ``unk_score`` (-inf: no unknown words), ``sil_score``: the score terms. ``log_add``: merge equal states by
    log-sum (else max). ``blank_token``, ``sil_token``, ``unk_word``: the special tokens and word.
    """
    if lm_dict is not None and not isinstance(lm_dict, str):
        raise ValueError("lm_dict must be None or str type.")
    nbest = check_int("nbest", nbest, least=1)
    if beam_size_token is not None:
        beam_size_token = check_int("beam_size_token", beam_size_token, least=1)
    tokens_dict = tokens_dictionary(tokens, blank_token, sil_token, unk_word)
    options = LexiconOptions(
        beam_size=beam_size,
        beam_size_token=beam_size_token or tokens_dict.index_size(),
        beam_threshold=check_float("beam_threshold", beam_threshold),
        lm_weight=check_float("lm_weight", lm_weight),
        word_score=check_float("word_score", word_score) if lexicon else 0.0,
        unk_score=check_float("unk_score", unk_score, minus_inf=True) if lexicon else -math.inf,
        sil_score=check_float("sil_score", sil_score),
        log_add=check_bool("log_add", log_add),
    )
    words = read_lexicon(lexicon) if lexicon else None
    word_dict = word_dictionary(words, lm, lm_dict, tokens_dict, unk_word)
    search_lm = search_lm_of(lm, word_dict)
    check_words(words, word_dict, unk_word)
    return CTCDecoder(
        nbest=nbest,
        lexicon=words,
        word_dict=word_dict,
        tokens_dict=tokens_dict,
        lm=search_lm,
        decoder_options=options,
        blank_token=blank_token,
        sil_token=sil_token,
        unk_word=unk_word,
    )


def download_pretrained_files(model: str) -> Any:
    """Refused: beamkit downloads nothing. The error says where torchaudio serves the files (a lexicon, a tokens
    file and, for the n-gram models, a KenLM binary) to fetch them yourself and pass their paths to
    :func:`ctc_decoder`."""
    if model not in PRETRAINED:
        raise ValueError(f"{model} not supported. Must be one of {list(PRETRAINED)}")
    files = "lexicon.txt, tokens.txt" + ("" if model == "librispeech" else " and lm.bin")
    raise RuntimeError(
        f"beamkit does not download files: fetch {files} from "
        f"https://download.pytorch.org/torchaudio/decoder-assets/{model}/ yourself and pass their paths to "
        "ctc_decoder(lexicon=..., tokens=..., lm=...)"
    )
