"""The optional ``kenlm`` module behind the :class:`~beamkit.lm.arpa.NGramModel` interface (ARPA or KenLM
binary files), and :func:`load_language_model`, which picks ``kenlm`` or beamkit's ARPA reader."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from beamkit.textfiles import check_text_file

from .arpa import ArpaLM, arpa_order

KENLM_MAX_ORDER = 6  # the highest n-gram order the kenlm wheel reads (its default build)


class KenLMModel:
    """The :class:`ArpaLM` interface over ``kenlm.Model`` (needs the optional ``kenlm`` module)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Load an ARPA or KenLM binary file with the ``kenlm`` module."""
        try:
            import kenlm
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("the kenlm module is not installed (pip install kenlm)") from exc
        path = check_text_file(path, "language model file")  # missing, a folder, a pipe: refused here
        self._kenlm = kenlm
        try:
            with _quiet_stderr():  # kenlm writes loading chatter (and its own error trace) to fd 2
                self.model = kenlm.Model(path)
        except (OSError, RuntimeError, UnicodeDecodeError) as exc:  # UTF-16 text fails in kenlm's own decoding
            raise ValueError(kenlm_failure(path, exc)) from None
        self.order: int = int(self.model.order)

    @classmethod
    def from_model(cls, model: Any) -> KenLMModel:
        """Wrap an already-loaded ``kenlm.Model`` (or ``kenlm.LanguageModel``)."""
        import kenlm

        if not isinstance(model, kenlm.Model):
            raise TypeError(f"expected a kenlm.Model, got {type(model).__name__}")
        self = cls.__new__(cls)
        self._kenlm = kenlm
        self.model = model
        self.order = int(model.order)
        return self

    def begin_state(self) -> Any:
        """State after ``<s>``."""
        state = self._kenlm.State()
        self.model.BeginSentenceWrite(state)
        return state

    def null_state(self) -> Any:
        """Empty context."""
        state = self._kenlm.State()
        self.model.NullContextWrite(state)
        return state

    def score(self, state: Any, word: str) -> tuple[float, Any]:
        """Return ``(log10 p(word | state), new_state)``."""
        out = self._kenlm.State()
        return float(self.model.BaseScore(state, word, out)), out

    def score_many(self, states: Sequence[Any], words: Sequence[str]) -> tuple[list[float], list[Any]]:
        """:meth:`score` of each (state, word) pair: the log10 probabilities and the new states."""
        if len(states) != len(words):
            raise ValueError("states and words differ in length")
        new_state = self._kenlm.State
        outs = [new_state() for _ in range(len(words))]
        logps = list(map(float, map(self.model.BaseScore, states, words, outs)))
        return logps, outs

    def eos_score(self, state: Any) -> float:
        """Return ``log10 p(</s> | state)``."""
        out = self._kenlm.State()
        return float(self.model.BaseScore(state, "</s>", out))

    def eos_many(self, states: Sequence[Any]) -> list[float]:
        """:meth:`eos_score` of each state."""
        outs = [self._kenlm.State() for _ in range(len(states))]
        return list(map(float, map(self.model.BaseScore, states, ["</s>"] * len(states), outs)))

    def sentence_score(self, sentence: str, bos: bool = True, eos: bool = True) -> float:
        """log10 probability of a sentence (``kenlm.Model.score``)."""
        return float(self.model.score(sentence, bos=bos, eos=eos))

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is in the KenLM vocabulary."""
        return isinstance(word, str) and word in self.model


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the block (C++ libraries write there directly)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def kenlm_failure(path: str, exc: BaseException) -> str:
    """One line saying why kenlm could not read ``path``: for a text ARPA file, the line-numbered reason
    from beamkit's ARPA reader; else the start of kenlm's message."""
    try:
        ArpaLM.from_file(path)
    except ValueError as arpa_exc:  # not UTF-8 text, or a malformed line: the reader names the file and line
        return f"cannot read language model {path}: {arpa_exc}"
    gist = " ".join(str(exc).split())
    return f"kenlm cannot read {path}: {gist[:160]}{'...' if len(gist) > 160 else ''}"


def kenlm_available() -> bool:
    """Whether the optional ``kenlm`` module can be imported."""
    try:
        import kenlm  # noqa: F401
    except ImportError:
        return False
    return True


def load_language_model(path: str | os.PathLike[str], backend: str = "auto") -> ArpaLM | KenLMModel:
    """Load an n-gram model: ``backend`` is ``"arpa"`` (pure Python), ``"kenlm"``, or ``"auto"``.

    ``auto`` uses ``kenlm`` when it is installed (required for binary files) and the file is not an ARPA
    of an order above what kenlm reads (6), else the ARPA reader.
    """
    path = os.fspath(path)
    if backend not in ("auto", "arpa", "kenlm"):
        raise ValueError(f"unknown LM backend {backend!r}; use 'auto', 'arpa' or 'kenlm'")
    check_text_file(path, "language model file")  # missing, a folder, a pipe: refused before kenlm sees it
    if backend == "kenlm" or (backend == "auto" and kenlm_available() and arpa_order(path) <= KENLM_MAX_ORDER):
        return KenLMModel(path)
    return ArpaLM.from_file(path)
