"""The interactive search tree: one self-contained HTML page (inline CSS and JS, nothing fetched, opens offline)."""

from __future__ import annotations

import itertools
import math
from html import escape
from typing import TYPE_CHECKING, Any

from beamkit.trace import Trace

if TYPE_CHECKING:
    from beamkit.ctc.trace import CTCTrace
from beamkit.viz.layout import greedy_path
from beamkit.viz.render import CSS, to_svg

_PAGE_CSS = """
.bk-view{font:13px 'DejaVu Sans',sans-serif;color:#222}
.bk-view h1{font-size:16px;margin:4px 0}
.bk-view .meta{color:#555;margin:2px 0}
.bk-view table{border-collapse:collapse;margin:6px 0}
.bk-view td,.bk-view th{padding:1px 8px;text-align:left;font-family:'DejaVu Sans Mono',monospace;font-size:12px}
.bk-view .legend span{display:inline-block;margin-right:10px}
.bk-view .legend i{display:inline-block;width:14px;height:10px;border:1.5px solid;margin-right:3px;
 vertical-align:middle}
.bk-view .info{font-family:'DejaVu Sans Mono',monospace;font-size:12px;white-space:pre;background:#fafafa;
 border:1px solid #ddd;padding:4px 8px;min-height:4.5em;margin:6px 0}
.bk-view .tree{overflow:auto;border:1px solid #ddd}
.bk-view .bk-tree .node{cursor:pointer}
"""

# the page's script: hover shows a node's numbers and highlights its path; the checkbox folds pruned branches
_JS = """
(function () {
  var root = document.getElementById(%(id)s);
  var svg = root.querySelector('svg.bk-tree');
  var info = root.querySelector('.info');
  var nodes = svg.querySelectorAll('g.node');
  var byId = {};
  var edgeOf = {};
  nodes.forEach(function (g) { byId[g.getAttribute('data-id')] = g; });
  svg.querySelectorAll('path.edge[data-child]').forEach(function (p) {
    edgeOf[p.getAttribute('data-child')] = p;
  });
  function mark(id, on) {
    while (id) {
      byId[id].classList.toggle('hl', on);
      if (edgeOf[id]) { edgeOf[id].classList.toggle('hl', on); }
      id = byId[id].getAttribute('data-parent');
    }
  }
  nodes.forEach(function (g) {
    var title = g.querySelector('title');
    var text = title ? title.textContent : '';
    g.addEventListener('mouseenter', function () { info.textContent = text; mark(g.getAttribute('data-id'), true); });
    g.addEventListener('mouseleave', function () { mark(g.getAttribute('data-id'), false); });
  });
  var fold = root.querySelector('input.fold');
  var quiet = root.querySelector('input.quiet');
  function show(el, on) { el.style.display = on ? '' : 'none'; }
  var box = (svg.getAttribute('data-box') || '64 17').split(' ').map(Number);
  function at(id, mode) {
    var v = byId[id].getAttribute('data-' + mode);
    return v ? v.split(',').map(Number) : null;
  }
  // an edge without stored paths: from the nearest placed ancestor to the child, in this mode
  function curve(child, mode) {
    var b = at(child, mode);
    var up = byId[child].getAttribute('data-parent');
    var a = null;
    while (b && up) {
      a = at(up, mode);
      if (a) { break; }
      up = byId[up].getAttribute('data-parent');
    }
    if (!a || !b) { return ''; }
    var x1 = a[0] + box[0], y1 = a[1] + box[1] / 2, x2 = b[0], y2 = b[1] + box[1] / 2, mid = (x1 + x2) / 2;
    return 'M' + x1 + ',' + y1 + ' C' + mid + ',' + y1 + ' ' + mid + ',' + y2 + ' ' + x2 + ',' + y2;
  }
  function place() {
    var mode = (fold.checked ? 'fold' : 'full') + (quiet && quiet.checked ? '-q' : '');
    svg.classList.toggle('folded', fold.checked);
    svg.querySelectorAll('g.node, g.ghost, g.hdr-col').forEach(function (g) {
      var at = g.getAttribute('data-' + mode);
      if (at) { g.setAttribute('transform', 'translate(' + at + ')'); }
      show(g, !!at);
    });
    svg.querySelectorAll('path.edge').forEach(function (p) {
      var d = p.getAttribute('data-d-' + mode);
      if (d === null && p.hasAttribute('data-child')) { d = curve(p.getAttribute('data-child'), mode); }
      if (d) { p.setAttribute('d', d); }
      show(p, !!d);
    });
    var size = svg.getAttribute('data-' + mode + '-size').split(' ');
    svg.setAttribute('width', size[0]);
    svg.setAttribute('height', size[1]);
    svg.setAttribute('viewBox', '0 0 ' + size[0] + ' ' + size[1]);
  }
  fold.addEventListener('change', place);
  if (quiet) { quiet.addEventListener('change', place); }
  place();
  root.setAttribute('data-rendered', String(nodes.length));
})();
"""

# each node class a page draws: its fill and line colours, and its key on the search tree's page and on the CTC
# prefix search's page (None: not drawn there); the returned and the greedy paths look the same on both
_LEGEND = (
    ("running", "#dbe9ff", "#2b6cd1", "ran on", None),
    ("pruned", "#f6f6f6", "#bbb", "pruned", None),
    ("finished", "#d5f2cc", "#2e8b2e", "finished (eos)", None),
    ("unfinished", "#ffe8c4", "#d98c1a", "cut at max_len", None),
    ("evicted", "#fbdada", "#c0392b", "evicted from the pool", None),
    ("kept", "#dbe9ff", "#2b6cd1", None, "kept beam"),
    ("threshold", "#f6f6f6", "#bbb", None, "pruned: threshold"),
    ("beam", "#f9eeee", "#c77c7c", None, "pruned: beam width"),
    ("history", "#fff3dc", "#d98c1a", None, "pruned: history"),
    ("quiet", "#eef3fa", "#2b6cd1", None, "blank-only frame"),
    ("result", "#fff", "#b8860b", "returned n-best", "returned hypotheses"),
    ("greedy", "#fff", "#8e44ad", "greedy path", "greedy (best path) prefix"),
)
_SEARCH_PAGE, _CTC_PAGE = 0, 1


def _legend(page: int) -> tuple[tuple[str, str, str, str], ...]:
    """The keys of one page (``_SEARCH_PAGE`` or ``_CTC_PAGE``): ``(class, fill, line, text)`` in the table's
    order."""
    keys = ((cls, fill, line, texts[page]) for cls, fill, line, *texts in _LEGEND)
    return tuple((cls, fill, line, text) for cls, fill, line, text in keys if text is not None)


_ids = itertools.count()


def _num(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "-inf"


def _summary(trace: Trace) -> str:
    rows = []
    for rank, i in enumerate(trace.result, 1):
        n = trace.nodes[i]
        text = " ".join(trace.text(t) for t in trace.tokens(i))
        flag = "" if n.status == "finished" else " (unfinished)"
        rows.append(
            f"<tr><td>#{rank}</td><td>{escape(text)}{flag}</td><td>logprob {_num(n.logprob)}</td>"
            f"<td>score {_num(n.score)}</td></tr>"
        )
    if trace.greedy is not None:
        path, ghosts = greedy_path(trace)
        where = "leaves the beam's tree" if ghosts else "inside the tree"
        text = " ".join(trace.text(t) for t in trace.greedy)
        rows.append(f"<tr><td>greedy</td><td>{escape(text)}</td><td colspan=2>({where})</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def to_html(trace: Trace | CTCTrace, vocab: Any = None, standalone: bool = True, title: str | None = None) -> str:
    """The interactive search tree of ``trace`` as HTML: one column per step, nodes for the candidates with their
    tokens, edges to their parents, distinct styles for running / pruned / finished / cut / evicted nodes, the
    returned n-best and the greedy path highlighted, numbers on hover, a control to fold pruned branches.

    A :class:`beamkit.ctc.trace.CTCTrace` is drawn the same way: one column per frame, a node per prefix entry
    (kept, or pruned by threshold / beam width / history), edges to the source beam, p_b / p_nb / LM / total /
    merged count on hover, plus a control to compress runs of blank-only frames (see :mod:`beamkit.viz.ctc`).

    ``vocab`` (a list of strings, a mapping, a beamkit Vocab or a tokenizer) maps token ids to text (search
    traces only: a CTC trace carries its labels). ``standalone``: a whole page (``<!DOCTYPE html>``...); else a
    fragment (Jupyter). Everything is inline.
    """
    if not isinstance(trace, Trace):
        if vocab is not None:
            raise TypeError("vocab= is for search traces: a CTC trace carries its labels")
        return _ctc_html(as_ctc_trace(trace), standalone, title)
    if vocab is not None:
        trace.with_vocab(vocab)
    head = escape(title or (f"search tree: {trace.source}" if trace.source else "search tree"))
    params = (
        f"policy {trace.policy}, beam {trace.beam_size}, max_len {trace.max_len}, length penalty alpha "
        f"{trace.alpha:g}; {len(trace.nodes) - 1} candidates over {len(trace.steps)} steps"
    )
    meta = [params, f"stopped: {trace.stop_reason or '-'}"]
    controls = '<label><input type="checkbox" class="fold"> fold pruned branches</label>'
    hint = "hover a node for its prefix, log-probability, score and fate"
    return _page(
        trace.to_json(),
        head,
        meta,
        _summary(trace),
        _legend(_SEARCH_PAGE),
        controls,
        hint,
        to_svg(trace, style=False),
        "",
        standalone,
    )


def as_ctc_trace(trace: Any) -> CTCTrace:
    """``trace`` itself when it is a CTC trace; else a TypeError naming what the drawings take."""
    from beamkit.ctc.trace import CTCTrace

    if not isinstance(trace, CTCTrace):
        raise TypeError(f"expected a beamkit.trace.Trace or a beamkit.ctc.trace.CTCTrace, got {type(trace).__name__}")
    return trace


def _page(
    data: str,
    head: str,
    meta: list[str],
    summary: str,
    legend: tuple[tuple[str, str, str, str], ...],
    controls: str,
    hint: str,
    svg: str,
    css: str,
    standalone: bool,
) -> str:
    """The page around a drawing: title, parameters, summary table, legend, controls, hover box, the SVG, the
    trace's JSON (when ``data`` is not empty) and the inline style and script."""
    uid = f"bk-trace-{next(_ids)}"
    data = data.replace("</", "<\\/")  # no "</script>" inside the JSON
    embedded = f'<script type="application/json" class="bk-data">{data}</script>' if data else ""
    keys = "".join(
        f'<span><i style="background:{bg};border-color:{fg}"></i>{escape(txt)}</span>' for _, bg, fg, txt in legend
    )
    body = (
        f'<div class="bk-view" id="{uid}"><h1>{head}</h1>'
        + "".join(f'<div class="meta">{escape(m)}</div>' for m in meta)
        + f'{summary}<div class="legend">{keys}</div>{controls}<div class="info">{escape(hint)}</div>'
        f'<div class="tree">{svg}</div>'
        f"{embedded}"
        f"<style>{CSS}{css}{_PAGE_CSS}</style><script>{_JS % {'id': repr(uid)}}</script></div>"
    )
    if not standalone:
        return body
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{head}</title></head><body>{body}</body></html>\n"
    )


def _ctc_summary(trace: CTCTrace, leaves: int | None) -> str:
    rows = []
    for rank, h in enumerate(trace.hypotheses, 1):
        rows.append(
            f"<tr><td>#{rank}</td><td>{escape(h.text) or '∅'}</td><td>score {_num(h.score)}</td>"
            f"<td>logit {_num(h.logit_score)}</td><td>LM {_num(h.lm_score)}</td></tr>"
        )
    where = "a beam prefix at every frame" if leaves is None else f"no entry holds its prefix from frame {leaves}"
    rows.append(f"<tr><td>greedy</td><td>{escape(trace.greedy) or '∅'}</td><td colspan=3>({where})</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _ctc_html(trace: CTCTrace, standalone: bool, title: str | None) -> str:
    from beamkit.viz.ctc import CTC_CSS, ctc_layout, ctc_svg

    lay = ctc_layout(trace)
    what = f"CTC prefix search: {trace.source}" if trace.source else "CTC prefix search"
    head = escape(title or (what if trace.utterance == 0 else f"{what} (utterance {trace.utterance})"))
    kept = max((len(f.kept) for f in trace.frames), default=0)
    meta = [
        f"{len(trace.frames)} frames ({sum(lay.quiet)} blank-only), {trace.n_entries} entries, at most {kept} "
        f"beams per frame; {len(trace.labels)} labels"
    ]
    controls = (
        '<label><input type="checkbox" class="fold"> fold pruned branches</label> '
        '<label><input type="checkbox" class="quiet" checked> compress runs of blank-only frames</label>'
    )
    hint = "hover a node for its prefix, p_b, p_nb, LM score, total, merged count and fate"
    svg = ctc_svg(trace, style=False, lay=lay)
    summary = _ctc_summary(trace, lay.greedy_leaves)
    # no embedded JSON: the drawing carries every number, and traces get large (beamkit ctc explain --format json)
    return _page("", head, meta, summary, _legend(_CTC_PAGE), controls, hint, svg, CTC_CSS, standalone)
