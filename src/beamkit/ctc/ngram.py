"""An ARPA n-gram model compiled into flat arrays that the compiled CTC searches read directly (no Python, no
``kenlm``, inside the frame loop), with KenLM's scores and states.

Words have ids (0 is ``<unk>``); every n-gram has an id (0: the empty context; ``1 + word``: the unigrams; then
the longer n-grams). An n-gram of two or more words is found in one open-addressing table (the CTC searches' one
hash rule, :mod:`beamkit.ctc.tables`) by the key ``(id of its context n-gram) * words + last word``. An LM state is
the id of its context n-gram and, as in KenLM, that context is the longest suffix of the history that some
longer n-gram extends (its back-off is not 0, or it starts a longer n-gram): histories whose futures score alike
share a state. `backoff_score` is KenLM's back-off (``log10 p(w | h) = log10 p(w | h') + bow(h)`` when ``h w`` is
absent) in KenLM's float32 arithmetic, so its scores equal KenLM's ``BaseScore`` to the bit.

:func:`compiled_ngram` compiles a file once and keeps the arrays in a ``.npz`` file next to it (or, where that
folder is not writable, in the user cache, ``$XDG_CACHE_HOME/beamkit`` or ``~/.cache/beamkit``), keyed on the
file's path, size and modification time; a cache that does not match, or does not load, is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from beamkit.lm.arpa import ArpaLM

from .jit import njit
from .tables import probe

CACHE_FORMAT = 1  # the layout of the cached arrays: a cache written with another is rebuilt
FREE = -1  # an empty slot of the n-gram table
CACHE_SUFFIX = ".beamkit-ngram.npz"
MAX_KEPT = 8  # derived tables a compiled model keeps (CompiledNGram.kept)


class NGramArrays(NamedTuple):
    """An ARPA model as arrays (``n``: n-grams, the empty context included; ``W``: words)."""

    keys: np.ndarray  # shape: (slots,) int64, context id * W + word of the n-grams of 2+ words (FREE: empty)
    ids: np.ndarray  # shape: (slots,) int64, the n-gram id of each key
    prob: np.ndarray  # shape: (n,) float32 log10 probability (as KenLM holds it)
    bow: np.ndarray  # shape: (n,) float32 log10 back-off (0 for the empty context and the highest order)
    suffix: np.ndarray  # shape: (n,) int64 the n-gram without its first word (its longest suffix that exists)
    state: np.ndarray  # shape: (n,) int64 the LM state after the n-gram (see the module docstring)
    sizes: np.ndarray  # shape: (4,) int64: W, order, the state after <s> (KenLM's begin state), the id of </s>


@njit
def backoff_score(a: NGramArrays, state: int, word: int) -> tuple[float, int]:
    """``(log10 p(word | state), next state)``: KenLM's back-off, summed in float32 in KenLM's order (the
    longest matching n-gram's probability, then the back-offs of the longer contexts, shortest first)."""
    W = a.sizes[0]
    ctx = state
    skipped = 0
    while True:
        if ctx == 0:
            m = 1 + word
            break
        slot = probe(a.keys, ctx * W + word, FREE)
        if a.keys[slot] != FREE:
            m = a.ids[slot]
            break
        ctx = a.suffix[ctx]
        skipped += 1
    p = a.prob[m]
    for j in range(skipped - 1, -1, -1):
        c = state
        for _ in range(j):
            c = a.suffix[c]
        p = np.float32(p + a.bow[c])
    return float(p), a.state[m]


@njit
def _fill(keys: np.ndarray, ids: np.ndarray, new_keys: np.ndarray, new_ids: np.ndarray) -> None:
    """Put the (distinct) keys into the empty table."""
    for i in range(new_keys.shape[0]):
        s = probe(keys, new_keys[i], FREE)
        keys[s] = new_keys[i]
        ids[s] = new_ids[i]


class CompiledNGram:
    """An ARPA model's arrays (:class:`NGramArrays`) and its words, with the :class:`beamkit.lm.NGramModel`
    interface in Python (the set-up of a search; the searches call :func:`backoff_score` from compiled code). States
    are ints."""

    def __init__(self, arrays: NGramArrays, words: list[str]) -> None:
        """Wrap ``arrays`` whose word ids index ``words`` (``words[0]`` is ``<unk>``)."""
        self.arrays = arrays
        self.word_list = words
        self.vocab = {w: i for i, w in enumerate(words)}
        self.order = int(arrays.sizes[1])
        self._context_words: dict[int, tuple[int, ...]] | None = None
        self._kept: dict[Any, Any] = {}  # what searches derive from the model, by what else it depends on

    @property
    def begin(self) -> int:
        """The state after ``<s>``."""
        return int(self.arrays.sizes[2])

    @property
    def eos(self) -> int:
        """The word id of ``</s>``."""
        return int(self.arrays.sizes[3])

    def word_id(self, word: str) -> int:
        """The id of ``word`` (0, ``<unk>``, for a word the model lacks)."""
        return self.vocab.get(word, 0)

    def begin_state(self) -> int:
        """State after ``<s>``."""
        return self.begin

    def null_state(self) -> int:
        """Empty context."""
        return 0

    def score(self, state: int, word: str) -> tuple[float, int]:
        """``(log10 p(word | state), new_state)``."""
        with np.errstate(over="ignore"):  # the table's hashes wrap (interpreted, numpy would warn)
            p, nxt = backoff_score(self.arrays, state, self.word_id(word))
        return float(p), int(nxt)

    def eos_score(self, state: int) -> float:
        """``log10 p(</s> | state)``."""
        with np.errstate(over="ignore"):
            return float(backoff_score(self.arrays, state, self.eos)[0])

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is a known (non-``<unk>``) word."""
        return isinstance(word, str) and self.vocab.get(word, 0) != 0

    def kept(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()``, once per ``key`` (a few kept): what a search derives from this model and ``key`` (such as
        the prefix search's word table over an alphabet), shared by the decoders of the process."""
        got = self._kept.get(key)
        if got is None:
            got = build()
            if len(self._kept) >= MAX_KEPT:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = got
        return got

    def context_words(self, state: int) -> list[str]:
        """The words of a state's context, oldest first (empty for the empty context)."""
        if self._context_words is None:
            self._context_words = _contexts(self.arrays)
        return [self.word_list[w] for w in self._context_words.get(int(state), ())]


def _contexts(a: NGramArrays) -> dict[int, tuple[int, ...]]:
    """The words of every n-gram that is a state (read back from the table's keys)."""
    W = int(a.sizes[0])
    parent: dict[int, tuple[int, int]] = {}
    for key, nid in zip(a.keys.tolist(), a.ids.tolist(), strict=True):
        if key != FREE:
            parent[nid] = (key // W, key % W)
    out: dict[int, tuple[int, ...]] = {0: ()}

    def words(nid: int) -> tuple[int, ...]:
        got = out.get(nid)
        if got is None:
            if nid <= W:
                got = (nid - 1,)
            else:
                ctx, w = parent[nid]
                got = (*words(ctx), w)
            out[nid] = got
        return got

    for s in set(a.state.tolist()):
        words(s)
    return out


def compile_arpa(lm: ArpaLM) -> CompiledNGram:
    """Compile a parsed ARPA model (every n-gram of ``lm``) into arrays."""
    words = sorted(lm.vocab, key=lm.vocab.__getitem__)  # by id: the reader gives <unk> id 0
    assert words[0] == "<unk>" and lm.vocab[words[-1]] == len(words) - 1
    W = len(words)
    table = dict(lm._table)
    if (0,) not in table:
        table[(0,)] = (-100.0, 0.0)
    order = max(len(k) for k in table)
    by_len: list[list[tuple[int, ...]]] = [[] for _ in range(order + 1)]
    for ngram in table:
        by_len[len(ngram)].append(ngram)
    # contexts that an n-gram lacks get a blank entry (its back-off probability, no back-off of its own), as KenLM
    for n in range(order, 1, -1):
        for ngram in by_len[n]:
            ctx = ngram[:-1]
            if ctx not in table:
                table[ctx] = (_backed_off(table, ctx), 0.0)
                by_len[n - 1].append(ctx)
    for level in by_len:
        level.sort()
    ids: dict[tuple[int, ...], int] = {(): 0}
    for w in range(W):
        ids[(w,)] = 1 + w
    for n in range(2, order + 1):
        for ngram in by_len[n]:
            ids[ngram] = len(ids)
    count = len(ids)
    prob = np.zeros(count, dtype=np.float32)
    bow = np.zeros(count, dtype=np.float32)
    suffix = np.zeros(count, dtype=np.int64)
    extends = np.zeros(count, dtype=bool)
    for ngram, nid in ids.items():
        if not ngram:
            continue
        p, b = table.get(ngram, (-100.0, 0.0))
        prob[nid] = p
        bow[nid] = b
        extends[nid] = b != 0.0
        if len(ngram) > 1:
            extends[ids[ngram[:-1]]] = True
            tail = ngram[1:]
            while tail and tail not in ids:
                tail = tail[1:]
            suffix[nid] = ids[tail]
    state = np.zeros(count, dtype=np.int64)
    for ngram, nid in ids.items():
        tail = ngram[-(order - 1) :] if order > 1 else ()
        while tail and not (tail in ids and extends[ids[tail]]):
            tail = tail[1:]
        state[nid] = ids[tail] if tail else 0
    longer = [(ngram, nid) for ngram, nid in ids.items() if len(ngram) > 1]
    new_keys = np.array([ids[g[:-1]] * W + g[-1] for g, _ in longer], dtype=np.int64)
    new_ids = np.array([nid for _, nid in longer], dtype=np.int64)
    slots = 1 << max(4, (2 * len(longer)).bit_length())
    keys = np.full(slots, FREE, dtype=np.int64)
    kid = np.zeros(slots, dtype=np.int64)
    with np.errstate(over="ignore"):  # interpreted (no numba), numpy warns when the hashes wrap, as they are meant to
        _fill(keys, kid, new_keys, new_ids)
    begin = ids[(words.index("<s>"),)] if "<s>" in words else 0
    eos = words.index("</s>") if "</s>" in words else 0
    sizes = np.array([W, order, begin, eos], dtype=np.int64)
    return CompiledNGram(NGramArrays(keys, kid, prob, bow, suffix, state, sizes), words)


def _backed_off(table: dict[tuple[int, ...], tuple[float, float]], ngram: tuple[int, ...]) -> float:
    """log10 p of ``ngram``'s last word after its context by back-off over ``table``."""
    back = 0.0
    for start in range(len(ngram)):
        got = table.get(ngram[start:])
        if got is not None:
            return got[0] + back
        ctx = table.get(ngram[start:-1])
        if ctx is not None:
            back += ctx[1]
    return -100.0 + back


# ---------------------------------------------------------------------------------------------------------------
# the cache on disk

_FIELDS = NGramArrays._fields
_loaded: dict[tuple[str, int, int], CompiledNGram] = {}
_lock = threading.Lock()


def file_key(path: str) -> tuple[str, int, int]:
    """What a compiled file depends on: its absolute path, size and modification time (ns)."""
    st = os.stat(path)
    return os.path.abspath(path), int(st.st_size), int(st.st_mtime_ns)


def cache_paths(path: str) -> list[str]:
    """Where the compiled arrays of ``path`` are kept: next to it, then in the user cache."""
    absolute = os.path.abspath(path)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(absolute.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return [absolute + CACHE_SUFFIX, os.path.join(base, "beamkit", f"ngram-{digest}.npz")]


def compiled_ngram(path: str | os.PathLike[str]) -> CompiledNGram:
    """The compiled arrays of an ARPA file: from this process's memory, else from the cache on disk when it
    matches the file, else compiled (and cached). A malformed file: ValueError naming it and the line."""
    path = os.fspath(path)
    key = file_key(path)
    with _lock:
        got = _loaded.get(key)
    if got is not None:
        return got
    places = cache_paths(path)
    for place in places:
        got = _read_cache(place, key)
        if got is not None:
            break
    else:
        got = compile_arpa(ArpaLM.from_file(path))
        for place in places:
            if _write_cache(place, key, got):
                break
    with _lock:
        if len(_loaded) > 16:
            _loaded.clear()
        _loaded[key] = got
    return got


def _read_cache(place: str, key: tuple[str, int, int]) -> CompiledNGram | None:
    """The cached arrays at ``place`` when they were written for ``key`` in this format and hold together."""
    if not os.path.isfile(place):
        return None
    try:
        with np.load(place, allow_pickle=False) as z:
            meta = z["meta"]
            if meta.tolist() != [CACHE_FORMAT, key[1], key[2]] or str(z["path"]) != key[0]:
                return None
            arrays = NGramArrays(*(np.array(z[name]) for name in _FIELDS))
            words = z["words"].tolist()
    except Exception:  # noqa: BLE001 - a cache that does not load is rebuilt, whatever the reason
        return None
    return CompiledNGram(arrays, words) if _holds_together(arrays, words) else None


def _holds_together(a: NGramArrays, words: list[str]) -> bool:
    """Whether cached arrays have the types, sizes and index ranges the kernels rely on (a damaged cache file
    whose numbers still parse is refused here rather than read out of bounds)."""
    n = a.prob.shape[0]
    kinds = [(a.keys, np.int64), (a.ids, np.int64), (a.prob, np.float32), (a.bow, np.float32)]
    kinds += [(a.suffix, np.int64), (a.state, np.int64), (a.sizes, np.int64)]
    if any(x.dtype != t or x.ndim != 1 for x, t in kinds) or a.sizes.shape[0] != 4:
        return False
    W, order, begin, eos = a.sizes.tolist()
    slots = a.keys.shape[0]
    used = a.keys != FREE
    return bool(
        W == len(words) >= 1
        and order >= 1
        and n >= W + 1
        and slots >= 16
        and slots & (slots - 1) == 0
        and a.ids.shape[0] == slots
        and a.bow.shape[0] == a.suffix.shape[0] == a.state.shape[0] == n
        and 0 <= begin < n
        and 0 <= eos < W
        and (a.ids[used] > W).all()
        and (a.ids[used] < n).all()
        and (a.keys[used] >= 0).all()
        and (a.keys[used] < n * W).all()
        and (a.suffix >= 0).all()
        and (a.suffix < n).all()
        and (a.state >= 0).all()
        and (a.state < n).all()
        and int(used.sum()) == n - W - 1
        and 2 * int(used.sum()) <= slots  # free slots end every probe
    )


def _write_cache(place: str, key: tuple[str, int, int], got: CompiledNGram) -> bool:
    """Save the arrays at ``place`` (written whole, then renamed); False where that folder is not writable."""
    folder = os.path.dirname(place)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ngram-", suffix=".npz", dir=folder)
    except OSError:
        return False
    try:
        os.chmod(tmp, 0o644)  # readable by whoever can read the model (mkstemp makes it private)
        with os.fdopen(fd, "wb") as fh:
            np.savez(
                fh,
                meta=np.array([CACHE_FORMAT, key[1], key[2]], dtype=np.int64),
                path=np.array(key[0]),
                words=np.array(got.word_list),
                **got.arrays._asdict(),
            )
        os.replace(tmp, place)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def is_arpa_text(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ARPA text file (its first non-blank line is ``\\data\\``), not a KenLM binary."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if head[:2] == b"\x1f\x8b":
        return False  # gzip: read by kenlm or beamkit.lm.ArpaLM, not compiled here
    for line in head.splitlines():
        if line.strip():
            return line.strip() == b"\\data\\"
    return False


def ngram_of(model: Any) -> CompiledNGram | None:
    """The compiled arrays behind a model, when it is an ARPA file's: a path to an ARPA text file, an
    :class:`~beamkit.lm.ArpaLM`, or a :class:`~beamkit.lm.KenLMModel` (or ``kenlm.Model``) loaded from an ARPA
    text file. None for anything else (a KenLM binary file, a user's model, a model whose scoring methods were
    replaced on the object)."""
    if isinstance(model, CompiledNGram):
        return model
    if any(name in vars(model) for name in _SCORING if hasattr(model, "__dict__")):
        return None  # its scoring replaced on the object: the model is asked, in Python
    if isinstance(model, ArpaLM):
        held = _from_arpalm.get(id(model))
        if held is None or held[0] is not model:
            if len(_from_arpalm) > 16:
                _from_arpalm.clear()
            held = _from_arpalm[id(model)] = (model, compile_arpa(model))
        return held[1]
    path = model if isinstance(model, (str, os.PathLike)) else getattr(model, "path", None)
    if path is None:
        path = getattr(getattr(model, "model", None), "path", None)  # a KenLMModel: its kenlm.Model's path
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if path is None or not is_arpa_text(path):
        return None
    return compiled_ngram(path)


_from_arpalm: dict[int, tuple[ArpaLM, CompiledNGram]] = {}
_SCORING = ("score", "score_many", "eos_score", "eos_many")
