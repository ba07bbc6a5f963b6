"""CTC prefix-search traces: what the search did for one utterance, frame by frame, as plain data.

With ``record_trace=True`` the prefix search stops after every frame and hands a :class:`CTCTraceRecorder` a
snapshot (the lead's ``FrameSnapshot``; see ``/work/notes/ctc-trace-api.md``): the frame's candidate labels with
their log-probabilities, and every merged candidate beam of that frame, kept or pruned, in ranking order. The
recorder turns them into a :class:`CTCTrace` per utterance:

* ``frames[t].candidates``: the labels tried at frame ``t`` (:class:`CTCCandidate`);
* ``frames[t].entries``: one :class:`CTCEntry` per merged beam: prefix text, ``p_b`` / ``p_nb`` (log-probs of
  its alignments ending in blank / in its last label), the fused LM score, the ranking total
  ``logaddexp(p_b, p_nb) + lm``, how many (beam, label) extensions merged into it, its fate (``kept``, or pruned
  by ``threshold`` / ``beam`` width / ``history``) and ``source``: the index of the previous frame's kept entry
  whose extension contributed most (frame 0: the root, the empty prefix before any frame);
* ``hypotheses``: the returned hypotheses, best first, each with the prefix it came from and the kept entries
  of the last frame holding that prefix.

Label ids are mapped to text with the labels the recorder was given. ``CTCTrace.to_json()`` /
``CTCTrace.from_json()`` round-trip; :func:`beamkit.viz.to_html` (``to_svg``, ``to_dot``) draws a trace (in
Jupyter: ``IPython.display.HTML(to_html(trace, standalone=False))``). The drawing lives in :mod:`beamkit.viz`,
which reads this module; nothing here imports it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

FATES = ("kept", "threshold", "beam", "history")  # FrameSnapshot.fate codes 0..3
BLANK_TEXT = "ε"  # how the blank label is shown
_FLOATS = ("p_b", "p_nb", "lm", "total")


class Snapshot(Protocol):
    """What the search hands :meth:`CTCTraceRecorder.frame` per frame (the search's ``FrameSnapshot``)."""

    @property
    def t(self) -> int: ...
    @property
    def cand_labels(self) -> np.ndarray: ...
    @property
    def cand_lp(self) -> np.ndarray: ...
    @property
    def prefix(self) -> np.ndarray: ...
    @property
    def source(self) -> np.ndarray: ...
    @property
    def label(self) -> np.ndarray: ...
    @property
    def ends_in_blank(self) -> np.ndarray: ...
    @property
    def p_b(self) -> np.ndarray: ...
    @property
    def p_nb(self) -> np.ndarray: ...
    @property
    def lm(self) -> np.ndarray: ...
    @property
    def total(self) -> np.ndarray: ...
    @property
    def merged(self) -> np.ndarray: ...
    @property
    def fate(self) -> np.ndarray: ...


@dataclass
class CTCCandidate:
    """A label tried at a frame: its id, its text (:data:`BLANK_TEXT` for the blank) and log-probability."""

    label: int
    text: str
    logprob: float


@dataclass
class CTCEntry:
    """One merged candidate beam of a frame (see the module docstring).

    ``rank``: its place in the frame's ranking (kept first, best first, then the pruned ones); ``prefix``: the
    search's prefix id (0 = empty prefix); ``text``: the prefix text; ``source``: index of the previous frame's
    kept entry (frame 0: 0, the root); ``label``: the label its best contribution appended (-1: the prefix
    stayed the same), ``label_text`` that label's text; ``ends_in_blank``: the beam unit's blank flag;
    ``merged``: how many (beam, label) extensions merged into it; ``fate``: one of :data:`FATES`.
    """

    rank: int
    prefix: int
    text: str
    source: int
    label: int
    label_text: str
    ends_in_blank: bool
    p_b: float
    p_nb: float
    lm: float
    total: float
    merged: int
    fate: str

    @property
    def kept(self) -> bool:
        """Whether this entry is one of the frame's beams."""
        return self.fate == "kept"

    @property
    def logit(self) -> float:
        """``logaddexp(p_b, p_nb)``: the log-probability of all the prefix's alignments (no LM)."""
        return float(np.logaddexp(self.p_b, self.p_nb))


@dataclass
class CTCFrame:
    """One frame of the search: its candidates and its entries (kept first, in ranking order)."""

    t: int
    candidates: list[CTCCandidate]
    entries: list[CTCEntry]

    @property
    def kept(self) -> list[CTCEntry]:
        """The beams of this frame (what the next frame's ``source`` indexes)."""
        return [e for e in self.entries if e.fate == "kept"]


@dataclass
class CTCTraceHypothesis:
    """A returned hypothesis: text and scores as the search returned them, the prefix id and text it came from,
    and ``entries``: the indices (into the last frame's kept entries) holding that prefix (two with
    ``split_blank`` when the prefix ends both in blank and in a label; empty when the utterance has no frame)."""

    text: str
    score: float
    logit_score: float
    lm_score: float
    prefix: int
    prefix_text: str
    entries: list[int]


@dataclass
class CTCTrace:
    """The prefix search one utterance ran: its ``frames`` and returned ``hypotheses`` (best first).

    ``labels`` / ``blank``: the label texts by id and the blank's id. ``greedy_labels``: the best-path
    (greedy) decoding's collapsed labels, computed from the frames' candidates (the argmax of each frame is always
    a candidate); ``greedy``: its text. ``source``: what was decoded (a file name), when known.
    """

    utterance: int
    labels: list[str]
    blank: int
    frames: list[CTCFrame] = field(default_factory=list)
    hypotheses: list[CTCTraceHypothesis] = field(default_factory=list)
    source: str | None = None

    # ------------------------------------------------------------------------------------------ queries
    @property
    def n_entries(self) -> int:
        """How many entries (merged beams, kept and pruned) the trace holds over all frames."""
        return sum(len(f.entries) for f in self.frames)

    def label_text(self, label: int) -> str:
        """A label's text (:data:`BLANK_TEXT` for the blank, ``""`` for -1)."""
        if label < 0:
            return ""
        if label == self.blank:
            return BLANK_TEXT
        return self.labels[label] if label < len(self.labels) else str(label)

    def best_path(self) -> list[int]:
        """The argmax label of every frame (ties: the lowest label id, as ``numpy.argmax``)."""
        out = []
        for f in self.frames:
            best = max(f.candidates, key=lambda c: (c.logprob, -c.label))
            out.append(best.label)
        return out

    @property
    def greedy_labels(self) -> list[int]:
        """The greedy decoding: the best path with repeats collapsed and blanks dropped."""
        return collapse(self.best_path(), self.blank)

    @property
    def greedy(self) -> str:
        """The greedy decoding's text (words separated by single spaces)."""
        return join_labels(self.labels, self.greedy_labels)

    def greedy_prefixes(self) -> list[str]:
        """The greedy decoding's text after each frame."""
        path = self.best_path()
        return [join_labels(self.labels, collapse(path[: t + 1], self.blank)) for t in range(len(path))]

    # ------------------------------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The trace as JSON-ready dicts and lists (``-inf`` and other non-finite numbers as strings)."""
        out = asdict(self)
        for frame in out["frames"]:
            for cand in frame["candidates"]:
                cand["logprob"] = _json_float(cand["logprob"])
            for entry in frame["entries"]:
                for name in _FLOATS:
                    entry[name] = _json_float(entry[name])
        for hyp in out["hypotheses"]:
            for name in ("score", "logit_score", "lm_score"):
                hyp[name] = _json_float(hyp[name])
        out["greedy"] = self.greedy
        return out

    def to_json(self, indent: int | None = None) -> str:
        """The trace as JSON text (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> CTCTrace:
        """Read back what :meth:`to_json` wrote."""
        raw = dict(json.loads(text) if isinstance(text, str) else text)
        raw.pop("greedy", None)
        frames = []
        for f in raw.pop("frames"):
            cands = [CTCCandidate(c["label"], c["text"], _from_json_float(c["logprob"])) for c in f["candidates"]]
            entries = []
            for e in f["entries"]:
                e = dict(e)
                for name in _FLOATS:
                    e[name] = _from_json_float(e[name])
                entries.append(CTCEntry(**e))
            frames.append(CTCFrame(f["t"], cands, entries))
        hyps = []
        for h in raw.pop("hypotheses"):
            h = dict(h)
            for name in ("score", "logit_score", "lm_score"):
                h[name] = _from_json_float(h[name])
            hyps.append(CTCTraceHypothesis(**h))
        return cls(frames=frames, hypotheses=hyps, **raw)


def _json_float(x: float) -> float | str:
    return float(x) if math.isfinite(x) else str(float(x))


def _from_json_float(x: float | str) -> float:
    return float(x)


def collapse(path: Sequence[int], blank: int) -> list[int]:
    """A CTC label path read out: repeats collapsed, then blanks dropped."""
    out = []
    prev = None
    for lab in path:
        if lab != prev and lab != blank:
            out.append(int(lab))
        prev = lab
    return out


def join_labels(labels: Sequence[str], ids: Sequence[int]) -> str:
    """The text of collapsed label ids: pieces joined (``▁`` starts a word), whitespace normalised."""
    text = "".join(labels[i] for i in ids).replace("▁", " ")
    return " ".join(text.split())


class _Utterance:
    """The trace of one utterance while its search runs."""

    def __init__(self, trace: CTCTrace, n_frames: int, text_of: Callable[[int], str]):
        self.trace = trace
        self.n_frames = n_frames
        self.text_of = text_of
        self.texts: dict[int, str] = {0: ""}


class CTCTraceRecorder:
    """Builds one :class:`CTCTrace` per utterance from the snapshots the prefix search hands it.

    The search calls :meth:`begin` once per utterance, :meth:`frame` after every frame and :meth:`end` with the
    returned hypotheses; :meth:`traces` gives the traces, by utterance. ``labels``: the label text of every
    column (the blank's is shown as :data:`BLANK_TEXT`); ``blank``: the blank's column.
    """

    def __init__(self, labels: Sequence[str], blank: int):
        if isinstance(labels, str) or not all(isinstance(x, str) for x in labels):
            raise TypeError("labels must be a sequence of strings")
        if not 0 <= int(blank) < len(labels):
            raise ValueError(f"blank index {blank} out of range for {len(labels)} labels")
        self.labels = list(labels)
        self.blank = int(blank)
        self._open: dict[int, _Utterance] = {}
        self._done: dict[int, CTCTrace] = {}

    def _text(self, label: int) -> str:
        if label < 0:
            return ""
        return BLANK_TEXT if label == self.blank else self.labels[label]

    def begin(self, utt: int, n_frames: int, text_of: Callable[[int], str]) -> None:
        """A new utterance of ``n_frames`` frames; ``text_of(prefix_id)`` gives a prefix's text."""
        self._open[utt] = _Utterance(CTCTrace(utt, self.labels, self.blank), n_frames, text_of)

    def frame(self, utt: int, snap: Snapshot) -> None:
        """Record one frame's snapshot (frames come in order, 0 .. n_frames - 1)."""
        u = self._open[utt]
        t = int(snap.t)
        if t != len(u.trace.frames):
            raise ValueError(f"utterance {utt}: frame {t} recorded after {len(u.trace.frames)} frames")
        cands = [
            CTCCandidate(int(lab), self._text(int(lab)), float(lp))
            for lab, lp in zip(snap.cand_labels.tolist(), snap.cand_lp.tolist(), strict=True)
        ]
        columns = zip(
            snap.prefix.tolist(),
            snap.source.tolist(),
            snap.label.tolist(),
            snap.ends_in_blank.tolist(),
            snap.p_b.tolist(),
            snap.p_nb.tolist(),
            snap.lm.tolist(),
            snap.total.tolist(),
            snap.merged.tolist(),
            snap.fate.tolist(),
            strict=True,
        )
        entries = []
        for rank, (pid, src, lab, eib, p_b, p_nb, lm, total, merged, fate) in enumerate(columns):
            text = u.texts.get(pid)
            if text is None:
                text = u.texts[pid] = str(u.text_of(pid))
            entries.append(
                CTCEntry(rank, pid, text, src, lab, self._text(lab), eib, p_b, p_nb, lm, total, merged, FATES[fate])
            )
        u.trace.frames.append(CTCFrame(t, cands, entries))

    def end(self, utt: int, hyps: Sequence[Any], prefix_ids: Sequence[int]) -> None:
        """The utterance's returned hypotheses (best first) and the prefix id each came from."""
        u = self._open.pop(utt)
        if len(u.trace.frames) != u.n_frames:
            raise ValueError(f"utterance {utt}: {len(u.trace.frames)} frames recorded, {u.n_frames} announced")
        last = u.trace.frames[-1].kept if u.trace.frames else []
        for h, pid in zip(hyps, prefix_ids, strict=True):
            pid = int(pid)
            text = u.texts.get(pid)
            if text is None:
                text = u.texts[pid] = str(u.text_of(pid))
            at = [i for i, e in enumerate(last) if e.prefix == pid]
            u.trace.hypotheses.append(
                CTCTraceHypothesis(h.text, float(h.score), float(h.logit_score), float(h.lm_score), pid, text, at)
            )
        self._done[utt] = u.trace

    def traces(self) -> list[CTCTrace]:
        """The finished traces, by utterance."""
        return [self._done[k] for k in sorted(self._done)]
