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

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from beamkit._checks import check_bool, check_float, check_int
from beamkit.ctc.lexicon.lm import KenLMWords, LMState, ZeroLM
from beamkit.ctc.lexicon.options import LexiconResult, LexiconSearchOptions
from beamkit.ctc.lexicon.search import LexiconSearch
from beamkit.ctc.lexicon.trie import UNK_WORD, build_trie, f32, read_lexicon
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


class _UserLM:
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


class CTCDecoder:
    """The CTC beam search decoder (build it with :func:`ctc_decoder`): ``decoder(emissions, lengths)`` decodes a
    batch; ``decode_begin`` / ``decode_step`` / ``decode_end`` / ``get_final_hypothesis`` decode incrementally."""

    def __init__(
        self,
        nbest: int,
        lexicon: dict[str, list[list[str]]] | None,
        word_dict: Dictionary | None,
        tokens_dict: Dictionary,
        lm: Any,
        decoder_options: LexiconSearchOptions,
        blank_token: str,
        sil_token: str,
        unk_word: str,
    ) -> None:
        """Assemble the decoder (:func:`ctc_decoder` reads the files and checks the arguments)."""
        self.nbest = nbest
        self.word_dict = word_dict
        self.tokens_dict = tokens_dict
        self.blank = tokens_dict.get_index(blank_token)
        silence = tokens_dict.get_index(sil_token)
        self.lm = lm
        search_lm: Any = lm if isinstance(lm, (ZeroLM, KenLMWords)) else _UserLM(lm)
        if lexicon:
            assert word_dict is not None
            start = search_lm.start(False)
            scores = {word: search_lm.score(start, word_dict.get_index(word))[1] for word in lexicon}
            index = {word: word_dict.get_index(word) for word in lexicon}
            tokens = {tokens_dict.get_entry(i): i for i in range(tokens_dict.index_size())}
            tokens.update(tokens_dict._index)
            trie = build_trie(lexicon, tokens, index, scores, tokens_dict.index_size())
            unk = word_dict.get_index(unk_word)
            self.decoder = LexiconSearch(decoder_options, search_lm, trie=trie, sil=silence, blank=self.blank, unk=unk)
        else:
            self.decoder = LexiconSearch(decoder_options, search_lm, trie=None, sil=silence, blank=self.blank)

    # ------------------------------------------------------------------------------------------------------------
    def _get_tokens(self, idxs: Any) -> torch.Tensor:
        """The token ids of a per-step path: runs of one id as one, blanks dropped."""
        if hasattr(idxs, "tolist"):
            idxs = idxs.tolist()
        out = []
        prev = None
        for idx in idxs:
            if idx != prev and idx != self.blank:
                out.append(idx)
            prev = idx
        return torch.tensor(out, dtype=torch.int64)

    def _get_timesteps(self, idxs: Any) -> torch.Tensor:
        """The step of each token (a token differing from the one before and not the blank)."""
        if hasattr(idxs, "tolist"):
            idxs = idxs.tolist()
        steps = [i for i, idx in enumerate(idxs) if idx != self.blank and (i == 0 or idx != idxs[i - 1])]
        return torch.tensor(steps, dtype=torch.int32)

    def _to_hypo(self, results: list[LexiconResult]) -> list[CTCHypothesis]:
        words = self.word_dict
        return [
            CTCHypothesis(
                tokens=self._get_tokens(r.tokens),
                words=[words.get_entry(x) for x in r.words if x >= 0] if words is not None else [],
                score=r.score,
                timesteps=self._get_timesteps(r.tokens),
            )
            for r in results
        ]

    def decode_begin(self) -> None:
        """Start an utterance for incremental decoding (not needed for ``decoder(emissions)``)."""
        self.decoder.begin()

    def decode_step(self, emissions: Any) -> None:
        """Decode more frames of the current utterance: a float32 CPU tensor (or numpy array) of shape
        ``(frames, tokens)``."""
        array = _emissions(emissions, 2)
        self._check_emissions(array)
        self.decoder.step(array)

    def decode_end(self) -> None:
        """Finish the current utterance (the LM's end-of-sentence score)."""
        self.decoder.end()

    def get_final_hypothesis(self) -> list[CTCHypothesis]:
        """The ``nbest`` best hypotheses of the finished utterance, best first."""
        return self._to_hypo(self.decoder.results()[: self.nbest])

    def __call__(self, emissions: Any, lengths: Any = None) -> list[list[CTCHypothesis]]:
        """Decode a batch: float32 CPU emissions of shape ``(batch, frames, tokens)`` and optional valid lengths
        of shape ``(batch,)``; the ``nbest`` best hypotheses of each utterance, best first."""
        array = _emissions(emissions, 3)
        B, T, N = array.shape
        self._check_width(N)
        if lengths is None:
            valid = [T] * B
        else:
            if isinstance(lengths, torch.Tensor) and not lengths.is_cpu:
                raise EmissionsError("lengths must be a CPU tensor.")
            valid = np.asarray(lengths).reshape(-1).tolist()
            if len(valid) != B:
                raise EmissionsError(f"lengths must hold one length per utterance ({B}), got {len(valid)}")
            for n in valid:
                if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= T:
                    raise EmissionsError(f"lengths must be integers in 0 .. {T} (the frames), got {n!r}")
        for b in range(B):
            self._check_values(array[b, : valid[b]])
        hypos = []
        for b in range(B):
            self.decoder.begin()
            self.decoder.step(array[b, : valid[b]])
            self.decoder.end()
            hypos.append(self.get_final_hypothesis())
        return hypos

    def idxs_to_tokens(self, idxs: Any) -> list[str]:
        """The tokens of token ids."""
        return [self.tokens_dict.get_entry(int(i)) for i in idxs]

    def _check_emissions(self, array: np.ndarray) -> None:
        """:meth:`_check_width` and :meth:`_check_values`."""
        self._check_width(array.shape[-1])
        self._check_values(array)

    def _check_width(self, n: int) -> None:
        """Emissions need one column per token: torchaudio reads past a narrower array and decodes the columns
        of a wider one as tokens no one can name."""
        if n != self.tokens_dict.index_size():
            raise EmissionsError(
                f"emissions must have a column per token ({self.tokens_dict.index_size()}), got {n} columns"
            )

    @staticmethod
    def _check_values(array: np.ndarray) -> None:
        """No NaN among the frames decoded (every comparison of the search with a NaN is false)."""
        if np.isnan(array).any():
            raise EmissionsError("emissions hold NaN: check the acoustic model's output")


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


def _word_dict(
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
    tokens_dict = _tokens_dict(tokens, blank_token, sil_token, unk_word)
    options = LexiconSearchOptions(
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
    word_dict = _word_dict(words, lm, lm_dict, tokens_dict, unk_word)
    search_lm = _search_lm(lm, word_dict)
    _check_words(words, word_dict, unk_word)
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


def _tokens_dict(tokens: str | list[str], blank_token: str, sil_token: str, unk_word: str) -> Dictionary:
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


def _search_lm(lm: str | CTCDecoderLM | None, word_dict: Dictionary | None) -> Any:
    """The LM the search asks: a KenLM file's words (``word_dict``'s indices), no LM, or the user's
    :class:`CTCDecoderLM`."""
    if isinstance(lm, (str, Path)):
        from beamkit.lm import KenLMModel

        assert word_dict is not None
        model = KenLMModel(str(lm)).model
        return KenLMWords(model, [word_dict.get_entry(i) for i in range(word_dict.index_size())])
    if lm is None:
        return ZeroLM()
    if all(callable(getattr(lm, name, None)) for name in ("start", "score", "finish")):
        return lm
    raise TypeError(f"lm must be a KenLM file path, a CTCDecoderLM or None, got {type(lm).__name__}")


def _check_words(words: Any, word_dict: Dictionary | None, unk_word: str) -> None:
    """With a lexicon and an LM dictionary, the unknown word and every lexicon word must be in the dictionary
    (unless it has a default)."""
    if words is None or word_dict is None:
        return
    if not word_dict.contains(unk_word) and word_dict._default < 0:
        raise ValueError(f"unk_word {unk_word!r} must be in the LM dictionary")
    for word in words:
        if not word_dict.contains(word) and word_dict._default < 0:
            raise ValueError(f"the lexicon word {word!r} must be in the LM dictionary (lm_dict)")


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
