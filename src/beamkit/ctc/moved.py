"""Where the CTC room's earlier import paths went (the migration guide's table of earlier names): importing one
of them is an ``ImportError`` naming its new home (reading it as an attribute: an ``AttributeError`` naming it).
Nothing is forwarded: the old names do not work, they only say where to look.

One mechanism, the import system's own: :class:`MovedFinder`, the last finder on ``sys.meta_path``, answers a
removed module (``import beamkit.ctc.kneser_ney``) and an old name of a module (``from beamkit.ctc.lm import
ArpaLM``: for a name it does not hold, ``from`` asks the import system for ``beamkit.ctc.lm.ArpaLM`` as it does
for a package's submodules, which is why each module of :data:`MOVED_NAMES` is given an empty ``__path__``) with
an error naming the new home. Read as an attribute, an old name is an ``AttributeError`` naming it (the module's
``__getattr__``, PEP 562).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
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


def _home(module: str, name: str) -> str | None:
    """The new import of ``module.name``, or None when it is not an old name."""
    home = MOVED_NAMES.get(module, {}).get(name)
    return None if home is None else home.replace("*", name)


class MovedFinder:
    """The last finder on ``sys.meta_path`` (asked only for what no other finder found): a removed module of
    :data:`MOVED_MODULES`, or ``module.old_name`` of :data:`MOVED_NAMES` (asked by ``from module import
    old_name``), raises an error naming the new home; anything else is not found here."""

    @staticmethod
    def find_spec(fullname: str, path: Sequence[str] | None = None, target: Any = None) -> ModuleSpec | None:
        """None for every module but a removed one or an old name, which raise."""
        home = MOVED_MODULES.get(fullname)
        if home is not None:
            raise ModuleNotFoundError(f"{fullname} was removed: import {home} instead", name=fullname)
        module, _, name = fullname.rpartition(".")
        home = _home(module, name)
        if home is None:
            return None
        raise MovedNameError(f"{module}.{name} was removed: import {home} instead", name=module)


def _getattr_of(module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` (PEP 562): an old name is a :class:`MovedAttributeError` naming its new
    home, any other missing name the usual AttributeError."""

    def __getattr__(name: str) -> Any:
        missing = f"module {module!r} has no attribute {name!r}"
        home = _home(module, name)
        if home is None:
            raise AttributeError(missing)
        raise MovedAttributeError(f"{missing}: it was removed, import {home} instead")

    return __getattr__


def refuse_moved_names() -> None:
    """Make the modules of :data:`MOVED_NAMES` refuse their old names and removed modules name their new home
    (idempotent; :mod:`beamkit.ctc` imports this module, which calls it)."""
    for module_name in MOVED_NAMES:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        module.__getattr__ = _getattr_of(module_name)  # type: ignore[method-assign]
        if not hasattr(module, "__path__"):
            module.__path__ = []  # so that ``from module import name`` asks MovedFinder for a name it lacks
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())  # type: ignore[arg-type]


refuse_moved_names()
