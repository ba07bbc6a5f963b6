"""Evaluating search on the dates task: exact match and mean log-probability per beam width, and a plot."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from beamkit._checks import check_int
from beamkit.progress import Progress, Silent, progress_bar
from beamkit.tasks import dates


def parse_beams(text: str) -> list[int]:
    """Parse ``"1,2,5,10"`` into sorted unique beam widths; each must be an integer >= 1."""
    try:
        beams = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as exc:
        raise ValueError(f"--beams must be comma-separated integers, got {text!r}") from exc
    if not beams:
        raise ValueError(f"--beams must list integers >= 1, got {text!r}")
    check_int("--beams", beams[0], 1)
    return beams


SEARCH_ERROR_TOL = 1e-5  # beam and exact search batch rows differently: float32 noise, not a search error


def exact_scores(
    model: Any, sources: Sequence[str], length_penalty: float, batch_size: int = 256, progress: Progress | None = None
) -> list[float]:
    """Score of the true best output of each source, by :func:`beamkit.exact_search` (branch and bound).

    ``progress`` advances by one per source.
    """
    from beamkit import exact_search, select_state
    from beamkit.models.common import encode_sources, inference, model_inputs, pad_batch

    ids = encode_sources(model.src_vocab, sources)
    max_len = int(getattr(model, "meta", {}).get("max_len", 12))
    tv = model.tgt_vocab
    bar = progress or Silent()
    out: list[float] = []
    with inference(model):
        for start in range(0, len(ids), batch_size):
            src, lengths = pad_batch(ids[start : start + batch_size], model.src_vocab.pad)
            state = model.init_state(*model_inputs(model, src, lengths))
            for r in range(src.shape[0]):
                one = select_state(state, np.array([r], dtype=np.int64))  # one request: its req row only
                best = exact_search(model.step, one, tv.bos, tv.eos, max_len, length_penalty)
                out.append(float(best[0].score) if best else float("-inf"))
                bar.update(1)
    return out


def evaluate_dates(
    model: Any,
    beams: Sequence[int],
    length_penalty: float = 1.0,
    limit: int | None = None,
    split_name: str = "test",
    search_errors: bool = False,
    progress: bool = False,
    lm: Any = None,
    weights: Sequence[float] = (),
    **options: Any,
) -> dict[str, Any]:
    """Exact match and mean best-hypothesis log-prob for each beam width on a dates split.

    Returns ``{"beams": {"1": {"exact_match": ..., "mean_logprob": ...}, ...}, "n": N, ...}``. With
    ``search_errors``, each beam entry also counts the inputs whose best output scores below the exact
    optimum found by :func:`beamkit.exact_search` (a search error, Stahlberg & Byrne 2019). With ``progress``,
    a bar on standard error for the exact search and for each beam width. With a target-side ``lm``
    (:class:`beamkit.NGramLM`), each weight of ``weights`` is also decoded with shallow fusion, under
    ``"fusion"``. ``options`` go to :func:`beamkit.search_batch`.
    """
    from beamkit.adapters import translate

    pairs = dates.split(split_name, limit=limit)
    sources = [s for s, _ in pairs]
    result: dict[str, Any] = {"beams": {}, "n": len(pairs), "split": split_name, "length_penalty": length_penalty}
    optimum = None
    if search_errors:
        bar = progress_bar(len(sources), f"exact search (lp={length_penalty:g})", enabled=progress)
        try:
            optimum = exact_scores(model, sources, length_penalty, progress=bar)
        finally:
            bar.close()
    for k in beams:
        bar = progress_bar(len(sources), f"beam {k} (lp={length_penalty:g})", enabled=progress)
        try:
            outs = translate(model, sources, beam_size=k, length_penalty=length_penalty, progress=bar, **options)
        finally:
            bar.close()
        entry = _match(outs, pairs)
        if optimum is not None:
            entry["search_errors"] = sum(
                o[0].score < best - SEARCH_ERROR_TOL for o, best in zip(outs, optimum, strict=True)
            )
        result["beams"][str(k)] = entry
    if lm is not None:
        result["fusion"] = {
            f"{w:g}": {
                "beams": {
                    str(k): _match(
                        translate(model, sources, k, length_penalty=length_penalty, lm=lm, lm_weight=w, **options),
                        pairs,
                    )
                    for k in beams
                }
            }
            for w in weights
        }
    return result


def _match(outs: list[Any], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    correct = [o[0].text == t for o, (_, t) in zip(outs, pairs, strict=True)]
    return {"exact_match": float(np.mean(correct)), "mean_logprob": float(np.mean([o[0].logprob for o in outs]))}


def parse_weights(text: str) -> list[float]:
    """Parse ``"0.1,0.3"`` into LM weights (finite numbers >= 0), in the order given."""
    try:
        weights = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"--lm-weight must be comma-separated numbers, got {text!r}") from exc
    if not weights or any(not np.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"--lm-weight must list finite numbers >= 0, got {text!r}")
    return weights


def _cell(entry: dict[str, Any], metric: str) -> str:
    """A fused figure, with the examples it fixed and broke against the model alone when known."""
    if "fixed" in entry:
        return f"{entry[metric]:.4f} (+{entry['fixed']} / -{entry['broken']})"
    return f"{entry[metric]:.4f}"


def format_fusion_table(result: dict[str, Any], metric: str) -> str:
    """A markdown table: one row per beam width, ``metric`` without the LM and with each LM weight (with the
    examples the LM fixed / broke at that width, when the evaluation counted them)."""
    fusion = result["fusion"]
    head = "| beam | no LM | " + " | ".join(f"LM weight {w}" for w in fusion) + " |"
    rows = [head, "|---:|---:|" + "---:|" * len(fusion)]
    for k in sorted(result["beams"], key=int):
        cells = [f"{result['beams'][k][metric]:.4f}"] + [_cell(fusion[w]["beams"][k], metric) for w in fusion]
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def format_table(results: dict[float, dict[str, Any]], metric: str = "exact_match") -> str:
    """A markdown table: one row per beam width, ``metric`` and mean log-prob for each length penalty."""
    alphas = sorted(results)
    beams = sorted({int(k) for r in results.values() for k in r["beams"]})
    errs = all("search_errors" in e for r in results.values() for e in r["beams"].values())
    names = [metric, "mean logprob"] + (["search errors"] if errs else [])
    head = "| beam | " + " | ".join(f"{n} (lp={a:g})" for a in alphas for n in names) + " |"
    rule = "|---:|" + "---:|" * len(names) * len(alphas)
    rows = [head, rule]
    for k in beams:
        cells = []
        for a in alphas:
            entry = results[a]["beams"].get(str(k))
            if entry is None:
                cells += [""] * len(names)
                continue
            cells += [f"{entry[metric]:.4f}", f"{entry['mean_logprob']:.4f}"]
            if errs:
                cells.append(str(entry["search_errors"]))
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def check_plot_path(path: str | Path) -> Path:
    """Refuse a plot path that cannot be written, before any evaluation runs; needs matplotlib.

    The folder must exist and be writable, and the suffix must be a format matplotlib writes (none: PNG).
    """
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from exc
    out = Path(path)
    folder = out.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"--plot: folder {str(folder)!r} does not exist")
    if out.is_dir():
        raise ValueError(f"--plot: {str(out)!r} is a folder; give a file name such as {str(out / 'plot.png')!r}")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--plot: folder {str(folder)!r} is not writable")
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = out.suffix.lower().lstrip(".")
    if suffix and suffix not in formats:
        raise ValueError(f"--plot: unsupported format {suffix!r}; use one of {', '.join(sorted(formats))}")
    return out


def plot(results: dict[float, dict[str, Any]], path: str | Path, metric: str = "exact_match", title: str = "") -> Path:
    """Write a PNG of ``metric`` against beam width, one line per length penalty; needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("d", "-.")]
    beams: list[int] = []
    for i, a in enumerate(sorted(results)):
        beams = sorted(int(k) for k in results[a]["beams"])
        marker, line = styles[i % len(styles)]
        values = [results[a]["beams"][str(k)][metric] for k in beams]
        ax.plot(beams, values, marker=marker, linestyle=line, label=f"length penalty {a:g}")
    ax.set_xscale("log")
    ax.set_xticks(beams)
    ax.set_xticklabels([str(k) for k in beams])
    ax.set_xticks([], minor=True)  # a log axis spanning under a decade labels its minor ticks (2x10^0, ...)
    ax.set_xlabel("beam width")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    image = io.BytesIO()
    fig.savefig(image, format=out.suffix.lower().lstrip(".") or "png")
    plt.close(fig)
    write_file(out, image.getvalue(), "--plot")
    return out


def write_file(path: Path, data: bytes, option: str) -> None:
    """Write ``data`` to ``path`` and make sure it arrived: a write or flush error (a full disk, ``/dev/full``) or
    a regular file shorter than ``data`` afterwards is an OSError naming ``option`` and ``path``."""
    try:
        with path.open("wb") as fh:
            fh.write(data)
            fh.flush()
    except OSError as exc:
        raise OSError(f"{option} {path}: could not write the file ({exc.strerror or exc})") from None
    if path.is_file() and path.stat().st_size != len(data):
        raise OSError(f"{option} {path}: the file holds {path.stat().st_size} of {len(data)} bytes written")
