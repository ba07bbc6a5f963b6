"""Build an ARPA n-gram model with interpolated modified Kneser-Ney smoothing (Chen & Goodman 1998).

As KenLM's ``lmplz`` does:

* each sentence is ``<s> w1 .. wk </s>``; the highest order uses raw counts, lower orders use continuation
  counts (the number of distinct words seen before the n-gram), except n-grams starting with ``<s>``,
  which keep raw counts;
* per order, three discounts ``D1, D2, D3+`` from the counts-of-counts ``t1..t4``:
  ``Y = t1 / (t1 + 2 t2)``, ``Dk = k - (k + 1) Y t(k+1) / tk``;
* ``p(w | h) = (c(hw) - D(c(hw))) / c(h.) + gamma(h) p(w | h')`` with
  ``gamma(h) = (D1 N1(h.) + D2 N2(h.) + D3 N3+(h.)) / c(h.)``, and unigrams interpolate with the uniform
  distribution over the vocabulary (``</s>`` and ``<unk>`` included, ``<s>`` excluded);
* the ARPA stores ``log10 p`` for every seen n-gram and ``log10 gamma(h)`` as the back-off of each context,
  which makes the back-off reading of the file equal to the interpolated model.
"""

from __future__ import annotations

import math
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator

from beamkit._checks import check_int
from beamkit.textfiles import text_lines

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
MAX_ORDER = 20  # n-gram orders above this model nothing real, and the counts grow with the order squared
_FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


def _discounts(adjusted: dict[tuple[str, ...], int]) -> tuple[float, float, float]:
    t = [0, 0, 0, 0, 0]
    for gram, c in adjusted.items():
        if gram == (BOS,):
            continue
        if 1 <= c <= 4:
            t[c] += 1
    t1, t2, t3, t4 = t[1], t[2], t[3], t[4]
    if min(t1, t2, t3, t4) == 0:
        return _FALLBACK_DISCOUNTS
    y = t1 / (t1 + 2 * t2)
    d = (1 - 2 * y * t2 / t1, 2 - 3 * y * t3 / t2, 3 - 4 * y * t4 / t3)
    if not all(0 < dk <= k + 1 for k, dk in enumerate(d)):
        return _FALLBACK_DISCOUNTS
    return d


def _tokenize(sentences: Iterable[str | list[str]]) -> Iterable[list[str]]:
    for s in sentences:
        words = s.split() if isinstance(s, str) else list(s)
        if words:
            yield words


def build_arpa(sentences: Iterable[str | list[str]], order: int = 3) -> str:
    """Return the ARPA text of an interpolated modified Kneser-Ney model of ``order`` over ``sentences``
    (strings are split on whitespace; empty ones are skipped). ``order``: 1 to ``MAX_ORDER`` (20)."""
    check_int("order", order, least=1, most=MAX_ORDER)
    if isinstance(sentences, str):
        raise TypeError("sentences must be an iterable of sentences, not one string")
    raw: list[dict[tuple[str, ...], int]] = [defaultdict(int) for _ in range(order)]
    n_sent = 0
    for words in _tokenize(sentences):
        if any(w in (BOS, EOS) for w in words):
            raise ValueError("sentences must not contain <s> or </s>")
        n_sent += 1
        seq = [BOS, *words, EOS]
        for n in range(1, order + 1):
            level = raw[n - 1]
            for i in range(len(seq) - n + 1):
                level[tuple(seq[i : i + n])] += 1
    if n_sent == 0:
        raise ValueError("the corpus has no words")
    # adjusted counts
    adjusted: list[dict[tuple[str, ...], int]] = [dict() for _ in range(order)]
    adjusted[order - 1] = dict(raw[order - 1])
    for n in range(order - 1, 0, -1):
        cont: dict[tuple[str, ...], int] = defaultdict(int)
        for gram in raw[n]:
            cont[gram[1:]] += 1
        level = adjusted[n - 1]
        for gram, c in raw[n - 1].items():
            level[gram] = c if gram[0] == BOS else cont.get(gram, 0)
    adjusted[0].pop((BOS,), None)
    adjusted[0].setdefault((UNK,), 0)
    adjusted[0].setdefault((EOS,), 0)
    discounts = [_discounts(level) for level in adjusted]
    # context statistics: denominator and gamma per context, per order
    gammas: list[dict[tuple[str, ...], float]] = []
    denoms: list[dict[tuple[str, ...], int]] = []
    for n in range(order):
        d1, d2, d3 = discounts[n]
        den: dict[tuple[str, ...], int] = defaultdict(int)
        nk: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
        for gram, c in adjusted[n].items():
            ctx = gram[:-1]
            den[ctx] += c
            if c >= 1:
                nk[ctx][min(c, 3) - 1] += 1
        gam = {}
        for ctx, total in den.items():
            k = nk[ctx]
            gam[ctx] = (d1 * k[0] + d2 * k[1] + d3 * k[2]) / total if total > 0 else 1.0
        gammas.append(gam)
        denoms.append(dict(den))
    vocab_size = len(adjusted[0])
    probs: list[dict[tuple[str, ...], float]] = []
    for n in range(order):
        d = (0.0, *discounts[n])
        level_p: dict[tuple[str, ...], float] = {}
        for gram, c in adjusted[n].items():
            ctx = gram[:-1]
            den_c = denoms[n][ctx]
            disc = d[min(c, 3)]
            lower = 1.0 / vocab_size if n == 0 else probs[n - 1][gram[1:]]
            level_p[gram] = (max(c - disc, 0.0) / den_c if den_c > 0 else 0.0) + gammas[n][ctx] * lower
        probs.append(level_p)
    return _format_arpa(probs, gammas, order)


def _format_arpa(
    probs: list[dict[tuple[str, ...], float]], gammas: list[dict[tuple[str, ...], float]], order: int
) -> str:
    lines = ["\\data\\"]
    counts = [len(probs[0]) + 1] + [len(p) for p in probs[1:]]
    for n, c in enumerate(counts, start=1):
        lines.append(f"ngram {n}={c}")
    for n in range(order):
        lines.append("")
        lines.append(f"\\{n + 1}-grams:")
        contexts = gammas[n + 1] if n + 1 < order else {}
        entries = sorted(probs[n].items())
        if n == 0:
            g = contexts.get((BOS,))
            bos_line = f"-99\t{BOS}"
            if g is not None and g > 0:
                bos_line += f"\t{math.log10(g):.7f}"
            lines.append(bos_line)
        for gram, p in entries:
            line = f"{math.log10(p):.7f}\t{' '.join(gram)}" if p > 0 else f"-99\t{' '.join(gram)}"
            g = contexts.get(gram)
            if g is not None and g > 0:
                line += f"\t{math.log10(g):.7f}"
            elif n == 0 and order > 1 and gram != (EOS,):
                line += "\t0"
            lines.append(line)
    lines.append("")
    lines.append("\\end\\")
    lines.append("")
    return "\n".join(lines)


def write_arpa(
    corpus_path: str | os.PathLike[str], output_path: str | os.PathLike[str], order: int = 3, progress: bool = False
) -> int:
    """Build a Kneser-Ney ARPA from a text corpus (one sentence per line); return the number of n-grams.

    ``progress``: show a tqdm bar (bytes read, rate, ETA) on stderr while the corpus is counted (needs
    ``tqdm``; without it no bar is shown)."""
    corpus_path = os.fspath(corpus_path)
    output_path = os.fspath(output_path)
    if os.path.isdir(corpus_path):
        raise ValueError(f"corpus is a directory, not a text file: {corpus_path}")
    if not os.path.exists(corpus_path):
        raise FileNotFoundError(f"corpus not found: {corpus_path}")
    if os.path.isdir(output_path) or output_path.endswith(("/", os.sep)):
        raise ValueError(f"output must be a file path, not a directory: {output_path}")
    out_dir = os.path.dirname(output_path)
    if out_dir and not os.path.isdir(out_dir):
        raise FileNotFoundError(f"output directory not found: {out_dir}")
    lines = text_lines(corpus_path, "corpus")  # UTF-8 text, checked: a binary or UTF-16 file is named
    text = build_arpa(_read_lines(lines, os.path.getsize(corpus_path), progress), order=order)
    with open(output_path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return sum(int(line.split("=")[1]) for line in text.splitlines()[: order + 1] if line.startswith("ngram "))


def _read_lines(fh: Iterable[str], size: int, progress: bool) -> Iterator[str]:
    """The lines of ``fh`` (``size`` bytes), with a tqdm bar on stderr when ``progress`` (and tqdm is there)."""
    bar = None
    if progress:
        try:
            from tqdm import tqdm
        except ImportError:
            progress = False
        else:
            bar = tqdm(total=size, unit="B", unit_scale=True, desc="counting n-grams", file=sys.stderr)
    try:
        for line in fh:
            if bar is not None:
                bar.update(len(line.encode("utf-8")))
            yield line
    finally:
        if bar is not None:
            bar.close()
