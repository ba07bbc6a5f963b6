"""Where the CTC room's earlier import paths went (the migration guide's table of earlier names): importing one
of them is an ``ImportError`` naming its new home (reading it as an attribute: an ``AttributeError`` naming it).
Nothing is forwarded: the old names do not work, they only say where to look.

:func:`refuse_moved_names` makes the modules below answer an old name so (``from beamkit.ctc.lm import ArpaLM``);
a removed module (``import beamkit.ctc.kneser_ney``) is a ``ModuleNotFoundError`` naming its new home.
"""

from __future__ import annotations

import dis
import importlib
import sys
import types
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from typing import Any

_LM = "beamkit.lm.*"  # "*": the same name

#: module -> {old name: its new import ("*" stands for the same name)}
MOVED_NAMES: dict[str, dict[str, str]] = {
    "beamkit.ctc": {
        "CTCDecoder": "beamkit.ctc.Decoder (or beamkit.ctc.compat.BeamSearchDecoderCTC for pyctcdecode's API)",
        "build_ctcdecoder": "beamkit.ctc.Decoder with beamkit.ctc.fusion_of (or beamkit.ctc.compat.build_ctcdecoder)",
        "greedy_decode": "beamkit.ctc.greedy_ctc",
        "log_softmax": "beamkit.ops.log_softmax",
        "HotwordScorer": "beamkit.ctc.Hotwords",
        **dict.fromkeys(
            [
                "ArpaLM",
                "KenLMModel",
                "build_arpa",
                "write_arpa",
                "kenlm_available",
                "load_language_model",
                "load_unigrams_from_arpa",
            ],
            _LM,
        ),
    },
    "beamkit.ctc.decoder": {
        "CTCDecoder": "beamkit.ctc.Decoder (or beamkit.ctc.compat.BeamSearchDecoderCTC for pyctcdecode's API)",
        "build_ctcdecoder": "beamkit.ctc.Decoder with beamkit.ctc.fusion_of (or beamkit.ctc.compat.build_ctcdecoder)",
        **dict.fromkeys(["OutputBeam", "OutputBeamMPSafe", "WordFrames"], "beamkit.ctc.compat.decoder.*"),
    },
    "beamkit.ctc.options": {"SearchOptions": "beamkit.ctc.CTCOptions"},
    "beamkit.ctc.prefix_search": {"greedy_decode": "beamkit.ctc.greedy_ctc", "log_softmax": "beamkit.ops.log_softmax"},
    "beamkit.ctc.lm": {
        "HotwordScorer": "beamkit.ctc.Hotwords",
        **dict.fromkeys(
            [
                "ArpaLM",
                "KenLMModel",
                "NGramModel",
                "kenlm_available",
                "load_language_model",
                "load_unigrams_from_arpa",
                "KENLM_MAX_ORDER",
                "SPECIAL_WORDS",
            ],
            _LM,
        ),
    },
    "beamkit.ctc.search": {
        "Recorder": "beamkit.ctc.search.CTCRecorder",
        **dict.fromkeys(
            [
                "Workspace",
                "SearchCaches",
                "SearchRun",
                "search_candidates",
                "spread",
                "thread_count",
                "SPARE_MAX_BYTES",
                "UTTERANCES_PER_THREAD",
            ],
            "beamkit.ctc.prefix.run.*",
        ),
        "EndKnobs": "beamkit.ctc.prefix.final.EndKnobs",
    },
    "beamkit.ctc.lexicon": dict.fromkeys(
        ["UNK_WORD", "f32", "read_lexicon", "log_add", "TrieNode", "LexiconTrie", "build_trie"],
        "beamkit.ctc.lexicon.trie.*",
    ),
    "beamkit.ctc.posteriors": {"Candidates": "beamkit.ctc.posteriors.FrameCandidates"},
}

#: removed module -> its new home
MOVED_MODULES: dict[str, str] = {
    "beamkit.ctc.kneser_ney": "beamkit.lm (build_arpa, write_arpa)",
    "beamkit.ctc.cli": "beamkit.cli.ctc",
    "beamkit.ctc.kernel": "beamkit.ctc.prefix.kernel (its records: beamkit.ctc.prefix.records)",
    "beamkit.ctc.nodes": "beamkit.ctc.prefix.nodes",
    "beamkit.ctc.fusion": "beamkit.ctc.prefix.fusion",
    "beamkit.ctc.chartrie": "beamkit.ctc.prefix.chartrie",
    "beamkit.ctc.lexicon_search": (
        "beamkit.ctc.lexicon.search (LexiconSearch), beamkit.ctc.lexicon.lm (KenLMWords, ZeroLM, LMState) or "
        "beamkit.ctc.lexicon.options (LexiconOptions, was LexiconSearchOptions); or beamkit.ctc.LexiconDecoder"
    ),
    "beamkit.ctc.lexicon_kernel": "beamkit.ctc.lexicon.kernel",
    "beamkit.ctc.lexicon_compiled": "beamkit.ctc.lexicon.compiled",
}


class MovedNameError(ImportError):
    """``from module import old_name`` of an earlier import path of the CTC room: the message names the new one."""


class MovedAttributeError(AttributeError):
    """``module.old_name`` (``getattr``, ``hasattr``) of an earlier import path: the message names the new one."""


_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


def _in_from_import(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` is running a ``from module import name`` statement (Python turns any AttributeError
    there into its own ImportError, which would drop the new home from the message)."""
    return frame is not None and frame.f_lasti >= 0 and frame.f_code.co_code[frame.f_lasti] == _IMPORT_FROM


class _RefusingModule(types.ModuleType):
    """A module that answers an old name of :data:`MOVED_NAMES` with an error naming its new home: a
    :class:`MovedNameError` in a ``from ... import``, else a :class:`MovedAttributeError` (any other missing name:
    the usual AttributeError)."""

    def __getattr__(self, name: str) -> Any:
        home = MOVED_NAMES.get(self.__name__, {}).get(name)
        missing = f"module {self.__name__!r} has no attribute {name!r}"
        if home is None:
            raise AttributeError(missing)
        home = home.replace("*", name)
        if _in_from_import(sys._getframe(1)):
            raise MovedNameError(f"{self.__name__}.{name} was removed: import {home} instead", name=self.__name__)
        raise MovedAttributeError(f"{missing}: it was removed, import {home} instead")


class _RemovedModules:
    """The last finder on ``sys.meta_path``: a removed module of :data:`MOVED_MODULES` (found by no other
    finder) is a ModuleNotFoundError naming its new home."""

    @staticmethod
    def find_spec(fullname: str, path: Sequence[str] | None = None, target: Any = None) -> ModuleSpec | None:
        """None for every module but a removed one, which raises."""
        home = MOVED_MODULES.get(fullname)
        if home is None:
            return None
        raise ModuleNotFoundError(f"{fullname} was removed: import {home} instead", name=fullname)


def refuse_moved_names() -> None:
    """Make the modules of :data:`MOVED_NAMES` refuse their old names and removed modules name their new home
    (idempotent; :mod:`beamkit.ctc` imports this module, which calls it)."""
    for module_name in MOVED_NAMES:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        if not isinstance(module, _RefusingModule):
            module.__class__ = _RefusingModule
    if not any(isinstance(finder, _RemovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_RemovedModules())  # type: ignore[arg-type]


refuse_moved_names()
