"""pyctcdecode's ``BeamSearchDecoderCTC`` and ``build_ctcdecoder`` over beamkit's CTC search.

Each call normalises the logits as pyctcdecode does (probabilities when the rows sum to 1 on average, else a
log-softmax; both clipped at ``MIN_TOKEN_CLIP_P``) and runs beamkit's :class:`~beamkit.ctc.Decoder`
with pyctcdecode's end-of-utterance rule. Language models live in the class-level ``model_container`` (as in
pyctcdecode) so a decoder pickles into ``multiprocessing`` workers.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import multiprocessing as mp
import os
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from ..decoder import Decoder, checked
from ..options import CTCOptions, word_tuple
from ..search import CTCHypothesis
from .alphabet import Alphabet, verify_alphabet_coverage
from .constants import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_WIDTH,
    DEFAULT_BETA,
    DEFAULT_HOTWORD_WEIGHT,
    DEFAULT_MIN_TOKEN_LOGP,
    DEFAULT_PRUNE_BEAMS,
    DEFAULT_PRUNE_LOGP,
    DEFAULT_SCORE_LM_BOUNDARY,
    DEFAULT_UNK_LOGP_OFFSET,
    MIN_TOKEN_CLIP_P,
)
from .language_model import AbstractLanguageModel, LanguageModel, load_unigram_set_from_arpa, read_kenlm
from .search_lm import fusion_weights, search_lm

logger = logging.getLogger(__name__)

Frames = tuple[int, int]
WordFrames = tuple[str, Frames]
OutputBeam = tuple[str, Any, list[WordFrames], float, float]
OutputBeamMPSafe = tuple[str, list[WordFrames], float, float]
# one call's knobs: beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight
CallKnobs = tuple[int, float, float, bool, Iterable[str] | None, float]

# the search options of every call: pyctcdecode's end-of-utterance rule, the call's knobs on top
PYCTCDECODE = CTCOptions(pyctcdecode_compat=True)

__all__ = ["BeamSearchDecoderCTC", "OutputBeam", "OutputBeamMPSafe", "WordFrames", "build_ctcdecoder"]


def beams_of(hyps: Sequence[CTCHypothesis]) -> list[OutputBeam]:
    """pyctcdecode's beams ``(text, lm_state, word_frames, logit_score, combined_score)`` of hypotheses."""
    return [(h.text, h.lm_state, h.word_frames, h.logit_score, h.score) for h in hyps]


def mp_safe_beams_of(hyps: Sequence[CTCHypothesis]) -> list[OutputBeamMPSafe]:
    """pyctcdecode's beams without LM state ``(text, word_frames, logit_score, combined_score)``."""
    return [(h.text, h.word_frames, h.logit_score, h.score) for h in hyps]


def raise_single(errors: dict[int, Exception]) -> None:
    """Raise what is wrong with the one matrix of a single-matrix call, as it was raised."""
    if errors:
        raise errors[0]


def call_options(base: CTCOptions, knobs: CallKnobs, best_only: bool = False) -> CTCOptions:
    """``base`` with the knobs of one pyctcdecode-style call (``best_only``: one hypothesis, no word frames)."""
    beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight = knobs
    return dataclasses.replace(
        base,
        beam_width=beam_width,
        beam_prune_logp=beam_prune_logp,
        token_min_logp=token_min_logp,
        prune_history=bool(prune_history),
        hotwords=None if hotwords is None else word_tuple(hotwords),
        hotword_weight=hotword_weight,
        num_hypotheses=1 if best_only else None,
        word_frames=not best_only,
    )


def _valid_pool(pool: Any) -> Any:
    """``pool``, or None for a spawn-context pool (which cannot see ``model_container``: decoded in turn)."""
    if pool is not None and isinstance(getattr(pool, "_ctx", None), mp.context.SpawnContext):
        logger.warning("Specified pool object has a spawn context, which is not supported; decoding sequentially.")
        return None
    return pool


def _log_probs(logits: np.ndarray) -> np.ndarray:
    """pyctcdecode's input rule: rows summing to 1 on average are probabilities (log of the clipped values),
    anything else gets a log-softmax clipped at ``log(MIN_TOKEN_CLIP_P)``."""
    # shape: (T, V)
    if math.isclose(logits.sum(axis=1).mean(), 1):
        return np.log(np.clip(logits, MIN_TOKEN_CLIP_P, 1))
    shifted = logits - np.max(logits, axis=1, keepdims=True)
    lp = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    return np.clip(lp, np.log(MIN_TOKEN_CLIP_P), 0)


class BeamSearchDecoderCTC:
    """CTC beam search over an :class:`Alphabet` with an optional language model (pyctcdecode's API)."""

    model_container: dict[bytes, AbstractLanguageModel | None] = {}

    _ALPHABET_SERIALIZED_FILENAME = "alphabet.json"
    _LANGUAGE_MODEL_SERIALIZED_DIRECTORY = "language_model"

    def __init__(self, alphabet: Alphabet, language_model: AbstractLanguageModel | None = None) -> None:
        """Decode over ``alphabet`` (one label per logit column) fusing ``language_model`` when given."""
        self._alphabet = alphabet
        self._idx2vocab = dict(enumerate(alphabet.labels))
        self._is_bpe = alphabet.is_bpe
        self._vocab = alphabet.vocabulary()
        search_lm(language_model)  # unsupported model classes are refused here, not at the first decode
        self._model_key = os.urandom(16)
        BeamSearchDecoderCTC.model_container[self._model_key] = language_model
        self._last_call: tuple[Any, CTCOptions] | None = None  # the last call's knobs and options
        # the last call's search (its language model and weights, and the Decoder whose fusion keeps the scored
        # words): calls without a start state and with unchanged weights reuse it
        self._last_search: tuple[Any, Any, Decoder] | None = None
        # an LM-free decoder over the alphabet: every call's decoder starts from its label tables
        self._tables = Decoder(self._vocab, None, PYCTCDECODE, input_kind="log_probs")

    def __getstate__(self) -> dict[str, Any]:
        """What pickles into a pool's workers: not the last search, which holds the language model (workers
        find it in ``model_container``, as pyctcdecode's do)."""
        state = self.__dict__.copy()
        state["_last_search"] = None
        return state

    def _call_options(self, knobs: CallKnobs, best_only: bool = False) -> CTCOptions:
        """The search options of one call's knobs (its hotwords as given: cleaned here as pyctcdecode cleans
        them). A call with the knobs of the one before reuses its options: a list of 10,000 hotwords passed
        with every call is cleaned and checked once, not per utterance."""
        beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, weight = knobs
        scalars = (beam_width, beam_prune_logp, token_min_logp, prune_history)
        key = None
        if hotwords is None or type(hotwords) in (list, tuple):  # a string or another iterable: no shortcut
            raw = None if hotwords is None else tuple(hotwords)
            key = (*scalars, weight, best_only, tuple(map(type, (*scalars, weight))), raw)
            last = self._last_call
            if last is not None and last[0] == key:
                return last[1]
        cleaned: CallKnobs = (
            beam_width, beam_prune_logp, token_min_logp, prune_history, _hotword_list(hotwords), weight
        )  # fmt: skip
        opts = call_options(PYCTCDECODE, cleaned, best_only)
        if key is not None:
            self._last_call = (key, opts)
        return opts

    def reset_params(
        self,
        alpha: float | None = None,
        beta: float | None = None,
        unk_score_offset: float | None = None,
        lm_score_boundary: bool | None = None,
    ) -> None:
        """Change the language model's fusion parameters (see ``LanguageModel.reset_params``)."""
        lm = self._language_model
        if lm is None:
            return
        params: dict[str, Any] = {}
        for name, value in (("alpha", alpha), ("beta", beta), ("unk_score_offset", unk_score_offset)):
            if value is not None:
                params[name] = value
        if lm_score_boundary is not None:
            params["score_boundary"] = lm_score_boundary
        lm.reset_params(**params)

    @classmethod
    def clear_class_models(cls) -> None:
        """Forget every decoder's language model."""
        cls.model_container = {}

    def cleanup(self) -> None:
        """Forget this decoder's language model."""
        BeamSearchDecoderCTC.model_container.pop(self._model_key, None)

    @property
    def _language_model(self) -> AbstractLanguageModel | None:
        return BeamSearchDecoderCTC.model_container[self._model_key]

    def _check_logits_dimension(self, logits: Any) -> None:
        """2-D with one column per label, else ValueError."""
        if len(logits.shape) != 2:
            raise ValueError(f"Input logits have {len(logits.shape)} dimensions, but need 2: (time, vocabulary)")
        if logits.shape[-1] != len(self._idx2vocab):
            raise ValueError(
                f"Input logits shape is {logits.shape}, but vocabulary is size {len(self._idx2vocab)}. "
                "Need logits of shape: (time, vocabulary)"
            )

    def _decoder(self, lm_start_state: Any = None) -> Decoder:
        """The search of one call. Without a start state, the previous call's when the language model and its
        weights are unchanged: its fusion keeps the (context, word) scores already asked of the LM, as
        beamkit's own :class:`Decoder` does across calls (a fusion built per call started cold, and with
        10,000 unigrams spent about 100 ms a call rebuilding their prefix trie)."""
        language_model = self._language_model
        key = None if lm_start_state is not None else fusion_weights(language_model)
        last = self._last_search
        if key is not None and last is not None and last[0] is language_model and last[1] == key:
            return last[2]
        lm = search_lm(language_model, lm_start_state)
        if lm is not None:
            lm.check_scorable()  # the weights take any float, as pyctcdecode's; NaN cannot be decoded
        decoder = self._tables.with_lm(lm)
        if key is not None:
            self._last_search = (language_model, key, decoder)
        return decoder

    def _prepared(self, logits: Any) -> np.ndarray:
        """Checked and normalised log-probabilities (NaN, +inf, or an all -inf frame: ValueError; pyctcdecode
        fails on them too, with ``max() arg is an empty sequence``)."""
        self._check_logits_dimension(logits)
        if np.isnan(logits).any():
            raise ValueError("logits contain NaN")
        if np.isposinf(logits).any() or (len(logits) and np.isneginf(logits).all(axis=1).any()):
            raise ValueError("logits have a frame that holds +inf or is all -inf (it normalises to NaN)")
        with np.errstate(divide="ignore"):
            return _log_probs(logits)

    def decode_beams(
        self,
        logits: Any,
        beam_width: int = DEFAULT_BEAM_WIDTH,
        beam_prune_logp: float = DEFAULT_PRUNE_LOGP,
        token_min_logp: float = DEFAULT_MIN_TOKEN_LOGP,
        prune_history: bool = DEFAULT_PRUNE_BEAMS,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = DEFAULT_HOTWORD_WEIGHT,
        lm_start_state: Any = None,
    ) -> list[OutputBeam]:
        """Beams ``(text, lm_state, word_frames, logit_score, lm_score)``, best first; ``lm_start_state``
        (a beam's ``lm_state`` from the previous chunk) continues the LM context."""
        knobs: CallKnobs = (beam_width, beam_prune_logp, token_min_logp, prune_history, hotwords, hotword_weight)
        return beams_of(self._search_one(logits, knobs, lm_start_state))

    def _search_one(
        self, logits: Any, knobs: CallKnobs, lm_start_state: Any, best_only: bool = False
    ) -> list[CTCHypothesis]:
        """The hypotheses of one matrix (what is wrong with it raised as it was raised)."""
        lp = self._prepared(logits)
        results, errors = self._decoder(lm_start_state).search([lp], self._call_options(knobs, best_only))
        raise_single(errors)
        return results[0]

    def _decode_beams_mp_safe(self, logits: Any, knobs: CallKnobs) -> list[OutputBeamMPSafe]:
        beams = self.decode_beams(logits, *knobs)
        return [(text, frames, logit_score, lm_score) for text, _, frames, logit_score, lm_score in beams]

    def _pool_map(self, pool: Any, logits_list: Sequence[Any], knobs: CallKnobs) -> Any:
        """Each matrix's beams without LM states through ``pool.map`` (``knobs``: those of
        :meth:`decode_beams` after the logits); None when ``pool`` is None or a spawn pool."""
        valid = _valid_pool(pool)
        if valid is None:
            return None
        for i, logits in enumerate(logits_list):
            _naming_utterance(i, self._check_logits_dimension, logits)
        return list(valid.map(functools.partial(_mp_safe_beams, self, knobs), logits_list))

    def _searched(
        self, logits_list: Sequence[Any], knobs: CallKnobs, best_only: bool = False
    ) -> tuple[list[list[CTCHypothesis]], dict[int, Exception]]:
        """The hypotheses of each matrix from one search call, and what is wrong with each matrix that cannot
        be decoded (a matrix :meth:`_prepared` refuses raises, naming the utterance, as pyctcdecode fails)."""
        lps = [_naming_utterance(i, self._prepared, x) for i, x in enumerate(logits_list)]
        return self._decoder().search(lps, self._call_options(knobs, best_only))

    def decode_beams_batch(
        self,
        pool: Any,
        logits_list: Sequence[Any],
        beam_width: int = DEFAULT_BEAM_WIDTH,
        beam_prune_logp: float = DEFAULT_PRUNE_LOGP,
        token_min_logp: float = DEFAULT_MIN_TOKEN_LOGP,
        prune_history: bool = DEFAULT_PRUNE_BEAMS,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = DEFAULT_HOTWORD_WEIGHT,
    ) -> list[list[OutputBeamMPSafe]]:
        """:meth:`decode_beams` of each matrix without LM states; through ``pool.map`` when a (fork) pool is
        given, else in one search call."""
        hot = _hotword_list(hotwords)
        knobs: CallKnobs = (beam_width, beam_prune_logp, token_min_logp, prune_history, hot, hotword_weight)
        mapped = self._pool_map(pool, logits_list, knobs)
        if mapped is not None:
            return mapped
        results, errors = self._searched(logits_list, knobs)
        return checked([mp_safe_beams_of(hyps) for hyps in results], errors)

    def decode(
        self,
        logits: Any,
        beam_width: int = DEFAULT_BEAM_WIDTH,
        beam_prune_logp: float = DEFAULT_PRUNE_LOGP,
        token_min_logp: float = DEFAULT_MIN_TOKEN_LOGP,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = DEFAULT_HOTWORD_WEIGHT,
        lm_start_state: Any = None,
    ) -> str:
        """The best text (history pruning on, as in pyctcdecode): the text of :meth:`decode_beams`'s first
        beam, found without spelling the other beams or any word frames."""
        knobs: CallKnobs = (beam_width, beam_prune_logp, token_min_logp, True, hotwords, hotword_weight)
        return self._search_one(logits, knobs, lm_start_state, best_only=True)[0].text

    def decode_batch(
        self,
        pool: Any,
        logits_list: Sequence[Any],
        beam_width: int = DEFAULT_BEAM_WIDTH,
        beam_prune_logp: float = DEFAULT_PRUNE_LOGP,
        token_min_logp: float = DEFAULT_MIN_TOKEN_LOGP,
        hotwords: Iterable[str] | None = None,
        hotword_weight: float = DEFAULT_HOTWORD_WEIGHT,
    ) -> list[str]:
        """:meth:`decode` of each matrix; through ``pool.map`` when a (fork) pool is given, else in one
        search call."""
        hot = _hotword_list(hotwords)
        knobs: CallKnobs = (beam_width, beam_prune_logp, token_min_logp, True, hot, hotword_weight)
        mapped = self._pool_map(pool, logits_list, knobs)
        if mapped is not None:
            return [beams[0][0] for beams in mapped]
        results, errors = self._searched(logits_list, knobs, best_only=True)
        return checked([hyps[0].text if hyps else "" for hyps in results], errors)

    # ------------------------------------------------------------------ saving and loading
    def save_to_dir(self, filepath: str) -> None:
        """Write ``alphabet.json`` and, with an LM, a ``language_model/`` directory (pyctcdecode's layout)."""
        with open(os.path.join(filepath, self._ALPHABET_SERIALIZED_FILENAME), "w") as fh:
            fh.write(self._alphabet.dumps())
        lm = self._language_model
        if lm is not None:
            lm_path = os.path.join(filepath, self._LANGUAGE_MODEL_SERIALIZED_DIRECTORY)
            os.makedirs(lm_path)
            lm.save_to_dir(lm_path)

    @staticmethod
    def parse_directory_contents(filepath: str) -> dict[str, str | None]:
        """Paths of a saved decoder's alphabet and LM directory (None without one); other files: ValueError."""
        contents = [c for c in os.listdir(filepath) if not c.startswith(".") and not c.startswith("__")]
        alphabet_name = BeamSearchDecoderCTC._ALPHABET_SERIALIZED_FILENAME
        lm_name = BeamSearchDecoderCTC._LANGUAGE_MODEL_SERIALIZED_DIRECTORY
        if alphabet_name not in contents:
            raise ValueError(f"Could not find alphabet file {alphabet_name}. Found {contents}")
        contents.remove(alphabet_name)
        if contents and lm_name not in contents:
            raise ValueError(f"Could not find language model directory. Looking for {lm_name}, found {contents}")
        return {
            "alphabet": os.path.join(filepath, alphabet_name),
            "language_model": os.path.join(filepath, lm_name) if contents else None,
        }

    @classmethod
    def load_from_dir(cls, filepath: str, unigram_encoding: str | None = None) -> BeamSearchDecoderCTC:
        """Read a decoder saved by :meth:`save_to_dir` (by beamkit or pyctcdecode)."""
        files = cls.parse_directory_contents(filepath)
        with open(str(files["alphabet"])) as fh:
            alphabet = Alphabet.loads(fh.read())
        lm_dir = files["language_model"]
        lm = None if lm_dir is None else LanguageModel.load_from_dir(lm_dir, unigram_encoding=unigram_encoding)
        return cls(alphabet, language_model=lm)

    @classmethod
    def load_from_hf_hub(cls, model_id: str, cache_dir: str | None = None, **kwargs: Any) -> BeamSearchDecoderCTC:
        """Load a decoder from a Hugging Face Hub repository through ``huggingface_hub.snapshot_download``
        (``local_files_only=True`` reads the offline cache); ``model_id`` that is a local directory is read
        directly."""
        if os.path.isdir(model_id):
            return cls.load_from_dir(model_id)
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise ImportError(
                "You need to install huggingface_hub to use `load_from_hf_hub` (pip install huggingface-hub)."
            ) from None
        cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "pyctcdecode")
        return cls.load_from_dir(snapshot_download(model_id, cache_dir=cache_dir, **kwargs))


def _naming_utterance(index: int, fn: Any, logits: Any) -> Any:
    """``fn(logits)``; a ValueError (pyctcdecode raises for a bad matrix of a batch too) names the utterance."""
    try:
        return fn(logits)
    except ValueError as exc:
        raise ValueError(f"utterance {index} of the batch: {exc}") from exc


def _mp_safe_beams(decoder: BeamSearchDecoderCTC, knobs: CallKnobs, logits: Any) -> list[OutputBeamMPSafe]:
    """``decoder._decode_beams_mp_safe(logits, knobs)`` (a module-level function: it pickles into workers)."""
    return decoder._decode_beams_mp_safe(logits, knobs)


def _hotword_list(hotwords: Iterable[str] | None) -> list[str] | None:
    """pyctcdecode's hotword clean-up: entries stripped, blank ones dropped (a lone string: TypeError)."""
    if hotwords is None:
        return None
    if isinstance(hotwords, str):
        raise TypeError("hotwords must be a list of strings, not one string")
    words = list(filter(None, map(str.strip, word_tuple(hotwords))))
    return words or None


def build_ctcdecoder(
    labels: list[str],
    kenlm_model_path: str | None = None,
    unigrams: Collection[str] | None = None,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    unk_score_offset: float = DEFAULT_UNK_LOGP_OFFSET,
    lm_score_boundary: bool = DEFAULT_SCORE_LM_BOUNDARY,
) -> BeamSearchDecoderCTC:
    """A decoder for ``labels`` (normalised by ``Alphabet.build_alphabet``), with a KenLM model read from
    ``kenlm_model_path`` when given (unigrams read from an ``.arpa`` file when not given)."""
    kenlm_model = None
    if kenlm_model_path is not None:
        kenlm_model = read_kenlm(kenlm_model_path)
        if unigrams is None:
            if kenlm_model_path.endswith(".arpa"):
                unigrams = load_unigram_set_from_arpa(kenlm_model_path)
            else:
                logger.warning("Unigrams not provided and cannot be read from a binary LM file.")
    alphabet = Alphabet.build_alphabet(labels)
    if unigrams is not None:
        verify_alphabet_coverage(alphabet, unigrams)
    lm = None
    if kenlm_model is not None:
        lm = LanguageModel(kenlm_model, unigrams, alpha, beta, unk_score_offset, lm_score_boundary)
    return BeamSearchDecoderCTC(alphabet, lm)


def load_compiled_search() -> bool:
    """Load the compiled search into this process ahead of the first decode, when numba's on-disk cache holds
    it (about half a second; the first decode then answers as fast as the later ones, as pyctcdecode's does).
    A cold cache is left alone: compiling takes 20-60 s, which the first decode does, saying so. Returns
    whether it loaded."""
    from ..jit import COMPILED, is_cold
    from ..prefix.kernel import run_frames

    if not COMPILED or is_cold(run_frames):
        return False
    lp = np.log(np.full((2, 3), 1 / 3))  # shape: (T, V) two frames over a blank, a space and one letter
    BeamSearchDecoderCTC(Alphabet.build_alphabet(["", " ", "a"])).decode_beams(lp)  # with a space: nothing logged
    return True


# importing the drop-in loads the compiled search, so that a first decode timed by a caller (pyctcdecode's
# property tests give each example one second) is not the one that loads it
load_compiled_search()
